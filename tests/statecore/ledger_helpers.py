"""Helpers shared by the ledger tests: incarnations, a fake probe, and short ways to build a
ledger, record rows and read them back."""

from __future__ import annotations

from typing import Any

from statecore import (
    OBLIGATION_KIND,
    Audit,
    FakeClock,
    Incarnation,
    Ledger,
    LedgerPolicy,
    ObligationState,
    Store,
)

S = ObligationState

HOST = Incarnation.current().host

LIVE = Incarnation(HOST, 4001, 1_000, "live-token")
"""The process running the sweeps in most tests (alive according to the probe)."""

OTHER_LIVE = Incarnation(HOST, 4002, 2_000, "other-live-token")
"""Another gateway process on this host that is also alive."""

DEAD = Incarnation(HOST, 999_999, 1, "deadtoken")
"""A crashed process: the probe does not know its pid."""

POLICY = LedgerPolicy()


class FakeProbe:
    """A scripted ProcessProbe: ``procs`` maps a live pid to its start time (None: unreadable).

    Records every call, and raises from both methods when ``raises`` is set.
    """

    def __init__(self, procs: dict[int, int | None] | None = None, *, raises: bool = False) -> None:
        self.procs = dict(procs or {})
        self.raises = raises
        self.start_time_calls: list[int] = []
        self.pid_exists_calls: list[int] = []

    def pid_exists(self, pid: int) -> bool:
        self.pid_exists_calls.append(pid)
        if self.raises:
            raise RuntimeError("probe broke")
        return pid in self.procs

    def start_time(self, pid: int) -> int | None:
        self.start_time_calls.append(pid)
        if self.raises:
            raise RuntimeError("probe broke")
        return self.procs.get(pid)


def _live_procs() -> dict[int, int | None]:
    return {LIVE.pid: LIVE.started_at, OTHER_LIVE.pid: OTHER_LIVE.started_at}


def make(
    store: Store,
    clock: FakeClock,
    probe: Any,
    incarnation: Incarnation = LIVE,
    **kwargs: Any,
) -> Ledger:
    """A ledger over ``store`` acting as ``incarnation``."""
    return Ledger(store, clock=clock, probe=probe, incarnation=incarnation, **kwargs)


def dead_incarnation(pid: int = DEAD.pid, host: str = HOST) -> Incarnation:
    """A same-host incarnation the default probe considers dead."""
    return Incarnation(host, pid, 1, f"dead-{pid}")


def record(ledger: Ledger, oid: str = "ob-1", **overrides: Any) -> str:
    """Record one obligation (defaults: a Slack thread reply) and return its id."""
    values: dict[str, Any] = {
        "session_key": f"agent:main:slack:channel:{oid}",
        "platform": "slack",
        "chat_id": "C1",
        "thread_id": "171.001",
        "content": "the final answer",
    }
    values.update(overrides)
    return ledger.record(obligation_id=oid, **values).obligation_id


def failed(ledger: Ledger, oid: str = "ob-1", error: str = "send_path_degraded", **kw: Any) -> str:
    """Record, mark attempting and fail one obligation."""
    record(ledger, oid, **kw)
    ledger.mark_attempting(oid)
    ledger.mark_failed(oid, error)
    return oid


def snapshot(ledger: Ledger, oid: str) -> tuple[Any, ...]:
    """What a refused call must not change."""
    ob = ledger.get(oid)
    assert ob is not None
    return (
        ob.state,
        ob.attempts,
        ob.fence,
        ob.last_error,
        ob.owner,
        ob.updated_at,
        len(ledger.history(oid)),
    )


def current(ledger: Ledger, oid: str) -> Any:
    """The stored obligation (asserted to exist)."""
    ob = ledger.get(oid)
    assert ob is not None
    return ob


def spend_budget_at_runtime(ledger: Ledger, oid: str) -> None:
    """Drive one own reconnect-failed row to the attempt cap through runtime claims."""
    for _ in range(ledger.policy.max_attempts):
        (claim,) = ledger.sweep_failed_for_runtime(current(ledger, oid).platform)
        ledger.mark_failed(claim.obligation_id, "send_path_degraded")
    assert current(ledger, oid).attempts == ledger.policy.max_attempts


def claim_chain(store: Store, clock: FakeClock, probe: FakeProbe, oid: str, hops: int) -> None:
    """Each hop, a new process claims the row at startup and then dies (attempts + 1 each)."""
    for n in range(hops):
        claimer = make(store, clock, probe, dead_incarnation(5_000 + n))
        assert [c.obligation_id for c in claimer.sweep_recoverable()] == [oid]


def insert_unowned(store: Store, oid: str, at: float, **values: Any) -> None:
    """Insert a pending obligation with no owner at all (as a pre-ownership writer left it)."""
    row: dict[str, Any] = {
        "session_key": f"sk:{oid}",
        "platform": "slack",
        "chat_id": "C1",
        "content": "the final answer",
        "attempts": 0,
        "created_at": at,
        "updated_at": at,
    }
    row.update(values)
    store.insert(OBLIGATION_KIND, oid, row, event="record", audit=Audit(at))

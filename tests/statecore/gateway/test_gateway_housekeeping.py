"""The gateway's housekeeping: every table with settled rows is pruned on a retention, each prune
counted and logged, owed rows never.

Obligations (past the policy's retention), ended sessions, settled delegations, and what the
relay adapter's dedupe store keeps (handled-replay keys, dismissed undeliverable records) are
pruned by one round (``Gateway.housekeep()``, run by the timer every ``prune_interval_s``);
applications add their own jobs.  Time is a FakeClock's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from relay.client.adapter import RelayAdapter
from relay.client.dedupe import DEDUPE_KIND, UNDELIVERABLE_KIND, StoreBufferDedupe
from relay.client.transport import WebSocketRelayTransport
from statecore.clock import FakeClock
from statecore.gateway import Gateway, RoutingOrigin
from statecore.gateway.adapter import AdapterAbilities
from statecore.gateway.delegations import DELEGATION_KIND, Delegations
from statecore.gateway.sessions import SESSION_KIND, SessionStore
from statecore.ledger import Ledger
from statecore.obligation import OBLIGATION_KIND
from statecore.policy import LedgerPolicy
from stores.memory import InMemoryStore
from tests.recording_metrics import RecordingMetrics
from tests.statecore.gateway.gateway_rig import BOUND, PROBE, FakeAdapter, FakeSessions
from tests.waiting import eventually

RETENTION = 100.0
RUNTIME_LOGGER = "statecore.gateway.runtime"


@pytest.fixture
def store() -> Iterator[InMemoryStore]:
    """The one store every table of these tests lives in."""
    opened = InMemoryStore()
    yield opened
    opened.close()


def origin(chat_id: str) -> RoutingOrigin:
    """A delegation's origin in chat ``chat_id``."""
    return RoutingOrigin(
        platform="loopback", chat_id=chat_id, chat_type="dm", session_key=f"k-{chat_id}"
    )


@pytest.mark.asyncio
async def test_one_round_prunes_every_settled_table_and_keeps_what_is_owed(
    store: InMemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Settled rows older than their retention go from every table -- obligations, sessions,
    delegations, dedupe keys, dismissed undeliverable records -- while an owed obligation, an
    active session, a running delegation, an undismissed record and recent settled rows stay.
    Each count is reported to metrics.pruned and the round is logged once at INFO."""
    clock = FakeClock()
    metrics = RecordingMetrics()
    sessions = SessionStore(store, clock=clock)
    delegations = Delegations(store, clock=clock, probe=PROBE)
    dedupe = StoreBufferDedupe(store, clock=clock)
    ledger = Ledger(store, clock=clock)

    delivered = ledger.record(session_key="k", platform="p", chat_id="c", content="done")
    ledger.mark_attempting(delivered.obligation_id)
    ledger.mark_delivered(delivered.obligation_id)
    owed = ledger.record(session_key="k", platform="p", chat_id="c", content="still owed")
    ended = sessions.start("k-ended")
    sessions.end(ended.session_id, "idle")
    active = sessions.start("k-active")
    done = delegations.dispatch(origin("c1"), {"job": 1})
    delegations.complete(done, {"ok": True})
    delegations.mark_delivered(done)
    running = delegations.dispatch(origin("c2"), {"job": 2})
    await dedupe.remember("b-handled")
    await dedupe.record_undeliverable("b-poison", frame_type="inbound", reason="r", raw_line="{}")
    dedupe.dismiss("b-poison")
    await dedupe.record_undeliverable("b-waiting", frame_type="inbound", reason="r", raw_line="x")

    clock.advance(RETENTION * 2)
    recent = sessions.start("k-recent")
    sessions.end(recent.session_id, "idle")

    transport = WebSocketRelayTransport("ws://127.0.0.1:9", "loopback", "bot", dedupe=dedupe)
    gateway = Gateway(
        store,
        sessions=sessions,
        delegations=delegations,
        clock=clock,
        probe=PROBE,
        policy=LedgerPolicy(retention=RETENTION, stale_after=RETENTION * 100),
        retention_s=RETENTION,
        metrics=metrics,
    )
    gateway.add_adapter("loopback", RelayAdapter(transport))
    assert gateway.housekeeping_jobs() == [
        "obligations",
        "owners",
        "sessions",
        "delegations",
        "dedupe",
        "undeliverable",
    ]
    try:
        with caplog.at_level(logging.INFO, logger=RUNTIME_LOGGER):
            counts = await asyncio.wait_for(gateway.housekeep(), BOUND)
    finally:
        await asyncio.wait_for(gateway.stop(budget_s=1.0), BOUND)

    # Three dedupe keys: the handled one and the two undeliverable records' own keys.
    expected = {
        "obligations": 1,
        "owners": 0,  # no gateway ever beat here
        "sessions": 1,
        "delegations": 1,
        "dedupe": 3,
        "undeliverable": 1,
    }
    assert counts == expected
    assert metrics.of("pruned") == list(expected.items())
    assert [r.id for r in store.select(OBLIGATION_KIND)] == [owed.obligation_id]
    assert {r.id for r in store.select(SESSION_KIND)} == {active.session_id, recent.session_id}
    assert [r.id for r in store.select(DELEGATION_KIND)] == [running]
    assert store.select(DEDUPE_KIND) == []
    assert [r.id for r in store.select(UNDELIVERABLE_KIND)] == ["b-waiting"]
    [line] = [r for r in caplog.records if r.getMessage().startswith("housekeeping:")]
    assert line.name == RUNTIME_LOGGER
    assert line.levelno == logging.INFO
    assert line.__dict__["pruned"] == expected
    assert line.__dict__["rows"] == 7
    assert "1 obligations" in line.getMessage()
    assert "3 dedupe" in line.getMessage()


@pytest.mark.asyncio
async def test_the_timer_runs_the_housekeeping_every_prune_interval(
    store: InMemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    """With the retry timer ticking every 10 s and prune_interval_s=50, the application's job
    runs after 50 s (not before); a job that raises is logged at WARNING and the others still
    run and are counted."""
    clock = FakeClock()
    metrics = RecordingMetrics()
    runs: list[float] = []

    async def custom() -> int:
        runs.append(clock.monotonic())
        return 7

    async def broken() -> int:
        raise RuntimeError("the cache is gone")

    gateway = Gateway(
        store,
        sessions=FakeSessions(),
        clock=clock,
        retry_interval_s=10.0,
        prune_interval_s=50.0,
        metrics=metrics,
    )
    gateway.add_housekeeping("broken", broken)
    gateway.add_housekeeping("custom", custom)
    began = clock.monotonic()
    await asyncio.wait_for(gateway.start(), BOUND)
    try:
        with caplog.at_level(logging.INFO, logger=RUNTIME_LOGGER):
            for _ in range(4):
                await eventually(lambda: clock.next_deadline is not None, "the timer to sleep")
                clock.advance(10.0)
                await asyncio.sleep(0.05)
            assert runs == []
            await eventually(lambda: clock.next_deadline is not None, "the timer to sleep")
            clock.advance(10.0)
            await eventually(lambda: ("custom", 7) in metrics.of("pruned"), "the round")
    finally:
        await asyncio.wait_for(gateway.stop(budget_s=1.0), BOUND)
    assert runs == [began + 50.0]
    assert ("obligations", 0) in metrics.of("pruned")
    assert all(what != "broken" for what, _ in metrics.of("pruned"))
    [failed] = [r for r in caplog.records if "pruning broken failed" in r.getMessage()]
    assert failed.levelno == logging.WARNING
    assert failed.__dict__["what"] == "broken"


@pytest.mark.asyncio
async def test_adapters_jobs_of_one_name_all_run_and_application_jobs_replace(
    store: InMemoryStore,
) -> None:
    """Two adapters that keep house under the same job name both run, their counts added up;
    an application's add_housekeeping replaces a job of its name; bad jobs are refused."""

    class Keeper(FakeAdapter):
        abilities = AdapterAbilities(connects=True, keeps_house=True)

        def __init__(self, rows: int) -> None:
            super().__init__()
            self.rows = rows
            self.retentions: list[float] = []

        def housekeeping(self, retention_s: float) -> dict[str, object]:
            self.retentions.append(retention_s)

            async def job() -> int:
                return self.rows

            return {"cache": job}

    gateway = Gateway(store, sessions=FakeSessions(), retention_s=42.0)
    first, second = Keeper(2), Keeper(3)
    gateway.add_adapter("a", first)
    gateway.add_adapter("b", second)
    assert (first.retentions, second.retentions) == ([42.0], [42.0])
    try:
        assert (await gateway.housekeep())["cache"] == 5

        async def replacement() -> int:
            return 11

        gateway.add_housekeeping("cache", replacement)
        assert (await gateway.housekeep())["cache"] == 11
        with pytest.raises(ValueError, match="name"):
            gateway.add_housekeeping("", replacement)
        with pytest.raises(TypeError, match="callable"):
            gateway.add_housekeeping("x", 3)  # type: ignore[arg-type]
        assert "x" not in gateway.housekeeping_jobs()
    finally:
        await asyncio.wait_for(gateway.stop(budget_s=1.0), BOUND)


def test_retention_must_be_positive(store: InMemoryStore) -> None:
    """retention_s must be a positive number."""
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="retention_s"):
            Gateway(store, sessions=FakeSessions(), retention_s=bad)

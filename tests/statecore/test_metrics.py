"""The metrics hook as the ledger drives it: every guarded write with its outcome (batched writes
one per row, like single ones), claim latency per sweep chunk, settle latency on the ledger's
clock, every sweep; nothing reported, and no report built, without metrics; group commit
reports only what it committed."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from statecore import (
    OBLIGATION_KIND,
    AsyncLedger,
    FakeClock,
    InvalidTransition,
    LedgerPolicy,
    StaleState,
    Store,
    StoreError,
    UnknownEntity,
)
from statecore.metrics import (
    NO_METRICS,
    HeldMetrics,
    Metrics,
    NullMetrics,
    Outcome,
    TransitionMeter,
    outcome_of,
)
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from tests.statecore.ledger_helpers import (
    DEAD,
    LIVE,
    OTHER_LIVE,
    FakeProbe,
    _live_procs,
    make,
    record,
)

GUARD = 30.0
"""Real seconds an async test may take before it fails."""


class Recorder:
    """A Metrics that keeps every report (from any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[tuple[Any, ...]] = []

    def _add(self, *call: Any) -> None:
        with self._lock:
            self.calls.append(call)

    def transition(self, lifecycle: str, event: str, outcome: str, count: int = 1) -> None:
        self._add("transition", lifecycle, event, outcome, count)

    def latency(self, operation: str, seconds: float) -> None:
        self._add("latency", operation, seconds)

    def sweep(self, kind: str, claimed: int, abandoned: int, seconds: float) -> None:
        self._add("sweep", kind, claimed, abandoned, seconds)

    def reconnect(self, target: str) -> None:
        self._add("reconnect", target)

    def dormant(self, target: str, seconds: float) -> None:
        self._add("dormant", target, seconds)

    def buffer(self, gateway_id: str, depth: int, replay_lag_s: float | None) -> None:
        self._add("buffer", gateway_id, depth, replay_lag_s)

    def pruned(self, what: str, rows: int) -> None:
        self._add("pruned", what, rows)

    def transitions(self) -> Counter[tuple[str, str]]:
        """(event, outcome) -> writes, summed over the reports."""
        found: Counter[tuple[str, str]] = Counter()
        for call in self.calls:
            if call[0] == "transition":
                assert call[1] == "obligation"
                found[(call[2], call[3])] += call[4]
        return found

    def of(self, name: str) -> list[tuple[Any, ...]]:
        """The reports of one method, without the method name."""
        return [call[1:] for call in self.calls if call[0] == name]


def _is_metrics(metrics: Metrics) -> Metrics:
    return metrics


@pytest.fixture
def clock() -> FakeClock:
    """The ledgers' clock."""
    return FakeClock()


@pytest.fixture
def probe() -> FakeProbe:
    """LIVE and OTHER_LIVE are alive; DEAD is not."""
    return FakeProbe(_live_procs())


def test_the_protocol_is_implemented_by_the_recorder_and_the_helpers() -> None:
    """Recorder, NullMetrics and HeldMetrics are Metrics (checked by mypy through this call)."""
    for metrics in (Recorder(), NullMetrics(), HeldMetrics(NO_METRICS), NO_METRICS):
        assert _is_metrics(metrics) is metrics


def test_outcomes_of_refusals_and_failures() -> None:
    """Each refusal has its outcome; bad input is no transition; anything else is an error."""
    assert outcome_of(InvalidTransition("obligation", None, "x")) == Outcome.REFUSED
    assert outcome_of(StaleState("obligation", "ob-1")) == Outcome.STALE
    assert outcome_of(UnknownEntity("obligation", "ob-1")) == Outcome.UNKNOWN
    assert outcome_of(StoreError("disk")) == Outcome.ERROR
    assert outcome_of(RuntimeError("bug")) == Outcome.ERROR
    for bad in (TypeError("x"), ValueError("x"), KeyError("x")):
        assert outcome_of(bad) is None


def test_without_metrics_the_ledger_builds_no_meter(clock: FakeClock, probe: FakeProbe) -> None:
    """The default reports nothing, and the hot path holds no meter to call."""
    ledger = make(InMemoryStore(), clock, probe)
    assert ledger.metrics is NO_METRICS
    assert ledger._meter is None
    oid = record(ledger)
    ledger.mark_attempting(oid)
    ledger.mark_delivered(oid)  # nothing to report to: must simply work


def test_every_write_is_reported_with_its_outcome(clock: FakeClock, probe: FakeProbe) -> None:
    """Records (a repeated one wrote nothing), marks, refusals, stale and unknown writes and a
    failed store are each counted once under their outcome; bad input is not counted."""
    store = InMemoryStore()
    metrics = Recorder()
    ledger = make(store, clock, probe, metrics=metrics)
    record(ledger, "ob-1")
    record(ledger, "ob-1")  # idempotent: no write
    with pytest.raises(ValueError, match="chat_id"):
        record(ledger, "ob-bad", chat_id="")
    ledger.mark_attempting("ob-1")
    with pytest.raises(InvalidTransition):
        ledger.mark_attempting("ob-1")
    with pytest.raises(UnknownEntity):
        ledger.mark_delivered("ob-none")
    with pytest.raises(UnknownEntity):
        ledger.mark_failed("ob-none", "boom")
    other = make(store, clock, probe, OTHER_LIVE, metrics=metrics)
    with pytest.raises(StaleState):
        other.mark_delivered("ob-1")  # not its row
    with pytest.raises(TypeError):
        ledger.mark_failed("ob-1", 42)  # type: ignore[arg-type]
    ledger.mark_failed("ob-1", "upstream timeout")
    store.close()
    with pytest.raises(StoreError):
        record(ledger, "ob-2")

    assert metrics.transitions() == {
        ("record", "ok"): 1,
        ("record", "error"): 1,
        ("attempt", "ok"): 1,
        ("attempt", "refused"): 1,
        ("deliver", "unknown"): 1,
        ("deliver", "stale"): 1,
        ("fail", "unknown"): 1,
        ("fail", "ok"): 1,
    }


def test_settle_latency_runs_from_the_send_start_on_the_ledgers_clock(
    clock: FakeClock, probe: FakeProbe
) -> None:
    """Attempt -> deliver and attempt -> fail are timed on the fake clock; a released claim is
    not; a sweep's claim starts a send, timed to its delivery."""
    metrics = Recorder()
    store = InMemoryStore()
    ledger = make(store, clock, probe, metrics=metrics)
    for oid in ("ob-1", "ob-2", "ob-3"):
        record(ledger, oid)
        ledger.mark_attempting(oid)
    clock.advance(2.5)
    ledger.mark_delivered("ob-1")
    clock.advance(1.0)
    ledger.mark_failed("ob-2", "upstream timeout")
    ledger.release("ob-3")
    assert metrics.of("latency") == [("settle", 2.5), ("settle", 3.5)]
    assert ledger._meter is not None
    assert ledger._meter.sends() == 0

    dead = make(store, clock, probe, DEAD)
    record(dead, "ob-4")
    dead.mark_attempting("ob-4")
    metrics.calls.clear()
    (claim,) = ledger.sweep_recoverable()
    clock.advance(4.0)
    ledger.mark_delivered(claim.obligation_id)
    assert metrics.of("latency") == [("claim", 0.0), ("settle", 4.0)]


def test_the_meter_keeps_a_bounded_number_of_send_starts() -> None:
    """Sends never settled cannot grow the meter: past its bound the oldest start is dropped
    (its settle is then not timed), the newest kept."""
    metrics = Recorder()
    now = [0.0]
    meter = TransitionMeter(
        metrics,
        "obligation",
        lambda: now[0],
        begins=("attempt",),
        settles=("deliver",),
        starts_max=3,
    )
    for n in range(5):
        meter.write("attempt", lambda: None, f"ob-{n}")
    assert meter.sends() == 3
    now[0] = 7.0
    meter.write("deliver", lambda: None, "ob-0")  # dropped: untimed
    meter.write("deliver", lambda: None, "ob-4")
    assert metrics.of("latency") == [("settle", 7.0)]
    assert meter.sends() == 2


def test_sweeps_report_claims_abandonments_chunk_latency_and_themselves(
    clock: FakeClock, probe: FakeProbe
) -> None:
    """A startup sweep over five dead rows in chunks of two (one stale: abandoned): one claim
    latency per chunk, the claims and the abandonment counted, one sweep report."""

    class SlowClaims(InMemoryStore):
        def transition_many(self, *args: Any, **kwargs: Any) -> Any:
            clock.advance(0.25)
            return super().transition_many(*args, **kwargs)

    store = SlowClaims()
    dead = make(store, clock, probe, DEAD)
    record(dead, "ob-0")
    clock.advance(LedgerPolicy().stale_after + 1)
    for n in range(1, 5):
        record(dead, f"ob-{n}")
    metrics = Recorder()
    live = make(store, clock, probe, LIVE, policy=LedgerPolicy(sweep_chunk=2), metrics=metrics)

    assert len(live.sweep_recoverable()) == 4

    assert metrics.transitions() == {("claim", "ok"): 4, ("abandon", "ok"): 1}
    assert metrics.of("latency") == [("claim", 0.25), ("claim", 0.25), ("claim", 0.25)]
    assert metrics.of("sweep") == [("startup", 4, 1, 0.75)]


def test_a_claim_lost_to_another_sweeper_is_counted_stale(
    clock: FakeClock, probe: FakeProbe
) -> None:
    """A row read by a sweep but changed before its claim is counted stale, not claimed."""
    store = InMemoryStore()
    dead = make(store, clock, probe, DEAD)
    record(dead, "ob-1")
    metrics = Recorder()
    live = make(store, clock, probe, LIVE, metrics=metrics)
    (row,) = store.select(OBLIGATION_KIND)
    make(store, clock, probe, OTHER_LIVE).sweep_recoverable()  # wins the row
    assert live._claim(row, clock.now(), True, "recovered") is None
    assert metrics.transitions() == {("claim", "stale"): 1}


def test_runtime_and_stuck_sweeps_report_their_kind(clock: FakeClock, probe: FakeProbe) -> None:
    """Each sweep reports under its kind, even one that found nothing."""
    metrics = Recorder()
    ledger = make(InMemoryStore(), clock, probe, metrics=metrics)
    record(ledger, "ob-1")
    ledger.mark_attempting("ob-1")
    ledger.mark_failed("ob-1", "send_path_degraded")
    record(ledger, "ob-2")
    clock.advance(120)
    assert len(ledger.sweep_failed_for_runtime("slack")) == 1
    assert len(ledger.sweep_stuck_own(older_than_s=60.0)) == 1
    assert ledger.sweep_recoverable() == []
    assert [(kind, claimed, abandoned) for kind, claimed, abandoned, _ in metrics.of("sweep")] == [
        ("runtime", 1, 0),
        ("stuck", 1, 0),
        ("startup", 0, 0),
    ]


# -- group commit ---------------------------------------------------------------------------------


async def _workload(ledger: Any) -> None:
    """Records, marks and refusals, each step's calls concurrent (as one group when the
    ledger is an AsyncLedger); a sync ledger's calls are made one by one."""

    async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        return await result if asyncio.iscoroutine(result) else result

    async def step(calls: list[tuple[Any, ...]]) -> None:
        await asyncio.gather(
            *(call(fn, *args, **kwargs) for fn, args, kwargs in calls), return_exceptions=True
        )

    ids = [f"ob-{n}" for n in range(8)]

    def rec(oid: str, **kw: Any) -> tuple[Any, ...]:
        values = {"session_key": "s", "platform": "slack", "chat_id": "C1", "content": oid}
        return (ledger.record, (), {"obligation_id": oid, **values, **kw})

    await step([rec(oid) for oid in ids] + [rec("ob-0"), rec("ob-bad", chat_id="")])
    await step(
        [(ledger.mark_attempting, (oid,), {}) for oid in ids]
        + [(ledger.mark_attempting, ("ob-none",), {}), (ledger.mark_attempting, ("ob-1",), {})]
    )
    await step(
        [(ledger.mark_delivered, (oid,), {}) for oid in ids[:5]]
        + [(ledger.mark_delivered, ("ob-none",), {})]
    )


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_group_commit_reports_what_single_calls_report(
    kind: str, tmp_path: Path, clock: FakeClock, probe: FakeProbe
) -> None:
    """The same records, marks and refusals through AsyncLedger (store batches) and through
    Ledger (one call at a time) report the same transitions, row for row."""

    def store(name: str) -> Store:
        return InMemoryStore() if kind == "memory" else SQLiteStore(tmp_path / name)

    single = Recorder()
    one_by_one = make(store("single.db"), clock, probe, metrics=single)
    asyncio.run(_workload(one_by_one))

    grouped = Recorder()

    async def run() -> None:
        async with AsyncLedger(
            store("grouped.db"), clock=clock, probe=probe, incarnation=LIVE, metrics=grouped
        ) as ledger:
            await asyncio.wait_for(_workload(ledger), GUARD)
            assert ledger.batches < ledger.operations  # calls were grouped

    asyncio.run(run())
    assert single.transitions() == {
        ("record", "ok"): 8,
        ("attempt", "ok"): 8,
        ("attempt", "unknown"): 1,
        ("attempt", "refused"): 1,
        ("deliver", "ok"): 5,
        ("deliver", "unknown"): 1,
    }
    assert grouped.transitions() == single.transitions()
    assert len(grouped.of("latency")) == len(single.of("latency")) == 5


class FailingCommit(InMemoryStore):
    """The outermost transaction begun once ``armed`` fails as it commits (rolled back)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self._depth = 0

    @contextmanager
    def atomic(self) -> Iterator[None]:
        with super().atomic():
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            if self._depth == 0 and self.armed:
                self.armed = False
                raise StoreError("commit failed (simulated)")


class WritesThenBreaks(InMemoryStore):
    """The transition of ``ob-bad`` is written, then the call raises (a bug, not a refusal)."""

    def transition(self, kind: Any, entity_id: str, event: str, **kwargs: Any) -> Any:
        row = super().transition(kind, entity_id, event, **kwargs)
        if entity_id == "ob-bad":
            raise RuntimeError("broke after writing")
        return row


def test_a_commit_that_fails_reports_errors_not_successes(
    clock: FakeClock, probe: FakeProbe
) -> None:
    """A mark whose transaction failed to commit wrote nothing: it is an error, not an ok; the
    retry that commits is the one ok."""
    store = FailingCommit()
    metrics = Recorder()

    async def run() -> None:
        async with AsyncLedger(
            store, clock=clock, probe=probe, incarnation=LIVE, metrics=metrics
        ) as ledger:
            await ledger.record(session_key="s", platform="slack", chat_id="C1", content="a")
            (owed,) = await ledger.owed()
            store.armed = True
            with pytest.raises(StoreError):
                await ledger.mark_attempting(owed.obligation_id)
            await ledger.mark_attempting(owed.obligation_id)

    asyncio.run(asyncio.wait_for(run(), GUARD))
    assert metrics.transitions() == {
        ("record", "ok"): 1,
        ("attempt", "error"): 1,
        ("attempt", "ok"): 1,
    }


def test_an_operation_undone_and_replayed_is_counted_once(
    clock: FakeClock, probe: FakeProbe
) -> None:
    """One mark breaks after writing: the batch is rolled back and replayed; the broken one
    counts one error, every other mark one ok (not one per attempt of the batch)."""
    store = WritesThenBreaks()
    metrics = Recorder()
    ids = [f"ob-{n}" for n in range(6)] + ["ob-bad"]

    async def run() -> None:
        async with AsyncLedger(
            store, clock=clock, probe=probe, incarnation=LIVE, metrics=metrics
        ) as ledger:
            for oid in ids:
                await ledger.record(
                    obligation_id=oid, session_key="s", platform="slack", chat_id="C1", content=oid
                )
            results = await asyncio.gather(
                *(ledger.mark_attempting(oid) for oid in ids), return_exceptions=True
            )
            assert [isinstance(r, RuntimeError) for r in results] == [False] * 6 + [True]

    asyncio.run(asyncio.wait_for(run(), GUARD))
    assert metrics.transitions() == {
        ("record", "ok"): 7,
        ("attempt", "ok"): 6,
        ("attempt", "error"): 1,
    }


def test_held_metrics_pass_other_threads_through() -> None:
    """While one thread holds, another thread's reports go straight to the inner metrics."""
    inner = Recorder()
    held = HeldMetrics(inner)
    held.hold()
    worker = threading.Thread(target=lambda: held.reconnect("wss://elsewhere"))
    worker.start()
    worker.join(GUARD)
    held.transition("obligation", "attempt", Outcome.OK)
    assert inner.calls == [("reconnect", "wss://elsewhere")]
    held.commit()
    assert inner.calls[-1] == ("transition", "obligation", "attempt", "ok", 1)

"""Tests for statecore.async_ledger: the ledger for asyncio, with group commit.

Every test runs against the in-memory store and the SQLite store.  Ledger time comes from a
FakeClock; real time appears only as bounds (``asyncio.wait_for`` guards and the one
deliberately slow store call), so a regression fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from statecore import (
    OBLIGATION_KIND,
    AsyncLedger,
    FakeClock,
    Incarnation,
    InvalidTransition,
    Ledger,
    ObligationState,
    Store,
    StoreError,
    UnknownEntity,
)
from statecore.batch import BatchStore, insert_each_sequentially, transition_each_sequentially
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore

S = ObligationState
HOST = Incarnation.current().host
LIVE = Incarnation(HOST, 4001, 1_000, "live-token")
DEAD = Incarnation(HOST, 999_999, 1, "deadtoken")
GUARD = 10.0
"""Real seconds any single await may take before the test fails."""


class FakeProbe:
    """A scripted ProcessProbe: only LIVE is alive."""

    def pid_exists(self, pid: int) -> bool:
        return pid == LIVE.pid

    def start_time(self, pid: int) -> int | None:
        return LIVE.started_at if pid == LIVE.pid else None


StoreFactory = Callable[[], Store]


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """A factory of empty stores of one kind; every store it made is closed at teardown."""
    made: list[Store] = []

    def factory() -> Store:
        store: Store = (
            InMemoryStore()
            if request.param == "memory"
            else SQLiteStore(tmp_path / f"ledger-{len(made)}.db")
        )
        made.append(store)
        return store

    yield factory
    for store in made:
        store.close()


def new_async(store: Any, clock: FakeClock | None = None, **kwargs: Any) -> AsyncLedger:
    """An AsyncLedger acting as LIVE."""
    return AsyncLedger(
        store, clock=clock or FakeClock(), incarnation=LIVE, probe=FakeProbe(), **kwargs
    )


def record_kwargs(oid: str, **overrides: Any) -> dict[str, Any]:
    """Arguments of one record() call."""
    values: dict[str, Any] = {
        "obligation_id": oid,
        "session_key": f"agent:main:slack:channel:{oid}",
        "platform": "slack",
        "chat_id": "C1",
        "thread_id": "171.001",
        "content": f"the final answer for {oid}",
    }
    values.update(overrides)
    return values


async def guarded(awaitable: Any) -> Any:
    """Await with the real-time guard."""
    return await asyncio.wait_for(awaitable, GUARD)


async def spin(turns: int = 5) -> None:
    """Let freshly created tasks run up to their first suspension."""
    for _ in range(turns):
        await asyncio.sleep(0)


class DelegatingStore:
    """Forwards everything to ``inner``; subclasses override single methods."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class GatedStore(DelegatingStore):
    """get("gate") blocks the calling thread until ``release`` is set (bounded); see
    :func:`hold_writer` for holding the writer thread with it."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.entered = threading.Event()
        self.release = threading.Event()

    def get(self, kind: Any, entity_id: str) -> Any:
        if entity_id == "gate":
            self.entered.set()
            self.release.wait(GUARD)
        return self.inner.get(kind, entity_id)


async def hold_writer(al: AsyncLedger) -> None:
    """A writer operation that reads "gate" (where a GatedStore holds the writer thread), then
    is refused as unknown, writing nothing."""
    with contextlib.suppress(UnknownEntity):
        await al.release("gate")


class FailingCommitStore(GatedStore):
    """Fails the commit of the first outermost transaction begun after ``fail_after`` was set:
    the StoreError is raised inside the real transaction, so it rolls back."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.depth = 0
        self.outer_entries = 0
        self.fail_after: int | None = None
        self.failures = 0

    @contextmanager
    def atomic(self) -> Iterator[None]:
        outer = self.depth == 0
        if outer:
            self.outer_entries += 1
        entry = self.outer_entries
        with self.inner.atomic():
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1
            armed = self.fail_after is not None and entry > self.fail_after
            if outer and armed and not self.failures:
                self.failures += 1
                raise StoreError("commit failed (simulated disk error)")


class SlowStore(DelegatingStore):
    """The first transition (single or batched) stalls the calling (writer) thread for 0.2 s."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.stalled = False

    def _stall(self) -> None:
        if not self.stalled:
            self.stalled = True
            threading.Event().wait(0.2)

    def transition(self, *args: Any, **kwargs: Any) -> Any:
        self._stall()
        return self.inner.transition(*args, **kwargs)

    def transition_each(self, kind: Any, moves: Any) -> Any:
        self._stall()
        if isinstance(self.inner, BatchStore):
            return self.inner.transition_each(kind, moves)
        return transition_each_sequentially(self.inner, kind, moves)


class CountingStore(DelegatingStore):
    """Counts every store call made after construction."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return attr(*args, **kwargs)

        return counted


# -- same results as the sync ledger -----------------------------------------------------------


@pytest.mark.asyncio
async def test_async_lifecycle_matches_the_sync_ledger(make_store: StoreFactory) -> None:
    """A full lifecycle through AsyncLedger gives exactly the rows, claims and history of Ledger."""
    sync_store, async_store = make_store(), make_store()
    sync_clock, async_clock = FakeClock(), FakeClock()
    for store, clock in ((sync_store, sync_clock), (async_store, async_clock)):
        dead = Ledger(store, clock=clock, incarnation=DEAD, probe=FakeProbe())
        dead.record(**record_kwargs("ob-orphan"))
    sync = Ledger(sync_store, clock=sync_clock, incarnation=LIVE, probe=FakeProbe())

    def run_sync() -> list[Any]:
        out: list[Any] = [sync.record(**record_kwargs("ob-1"))]
        out.append(sync.mark_attempting("ob-1"))
        out.append(sync.mark_failed("ob-1", "connection reset"))
        sync_clock.advance(30)
        out.append(sync.sweep_failed_for_runtime("slack"))
        out.append(sync.mark_delivered("ob-1"))
        out.append(sync.sweep_recoverable())
        out.append(sync.release("ob-orphan"))
        out.append(sync.history("ob-1"))
        out.append(sync.history("ob-orphan"))
        sync_clock.advance(sync.policy.retention + 1)
        out.append(sync.prune())
        out.append(sync.owed())
        return out

    async with new_async(async_store, async_clock) as al:
        out: list[Any] = [await guarded(al.record(**record_kwargs("ob-1")))]
        out.append(await guarded(al.mark_attempting("ob-1")))
        out.append(await guarded(al.mark_failed("ob-1", "connection reset")))
        async_clock.advance(30)
        out.append(await guarded(al.sweep_failed_for_runtime("slack")))
        out.append(await guarded(al.mark_delivered("ob-1")))
        out.append(await guarded(al.sweep_recoverable()))
        out.append(await guarded(al.release("ob-orphan")))
        out.append(await guarded(al.history("ob-1")))
        out.append(await guarded(al.history("ob-orphan")))
        async_clock.advance(al.policy.retention + 1)
        out.append(await guarded(al.prune()))
        out.append(await guarded(al.owed()))
    expected = run_sync()
    assert out == expected
    assert out[4].state is S.DELIVERED
    assert out[9] == 1
    assert [o.obligation_id for o in out[10]] == ["ob-orphan"]


@pytest.mark.asyncio
async def test_async_errors_match_the_sync_ledger(make_store: StoreFactory) -> None:
    """The async ledger raises the sync ledger's errors: refused moves, unknown ids, bad input."""
    async with new_async(make_store()) as al:
        await guarded(al.record(**record_kwargs("ob-1")))
        with pytest.raises(InvalidTransition):
            await guarded(al.mark_delivered("ob-1"))
        with pytest.raises(LookupError):
            await guarded(al.mark_attempting("nope"))
        with pytest.raises(TypeError):
            await guarded(al.record(**record_kwargs("ob-2", content=b"bytes")))
        assert await guarded(al.get("ob-2")) is None
        ob = await guarded(al.get("ob-1"))
        assert ob is not None
        assert (ob.state, ob.fence) == (S.PENDING, 0)


# -- group commit ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_concurrent_lifecycles_share_commits(make_store: StoreFactory) -> None:
    """100 concurrent record/attempt/deliver lifecycles all succeed in fewer commits than ops."""
    store = make_store()
    async with new_async(store) as al:

        async def lifecycle(n: int) -> Any:
            ob = await al.record(**record_kwargs(f"ob-{n:03d}"))
            await al.mark_attempting(ob.obligation_id)
            return await al.mark_delivered(ob.obligation_id)

        results = await guarded(asyncio.gather(*(lifecycle(n) for n in range(100))))
        assert [r.state for r in results] == [S.DELIVERED] * 100
        assert len({r.obligation_id for r in results}) == 100
        assert al.operations == 300
        assert al.batches < al.operations
        assert await guarded(al.owed()) == []
    assert store.count(OBLIGATION_KIND, states=[S.DELIVERED]) == 100


@pytest.mark.asyncio
async def test_errors_are_isolated_per_caller_within_one_batch(make_store: StoreFactory) -> None:
    """One caller's InvalidTransition does not undo the writes of callers in the same batch."""
    store = GatedStore(make_store())
    async with new_async(store) as al:
        await guarded(al.record(**record_kwargs("ob-pending")))
        await guarded(al.record(**record_kwargs("ob-ready")))
        gate = asyncio.ensure_future(hold_writer(al))
        assert await guarded(asyncio.to_thread(store.entered.wait, GUARD))
        batches = al.batches
        ops = [
            asyncio.ensure_future(al.record(**record_kwargs("ob-new"))),
            asyncio.ensure_future(al.mark_delivered("ob-pending")),  # pending: refused
            asyncio.ensure_future(al.mark_attempting("ob-ready")),
        ]
        await spin()
        store.release.set()
        assert await guarded(gate) is None
        new, refused, attempting = await guarded(asyncio.gather(*ops, return_exceptions=True))
        assert al.batches == batches + 2, "the three calls did not share one batch"
        assert isinstance(refused, InvalidTransition)
        assert new.state is S.PENDING
        assert attempting.state is S.ATTEMPTING
        stored = {oid: await guarded(al.get(oid)) for oid in ("ob-new", "ob-pending", "ob-ready")}
        assert stored["ob-new"] == new
        assert stored["ob-ready"] == attempting
        assert stored["ob-pending"] is not None
        assert (stored["ob-pending"].state, stored["ob-pending"].fence) == (S.PENDING, 0)


class HiccupStore(GatedStore):
    """The transition of "ob-hiccup" is written, then the call raises ``error``."""

    def __init__(self, inner: Store, error: Exception) -> None:
        super().__init__(inner)
        self.error = error

    def transition(self, kind: Any, entity_id: str, *args: Any, **kwargs: Any) -> Any:
        row = self.inner.transition(kind, entity_id, *args, **kwargs)
        if entity_id == "ob-hiccup":
            raise self.error
        return row

    def transition_each(self, kind: Any, moves: Any) -> Any:
        # A batch with "ob-hiccup" in it is written, then fails as a whole.
        outcomes = (
            self.inner.transition_each(kind, moves)
            if isinstance(self.inner, BatchStore)
            else transition_each_sequentially(self.inner, kind, moves)
        )
        if any(move.entity_id == "ob-hiccup" for move in moves):
            raise self.error
        return outcomes


@pytest.mark.asyncio
async def test_an_operation_failing_after_a_write_is_undone_alone(
    make_store: StoreFactory,
) -> None:
    """An unexpected error after an operation wrote is undone for that operation only; the
    other operations of its batch still commit."""
    store = HiccupStore(make_store(), RuntimeError("hiccup after the write (simulated)"))
    async with new_async(store) as al:
        for oid in ("ob-ok", "ob-hiccup"):
            await guarded(al.record(**record_kwargs(oid)))
        gate = asyncio.ensure_future(hold_writer(al))
        assert await guarded(asyncio.to_thread(store.entered.wait, GUARD))
        ops = [
            asyncio.ensure_future(al.mark_attempting("ob-ok")),
            asyncio.ensure_future(al.mark_attempting("ob-hiccup")),
            asyncio.ensure_future(al.record(**record_kwargs("ob-new"))),
        ]
        await spin()
        store.release.set()
        await guarded(gate)
        ok, hiccup, new = await guarded(asyncio.gather(*ops, return_exceptions=True))
        assert isinstance(hiccup, RuntimeError)
        assert ok.state is S.ATTEMPTING
        assert new.state is S.PENDING
        undone = await guarded(al.get("ob-hiccup"))
        assert undone is not None
        assert (undone.state, undone.fence) == (S.PENDING, 0)
        assert [e.event for e in await guarded(al.history("ob-hiccup"))] == ["record"]
        assert await guarded(al.get("ob-ok")) == ok
        assert await guarded(al.get("ob-new")) == new
        assert (await guarded(al.mark_delivered("ob-ok"))).state is S.DELIVERED


@pytest.mark.asyncio
async def test_driver_failure_inside_one_operation_fails_its_whole_batch(
    make_store: StoreFactory,
) -> None:
    """A StoreError inside one operation fails every operation of its batch and writes nothing,
    not even the writes that came before it; the ledger works again afterwards."""
    store = HiccupStore(make_store(), StoreError("driver failed after the write (simulated)"))
    async with new_async(store) as al:
        for oid in ("ob-ok", "ob-hiccup"):
            await guarded(al.record(**record_kwargs(oid)))
        gate = asyncio.ensure_future(hold_writer(al))
        assert await guarded(asyncio.to_thread(store.entered.wait, GUARD))
        batches = al.batches
        ops = [
            asyncio.ensure_future(al.mark_attempting("ob-ok")),
            asyncio.ensure_future(al.record(**record_kwargs("ob-new"))),
            asyncio.ensure_future(al.mark_attempting("ob-hiccup")),
        ]
        await spin()
        store.release.set()
        await guarded(gate)
        results = await guarded(asyncio.gather(*ops, return_exceptions=True))
        assert all(isinstance(r, StoreError) for r in results), results
        assert al.batches == batches + 1  # the gate's batch only
        for oid in ("ob-ok", "ob-hiccup"):
            row = await guarded(al.get(oid))
            assert row is not None
            assert (row.state, row.fence) == (S.PENDING, 0)
            assert [e.event for e in await guarded(al.history(oid))] == ["record"]
        assert await guarded(al.get("ob-new")) is None
        assert (await guarded(al.mark_attempting("ob-ok"))).state is S.ATTEMPTING
        assert (await guarded(al.mark_delivered("ob-ok"))).state is S.DELIVERED


@pytest.mark.asyncio
async def test_failed_commit_fails_the_whole_batch_and_writes_nothing(
    make_store: StoreFactory,
) -> None:
    """A batch whose transaction fails raises StoreError to every caller in it, writes nothing,
    and later operations work again."""
    store = FailingCommitStore(make_store())
    async with new_async(store) as al:
        await guarded(al.record(**record_kwargs("ob-p")))
        gate = asyncio.ensure_future(hold_writer(al))
        assert await guarded(asyncio.to_thread(store.entered.wait, GUARD))
        store.fail_after = store.outer_entries  # fail the next batch, not the gate's
        batches = al.batches
        ops = [
            asyncio.ensure_future(al.mark_attempting("ob-p")),
            asyncio.ensure_future(al.record(**record_kwargs("ob-a"))),
            asyncio.ensure_future(al.record(**record_kwargs("ob-b"))),
        ]
        await spin()
        store.release.set()
        await guarded(gate)
        results = await guarded(asyncio.gather(*ops, return_exceptions=True))
        assert store.failures == 1
        assert all(isinstance(r, StoreError) for r in results), results
        assert al.batches == batches + 1  # the gate's batch only
        assert await guarded(al.get("ob-a")) is None
        assert await guarded(al.get("ob-b")) is None
        p = await guarded(al.get("ob-p"))
        assert p is not None
        assert (p.state, p.fence) == (S.PENDING, 0)
        assert len(await guarded(al.history("ob-p"))) == 1
        # The ledger recovers: the same operations now succeed.
        assert (await guarded(al.mark_attempting("ob-p"))).state is S.ATTEMPTING
        assert (await guarded(al.mark_delivered("ob-p"))).state is S.DELIVERED
        assert (await guarded(al.record(**record_kwargs("ob-a")))).state is S.PENDING


# -- the event loop is never blocked -----------------------------------------------------------


@pytest.mark.asyncio
async def test_slow_store_call_does_not_block_the_event_loop(make_store: StoreFactory) -> None:
    """While the writer thread is stuck in a slow store call, other coroutines keep running."""
    store = SlowStore(make_store())
    async with new_async(store) as al:
        await guarded(al.record(**record_kwargs("ob-1")))
        loop = asyncio.get_running_loop()
        started = loop.time()
        op = asyncio.ensure_future(al.mark_attempting("ob-1"))
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            deadline = loop.time() + GUARD
            while not op.done() and loop.time() < deadline:
                ticks += 1
                await asyncio.sleep(0.01)

        await guarded(asyncio.gather(op, ticker()))
        assert store.stalled
        assert loop.time() - started >= 0.15
        assert ticks >= 5, f"the loop ran only {ticks} ticks during a 0.2 s store call"
        assert op.result().state is S.ATTEMPTING


@pytest.mark.asyncio
async def test_calls_return_awaitables_without_touching_the_store(
    make_store: StoreFactory,
) -> None:
    """Every ledger call returns an awaitable at once; the store is used only once awaited."""
    store = CountingStore(make_store())
    async with new_async(store) as al:
        store.calls = 0  # construction registered the entity kind
        calls = [
            al.record(**record_kwargs("ob-1")),
            al.mark_attempting("ob-1"),
            al.mark_delivered("ob-1"),
            al.mark_failed("ob-1", "x"),
            al.release("ob-1"),
            al.sweep_recoverable(),
            al.sweep_failed_for_runtime("slack"),
            al.prune(),
            al.get("ob-1"),
            al.history("ob-1"),
            al.owed(),
            al.abandoned(),
        ]
        try:
            assert all(inspect.isawaitable(c) for c in calls)
            assert store.calls == 0
        finally:
            for c in calls[1:]:
                c.close()
        await guarded(calls[0])
        assert store.calls > 0


# -- closing -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_aclose_finishes_queued_work_then_refuses(make_store: StoreFactory) -> None:
    """aclose() lets queued work finish; afterwards calls raise StoreError; it is idempotent."""
    al = new_async(make_store())
    queued = [asyncio.ensure_future(al.record(**record_kwargs(f"ob-{n}"))) for n in range(5)]
    await spin()
    await guarded(al.aclose())
    assert [t.result().state for t in queued] == [S.PENDING] * 5
    with pytest.raises(StoreError):
        await guarded(al.get("ob-0"))
    with pytest.raises(StoreError):
        await guarded(al.record(**record_kwargs("ob-late")))
    await guarded(al.aclose())
    al.close(timeout=GUARD)
    assert al._threads is not None
    assert not al._threads.writer.is_alive()


@pytest.mark.asyncio
async def test_async_with_closes_the_ledger(make_store: StoreFactory) -> None:
    """``async with`` yields a working ledger and closes it on exit."""
    async with new_async(make_store()) as al:
        ob = await guarded(al.record(**record_kwargs("ob-1")))
        assert ob.state is S.PENDING
        assert al.incarnation == LIVE
        assert al.policy.max_attempts == 3
    with pytest.raises(StoreError):
        await guarded(al.get("ob-1"))


def test_max_batch_must_be_positive(make_store: StoreFactory) -> None:
    """A non-positive max_batch is refused before any thread starts."""
    with pytest.raises(ValueError, match="max_batch"):
        new_async(make_store(), max_batch=0)


@pytest.mark.asyncio
async def test_max_batch_bounds_each_transaction(make_store: StoreFactory) -> None:
    """With max_batch=1 every operation commits on its own."""
    async with new_async(make_store(), max_batch=1) as al:
        await guarded(asyncio.gather(*(al.record(**record_kwargs(f"ob-{n}")) for n in range(20))))
        assert al.batches == al.operations == 20


# -- store batches inside a group ---------------------------------------------------------------


class CountingBatches(GatedStore):
    """Counts the store batches (insert_each / transition_each) and their sizes."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.sizes: list[tuple[str, int]] = []

    def insert_each(self, kind: Any, creations: Any) -> Any:
        self.sizes.append(("insert_each", len(creations)))
        if isinstance(self.inner, BatchStore):
            return self.inner.insert_each(kind, creations)
        return insert_each_sequentially(self.inner, kind, creations)

    def transition_each(self, kind: Any, moves: Any) -> Any:
        self.sizes.append(("transition_each", len(moves)))
        if isinstance(self.inner, BatchStore):
            return self.inner.transition_each(kind, moves)
        return transition_each_sequentially(self.inner, kind, moves)


class NoBatches(GatedStore):
    """A store without the optional batch capability."""

    def __getattr__(self, name: str) -> Any:
        if name in ("insert_each", "transition_each"):
            raise AttributeError(name)
        return getattr(self.inner, name)


async def _held_batch(store: GatedStore, al: AsyncLedger, calls: list[Any]) -> list[Any]:
    """Run ``calls`` (awaitables) as one writer batch: queued while the writer is held."""
    gate = asyncio.ensure_future(hold_writer(al))
    assert await guarded(asyncio.to_thread(store.entered.wait, GUARD))
    ops = [asyncio.ensure_future(call) for call in calls]
    await spin()
    store.release.set()
    await guarded(gate)
    store.entered.clear()
    store.release.clear()
    return list(await guarded(asyncio.gather(*ops, return_exceptions=True)))


@pytest.mark.asyncio
async def test_a_group_runs_as_store_batches_with_each_callers_own_outcome(
    make_store: StoreFactory,
) -> None:
    """Concurrent records, then concurrent marks, each run as one store batch; a refused call
    in the middle (a deliver of a pending row, an unknown id, a bad argument) gets its own
    error while the others commit."""
    store = CountingBatches(make_store())
    async with new_async(store) as al:
        ids = [f"ob-{n}" for n in range(6)]
        recorded = await _held_batch(
            store,
            al,
            [al.record(**record_kwargs(oid)) for oid in ids]
            + [al.record(**record_kwargs("ob-bad", chat_id=""))],
        )
        assert [r.obligation_id for r in recorded[:6]] == ids
        assert isinstance(recorded[6], ValueError)
        assert ("insert_each", 6) in store.sizes  # the bad one was refused before the store
        marked = await _held_batch(
            store,
            al,
            [al.mark_attempting(oid) for oid in ids[:3]]
            + [al.mark_delivered(ids[3]), al.mark_attempting("ob-none")]
            + [al.mark_attempting(oid) for oid in ids[4:]],
        )
        assert [m.state for m in marked[:3]] == [S.ATTEMPTING] * 3
        assert isinstance(marked[3], InvalidTransition)
        assert type(marked[4]).__name__ == "UnknownEntity"
        assert [m.state for m in marked[5:]] == [S.ATTEMPTING] * 2
        assert ("transition_each", 7) in store.sizes
        assert (await guarded(al.get(ids[3]))).state is S.PENDING
        delivered = await _held_batch(store, al, [al.mark_delivered(oid) for oid in ids[:3]])
        assert [d.state for d in delivered] == [S.DELIVERED] * 3
        for oid in ids[:3]:
            events = [e.event for e in await guarded(al.history(oid))]
            assert events == ["record", "attempt", "deliver"]


@pytest.mark.asyncio
async def test_the_same_obligation_twice_in_one_group_behaves_as_one_after_the_other(
    make_store: StoreFactory,
) -> None:
    """Two callers racing on one obligation inside one group: the first attempt wins, the
    second is refused as it would be afterwards; a repeated record returns the same row."""
    store = CountingBatches(make_store())
    async with new_async(store) as al:
        first, again = await _held_batch(
            store, al, [al.record(**record_kwargs("ob-1")), al.record(**record_kwargs("ob-1"))]
        )
        assert first == again
        won, lost, delivered = await _held_batch(
            store,
            al,
            [al.mark_attempting("ob-1"), al.mark_attempting("ob-1"), al.mark_delivered("ob-1")],
        )
        assert won.state is S.ATTEMPTING
        assert isinstance(lost, InvalidTransition)
        assert delivered.state is S.DELIVERED
        assert delivered.fence == won.fence + 1
        events = [e.event for e in await guarded(al.history("ob-1"))]
        assert events == ["record", "attempt", "deliver"]


@pytest.mark.asyncio
async def test_a_cancelled_call_in_a_group_is_not_run(make_store: StoreFactory) -> None:
    """A caller cancelled while its operation waited in the queue: the rest of its group runs,
    its own operation does not."""
    store = CountingBatches(make_store())
    async with new_async(store) as al:
        await guarded(al.record(**record_kwargs("ob-1")))
        await guarded(al.record(**record_kwargs("ob-2")))
        gate = asyncio.ensure_future(hold_writer(al))
        assert await guarded(asyncio.to_thread(store.entered.wait, GUARD))
        kept = asyncio.ensure_future(al.mark_attempting("ob-1"))
        dropped = asyncio.ensure_future(al.mark_attempting("ob-2"))
        await spin()
        dropped.cancel()
        await spin()
        store.release.set()
        await guarded(gate)
        assert (await guarded(kept)).state is S.ATTEMPTING
        assert dropped.cancelled()
        assert (await guarded(al.get("ob-2"))).state is S.PENDING


@pytest.mark.asyncio
async def test_a_store_without_batches_gets_the_same_outcomes(make_store: StoreFactory) -> None:
    """Group commit over a store without the batch capability: one write per operation, the
    same per-caller outcomes."""
    store = NoBatches(make_store())
    assert not hasattr(store, "transition_each")
    async with new_async(store) as al:
        recorded = await _held_batch(
            store, al, [al.record(**record_kwargs(f"ob-{n}")) for n in range(3)]
        )
        assert [r.state for r in recorded] == [S.PENDING] * 3
        marked = await _held_batch(
            store,
            al,
            [al.mark_attempting("ob-0"), al.mark_delivered("ob-1"), al.mark_attempting("ob-2")],
        )
        assert marked[0].state is S.ATTEMPTING
        assert isinstance(marked[1], InvalidTransition)
        assert marked[2].state is S.ATTEMPTING

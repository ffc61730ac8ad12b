"""Batched writes are counted like single ones: a store subclass or wrapper that overrides
``insert`` / ``transition`` sees every write, whether the ledger made it alone, in a store
batch (group commit) or in a sweep's bulk claim; and the contract kit fails a store whose batch
methods go around such overrides."""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import pytest

if "stores.testing" not in sys.modules:  # detailed assertion messages from the kit's asserts
    pytest.register_assert_rewrite("stores.testing")

from statecore import (
    OBLIGATION_KIND,
    AsyncLedger,
    Audit,
    EntityKind,
    FakeClock,
    Incarnation,
    Ledger,
    ObligationState,
    Row,
    Store,
    TransitionRecord,
)
from statecore.batch import Creation, Move, insert_each_sequentially, transition_each_sequentially
from statecore.batching import (
    has_batch,
    routes_through_overrides,
    transition_many_one_by_one,
)
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from stores.testing import TICKET_KIND, StoreContract, StoreFactory, StoreOpener
from stores.testing.overrides import OverrideContract

S = TypeVar("S", bound=Enum)

GUARD = 30.0
"""Real seconds the whole group-commit run may take before the test fails."""


# -- stores that count their writes -------------------------------------------------------------


class _Counts:
    """Writes seen by a counting store, by operation (``insert``) and event."""

    def __init__(self) -> None:
        self.inserts = 0
        self.transitions: Counter[str] = Counter()


class CountingSQLiteStore(SQLiteStore):
    """The documented way to count writes: subclass the store, override the single writes."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.counts = _Counts()

    def insert(
        self,
        kind: EntityKind[Any],
        entity_id: str,
        values: Mapping[str, object],
        *,
        event: str,
        audit: Audit,
    ) -> tuple[Row[Any], bool]:
        row, created = super().insert(kind, entity_id, values, event=event, audit=audit)
        self.counts.inserts += created
        return row, created

    def transition(self, kind: EntityKind[Any], entity_id: str, event: str, **kw: Any) -> Row[Any]:
        row = super().transition(kind, entity_id, event, **kw)
        self.counts.transitions[event] += 1
        return row


class CountingWrapper:
    """The other documented way: wrap the store, override the single writes, delegate the
    rest through ``__getattr__`` (batch methods included, which the ledger must not use)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.counts = _Counts()

    def insert(
        self,
        kind: EntityKind[Any],
        entity_id: str,
        values: Mapping[str, object],
        *,
        event: str,
        audit: Audit,
    ) -> tuple[Row[Any], bool]:
        row, created = self.inner.insert(kind, entity_id, values, event=event, audit=audit)
        self.counts.inserts += created
        return row, created

    def transition(self, kind: EntityKind[Any], entity_id: str, event: str, **kw: Any) -> Row[Any]:
        row = self.inner.transition(kind, entity_id, event, **kw)
        self.counts.transitions[event] += 1
        return row

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CountingInMemoryStore(InMemoryStore):
    """docs/contract_example.py's pattern: overrides transition *and* transition_many, each
    counting what it wrote; the store must not route transition_many through the counting
    transition as well (each write counted once)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: Counter[str] = Counter()

    def transition(self, kind: EntityKind[Any], entity_id: str, event: str, **kw: Any) -> Row[Any]:
        row = super().transition(kind, entity_id, event, **kw)
        self.writes[event] += 1
        return row

    def transition_many(
        self, kind: EntityKind[Any], entity_ids: Sequence[str], event: str, **kw: Any
    ) -> list[Row[Any]]:
        rows = super().transition_many(kind, entity_ids, event, **kw)
        self.writes[event] += len(rows)
        return rows


# -- a store whose batches go around the overrides ----------------------------------------------


class BypassingStore:
    """A wrapper forwarding every method to an inner SQLiteStore, its batch methods included:
    a subclass overriding ``insert`` / ``transition`` never sees the batched writes.  The
    defect the contract kit must catch."""

    def __init__(self, path: Path) -> None:
        self.inner = SQLiteStore(path)

    def register(self, kind: EntityKind[Any]) -> None:
        self.inner.register(kind)

    def insert(self, kind: EntityKind[Any], entity_id: str, values: Any, **kw: Any) -> Any:
        return self.inner.insert(kind, entity_id, values, **kw)

    def transition(self, kind: EntityKind[Any], entity_id: str, event: str, **kw: Any) -> Any:
        return self.inner.transition(kind, entity_id, event, **kw)

    def transition_many(
        self,
        kind: EntityKind[S],
        entity_ids: Sequence[str],
        event: str,
        *,
        audit: Audit,
        expect: Mapping[str, object] | None = None,
        changes: Mapping[str, object] | None = None,
        increments: Mapping[str, int] | None = None,
    ) -> list[Row[S]]:
        return self.inner.transition_many(
            kind,
            entity_ids,
            event,
            audit=audit,
            expect=expect,
            changes=changes,
            increments=increments,
        )

    def insert_each(self, kind: EntityKind[Any], creations: Sequence[Creation]) -> Any:
        return self.inner.insert_each(kind, creations)

    def transition_each(self, kind: EntityKind[Any], moves: Sequence[Move]) -> Any:
        return self.inner.transition_each(kind, moves)

    def get(self, kind: EntityKind[Any], entity_id: str) -> Any:
        return self.inner.get(kind, entity_id)

    def select(self, kind: EntityKind[Any], **kw: Any) -> Any:
        return self.inner.select(kind, **kw)

    def count(self, kind: EntityKind[Any], **kw: Any) -> int:
        return self.inner.count(kind, **kw)

    def prune(self, kind: EntityKind[Any], event: str, **kw: Any) -> int:
        return self.inner.prune(kind, event, **kw)

    def history(self, kind: EntityKind[Any], entity_id: str) -> list[TransitionRecord]:
        return self.inner.history(kind, entity_id)

    def atomic(self) -> AbstractContextManager[None]:
        return self.inner.atomic()

    def close(self) -> None:
        self.inner.close()


class HonestWrapper(BypassingStore):
    """The same wrapper, fixed as docs/stores.md says: each batch method runs through this
    store's own single writes when a subclass overrides them."""

    def transition_many(
        self,
        kind: EntityKind[S],
        entity_ids: Sequence[str],
        event: str,
        *,
        audit: Audit,
        expect: Mapping[str, object] | None = None,
        changes: Mapping[str, object] | None = None,
        increments: Mapping[str, int] | None = None,
    ) -> list[Row[S]]:
        if routes_through_overrides(self, "transition_many", "transition"):
            return transition_many_one_by_one(
                self,
                kind,
                entity_ids,
                event,
                audit=audit,
                expect=expect,
                changes=changes,
                increments=increments,
            )
        return super().transition_many(
            kind,
            entity_ids,
            event,
            audit=audit,
            expect=expect,
            changes=changes,
            increments=increments,
        )

    def insert_each(self, kind: EntityKind[Any], creations: Sequence[Creation]) -> Any:
        if routes_through_overrides(self, "insert_each", "insert"):
            return insert_each_sequentially(self, kind, creations)
        return super().insert_each(kind, creations)

    def transition_each(self, kind: EntityKind[Any], moves: Sequence[Move]) -> Any:
        if routes_through_overrides(self, "transition_each", "transition"):
            return transition_each_sequentially(self, kind, moves)
        return super().transition_each(kind, moves)


KIT_TESTS = [name for name in dir(OverrideContract) if name.startswith("test_")]


@pytest.fixture
def opener(tmp_path: Path) -> Iterator[Callable[[Callable[[Path], Any]], StoreOpener]]:
    """Opens kit-registered stores of a given class on fresh files; closes them afterwards."""
    paths = (tmp_path / f"store-{n}.db" for n in itertools.count())
    with ExitStack() as stack:
        yield lambda make: StoreOpener(lambda: make(next(paths)), stack)


# -- the contract kit catches a bypassing store -------------------------------------------------


def test_the_kit_has_a_test_per_batch_path() -> None:
    """The section drives insert_each, transition_each, transition_many, the ledger's batches
    and sweeps, and AsyncLedger's group commit (a renamed test must be seen here)."""
    assert len(KIT_TESTS) == 5


@pytest.mark.parametrize("name", KIT_TESTS)
def test_the_kit_fails_a_store_whose_batches_bypass_the_overrides(
    opener: Callable[[Callable[[Path], Any]], StoreOpener], name: str
) -> None:
    """Every test of the overrides section fails on a store whose batch methods forward to an
    inner store, around a subclass's insert/transition."""
    db = opener(BypassingStore)()
    with pytest.raises(AssertionError, match="went around"):
        getattr(OverrideContract(), name)(db)


@pytest.mark.parametrize("name", KIT_TESTS)
def test_the_same_wrapper_routed_through_its_overrides_passes_the_kit(
    opener: Callable[[Callable[[Path], Any]], StoreOpener], name: str
) -> None:
    """The bypassing wrapper, fixed with routes_through_overrides and the one-by-one helpers,
    passes every test of the section (so the failures above are the bypass, not the kit)."""
    getattr(OverrideContract(), name)(opener(HonestWrapper)())


class TestHonestWrapperContract(StoreContract):
    """The fixed wrapper passes the whole contract."""

    @pytest.fixture
    def store(self, tmp_path: Path) -> StoreFactory:
        """A fresh HonestWrapper on a new file per call."""
        paths = (tmp_path / f"store-{n}.db" for n in itertools.count())
        return lambda: HonestWrapper(next(paths))


# -- the whole contract through the overrides ---------------------------------------------------


class _CountingMemory(InMemoryStore):
    def insert(self, *args: Any, **kw: Any) -> Any:
        return super().insert(*args, **kw)

    def transition(self, *args: Any, **kw: Any) -> Any:
        return super().transition(*args, **kw)


class _CountingSQLite(SQLiteStore):
    def insert(self, *args: Any, **kw: Any) -> Any:
        return super().insert(*args, **kw)

    def transition(self, *args: Any, **kw: Any) -> Any:
        return super().transition(*args, **kw)


class TestRoutedInMemoryStore(StoreContract):
    """InMemoryStore's transition_many, run through a subclass's transition, keeps the whole
    contract (outcomes, atomicity, refusals before any write)."""

    @pytest.fixture
    def store(self) -> StoreFactory:
        """A fresh subclass instance per call."""
        return _CountingMemory


class TestRoutedSQLiteStore(StoreContract):
    """SQLiteStore's batches, run through a subclass's insert/transition, keep the whole
    contract (outcomes, atomicity, refusals before any write)."""

    @pytest.fixture
    def store(self, tmp_path: Path) -> StoreFactory:
        """A fresh subclass instance on a new file per call."""
        paths = (tmp_path / f"store-{n}.db" for n in itertools.count())
        return lambda: _CountingSQLite(next(paths))


def test_the_routed_batches_are_taken() -> None:
    """The two subclasses above really take the routed paths (else the contract runs above
    would prove nothing about them)."""
    assert routes_through_overrides(_CountingMemory(), "transition_many", "transition")
    for method, single in [
        ("insert_each", "insert"),
        ("transition_each", "transition"),
        ("transition_many", "transition"),
    ]:
        assert routes_through_overrides(_CountingSQLite.__new__(_CountingSQLite), method, single)
        assert not routes_through_overrides(SQLiteStore.__new__(SQLiteStore), method, single)


# -- 600 transitions through AsyncLedger: every one counted ---------------------------------------


async def _lifecycles(store: Any, n: int) -> AsyncLedger:
    """Record, attempt and deliver ``n`` obligations concurrently (group commit)."""
    async with AsyncLedger(store, clock=FakeClock()) as ledger:
        ids = [f"ob-{i:03d}" for i in range(n)]
        await asyncio.gather(
            *(
                ledger.record(
                    obligation_id=oid,
                    session_key="s",
                    platform="slack",
                    chat_id="C1",
                    content=f"reply {oid}",
                )
                for oid in ids
            )
        )
        await asyncio.gather(*(ledger.mark_attempting(oid) for oid in ids))
        await asyncio.gather(*(ledger.mark_delivered(oid) for oid in ids))
    return ledger


@pytest.fixture
def batch_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every call of SQLiteStore's batch methods, with its size (the methods still run)."""
    calls: list[tuple[str, int]] = []
    for name in ("insert_each", "transition_each"):
        real = getattr(SQLiteStore, name)

        def spy(self: Any, kind: Any, items: Any, *, _real: Any = real, _name: str = name) -> Any:
            calls.append((_name, len(items)))
            return _real(self, kind, items)

        monkeypatch.setattr(SQLiteStore, name, spy)
    return calls


def test_a_counting_subclass_counts_600_transitions_under_async_ledger(
    tmp_path: Path, batch_calls: list[tuple[str, int]]
) -> None:
    """The issue's report: 300 obligations recorded, attempted and delivered through
    AsyncLedger over a counting SQLiteStore subclass -- 600 transitions, all counted, though
    group commit handed them to the store as batches."""
    store = CountingSQLiteStore(tmp_path / "bot.db")
    try:
        ledger = asyncio.run(asyncio.wait_for(_lifecycles(store, 300), GUARD))
        assert store.counts.transitions == {"attempt": 300, "deliver": 300}
        assert store.counts.inserts == 300
        # The writes went through the store's batch methods, several at a time.
        assert ledger.batches < ledger.operations
        assert any(size > 1 for name, size in batch_calls if name == "transition_each")
        assert sum(size for name, size in batch_calls if name == "transition_each") == 600
    finally:
        store.close()


def test_a_counting_wrapper_counts_600_transitions_under_async_ledger(
    tmp_path: Path, batch_calls: list[tuple[str, int]]
) -> None:
    """The same through a ``__getattr__`` wrapper: the ledger sees that the wrapper's class
    has no batch methods and drives it one write at a time, through its overrides."""
    inner = SQLiteStore(tmp_path / "bot.db")
    store = CountingWrapper(inner)
    assert not has_batch(store, "transition_each")
    assert hasattr(store, "transition_each")  # reachable, but not the wrapper's own
    try:
        ledger = asyncio.run(asyncio.wait_for(_lifecycles(store, 300), GUARD))
        assert store.counts.transitions == {"attempt": 300, "deliver": 300}
        assert store.counts.inserts == 300
        assert ledger.batches < ledger.operations  # still one transaction per group
        assert batch_calls == []
    finally:
        inner.close()


def test_a_wrapper_sees_the_sweeps_claims(tmp_path: Path) -> None:
    """A startup sweep's bulk claim over a ``__getattr__`` wrapper is made one transition at a
    time through the wrapper, so it counts every claim."""
    inner = SQLiteStore(tmp_path / "bot.db")
    store = CountingWrapper(inner)
    try:
        clock = FakeClock()
        me = Incarnation.current()
        dead = Incarnation(me.host, 4_000_000, 1, "dead")

        class Probe:
            def pid_exists(self, pid: int) -> bool:
                return pid == me.pid

            def start_time(self, pid: int) -> int | None:
                return None

        zombie = Ledger(store, clock=clock, incarnation=dead, probe=Probe())
        for n in range(25):
            zombie.record(session_key="s", platform="slack", chat_id="C1", content=f"r{n}")
        live = Ledger(store, clock=clock, incarnation=me, probe=Probe())
        assert len(live.sweep_recoverable()) == 25
        assert store.counts.transitions == {"claim": 25}
        assert inner.count(OBLIGATION_KIND, states=[ObligationState.ATTEMPTING]) == 25
    finally:
        inner.close()


# -- the decisions ------------------------------------------------------------------------------


def test_has_batch_asks_the_class_not_the_instance(tmp_path: Path) -> None:
    """has_batch: the store's class must define the method; a __getattr__ wrapper does not,
    a wrapper defining it does, InMemoryStore has transition_many only."""
    inner = SQLiteStore(tmp_path / "a.db")
    try:
        assert has_batch(inner, "insert_each")
        assert has_batch(inner, "transition_each")
        assert has_batch(inner, "transition_many")
        wrapped = CountingWrapper(inner)
        assert not has_batch(wrapped, "insert_each")
        assert not has_batch(wrapped, "transition_many")
        assert has_batch(BypassingStore.__new__(BypassingStore), "transition_each")
        memory = InMemoryStore()
        assert has_batch(memory, "transition_many")
        assert not has_batch(memory, "insert_each")
    finally:
        inner.close()


def test_a_subclass_overriding_the_bulk_method_too_counts_each_write_once() -> None:
    """A subclass that overrides transition_many as well has taken charge of it: its rows are
    counted once (by its transition_many), not a second time through its transition."""
    store = CountingInMemoryStore()
    assert not routes_through_overrides(store, "transition_many", "transition")
    store.register(TICKET_KIND)
    for ticket_id in ("t1", "t2", "t3"):
        store.insert(TICKET_KIND, ticket_id, {"title": ticket_id}, event="file", audit=Audit(1.0))
    moved = store.transition_many(TICKET_KIND, ["t1", "t2", "t3"], "hold", audit=Audit(2.0))
    assert len(moved) == 3
    assert store.writes == {"hold": 3}


def test_routing_keeps_transition_many_refusals_before_any_write() -> None:
    """Routed through the overrides, transition_many still refuses bad input before writing:
    one str for the ids, an increment of a field it also changes, an undeclared event."""
    store = _CountingMemory()
    store.register(TICKET_KIND)
    store.insert(TICKET_KIND, "t1", {"title": "t1"}, event="file", audit=Audit(1.0))
    before = store.get(TICKET_KIND, "t1")
    with pytest.raises(TypeError):
        store.transition_many(TICKET_KIND, "t1", "hold", audit=Audit(2.0))
    with pytest.raises(ValueError, match="both changed and incremented"):
        store.transition_many(
            TICKET_KIND,
            ["t1"],
            "touch",
            audit=Audit(2.0),
            changes={"priority": 1},
            increments={"priority": 1},
        )
    with pytest.raises(Exception, match="bogus"):
        store.transition_many(TICKET_KIND, ["t1"], "bogus", audit=Audit(2.0))
    assert store.get(TICKET_KIND, "t1") == before
    assert len(store.history(TICKET_KIND, "t1")) == 1

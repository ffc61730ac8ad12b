"""The store contract: a subclass's single writes see every write, batched ones included.

The documented way to observe a store's writes (count them, log them, feed them elsewhere) is to
subclass it, or wrap it, and override ``insert`` and ``transition``.  That only works if the
store's batch methods -- ``transition_many``, and ``insert_each`` / ``transition_each`` when the
store has them -- do not go around the overrides.  This section turns the store under test into
an instance of a subclass of its own class whose ``insert`` and ``transition`` count what they
write (:func:`count_writes`), drives the batch methods and the ledger's batch paths (group
commit, sweeps), and fails when the counts differ from the writes the store made (its audit
entries).

A store passes by running a batch through ``self.insert`` / ``self.transition`` when a subclass
overrides them: :func:`statecore.batching.routes_through_overrides` says when, and
``statecore.batch.insert_each_sequentially`` / ``transition_each_sequentially`` and
:func:`statecore.batching.transition_many_one_by_one` do it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from statecore.async_ledger import AsyncLedger
from statecore.batch import BatchStore, Creation, Move
from statecore.batching import has_batch
from statecore.clock import FakeClock
from statecore.ledger import Ledger
from statecore.lifecycles import ObligationState
from statecore.obligation import OBLIGATION_KIND
from statecore.ownership import Incarnation
from statecore.store import Audit, Row, Store
from stores.testing._base import KitFixtures
from stores.testing._kit import (
    AUDIT,
    JOIN_TIMEOUT,
    TICKET_KIND,
    ContractProbe,
    file_ticket,
    move,
    seed,
)

__all__ = ["OverrideContract", "WriteCount", "count_writes"]


class WriteCount:
    """The writes a counting subclass's ``insert`` and ``transition`` made, by event (only
    writes that happened: a creation of an existing id or a refused move is not counted)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: Counter[str] = Counter()

    def add(self, event: str) -> None:
        """Count one write of ``event`` (from any thread)."""
        with self._lock:
            self._events[event] += 1

    def by_event(self) -> dict[str, int]:
        """The writes counted so far, by event."""
        with self._lock:
            return dict(self._events)

    def total(self) -> int:
        """Every write counted so far."""
        with self._lock:
            return sum(self._events.values())


def count_writes(store: Store) -> WriteCount:
    """Make ``store`` an instance of a new subclass of its own class whose ``insert`` and
    ``transition`` count every write they make, then call the store's own; returns the count.

    The store keeps its state (only its class changes).  Fails the test when the store's class
    cannot be given a subclass this way (a class whose instances cannot change class).
    """
    base = type(store)
    # The store's own single writes, bound before the class changes: for a plain class the
    # base class's methods, for a wrapper that delegates through __getattr__ the inner store's.
    inner_insert = store.insert
    inner_transition = store.transition
    seen = WriteCount()

    def insert(
        self: Any,
        kind: Any,
        entity_id: str,
        values: Mapping[str, object],
        *,
        event: str,
        audit: Audit,
    ) -> tuple[Row[Any], bool]:
        row, created = inner_insert(kind, entity_id, values, event=event, audit=audit)
        if created:
            seen.add(event)
        return row, created

    def transition(
        self: Any,
        kind: Any,
        entity_id: str,
        event: str,
        *,
        audit: Audit,
        fence: int | None = None,
        expect: Mapping[str, object] | None = None,
        changes: Mapping[str, object] | None = None,
    ) -> Row[Any]:
        row = inner_transition(
            kind, entity_id, event, audit=audit, fence=fence, expect=expect, changes=changes
        )
        seen.add(event)  # only reached when the guarded write matched
        return row

    counting = type(
        f"Counting{base.__name__}",
        (base,),
        {
            "__slots__": (),  # the same layout as the store's class: its instances convert
            "__module__": __name__,
            "__doc__": f"{base.__name__} counting its writes (the contract kit).",
            "insert": insert,
            "transition": transition,
        },
    )
    try:
        store.__class__ = counting
    except TypeError as exc:
        pytest.fail(f"the kit cannot subclass {base.__qualname__} to count its writes: {exc}")
    return seen


def _written(db: Store, kind: Any, ids: list[str], before: Mapping[str, int]) -> dict[str, int]:
    """The writes the store made to ``ids`` since ``before`` (each id's audit length then),
    by event: one audit entry per write."""
    events: Counter[str] = Counter()
    for entity_id in ids:
        history = db.history(kind, entity_id)
        events.update(record.event for record in history[before.get(entity_id, 0) :])
    return dict(events)


def _lengths(db: Store, kind: Any, ids: list[str]) -> dict[str, int]:
    return {entity_id: len(db.history(kind, entity_id)) for entity_id in ids}


class OverrideContract(KitFixtures):
    """A subclass overriding ``insert`` / ``transition`` sees every write, batched ones too."""

    def test_insert_each_runs_through_an_overridden_insert(self, db: Store) -> None:
        """A batch of creations (new ids, existing ids, refused ones) is made by the
        subclass's ``insert``: it counts exactly the rows created."""
        if not has_batch(db, "insert_each"):
            pytest.skip(f"{type(db).__name__} has no insert_each (optional capability)")
        k = TICKET_KIND
        file_ticket(db, "old")
        counted = count_writes(db)
        assert isinstance(db, BatchStore)
        creations = [
            Creation("n1", {"title": "n1"}, "file", AUDIT),
            Creation("old", {"title": "again"}, "file", AUDIT),  # exists: untouched
            Creation("n2", {"title": "n2", "priority": 2}, "file", AUDIT),
            Creation("n1", {"title": "twice"}, "file", AUDIT),  # made just above
            Creation("n3", {"title": "n3", "priority": "high"}, "file", AUDIT),  # refused
            Creation("n4", {"title": "n4"}, "file", AUDIT),
        ]
        outcomes = db.insert_each(k, creations)
        created = [o[0].id for o in outcomes if isinstance(o, tuple) and o[1]]
        assert created == ["n1", "n2", "n4"]
        assert counted.by_event() == {"file": 3}, "insert_each went around the overridden insert"

    def test_transition_each_runs_through_an_overridden_transition(self, db: Store) -> None:
        """A batch of moves (fresh, stale, refused, unknown, repeated) is made by the
        subclass's ``transition``: it counts exactly the rows moved."""
        if not has_batch(db, "transition_each"):
            pytest.skip(f"{type(db).__name__} has no transition_each (optional capability)")
        k = TICKET_KIND
        seed(db)
        ids = ["a1", "a2", "a3", "a4", "a5", "a6", "zz"]
        before = _lengths(db, k, ids)
        counted = count_writes(db)
        assert isinstance(db, BatchStore)
        moves = [
            Move("a1", "hold", AUDIT, fence=0),
            Move("a4", "hold", AUDIT, fence=0, changes={"score": 1.0}),
            Move("a6", "hold", AUDIT, fence=0),  # stale: fence 2
            Move("a3", "hold", AUDIT),  # done: forbidden
            Move("zz", "hold", AUDIT),  # unknown
            Move("a1", "resume", AUDIT, fence=1),  # sees the hold above
            Move("a2", "resume", AUDIT, expect={"assignee": None}),
        ]
        outcomes = db.transition_each(k, moves)
        moved = [isinstance(o, Row) for o in outcomes]
        assert moved == [True, True, False, False, False, True, True]
        assert _written(db, k, ids, before) == {"hold": 2, "resume": 2}
        assert counted.by_event() == {"hold": 2, "resume": 2}, (
            "transition_each went around the overridden transition"
        )

    def test_transition_many_runs_through_an_overridden_transition(self, db: Store) -> None:
        """``transition_many`` (which every store has; the ledger's sweeps claim with it) moves
        each admitted row by the subclass's ``transition``, increments included."""
        k = TICKET_KIND
        for ticket_id in ("t1", "t2", "t3", "t4"):
            file_ticket(db, ticket_id, priority=2)
        move(db, "t4", "hold")  # not admitted below: already held
        ids = ["t1", "t2", "t3", "t4", "zz"]
        before = _lengths(db, k, ids)
        counted = count_writes(db)
        moved = db.transition_many(
            k, ids, "hold", audit=AUDIT, changes={"assignee": "kit"}, increments={"priority": 1}
        )
        assert [(row.id, row["priority"], row["assignee"]) for row in moved] == [
            ("t1", 3, "kit"),
            ("t2", 3, "kit"),
            ("t3", 3, "kit"),
        ]
        assert db.transition_many(k, ["t1"], "resume", audit=AUDIT, expect={"assignee": "x"}) == []
        assert _written(db, k, ids, before) == {"hold": 3}
        assert counted.by_event() == {"hold": 3}, (
            "transition_many went around the overridden transition"
        )

    def test_the_ledgers_batches_and_sweeps_run_through_the_overrides(self, db: Store) -> None:
        """The ledger's store batches (records, attempt and deliver marks, as group commit
        hands them over) and a startup sweep's bulk claims are all counted by the subclass."""
        clock = FakeClock()
        me = Incarnation.current()
        probe = ContractProbe(alive={me.pid})
        dead = Ledger(
            db, clock=clock, incarnation=Incarnation(me.host, 4_000_000, 1, "dead"), probe=probe
        )
        for n in range(7):
            dead.record(obligation_id=f"z{n}", **_reply(n))
        counted = count_writes(db)
        live = Ledger(db, clock=clock, incarnation=me, probe=probe)
        ids = [f"ob-{n}" for n in range(12)]
        # The very calls AsyncLedger's writer makes for a run of records, then of marks.
        live._record_each([{"obligation_id": oid, **_reply(n)} for n, oid in enumerate(ids)])
        live._settle_each([(oid, "attempt") for oid in ids])
        live._settle_each([(oid, "deliver") for oid in ids[:8]])
        claims = live.sweep_recoverable()
        assert len(claims) == 7
        everything = ids + [f"z{n}" for n in range(7)]
        written = _written(db, OBLIGATION_KIND, everything, {f"z{n}": 1 for n in range(7)})
        assert written == {"record": 12, "attempt": 12, "deliver": 8, "claim": 7}
        assert counted.by_event() == written, "a ledger batch went around the overrides"

    def test_async_ledger_group_commit_runs_through_the_overrides(self, db: Store) -> None:
        """Concurrent records, attempts and deliveries through ``AsyncLedger`` (group commit
        into store batches): the subclass counts every one."""
        counted = count_writes(db)
        ids = [f"ob-{n}" for n in range(40)]

        async def run() -> None:
            async with AsyncLedger(db) as ledger:
                await asyncio.wait_for(
                    asyncio.gather(
                        *(ledger.record(obligation_id=o, **_reply(n)) for n, o in enumerate(ids))
                    ),
                    JOIN_TIMEOUT,
                )
                for mark in (ledger.mark_attempting, ledger.mark_delivered):
                    await asyncio.wait_for(
                        asyncio.gather(*(mark(oid) for oid in ids)), JOIN_TIMEOUT
                    )

        asyncio.run(run())
        assert db.count(OBLIGATION_KIND, states=[ObligationState.DELIVERED]) == len(ids)
        assert counted.by_event() == {"record": 40, "attempt": 40, "deliver": 40}, (
            "AsyncLedger's group commit went around the overrides"
        )


def _reply(n: int) -> dict[str, Any]:
    """The arguments of one ledger record (without its id)."""
    return {"session_key": "kit:session", "platform": "slack", "chat_id": "C1", "content": f"r{n}"}

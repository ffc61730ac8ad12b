"""The in-memory store: the Store protocol under one lock, for tests and single-process use.

It evaluates the very guard plan the SQLite store compiles to SQL
(:func:`statecore.store.plan_transition`), so it can never be looser than the real thing.
Nothing survives the process.  Rows are kept as compact tuples, so that a process holding many
owed entities stays small (``benchmarks/bench_ledger.py --only memory`` measures the heap per
stored obligation against its budget).

A row's entered time (when the write that last set its state happened, for its timers) costs
nothing extra: it is the ``at`` of the row's last audit entry, which every such write appends.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import Enum
from typing import Any, TypeVar

from statecore.batching import routes_through_overrides, transition_many_one_by_one
from statecore.catalog import declaration_json
from statecore.entity import EntityKind
from statecore.errors import StoreError
from statecore.lifecycle import Timer
from statecore.store import (
    Audit,
    Due,
    KindRecord,
    Row,
    TransitionPlan,
    TransitionRecord,
    Where,
    check_due_query,
    check_increments,
    check_limit,
    normalize_where,
    order_key,
    plan_creation,
    plan_transition,
    removal_sources,
    rows_matching,
    valid_states,
)
from stores._closing import ClosesOnExit
from stores._versions import MIGRATE_EVENT, MIGRATION_OWNER, migration_reason, plan_versions

__all__ = ["InMemoryStore"]

S = TypeVar("S", bound=Enum)

# A stored entity: (state, fence, field values in the kind's field order).
_Rec = tuple[Enum, int, tuple[Any, ...]]
# A stored audit entry: (event, from, to, at, owner, attempts, reason).
_AuditRec = tuple[str, Enum | None, Enum, float, str | None, int | None, str | None]


class _Table:
    __slots__ = ("audit", "by_state", "kind", "names", "record", "rows")

    def __init__(self, kind: EntityKind[Any]) -> None:
        self.kind = kind
        lifecycle = kind.lifecycle
        self.record = KindRecord(
            kind.name, lifecycle.name, lifecycle.version, declaration_json(kind), time.time()
        )
        self.names = tuple(f.name for f in kind.fields)
        self.rows: dict[str, _Rec] = {}
        # Insertion-ordered id sets per state, so a select by state never scans other states.
        self.by_state: dict[Enum, dict[str, None]] = {s: {} for s in kind.lifecycle.states}
        self.audit: dict[str, list[_AuditRec]] = {}


class InMemoryStore(ClosesOnExit):
    """A :class:`~statecore.store.Store` in process memory; thread-safe under one re-entrant
    lock.  ``atomic()`` blocks hold the lock until the outermost block ends and undo their own
    writes if an exception escapes them.

    InMemoryStore is long because it is the whole Store protocol in one class, one method per
    operation over the shared tables and undo journal; the guard itself is planned and
    evaluated in :mod:`statecore.store`.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._tables: dict[str, _Table] = {}
        self._closed = False
        # Undo journal of the open transaction (owned by the lock holder): what each write
        # replaced (row and history), plus the journal length at each open block.
        self._journal: list[tuple[_Table, str, _Rec | None, list[_AuditRec] | None]] = []
        self._marks: list[int] = []

    def __repr__(self) -> str:
        return "InMemoryStore()"

    # -- lifecycle of the store ---------------------------------------------------------------

    def register(self, kind: EntityKind[Any]) -> None:
        """Prepare storage for ``kind``; idempotent.  A newer version of the kind's lifecycle
        migrates the rows held (see ``stores._versions``: fence + 1 and a ``migrate`` audit
        entry per moved row, entered times kept, earlier entries read in the new states);
        an older one raises ``StaleVersion``, states it cannot map ``MigrationError``, with
        nothing changed.  A different kind of the same version under the same name raises
        ``StoreError``."""
        with self._lock:
            self._check_open()
            existing = self._tables.get(kind.name)
            if existing is None:
                self._tables[kind.name] = _Table(kind)
            elif existing.kind != kind:
                if existing.kind.lifecycle.version == kind.lifecycle.version:
                    raise StoreError(f"a different entity kind named {kind.name!r} is registered")
                self._tables[kind.name] = _migrated(existing, kind)

    def close(self) -> None:
        """Drop everything; later calls raise ``StoreError``."""
        with self._lock:
            self._closed = True
            self._tables.clear()

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """Run the block as one transaction (nested blocks are savepoints)."""
        with self._lock:
            self._check_open()
            mark = len(self._journal)
            self._marks.append(mark)
            try:
                yield
            except BaseException:
                self._undo_to(mark)
                raise
            finally:
                self._marks.pop()
                if not self._marks:
                    self._journal.clear()

    # -- reads ---------------------------------------------------------------------------------

    def get(self, kind: EntityKind[S], entity_id: str) -> Row[S] | None:
        """The entity, or None."""
        with self._lock:
            table = self._table(kind)
            rec = table.rows.get(entity_id)
            return None if rec is None else _row(table, entity_id, rec)

    def select(
        self,
        kind: EntityKind[S],
        *,
        states: Iterable[S] | None = None,
        where: Mapping[str, object] | None = None,
        order_by: str | None = None,
        limit: int | None = None,
    ) -> list[Row[S]]:
        """Entities in ``states`` matching ``where``, ordered by ``order_by`` then id."""
        check_limit(limit)
        wanted = valid_states(kind, states)
        conditions = normalize_where(kind, where)
        order_key(kind, order_by)  # validates the column
        with self._lock:
            table = self._table(kind)
            # Filter and order the stored tuples; build rows only for what is returned.
            found = self._matching(table, wanted, conditions)
            key = _raw_key(table, order_by)
            if limit is not None and limit < len(found):
                found = heapq.nsmallest(limit, found, key=key)
            else:
                found.sort(key=key)
            return [_row(table, entity_id, rec) for entity_id, rec in found]

    def _matching(
        self, table: _Table, states: Iterable[Enum] | None, conditions: Where
    ) -> list[tuple[str, _Rec]]:
        """(id, stored tuple) of every entity in ``states`` satisfying ``conditions``."""
        kind, rows = table.kind, table.rows
        ids: Iterable[str] = (
            rows if states is None else [i for s in states for i in table.by_state[s]]
        )
        tests = [(_getter(table, kind, column), cmp.test) for column, cmp in conditions]
        found: list[tuple[str, _Rec]] = []
        for entity_id in ids:
            rec = rows[entity_id]
            if all(test(get(entity_id, rec)) for get, test in tests):
                found.append((entity_id, rec))
        return found

    def count(
        self,
        kind: EntityKind[S],
        *,
        states: Iterable[S] | None = None,
        where: Mapping[str, object] | None = None,
    ) -> int:
        """How many entities :meth:`select` would return without a limit."""
        wanted = valid_states(kind, states)
        conditions = normalize_where(kind, where)
        with self._lock:
            table = self._table(kind)
            if not conditions:
                if wanted is None:
                    return len(table.rows)
                return sum(len(table.by_state[s]) for s in wanted)
            return sum(
                1 for _ in rows_matching(self._candidates(table, wanted), None, conditions, kind)
            )

    def due_timers(
        self, kind: EntityKind[S], timer: Timer[S], *, now: float | None, limit: int
    ) -> list[Due[S]]:
        """Rows in ``timer.source`` whose timer is due at ``now`` (None: every row with a
        timer), soonest due first, then by id; at most ``limit``.

        The entered time of a row is the ``at`` of its last audit entry (every write that sets
        a state appends one) other than a migration's (a migration keeps it).  Raises
        ``TypeError`` for a timer that is not a Timer, a limit
        that is not an int or a ``now`` that is not a number; ``ValueError`` for a timer not
        of ``kind``'s lifecycle, a negative limit or a NaN ``now``; ``StoreError`` for an
        unregistered kind or a closed store.
        """
        check_due_query(kind, timer, now, limit)
        with self._lock:
            table = self._table(kind)
            if limit == 0:
                return []
            rows, audit = table.rows, table.audit
            fixed = timer.seconds
            index = None if timer.field is None else table.names.index(timer.field)
            found: list[tuple[float, str, float]] = []
            for entity_id in table.by_state[timer.source]:
                entered = _entered(audit[entity_id])
                if index is None:
                    assert fixed is not None
                    due = entered + fixed
                else:
                    duration = rows[entity_id][2][index]
                    if duration is None:
                        continue
                    due = entered + duration
                if now is None or due <= now:
                    found.append((due, entity_id, entered))
            soonest = heapq.nsmallest(limit, found) if limit < len(found) else sorted(found)
            return [
                Due(_row(table, entity_id, rows[entity_id]), entered, due)
                for due, entity_id, entered in soonest
            ]

    def catalog(self) -> list[KindRecord]:
        """Every kind registered with this store, by name (what it was registered as, and
        when).  Raises ``StoreError`` once the store is closed."""
        with self._lock:
            self._check_open()
            return sorted((t.record for t in self._tables.values()), key=lambda r: r.name)

    def history(self, kind: EntityKind[S], entity_id: str) -> list[TransitionRecord]:
        """The entity's audit entries, oldest first."""
        with self._lock:
            table = self._table(kind)
            return [TransitionRecord(entity_id, *entry) for entry in table.audit.get(entity_id, ())]

    # -- writes --------------------------------------------------------------------------------

    def insert(
        self,
        kind: EntityKind[S],
        entity_id: str,
        values: Mapping[str, object],
        *,
        event: str,
        audit: Audit,
    ) -> tuple[Row[S], bool]:
        """Create the entity (idempotent: an existing id is returned untouched)."""
        state, checked = plan_creation(kind, entity_id, event, values)
        with self._lock:
            table = self._table(kind)
            existing = table.rows.get(entity_id)
            if existing is not None:
                return _row(table, entity_id, existing), False
            rec: _Rec = (state, 0, tuple(checked[n] for n in table.names))
            self._write(table, entity_id, rec)
            table.audit.setdefault(entity_id, []).append((event, None, state, *_audit(audit)))
            return _row(table, entity_id, rec), True

    def transition(
        self,
        kind: EntityKind[S],
        entity_id: str,
        event: str,
        *,
        audit: Audit,
        fence: int | None = None,
        expect: Mapping[str, object] | None = None,
        changes: Mapping[str, object] | None = None,
    ) -> Row[S]:
        """One guarded write: the plan's guard evaluated and applied under the lock."""
        plan = plan_transition(kind, entity_id, event, fence=fence, expect=expect, changes=changes)
        with self._lock:
            table = self._table(kind)
            written, current = self._apply_plan(table, plan, audit, {})
            if written is None:
                raise plan.miss(current)
            return written

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
        """The guarded transition for each listed entity the guard admits (others skipped).

        In a subclass that overrides :meth:`transition` (and not this method) every entity is
        moved by that override instead, in one transaction, so the subclass sees each write.
        """
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
        if isinstance(entity_ids, str):
            raise TypeError("entity_ids must be a sequence of ids, not one str")
        ids = list(dict.fromkeys(entity_ids))
        if not ids:  # the event, expect and changes are checked all the same
            plan_transition(kind, "", event, expect=expect, changes=changes)
        plans = [
            plan_transition(kind, entity_id, event, expect=expect, changes=changes)
            for entity_id in ids
        ]
        added = check_increments(kind, increments, changes)
        written: list[Row[S]] = []
        with self.atomic():
            table = self._table(kind)
            for plan in plans:
                row, _ = self._apply_plan(table, plan, audit, added)
                if row is not None:
                    written.append(row)
        return written

    def _apply_plan(
        self, table: _Table, plan: TransitionPlan[S], audit: Audit, added: Mapping[str, int]
    ) -> tuple[Row[S] | None, Row[S] | None]:
        """Evaluate the plan's guard on the stored row and, if it holds, write the move (changes,
        then ``added`` increments) and its audit entry: ``(written, None)``, or ``(None,
        current row or None)`` when the guard does not hold.  The caller holds the lock."""
        rec = table.rows.get(plan.entity_id)
        if rec is None:
            return None, None
        current: Row[S] = _row(table, plan.entity_id, rec)
        if not plan.matches(current.state, current.fence, current.values):
            return None, current
        state, target = current.state, plan.targets[current.state]
        mapping = dict(current.values)
        mapping.update(plan.changes)
        for name, amount in added.items():
            mapping[name] = mapping[name] + amount
        new: _Rec = (target, current.fence + 1, tuple(mapping[n] for n in table.names))
        self._write(table, plan.entity_id, new)
        table.audit.setdefault(plan.entity_id, []).append(
            (plan.event, state, target, *_audit(audit))
        )
        return _row(table, plan.entity_id, new), None

    def prune(
        self,
        kind: EntityKind[S],
        event: str,
        *,
        where: Mapping[str, object] | None = None,
        limit: int | None = None,
    ) -> int:
        """Delete removable entities matching ``where`` (with their history)."""
        check_limit(limit)
        sources = removal_sources(kind, event)
        conditions = normalize_where(kind, where)
        with self._lock:
            table = self._table(kind)
            doomed = sorted(
                rows_matching(self._candidates(table, sources), None, conditions, kind),
                key=order_key(kind, None),
            )
            if limit is not None:
                doomed = doomed[:limit]
            with self.atomic():
                for row in doomed:
                    self._write(table, row.id, None)
            return len(doomed)

    # -- internals -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    def _table(self, kind: EntityKind[Any]) -> _Table:
        self._check_open()
        table = self._tables.get(kind.name)
        if table is None:
            raise StoreError(f"entity kind {kind.name!r} is not registered with this store")
        if table.kind is not kind and table.kind != kind:
            raise StoreError(f"a different entity kind named {kind.name!r} is registered")
        return table

    def _candidates(self, table: _Table, states: Iterable[Enum] | None) -> Iterator[Row[Any]]:
        ids: Iterable[str] = (
            table.rows if states is None else (i for s in states for i in table.by_state[s])
        )
        for entity_id in ids:
            yield _row(table, entity_id, table.rows[entity_id])

    def _write(self, table: _Table, entity_id: str, rec: _Rec | None) -> None:
        """Replace (or with None, delete) a row and, on delete, its history.

        Inside ``atomic()`` the row and history it replaced are journaled so the block can be
        undone; a single operation validates everything before its first write.
        """
        old = table.rows.get(entity_id)
        if self._marks:
            history = table.audit.get(entity_id)
            self._journal.append(
                (table, entity_id, old, None if history is None else list(history))
            )
        _apply(table, entity_id, old, rec)
        if rec is None:
            table.audit.pop(entity_id, None)

    def _undo_to(self, mark: int) -> None:
        while len(self._journal) > mark:
            table, entity_id, old, history = self._journal.pop()
            _apply(table, entity_id, table.rows.get(entity_id), old)
            if history is None:
                table.audit.pop(entity_id, None)
            else:
                table.audit[entity_id] = history


def _apply(table: _Table, entity_id: str, old: _Rec | None, new: _Rec | None) -> None:
    if old is not None:
        del table.by_state[old[0]][entity_id]
    if new is None:
        table.rows.pop(entity_id, None)
    else:
        table.rows[entity_id] = new
        table.by_state[new[0]][entity_id] = None


def _getter(table: _Table, kind: EntityKind[Any], column: str) -> Any:
    """Read ``column`` from an (id, stored tuple) pair, as :func:`statecore.store` does."""
    if column == kind.id_field:
        return lambda entity_id, rec: entity_id
    if column == "fence":
        return lambda entity_id, rec: rec[1]
    index = table.names.index(column)
    return lambda entity_id, rec: rec[2][index]


def _raw_key(table: _Table, order_by: str | None) -> Any:
    """The sort key of (id, stored tuple) pairs: SQL's ``ORDER BY col (NULLs first), id``."""
    if order_by is None or order_by == table.kind.id_field:
        return lambda item: item[0]
    get = _getter(table, table.kind, order_by)

    def key(item: tuple[str, _Rec]) -> tuple[Any, ...]:
        value = get(item[0], item[1])
        return (value is not None, 0 if value is None else value, item[0])

    return key


def _row(table: _Table, entity_id: str, rec: _Rec) -> Row[Any]:
    return Row(entity_id, rec[0], rec[1], dict(zip(table.names, rec[2], strict=True)))


def _audit(audit: Audit) -> tuple[float, str | None, int | None, str | None]:
    return (audit.at, audit.owner, audit.attempts, audit.reason)


def _entered(entries: list[_AuditRec]) -> float:
    """A row's entered time: its last audit entry's ``at``, a migration's entries skipped."""
    for entry in reversed(entries):
        if entry[0] != MIGRATE_EVENT:
            return entry[3]
    return entries[-1][3]


def _migrated(old: _Table, kind: EntityKind[Any]) -> _Table:
    """``old``'s rows and histories as a table of ``kind`` (a newer version of its lifecycle):
    planned first (raising before anything changes), then built aside and swapped in whole."""
    present = [state.value for state, ids in old.by_state.items() if ids]
    plan = plan_versions(kind, old.record, present)
    lifecycle = kind.lifecycle
    table = _Table(kind)
    at = time.time()
    for entity_id, (state, old_fence, values) in old.rows.items():
        fence = old_fence
        by_name = dict(zip(old.names, values, strict=True))
        new_values = tuple(by_name.get(f.name, f.default) for f in kind.fields)
        history = [
            (e, None if f is None else lifecycle.decode(f.value), lifecycle.decode(t.value), *rest)
            for e, f, t, *rest in old.audit.get(entity_id, ())
        ]
        target = lifecycle.decode(state.value)
        if state.value in plan.moves:
            fence += 1
            reason = migration_reason(kind, plan, state.value)
            history.append((MIGRATE_EVENT, target, target, at, MIGRATION_OWNER, None, reason))
        table.rows[entity_id] = (target, fence, new_values)
        table.by_state[target][entity_id] = None
        table.audit[entity_id] = history
    return table

"""The SQLite store: the embedded default, durable across crashes and restarts.

* WAL journal, ``synchronous`` NORMAL (default) or FULL, a busy timeout: a database locked
  longer than that raises :class:`~statecore.errors.StoreError`, it never hangs.
* One long-lived connection per thread, never one per call.  A single write outside
  :meth:`SQLiteStore.atomic` is one statement that commits on its own; a write of several
  statements (a batch, a prune) runs in a ``BEGIN IMMEDIATE`` transaction, and nested ``atomic``
  blocks are savepoints (``stores._sqlite_conn``).
* A guarded transition is one ``UPDATE ... WHERE id AND state IN (...) AND fence ...
  RETURNING``, compiled from the same plan the in-memory store evaluates; it also sets the
  row's audit columns, and the table's trigger copies them into the audit table inside the
  same statement (a creation likewise), so the audit entry is committed exactly with its write.
  Of a row the store wrote last, the ``UPDATE`` instead proves the row unchanged and returns
  nothing (see :meth:`SQLiteStore.transition`).  Every statement's text comes from one seam,
  ``stores._sqlite_sql`` (with the once-per-file upgrades of older layouts in
  ``stores._sqlite_upgrade_sql``), pinned by golden files; state lists are inlined as literals
  so the partial indexes declared by each kind are usable by the planner.
* The speed shortcuts -- statement texts cached per kind and shape, transition shapes learned
  once and then bound directly, batches run as multi-row statements -- sit behind one seam,
  ``stores._sqlite_shortcuts``; each admits and writes exactly what the plain path would.
* A timer's rows are found by a partial index over the entered time (``audit_at``, set by
  every write) ``WHERE state = '<source>'``; registered kinds are kept in ``statecore_kinds``.
* A lifecycle's newer version migrates the rows when registered (``stores._versions``); one of
  version >= 2 gets triggers refusing the states it does not declare (an older process).
* The schema is versioned (``PRAGMA user_version``, :data:`SCHEMA_VERSION`) and tables are
  migrated in place: columns a kind declares but an older table lacks are added with their
  defaults, a version 1 table gains the audit columns and triggers, its history kept, and a
  trigger whose text differs from this layout's is replaced when its kind is registered.  A
  database newer than this code, or a file that is not SQLite, raises ``StoreError`` naming the
  path.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from typing import Any, Literal, TypeVar

import stores._sqlite_pragmas as pragmas
import stores._sqlite_sql as sql
import stores._sqlite_upgrade_sql as upgrade
import stores._versions as versions
from statecore.batch import (
    REFUSALS,
    Creation,
    Move,
    insert_each_sequentially,
    transition_each_sequentially,
)
from statecore.batching import routes_through_overrides, transition_many_one_by_one
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
    check_id,
    check_increments,
    check_limit,
    normalize_where,
    order_key,
    plan_creation,
    plan_transition,
    removal_sources,
    valid_states,
)
from stores._closing import ClosesOnExit
from stores._schema import migration, registered
from stores._sqlite_conn import (
    DEFAULT_PAGE_SIZE,
    Connections,
    Statement,
    Txn,
    check_checkpoint_pages,
    check_header,
    check_page_size,
)
from stores._sqlite_shortcuts import (
    CompiledKind,
    Step,
    audit_values,
    catalog_row,
    distinct_runs,
    due_params,
    fast_key,
    kind_records,
    new_row,
    pieces,
)

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

S = TypeVar("S", bound=Enum)

SCHEMA_VERSION = 4
"""The layout version this code writes (``PRAGMA user_version``); 0 is a pre-versioned file.
Version 2 writes audit entries by trigger (each write one statement); version 3 chains each
entity's audit entries (no index on the audit table) and declares partial indexes over
membership columns (see ``stores._sqlite_sql.member_columns``); in version 4 a creation names
its audit entry's seq and sets its membership columns itself, so its trigger only appends the
entry (see ``stores._sqlite_sql.audit_trigger_sql``).  An older file is upgraded in place: its
audit table is chained when it is opened, each table when its kind is registered (columns
added and filled, triggers and partial indexes replaced), its history kept."""

_BULK_CHUNK = 500  # ids per transition_many UPDATE (well under SQLite's bound-parameter limit)


class SQLiteStore(ClosesOnExit):
    """A :class:`~statecore.store.Store` in one SQLite file (see the module docs).

    ``SQLiteStore(path, synchronous="NORMAL" | "FULL", busy_timeout_s=5.0, page_size=2048,
    checkpoint_pages=None)``.  Opening checks that the file is a SQLite database of a version
    this code knows; raises ``StoreError`` naming the path otherwise.  ``page_size`` (a power
    of two from 512 to 65536) applies to a file this store creates; an existing file keeps its
    own.  ``checkpoint_pages`` is how many WAL pages a commit may leave before it copies them
    back into the file (None: 4000 at NORMAL, 1000 at FULL).  Either one out of range raises
    ``ValueError`` (``TypeError`` if not an int), before anything is opened.  Safe to share
    between threads; each thread gets its own connection, all closed by :meth:`close`.

    SQLiteStore is long because it is the whole Store and BatchStore protocol for one file, one
    method each; statement text is in ``stores._sqlite_sql``, speed shortcuts in
    ``stores._sqlite_shortcuts``, connections in ``stores._sqlite_conn``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout_s: float = 5.0,
        page_size: int = DEFAULT_PAGE_SIZE,
        checkpoint_pages: int | None = None,
    ) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        if not isinstance(busy_timeout_s, int | float) or busy_timeout_s < 0:
            raise ValueError(f"busy_timeout_s must be a non-negative number: {busy_timeout_s!r}")
        check_page_size(page_size)
        check_checkpoint_pages(checkpoint_pages)
        self.path = os.fspath(path)
        self.synchronous = synchronous
        self._db = Connections(
            self.path,
            synchronous,
            int(busy_timeout_s * 1000),
            page_size=page_size,
            checkpoint_pages=checkpoint_pages,
        )
        self._kinds: dict[str, CompiledKind] = {}
        check_header(self.path)
        with self._db.guard("open"):
            version = self._db.conn().execute(pragmas.USER_VERSION).fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: schema version {version} is newer than this code "
                    f"understands ({SCHEMA_VERSION}); upgrade statecore"
                )
        with self.atomic():
            conn = self._db.conn()
            conn.execute(sql.audit_schema_sql())
            conn.execute(upgrade.KINDS_SCHEMA)
            audit = {r[1] for r in conn.execute(sql.table_info_named_sql(sql.AUDIT_TABLE))}
            if "prev" not in audit:  # written before the chains: chain it, once
                for statement in upgrade.audit_chain_sql():
                    conn.execute(statement)
            conn.execute(pragmas.set_user_version_sql(SCHEMA_VERSION))

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, synchronous={self.synchronous!r})"

    def _conn(self) -> sqlite3.Connection:
        """The calling thread's connection (opened on first use)."""
        return self._db.conn()

    def atomic(self) -> Txn:
        """A transaction on this thread's connection (``BEGIN IMMEDIATE``); nested blocks are
        savepoints.  Raises ``StoreError`` if the database stays locked past the busy timeout."""
        return Txn(self._db, "transaction")

    def close(self) -> None:
        """Close every thread's connection; later calls raise ``StoreError``.  Idempotent."""
        self._db.close()

    def connection(self) -> sqlite3.Connection:
        """The calling thread's ``sqlite3`` connection inside :meth:`atomic`: what the caller
        executes on it (its own tables) commits or rolls back with the block.  Do not commit,
        roll back or close it, nor keep it past the block.  Raises ``StoreError`` outside an
        ``atomic()`` block, or once the store is closed."""
        return self._db.in_atomic()

    # -- schema -------------------------------------------------------------------------------

    def register(self, kind: EntityKind[Any]) -> None:
        """Create ``kind``'s table and indexes (its timers' too), or add what an older table
        lacks; migrate its rows when the catalog holds an older version of its lifecycle (see
        ``stores._sqlite_upgrade_sql.migrate_sql``: fence + 1, one ``migrate`` entry each, the
        entered time kept; states are read only when the versions differ); record the kind in
        the catalog.  One transaction.  Raises ``StaleVersion`` (a newer version is recorded)
        or ``MigrationError`` (states nothing maps) with nothing written, ``StoreError`` when
        another kind of that name is registered, or the table is not one of ``kind``."""
        if self._db.closed:
            raise StoreError(f"{self.path}: the store is closed")
        existing = self._kinds.get(kind.name)
        if existing is not None:
            if existing.kind != kind:
                raise StoreError(f"a different entity kind named {kind.name!r} is registered")
            return
        with Txn(self._db, f"register {kind.name}"):
            conn = self._db.conn()
            have = {r[1] for r in conn.execute(sql.table_info_sql(kind))}
            raw = conn.execute(upgrade.KIND_RECORD, (kind.name,)).fetchone()
            stored = None if raw is None else kind_records([raw], self.path)[0]
            same = (1 if stored is None else stored.version) == kind.lifecycle.version
            present = () if same or not have else conn.execute(upgrade.states_sql(kind))
            plan = versions.plan_versions(kind, stored, (value for (value,) in present))
            if not have:
                conn.execute(sql.create_table_sql(kind))
            else:
                for statement in self._migration(kind, have):
                    conn.execute(statement)
                for states, column in sql.member_columns(kind).items():
                    if column not in have:
                        for statement in upgrade.add_member_sql(kind, states, column):
                            conn.execute(statement)
                if "audit_head" not in have:  # written before the chains
                    old = conn.execute(upgrade.OLD_PARTIAL_INDEXES, (kind.table,)).fetchall()
                    # Heads noted at open (none noted: the audit table had no entries).
                    noted = conn.execute(sql.table_info_named_sql(upgrade.AUDIT_HEADS)).fetchone()
                    heads = () if noted is None else upgrade.heads_sql(kind)
                    for statement in (*(upgrade.drop_index_sql(n) for (n,) in old), *heads):
                        conn.execute(statement)
                if "audit_at" not in have:  # written before the audit columns
                    conn.execute(upgrade.entered_at_sql(kind))
            for name, text in (*sql.audit_trigger_sql(kind), *upgrade.version_trigger_sql(kind)):
                # An older layout's trigger of this name is replaced (one transaction: no
                # write can come between the drop and the create).
                was = conn.execute(upgrade.TRIGGER_TEXT, (name,)).fetchone()
                if was is None or was[0] != text:
                    conn.execute(upgrade.drop_trigger_sql(name))
                    conn.execute(text)
            for statement in (*sql.index_sql(kind), *sql.timer_index_sql(kind)):
                conn.execute(statement)
            now = time.time()
            if plan.moves:  # rows of old states move (see upgrade.migrate_sql)
                last = conn.execute(upgrade.AUDIT_LAST).fetchone()[0]
                why = {old: versions.migration_reason(kind, plan, old) for old in plan.moves}
                move, keep = upgrade.migrate_sql(kind, plan.moves, why)
                conn.execute(move, (versions.MIGRATE_EVENT, now, versions.MIGRATION_OWNER))
                conn.execute(keep, (last,))
            record = catalog_row(kind, now)
            if raw is None or raw[3] != record[3]:  # not recorded with this very declaration
                conn.execute(upgrade.KIND_UPSERT, record)
        self._db.versions[kind.lifecycle.name] = kind.lifecycle.version
        self._kinds[kind.name] = CompiledKind(kind, lambda: self._db.catalog_version(kind.name))

    def catalog(self) -> list[KindRecord]:
        """Every kind registered with this file (by any process, ever), by name, as last
        declared: rebuild one with :func:`statecore.catalog.kind_from_declaration`.  Raises
        ``StoreError`` once the store is closed or when the file cannot be read."""
        with self._db.guard("catalog"):
            return kind_records(self._db.conn().execute(upgrade.KINDS_ALL).fetchall(), self.path)

    def _migration(self, kind: EntityKind[Any], have: set[str]) -> list[str]:
        return migration(
            str(self.path),
            kind,
            have,
            add_managed=sql.add_managed_sql,
            add_field=sql.add_field_sql,
            managed=sql.MANAGED_COLUMNS,
        )

    def _compiled(self, kind: EntityKind[Any]) -> CompiledKind:
        c = self._kinds.get(kind.name)
        # The common case (this very kind, registered, store open) in two lookups; anything
        # else goes through the full check, which names the problem.
        if c is not None and c.kind is kind and not self._db.closed:
            return c
        return registered(str(self.path), self._kinds, kind, closed=self._db.closed)

    # -- reads --------------------------------------------------------------------------------

    def get(self, kind: EntityKind[S], entity_id: str) -> Row[S] | None:
        """The entity, or None."""
        c = self._compiled(kind)
        with self._db.guard("get"):
            return self._current(self._db.conn(), c, entity_id)

    def select(
        self,
        kind: EntityKind[S],
        *,
        states: Iterable[S] | None = None,
        where: Mapping[str, object] | None = None,
        order_by: str | None = None,
        limit: int | None = None,
    ) -> list[Row[S]]:
        """Entities in ``states`` matching ``where``, ordered by ``order_by`` (NULLs first)
        then id."""
        check_limit(limit)
        c = self._compiled(kind)
        wanted: frozenset[S] | None = valid_states(kind, states)
        conditions = normalize_where(kind, where)
        order_key(kind, order_by)  # validates the column
        text, params = sql.select_sql(kind, wanted, conditions, order_by, limit)
        with self._db.guard("select"):
            raws = self._db.conn().execute(text, params).fetchall()
        return [c.row(raw, self.path) for raw in raws]

    def count(
        self,
        kind: EntityKind[S],
        *,
        states: Iterable[S] | None = None,
        where: Mapping[str, object] | None = None,
    ) -> int:
        """How many entities :meth:`select` would return without a limit."""
        self._compiled(kind)
        wanted: frozenset[S] | None = valid_states(kind, states)
        text, params = sql.count_sql(kind, wanted, normalize_where(kind, where))
        with self._db.guard("count"):
            return int(self._db.conn().execute(text, params).fetchone()[0])

    def history(self, kind: EntityKind[S], entity_id: str) -> list[TransitionRecord]:
        """The entity's audit entries, oldest first (an entry of an older version's state
        decoded through the lifecycle's migrations)."""
        c = self._compiled(kind)
        with self._db.guard("history"):
            raws = self._db.conn().execute(c.history_sql, (entity_id, kind.name)).fetchall()
        return c.records(entity_id, raws, self.path)

    def due_timers(
        self, kind: EntityKind[S], timer: Timer[S], *, now: float | None, limit: int
    ) -> list[Due[S]]:
        """Rows in ``timer.source`` whose timer is due at ``now``: entered (the ``at`` of the
        write that last set the row's state) at least the timer's duration ago -- fixed, or
        the row's field, a NULL field meaning no timer; ``now`` None: every row with a timer.
        Soonest due first, then by id; at most ``limit``.  One range scan of the timer's
        index, ending at the first row not yet due.  Inside :meth:`atomic` it reads that
        transaction's view (one writer at a time: no other process fires those rows).
        Raises ``TypeError``/``ValueError`` for bad arguments before any query (see
        ``stores._sqlite_shortcuts.due_params``), ``StoreError`` as any read."""
        c = self._compiled(kind)
        params = due_params(kind, timer, now, limit)
        text = sql.due_timers_sql(kind, timer, bounded=now is not None)
        with self._db.guard("due_timers"):
            raws = self._db.conn().execute(text, params).fetchall()
        return [Due(c.row(raw, self.path), float(raw[-2]), float(raw[-1])) for raw in raws]

    # -- writes -------------------------------------------------------------------------------

    def insert(
        self,
        kind: EntityKind[S],
        entity_id: str,
        values: Mapping[str, object],
        *,
        event: str,
        audit: Audit,
    ) -> tuple[Row[S], bool]:
        """Create the entity (idempotent: an existing id is returned untouched): one
        ``INSERT``, its audit entry written by the table's trigger in the same statement."""
        c = self._compiled(kind)
        state, checked = plan_creation(kind, entity_id, event, values)
        params = c.insert_params(entity_id, state, checked, event, audit)
        db = self._db
        try:  # Statement's translation, inline: the context manager costs ~2 us per lifecycle
            conn = db.local.conn or db.conn()
            if conn.execute(c.insert_sql, params).rowcount == 0:  # the id exists: untouched
                existing = self._current(conn, c, entity_id)
                if existing is None:  # deleted between the two statements: a prune won
                    raise StoreError(f"{self.path}: {kind.name} {entity_id!r} was just pruned")
                return existing, False
        except (sqlite3.Error, OSError) as exc:
            raise db.error(exc, "insert") from exc
        # Exactly what was written: the checked values are in the form a read returns.
        row = new_row(entity_id, state, 0, checked)
        c.remember(row)
        return row, True

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
        """One guarded ``UPDATE``; the table's trigger writes its audit entry in the same
        statement.  Of a row this store wrote last (and knows), the ``UPDATE`` also proves the
        row unchanged since (its state, fence and every field the move leaves), and the row
        written is that one moved, not read back; otherwise, or when the proof fails (another
        writer moved it), the ``UPDATE`` returns the row it wrote (``RETURNING``)."""
        c = self._compiled(kind)
        key = fast_key(event, fence, expect, changes)
        fast = c.fast.get(key)
        params = (
            None
            if fast is None
            else fast.values(
                entity_id, fence, expect, changes, audit_values(event, audit), bulk=False
            )
        )
        if fast is not None and params is not None:
            db = self._db
            try:  # Statement's translation, inline (as in insert)
                conn = db.local.conn or db.conn()
                known = c.known.get(entity_id)
                if known is not None and known.state in fast.moves:
                    # The row this store last wrote, proved unchanged by the statement itself
                    # (state, fence and every field the move leaves): what it writes is then
                    # known without reading it back.  A stale row only fails the proof.
                    state = c.state_values[known.state]
                    proof = [*params, state, known.fence, *fast.compared(known.values)]
                    if conn.execute(fast.proved_sql, proof).rowcount == 1:
                        row = new_row(
                            entity_id,
                            fast.moves[known.state],
                            known.fence + 1,
                            fast.apply(known.values, changes),
                        )
                        c.remember(row)
                        return row
                raw = conn.execute(fast.sql, params).fetchone()
                if raw is not None:
                    row = c.row(raw, self.path)
                    c.remember(row)
                    return row
                current = self._current(conn, c, entity_id)
            except (sqlite3.Error, OSError) as exc:
                raise db.error(exc, "transition") from exc
            # A miss: the full plan names the refusal.
            plan = plan_transition(
                kind, entity_id, event, fence=fence, expect=expect, changes=changes
            )
            raise plan.miss(current)
        plan = plan_transition(kind, entity_id, event, fence=fence, expect=expect, changes=changes)
        if fast is None:
            c.learn(key, plan)
        with Statement(self._db, "transition"):
            outcome = self._one_planned(self._db.conn(), c, plan, audit)
        if isinstance(outcome, Exception):
            raise outcome
        c.remember(outcome)
        return outcome

    def _current(
        self, conn: sqlite3.Connection, c: CompiledKind, entity_id: str
    ) -> Row[Any] | None:
        """The entity as stored now (on this connection, in its transaction), or None."""
        raw = conn.execute(c.get_sql, (entity_id,)).fetchone()
        return None if raw is None else c.row(raw, self.path)

    def _one_planned(
        self, conn: sqlite3.Connection, c: CompiledKind, plan: TransitionPlan[Any], audit: Audit
    ) -> Row[Any] | Exception:
        """The plan's single-row UPDATE (its trigger writes the audit entry): the row written,
        or the refusal."""
        params = sql.update_params(plan, audit_values(plan.event, audit))
        raw = conn.execute(c.update_sql(plan), params).fetchone()
        if raw is not None:
            return c.row(raw, self.path)
        return plan.miss(self._current(conn, c, plan.entity_id))

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
        """One guarded ``UPDATE ... WHERE id IN (...) RETURNING`` per chunk of ids, plus their
        audit entries, all in one transaction; entities the guard does not admit are skipped.

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
        c = self._compiled(kind)
        if isinstance(entity_ids, str):
            raise TypeError("entity_ids must be a sequence of ids, not one str")
        ids = list(dict.fromkeys(entity_ids))
        for entity_id in ids:
            check_id(entity_id)
        plan = plan_transition(kind, "-", event, expect=expect, changes=changes)
        added = check_increments(kind, increments, changes)
        compared = sql.where_params(plan.expect)
        audited = audit_values(event, audit)
        rows: dict[str, Row[S]] = {}
        with Txn(self._db, "transition_many", savepoint=False):
            conn = self._db.conn()
            for start in range(0, len(ids), _BULK_CHUNK):
                chunk = ids[start : start + _BULK_CHUNK]
                text = sql.update_many_sql(plan, added, len(chunk))
                params = [*plan.changes.values(), *added.values(), *audited, *chunk, *compared]
                raws = conn.execute(text, params).fetchall()
                for raw in raws:
                    rows[raw[0]] = c.row(raw, self.path)
        return [rows[i] for i in ids if i in rows]

    def prune(
        self,
        kind: EntityKind[S],
        event: str,
        *,
        where: Mapping[str, object] | None = None,
        limit: int | None = None,
    ) -> int:
        """Delete removable entities matching ``where``, with their audit history."""
        check_limit(limit)
        self._compiled(kind)
        sources = removal_sources(kind, event)
        text, params = sql.prune_sql(kind, sources, normalize_where(kind, where), limit)
        with Txn(self._db, "prune"):
            conn = self._db.conn()
            pruned = conn.execute(text, params).fetchall()
            conn.executemany(sql.AUDIT_CHAIN_DELETE, [(h,) for _, h in pruned if h is not None])
        return len(pruned)

    # -- batches (statecore.batch.BatchStore) ------------------------------------------------

    def insert_each(
        self, kind: EntityKind[S], creations: Sequence[Creation]
    ) -> list[tuple[Row[S], bool] | Exception]:
        """Every creation as :meth:`insert` would, in one transaction, with one multi-row
        ``INSERT ... RETURNING`` (the ids created) per run of distinct ids (see BatchStore).

        In a subclass that overrides :meth:`insert` (and not this method) every creation is
        made by that override instead, in one transaction, so the subclass sees each write.
        """
        if routes_through_overrides(self, "insert_each", "insert"):
            return insert_each_sequentially(self, kind, creations)
        c = self._compiled(kind)
        outcomes: list[Any] = [None] * len(creations)
        ready: list[tuple[int, Creation, S, dict[str, object], list[Any]]] = []
        for i, creation in enumerate(creations):
            try:
                state, checked = plan_creation(
                    kind, creation.entity_id, creation.event, creation.values
                )
            except REFUSALS as exc:
                outcomes[i] = exc
                continue
            params = c.insert_params(
                creation.entity_id, state, checked, creation.event, creation.audit
            )
            ready.append((i, creation, state, checked, params))
        with Txn(self._db, "insert_each", savepoint=False):
            conn = self._db.conn()
            for run in distinct_runs(ready, lambda item: (item[1].entity_id, "insert")):
                for chunk in pieces(run):
                    text = c.insert_rows_sql(len(chunk))
                    raws = conn.execute(text, [p for item in chunk for p in item[4]]).fetchall()
                    created = {raw[0] for raw in raws}
                    for i, creation, state, checked, _ in chunk:
                        entity_id = creation.entity_id
                        if entity_id not in created:  # it existed: returned untouched
                            outcomes[i] = (self._current(conn, c, entity_id), False)
                            continue
                        # Exactly what was written, as insert() returns it.
                        outcomes[i] = (new_row(entity_id, state, 0, checked), True)
        return outcomes

    def transition_each(
        self, kind: EntityKind[S], moves: Sequence[Move]
    ) -> list[Row[S] | Exception]:
        """Every move as :meth:`transition` would, in one transaction (see BatchStore).

        Runs of moves of one shape (event, fenced or not, the changed fields, the compared
        fields, equality only) on distinct entities share one ``UPDATE ... FROM (VALUES ...)
        RETURNING``: each row is guarded by its own id, fence and values, exactly as its own
        UPDATE would be.  Any other move runs alone.  In a subclass that overrides
        :meth:`transition` (and not this method) every move is made by that override instead,
        in one transaction, so the subclass sees each write.
        """
        if routes_through_overrides(self, "transition_each", "transition"):
            return transition_each_sequentially(self, kind, moves)
        c = self._compiled(kind)
        outcomes: list[Any] = [None] * len(moves)
        steps: list[Step] = []
        for i, move in enumerate(moves):
            try:
                steps.append(Step.of(c, i, move))
            except REFUSALS as exc:
                outcomes[i] = exc
        with Txn(self._db, "transition_each", savepoint=False):
            conn = self._db.conn()
            for run in distinct_runs(steps, lambda step: (step.move.entity_id, step.shape)):
                first = run[0]
                if first.shape is None:  # such a step is always a run of its own
                    assert first.plan is not None
                    outcomes[first.index] = self._one_planned(conn, c, first.plan, first.move.audit)
                    continue
                for chunk in pieces(run):
                    self._bulk_update(conn, c, chunk, outcomes)
        return outcomes

    def _bulk_update(
        self, conn: sqlite3.Connection, c: CompiledKind, chunk: list[Step], outcomes: list[Any]
    ) -> None:
        """One UPDATE ... FROM (VALUES ...) for a chunk of same-shape moves on distinct ids."""
        shape = chunk[0].shape
        assert shape is not None
        text = c.bulk_update_sql(shape, len(chunk))
        params = [value for step in chunk for value in step.values]
        written = {raw[0]: raw for raw in conn.execute(text, params).fetchall()}
        for step in chunk:
            raw = written.get(step.move.entity_id)
            if raw is None:
                current = self._current(conn, c, step.move.entity_id)
                outcomes[step.index] = step.planned(c.kind).miss(current)
                continue
            outcomes[step.index] = c.row(raw, self.path)

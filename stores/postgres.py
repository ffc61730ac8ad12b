"""The PostgreSQL store: the ledger on a database server, shared by processes on many hosts.

* psycopg 3 with a ``psycopg_pool`` pool of autocommit connections; a call outside an
  :meth:`PostgresStore.atomic` block runs in a short transaction of its own, a block holds one
  connection for its thread, nested blocks are savepoints (``stores._postgres_conn``).
* A guarded transition is one ``UPDATE ... WHERE id AND state IN (...) AND fence ...
  RETURNING`` with its audit ``INSERT`` in the same statement (a CTE), compiled from the
  same plan the in-memory store evaluates; every statement's text comes from one seam,
  ``stores._postgres_sql``.  Under READ COMMITTED a concurrent writer of the same row waits for
  the first to commit and then re-checks the guard: exactly one compare-and-set wins.
* Batches (every one with its audit entries in the same statement): ``insert_each`` as
  multi-row ``INSERT ... ON CONFLICT DO NOTHING RETURNING``, ``transition_many`` as one
  ``UPDATE ... WHERE id = ANY(...) RETURNING`` per call,
  ``transition_each`` one ``UPDATE ... FROM unnest(...)`` per run of like moves, all in one
  transaction.
* Schema: the tables live in the connection's schema, or in ``schema=`` (created if absent).
  The layout is versioned (table ``statecore_schema``) and tables are migrated in place (columns
  a kind declares but its table lacks are added with their defaults), every creation and
  migration under the schema's ``pg_advisory_xact_lock``.  A layout newer than this code is
  refused with ``StoreError``.  Every kind registered is recorded in ``statecore_kinds``
  (:meth:`PostgresStore.catalog`), in register()'s transaction.
* Timers (``statecore.timers``): every write that sets a state also sets the row's managed
  ``entered_at`` to its audit time; register() gives each timer of a kind a partial index over
  the rows of its source state, so :meth:`PostgresStore.due_timers` is one range scan over due
  rows (``FOR UPDATE SKIP LOCKED`` inside a block, so that processes firing timers share them).
* :meth:`PostgresStore.connection`: the block's own connection, for the caller's tables.
* Claims and wake-ups (``statecore.claims``): :meth:`PostgresStore.claim_candidates` is a
  ``SELECT ... FOR UPDATE SKIP LOCKED`` on the block's connection (concurrent sweepers get
  disjoint rows), bounded by ``claim_lock_timeout_s`` against the waits the server may still
  make (``stores._postgres_claim``); :meth:`PostgresStore.notify` is ``pg_notify`` (in a
  block: sent on commit), :meth:`PostgresStore.listen` a ``LISTEN`` on a connection and thread
  of its own (``stores._postgres_listen``), stopped by its unsubscribe or :meth:`close`.
* Faults (``stores._postgres_faults``): an unreachable server raises ``StoreUnreachable``
  after bounded retries, a cancelled statement ``StoreTimeout``, a lost commit is resolved or
  raises ``StoreOutcomeUnknown``, another cluster at the address ``StoreIdentityChanged``;
  serialization failures and deadlocks are retried with a bound; a connection lost
  mid-transaction leaves nothing half-written.  The password never appears in an error
  message or a ``repr``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum
from typing import Any, TypeVar

import psycopg

import stores._postgres_sql as sql
from statecore.batch import (
    REFUSALS,
    Creation,
    Move,
    insert_each_sequentially,
    transition_each_sequentially,
)
from statecore.batching import routes_through_overrides, transition_many_one_by_one
from statecore.claims import check_notification
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
from stores._postgres_batch import create_all, move_all
from stores._postgres_conn import Connections, Target, Txn, open_schema
from stores._postgres_identity import Identity
from stores._postgres_listen import Listener
from stores._postgres_logged import logged_many_sql, scalar_audit
from stores._postgres_options import Options
from stores._postgres_rows import (
    MANAGED,
    Kind,
    catalog_row,
    due_bound,
    kind_records,
)
from stores._postgres_versions import register_kind, stored_version
from stores._schema import migration, registered

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

S = TypeVar("S", bound=Enum)
Conn = psycopg.Connection[Any]

SCHEMA_VERSION = 2
"""The layout version this code writes (table ``statecore_schema``).  Version 2 added the
managed ``entered_at`` column of every kind's table (added to an older table, and filled from
its audit entries, when its kind is registered) and the ``statecore_kinds`` catalog."""


class PostgresStore(ClosesOnExit):
    """A :class:`~statecore.store.Store`, :class:`~statecore.batch.BatchStore`,
    :class:`~statecore.claims.ClaimingStore`, :class:`~statecore.claims.NotifyingStore`,
    :class:`~statecore.store.TimerStore` and :class:`~statecore.store.KindCatalog` on a
    PostgreSQL server (see the module docs).

    ``PostgresStore(url, pool_size=10, connect_timeout_s=5.0, schema=None)`` -- a URL or a
    ``key=value`` conninfo string.  Opening connects once (so a wrong password or a schema newer
    than this code raises ``StoreError`` at once, naming host and database, never the
    password), creates or upgrades the schema's shared tables, records or checks the cluster's
    identifier, then keeps a pool of up to ``pool_size`` connections.  Safe to share between
    threads; the caller must :meth:`close` it.  Raises ``ValueError`` for a malformed URL or
    option.  Bounds against a bad server (``stores._postgres_faults``):

    * ``connect_retries=3``, ``retry_backoff_s=0.2``: a connection attempt (``connect_timeout_s``
      each) is tried this many times, waiting 0.2, 0.4, ... s between tries, at open and for
      every pooled connection; then ``StoreUnreachable`` (nothing written).  The pool keeps
      reconnecting: a server that comes back is used again without a restart.
    * ``statement_timeout_s=None``: the server's ``statement_timeout``; a statement cancelled
      at it raises ``StoreTimeout`` (its transaction rolled back: nothing written).
    * A commit lost in flight is resolved by asking the server about its transaction id: never
      guessed; when it cannot be learnt, ``StoreOutcomeUnknown`` (re-read, then decide).
    * ``claim_lock_timeout_s=1.0``: a claim waits at most this for a lock, then claims nothing
      this round (``stores._postgres_claim``).
    * ``adopt_system_identifier=None``: data written on another cluster (``system_identifier``)
      raises ``StoreIdentityChanged`` at open, and on any reconnection every later call; an
      operator who restored a backup passes the server's identifier here to record it.

    PostgresStore is long because it is the whole Store protocol and its capabilities, one
    method per operation; the rest is in the ``stores._postgres_*`` modules.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        pool_size: int = 10,
        connect_timeout_s: float = 5.0,
        schema: str | None = None,
        statement_timeout_s: float | None = None,
        connect_retries: int = 3,
        retry_backoff_s: float = 0.2,
        claim_lock_timeout_s: float = 1.0,
        adopt_system_identifier: int | None = None,
    ) -> None:
        if not isinstance(conninfo, str):
            raise TypeError(f"conninfo must be a str, not {type(conninfo).__name__}")
        options = Options(
            pool_size, connect_timeout_s, schema, statement_timeout_s, connect_retries,
            retry_backoff_s, claim_lock_timeout_s, adopt_system_identifier,
        )  # fmt: skip
        self._target = Target(conninfo)
        self.schema = schema
        self._kinds: dict[str, Kind] = {}
        kwargs = options.kwargs()
        self.system_identifier = open_schema(self._target, kwargs, options, SCHEMA_VERSION)
        """The cluster's ``system_identifier`` this store's data was written on."""
        self._kwargs = kwargs
        self._listeners: set[Listener] = set()
        self._listening = threading.Lock()
        identity = Identity(str(self._target), self.system_identifier)
        self._db = Connections(self._target, kwargs, options, identity)

    def __repr__(self) -> str:
        schema = "" if self.schema is None else f", schema={self.schema!r}"
        return f"PostgresStore({str(self._target)!r}{schema})"

    def atomic(self) -> Txn:
        """A transaction on this thread's connection; nested blocks are savepoints.  Raises
        ``StoreError`` when no connection can be had or the server fails the transaction."""
        return self._db.atomic("transaction")

    def close(self) -> None:
        """Stop every :meth:`listen` subscription (bounded), close the pool; later calls raise
        ``StoreError``.  Idempotent."""
        with self._listening:
            self._db.closed = True
            listeners = list(self._listeners)
        for listener in listeners:
            listener.stop()
        self._db.close()

    # -- schema -------------------------------------------------------------------------------

    def register(self, kind: EntityKind[Any]) -> None:
        """Create ``kind``'s table, its declared indexes and one partial index per timer, or
        add the columns an older table lacks (``entered_at``: filled from each row's latest
        audit entry, else the upgrade's time); migrate rows of an older lifecycle version and
        place the version's constraint (``stores._postgres_versions``); record the kind in
        :meth:`catalog` -- in one transaction, under the schema's advisory lock.  Raises
        ``StaleVersion`` when the schema holds a newer version, ``MigrationError`` naming
        stored states nothing maps (then nothing was written), ``StoreError`` for a table not
        of this kind, a required column without a default, a field named like a managed
        column (``entered_at``), or a different kind of this name."""
        self._check_open()
        existing = self._kinds.get(kind.name)
        if existing is not None:
            if existing.kind != kind:
                raise StoreError(f"a different entity kind named {kind.name!r} is registered")
            return
        record = catalog_row(kind)  # refuses a field named like a managed column
        upgrade = functools.partial(self._migration, kind)
        with self._db.atomic(f"register {kind.name}"):
            self._db.write(
                f"register {kind.name}",
                lambda conn: register_kind(conn, kind, self.schema, record, upgrade),
            )
        self._db.versions[kind.table] = (kind.lifecycle.name, kind.lifecycle.version)
        stored = functools.partial(stored_version, self._target.conninfo, self._kwargs, kind.name)
        self._kinds[kind.name] = Kind(kind, stored)

    def _migration(self, kind: EntityKind[Any], have: set[str]) -> list[str]:
        return migration(
            str(self._target),
            kind,
            have,
            add_managed=sql.add_managed_sql,
            add_field=sql.add_field_sql,
            managed=MANAGED,
        )

    def _compiled(self, kind: EntityKind[Any]) -> Kind:
        return registered(str(self._target), self._kinds, kind, closed=self._db.closed)

    def catalog(self) -> list[KindRecord]:
        """Every kind registered in this schema (by any process, ever), by name, as last
        declared (a process registering an older version does not replace a newer one):
        rebuild one with :func:`statecore.catalog.kind_from_declaration` (KindCatalog).
        Raises ``StoreError`` once the store is closed or when the server fails."""
        self._check_open()
        raws = self._db.read("catalog", lambda conn: conn.execute(sql.READ_KINDS).fetchall())
        return kind_records(raws, self._target)

    def connection(self) -> Conn:
        """The calling thread's psycopg connection, for writing tables of the caller's own in
        the same transaction as the store's writes: valid only inside :meth:`atomic` (what the
        caller executes on it commits or rolls back with the block).  The caller must not
        commit, roll back, close it or change its autocommit, nor keep it past the block.
        Raises ``StoreError`` outside an ``atomic()`` block, or once the store is closed."""
        self._check_open()
        conn = self._db.local.conn
        if conn is None:
            raise StoreError(
                f"{self._target}: connection() is only valid inside a store.atomic() block "
                "(its writes then commit or roll back with the store's)"
            )
        return conn

    # -- reads --------------------------------------------------------------------------------

    def get(self, kind: EntityKind[S], entity_id: str) -> Row[S] | None:
        """The entity, or None."""
        c = self._compiled(kind)
        return self._db.read("get", lambda conn: self._current(conn, c, entity_id))

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
        return self._rows(
            "select", kind, states=states, where=where, order_by=order_by, limit=limit
        )

    def _rows(
        self,
        what: str,
        kind: EntityKind[S],
        *,
        states: Iterable[S] | None,
        where: Mapping[str, object] | None,
        order_by: str | None,
        limit: int | None,
    ) -> list[Row[S]]:
        """The rows of a select (``what`` "select") or of a locking claim read."""
        check_limit(limit)
        c = self._compiled(kind)
        wanted: frozenset[S] | None = valid_states(kind, states)
        conditions = normalize_where(kind, where)
        order_key(kind, order_by)  # validates the column
        if what == "select":
            text, params = sql.select_sql(kind, wanted, conditions, order_by, limit)
            raws = self._db.read(what, lambda conn: conn.execute(text, params).fetchall())
        else:
            text, params = sql.claim_sql(kind, wanted, conditions, order_by, limit)
            raws = self._db.claim(what, text, params)  # bounded: stores._postgres_claim
        return [c.row(raw, self._target) for raw in raws]

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
        found = self._db.read("count", lambda conn: conn.execute(text, params).fetchone())
        return 0 if found is None else int(found[0])

    def history(self, kind: EntityKind[S], entity_id: str) -> list[TransitionRecord]:
        """The entity's audit entries, oldest first."""
        c = self._compiled(kind)
        raws = self._db.read(
            "history", lambda conn: conn.execute(sql.HISTORY, (kind.name, entity_id)).fetchall()
        )
        st, where = c.states, self._target  # a value of an older version: c.decode's slow path
        return [
            TransitionRecord(
                entity_id,
                event,
                None if source is None else st.get(source) or c.decode(entity_id, source, where),
                st.get(target) or c.decode(entity_id, target, where),
                at,
                owner,
                attempts,
                reason,
            )
            for event, source, target, at, owner, attempts, reason in raws
        ]

    def due_timers(
        self, kind: EntityKind[S], timer: Timer[S], *, now: float | None, limit: int
    ) -> list[Due[S]]:
        """Rows in ``timer.source`` due at ``now`` (None: every row with a timer), soonest due
        first, then by id; at most ``limit`` (TimerStore).  One range scan of the timer's
        partial index, ending at the first row not yet due.  Inside :meth:`atomic` the rows
        returned are locked until the block ends and rows another transaction holds are
        skipped (``FOR UPDATE SKIP LOCKED``): concurrent sweepers get disjoint rows; fire them
        in the block, each under its fence.  Raises as :func:`~stores._postgres_rows.due_bound`
        says before any query (``TypeError``/``ValueError``), ``StoreError`` as any read."""
        c = self._compiled(kind)
        bound = due_bound(kind, timer, now, limit)
        lock = self._db.local.conn is not None
        text, params = sql.due_sql(kind, timer, bound, limit, lock=lock)
        if lock:  # a claim: bounded as claim_candidates is
            raws = self._db.claim("due_timers", text, params)
        else:
            raws = self._db.read("due_timers", lambda conn: conn.execute(text, params).fetchall())
        return [c.due(raw, self._target) for raw in raws]

    def _current(self, conn: Conn, c: Kind, entity_id: str) -> Row[Any] | None:
        raw = conn.execute(c.get_sql, (entity_id,)).fetchone()
        return None if raw is None else c.row(raw, self._target)

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
        """Create the entity (idempotent: an existing id is returned untouched)."""
        c = self._compiled(kind)
        state, checked = plan_creation(kind, entity_id, event, values)
        params = [entity_id, state.value, 0, *(checked[n] for n in c.columns), audit.at]
        params += scalar_audit(kind, event, audit)

        def write(conn: Conn) -> tuple[Row[S], bool]:
            # The creation and its audit entry: one statement (stores._postgres_logged).
            raw = conn.execute(c.logged_insert_sql(1), params).fetchone()
            if raw is None:  # the id exists: untouched, nothing logged
                existing = self._current(conn, c, entity_id)
                assert existing is not None  # the conflict was on this id
                return existing, False
            return c.row(raw, self._target), True

        return self._db.write("insert", write)

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
        """One guarded ``UPDATE ... RETURNING`` plus its audit entry, in one transaction."""
        c = self._compiled(kind)
        plan = plan_transition(kind, entity_id, event, fence=fence, expect=expect, changes=changes)
        outcome = self._db.write("transition", lambda conn: self._one(conn, c, plan, audit))
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def _one(
        self, conn: Conn, c: Kind, plan: TransitionPlan[Any], audit: Audit
    ) -> Row[Any] | Exception:
        """The plan's guarded UPDATE and audit entry, one statement: the row written, or the
        refusal (nothing written; a read of the row decides which error)."""
        params = sql.update_params(plan, audit.at) + scalar_audit(c.kind, plan.event, audit)
        raw = conn.execute(c.update_sql(plan), params).fetchone()
        if raw is None:
            return plan.miss(self._current(conn, c, plan.entity_id))
        return c.row(raw, self._target)

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
        """One guarded ``UPDATE ... WHERE id = ANY(...) RETURNING`` plus the audit entries, in
        one transaction; entities the guard does not admit are skipped.

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
        text = logged_many_sql(plan, added)  # with the audit entries: one statement
        params = [
            audit.at,
            *plan.changes.values(),
            *added.values(),
            ids,
            *sql.where_params(plan.expect),
            *scalar_audit(kind, event, audit),
        ]

        def write(conn: Conn) -> dict[str, Row[S]]:
            if not ids:
                return {}
            raws = conn.execute(text, params).fetchall()
            return {raw[0]: c.row(raw, self._target) for raw in raws}

        rows = self._db.write("transition_many", write)
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

        def write(conn: Conn) -> int:
            ids = [r[0] for r in conn.execute(text, params).fetchall()]
            if ids:
                conn.execute(sql.AUDIT_DELETE, (kind.name, ids))
            return len(ids)

        return self._db.write("prune", write)

    # -- claims and notifications (statecore.claims) ------------------------------------------

    def claim_candidates(
        self,
        kind: EntityKind[S],
        *,
        states: Iterable[S] | None = None,
        where: Mapping[str, object] | None = None,
        order_by: str | None = None,
        limit: int | None = None,
    ) -> list[Row[S]]:
        """What :meth:`select` would return minus the rows another transaction holds, each
        locked (``FOR UPDATE SKIP LOCKED``) until this thread's ``atomic()`` block ends: claim
        them there, each under its fence (ClaimingStore).  Raises ``NoTransaction`` outside a
        block, ``StoreError`` when the server fails, and as :meth:`select` for bad input."""
        return self._rows(
            "claim_candidates", kind, states=states, where=where, order_by=order_by, limit=limit
        )

    def notify(self, channel: str, payload: str = "") -> None:
        """``pg_notify(channel, payload)``: in an ``atomic()`` block sent when it commits (never
        if it rolls back), else at once (NotifyingStore).  Raises ``ValueError``/``TypeError``
        for a bad channel or payload, ``StoreError`` when the server fails or the store is
        closed."""
        check_notification(channel, payload)
        self._check_open()

        def send(conn: Conn) -> None:
            conn.execute(sql.NOTIFY, (channel, payload))

        self._db.write("notify", send)

    def listen(self, channel: str, callback: Callable[[str], object]) -> Callable[[], None]:
        """Call ``callback(payload)`` on a thread of its own for every notification on
        ``channel`` committed after this returns; returns the idempotent, bounded
        ``unsubscribe`` (NotifyingStore).  Holds one connection outside the pool until then, or
        until :meth:`close`.  Raises ``ValueError``/``TypeError`` for a bad channel or callback,
        ``StoreError`` when the server cannot be reached or the store is closed."""
        check_notification(channel)
        if not callable(callback):
            raise TypeError(f"callback must be callable, not {type(callback).__name__}")
        self._check_open()
        listener = Listener(
            self._target, self._kwargs, channel, callback, on_stop=self._listeners.discard
        )
        with self._listening:
            if not self._db.closed:
                self._listeners.add(listener)
                return listener.stop
        listener.stop()  # closed while subscribing
        raise StoreError(f"{self._target}: the store is closed")

    def _check_open(self) -> None:
        """Raise ``StoreError`` when the store was closed."""
        if self._db.closed:
            raise StoreError(f"{self._target}: the store is closed")

    # -- batches (statecore.batch.BatchStore) ------------------------------------------------

    def insert_each(
        self, kind: EntityKind[S], creations: Sequence[Creation]
    ) -> list[tuple[Row[S], bool] | Exception]:
        """Every creation as :meth:`insert` would, in one transaction, with one multi-row
        ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` and its audit entries per run of
        distinct ids (``stores._postgres_batch``; BatchStore).

        In a subclass that overrides :meth:`insert` (and not this method) every creation is
        made by that override instead, in one transaction, so the subclass sees each write.
        """
        if routes_through_overrides(self, "insert_each", "insert"):
            return insert_each_sequentially(self, kind, creations)
        c = self._compiled(kind)
        outcomes: list[Any] = [None] * len(creations)
        ready: list[tuple[int, Creation, Enum, list[Any]]] = []
        for i, creation in enumerate(creations):
            try:
                state, checked = plan_creation(
                    kind, creation.entity_id, creation.event, creation.values
                )
            except REFUSALS as exc:
                outcomes[i] = exc
                continue
            params = [
                creation.entity_id, state.value, 0, *(checked[n] for n in c.columns),
                creation.audit.at,
            ]  # fmt: skip
            ready.append((i, creation, state, params))

        def write(conn: Conn) -> list[Any]:
            return create_all(conn, c, self._target, ready, outcomes, current=self._current)

        return self._db.write("insert_each", write)

    def transition_each(
        self, kind: EntityKind[S], moves: Sequence[Move]
    ) -> list[Row[S] | Exception]:
        """Every move as :meth:`transition` would, in order, in one transaction: one guarded
        UPDATE per run of like moves (``stores._postgres_batch``; see BatchStore).  In a
        subclass that overrides :meth:`transition` (and not this method) every move is made
        by that override instead."""
        if routes_through_overrides(self, "transition_each", "transition"):
            return transition_each_sequentially(self, kind, moves)
        c = self._compiled(kind)
        planned: list[TransitionPlan[Any] | Exception] = []
        for m in moves:
            try:
                planned.append(
                    plan_transition(
                        kind, m.entity_id, m.event, fence=m.fence, expect=m.expect,
                        changes=m.changes,
                    )
                )  # fmt: skip
            except REFUSALS as exc:
                planned.append(exc)

        def write(conn: Conn) -> list[Any]:
            return move_all(
                conn, c, self._target, planned, moves, current=self._current, one=self._one
            )

        return self._db.write("transition_each", write)

"""The SQLite store: the embedded default, durable across crashes and restarts.

* WAL journal, ``synchronous`` NORMAL (default) or FULL, a busy timeout: a database locked
  longer than that raises :class:`~statecore.errors.StoreError`, it never hangs.
* One long-lived connection per thread, never one per call (opening a connection costs ~40x a
  lifecycle; closing the last one checkpoints the WAL).
* Writes run in ``BEGIN IMMEDIATE`` transactions; nested :meth:`SQLiteStore.atomic` blocks are
  savepoints.  A guarded transition is one ``UPDATE ... WHERE id AND state IN (...) AND fence
  ... RETURNING`` plus its audit ``INSERT``, compiled from the same plan the in-memory store
  evaluates.  State lists are inlined as literals so the partial indexes declared by each kind
  are usable by the planner.
* The schema is versioned (``PRAGMA user_version``) and tables are migrated in place: columns a
  kind declares but an older table lacks are added with their defaults.  A database newer than
  this code, or a file that is not SQLite, raises ``StoreError`` naming the path.
"""

from __future__ import annotations

import contextlib
import operator
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Literal, TypeVar

from statecore.batch import REFUSALS, Creation, Move
from statecore.entity import EntityKind, Field
from statecore.errors import StatecoreError, StoreError
from statecore.store import (
    Audit,
    Cmp,
    Row,
    TransitionPlan,
    TransitionRecord,
    Where,
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
from statecore.trusted import trusted_constructor

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

S = TypeVar("S", bound=Enum)

SCHEMA_VERSION = 1
"""The layout version this code writes (``PRAGMA user_version``); 0 is a pre-versioned file."""

_SQL_TYPES = {str: "TEXT", int: "INTEGER", float: "REAL", bool: "INTEGER"}
_AUDIT_TABLE = "statecore_audit"
_SQLITE_MAGIC = b"SQLite format 3\x00"
_BULK_CHUNK = 500  # ids per bulk UPDATE (well under SQLite's bound-parameter limit)
_AUDIT_INSERT = (
    f"INSERT INTO {_AUDIT_TABLE} (kind, entity_id, event, from_state, to_state, at, owner, "
    "attempts, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _audit_row(
    kind: EntityKind[Any],
    entity_id: str,
    event: str,
    source: str | None,
    target: str,
    *,
    audit: Audit,
) -> tuple[Any, ...]:
    """The parameters of one _AUDIT_INSERT: a move of ``entity_id`` from state value ``source``
    (None for a creation) to ``target``."""
    return (
        kind.name,
        entity_id,
        event,
        source,
        target,
        audit.at,
        audit.owner,
        audit.attempts,
        audit.reason,
    )


class _Compiled:
    """Per-kind SQL fragments and decoders, built once at register()."""

    __slots__ = (
        "column_values",
        "columns",
        "decoders",
        "fast",
        "get_sql",
        "insert_sql",
        "kind",
        "select_cols",
        "states",
        "updates",
    )

    def __init__(self, kind: EntityKind[Any]) -> None:
        self.kind = kind
        self.columns = tuple(f.name for f in kind.fields)
        self.select_cols = ", ".join((kind.id_field, "state", "fence", *self.columns))
        self.states: dict[str, Enum] = {s.value: s for s in kind.lifecycle.states}
        self.get_sql = f"SELECT {self.select_cols} FROM {kind.table} WHERE {kind.id_field} = ?"
        self.insert_sql = (
            f"INSERT INTO {kind.table} ({self.select_cols}) "
            f"VALUES ({', '.join('?' * (3 + len(self.columns)))}) "
            f"ON CONFLICT({kind.id_field}) DO NOTHING"
        )
        # The declared fields' values of a checked mapping, in column order (C speed).
        self.column_values: Callable[[Mapping[str, object]], tuple[Any, ...]] = (
            operator.itemgetter(*self.columns)
            if len(self.columns) > 1
            else lambda values: tuple(values[n] for n in self.columns)
        )
        # Guarded UPDATE statements by shape (event, fenced?, changed columns, conditions).
        self.updates: dict[tuple[Any, ...], str] = {}
        # Shapes seen with plain values only: (event, fenced?, expect keys, change keys).
        self.fast: dict[tuple[Any, ...], _FastUpdate] = {}
        # SQLite may hand back a REAL column's whole number as an int (RETURNING does), and
        # stores bools as ints: these columns are converted back on read.
        self.decoders = tuple(
            (f.name, position, bool if f.type is bool else float)
            for position, f in enumerate(kind.fields, start=3)
            if f.type in (bool, float)
        )

    def update_sql(self, plan: TransitionPlan[Any]) -> str:
        """The guarded single-row UPDATE for the plan's shape (built once per shape)."""
        shape = (plan.event, plan.fence is not None, tuple(plan.changes), _shape(plan.expect))
        sql = self.updates.get(shape)
        if sql is None:
            sql = self.updates[shape] = _update_sql(plan, self.select_cols)
        return sql

    def insert_rows_sql(self, count: int) -> str:
        """The multi-row ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` for ``count`` rows."""
        sql = self.updates.get(("insert", count))
        if sql is None:
            one = f"({', '.join('?' * (3 + len(self.columns)))})"
            sql = self.updates[("insert", count)] = (
                f"INSERT INTO {self.kind.table} ({self.select_cols}) "
                f"VALUES {', '.join([one] * count)} "
                f"ON CONFLICT({self.kind.id_field}) DO NOTHING RETURNING {self.select_cols}"
            )
        return sql

    def row(self, raw: Sequence[Any], path: str) -> Row[Any]:
        try:
            state = self.states[raw[1]]
        except KeyError:
            raise StoreError(
                f"{path}: {self.kind.name} {raw[0]!r} has unknown state {raw[1]!r}"
            ) from None
        # raw may carry a trailing prev_state (RETURNING of a transition): zip stops before it.
        values = dict(zip(self.columns, raw[3:], strict=False))
        for name, position, decode in self.decoders:
            value = raw[position]
            if value is not None and type(value) is not decode:
                values[name] = decode(value)
        return _new_row(raw[0], state, raw[2], values)


# The row decoder above checked the state and the field types: Rows skip a second check.
_new_row = trusted_constructor(Row)


def _plain(values: Mapping[str, object], types: tuple[type, ...], out: list[Any]) -> bool:
    """Append ``values`` to ``out`` if each has exactly its expected type (text: ASCII)."""
    for value, expected in zip(values.values(), types, strict=True):
        if type(value) is not expected or (isinstance(value, str) and not value.isascii()):
            return False
        out.append(value)
    return True


class _FastUpdate:
    """A transition shape already planned once: its SQL and the exact type of each bound value.

    A later call of the same shape whose values all have exactly those types (and text is plain
    ASCII) is admitted by the very checks plan_transition would run, so it skips planning; any
    other value (None, a comparison, a convertible type) takes the full path.
    """

    __slots__ = ("change_types", "expect_types", "sql")

    def __init__(
        self, sql: str, change_types: tuple[type, ...], expect_types: tuple[type, ...]
    ) -> None:
        self.sql = sql
        self.change_types = change_types
        self.expect_types = expect_types

    def values(
        self,
        entity_id: object,
        fence: object,
        expect: Mapping[str, object] | None,
        changes: Mapping[str, object] | None,
        *,
        bulk: bool,
    ) -> list[Any] | None:
        """The bound values, or None when any needs the full checks: in the single-row
        UPDATE's order (changes, id, fence, compared values) or a bulk row's (id, fence,
        changes, compared values)."""
        if type(entity_id) is not str or (fence is not None and type(fence) is not int):
            return None
        key: list[Any] = [entity_id] if fence is None else [entity_id, fence]
        values: list[Any] = key if bulk else []
        if changes and not _plain(changes, self.change_types, values):
            return None
        if not bulk:
            values.extend(key)
        if expect and not _plain(expect, self.expect_types, values):
            return None
        return values


class _Step:
    """One checked move of a batch: its bulk shape (None: it runs alone) and the values of its
    bulk row (id, fence when fenced, changed values, compared values)."""

    __slots__ = ("index", "move", "plan", "shape", "values")

    def __init__(
        self,
        index: int,
        move: Move,
        plan: TransitionPlan[Any] | None,
        shape: tuple[Any, ...] | None,
        values: list[Any],
    ) -> None:
        self.index = index
        self.move = move
        self.plan = plan
        self.shape = shape
        self.values = values

    @classmethod
    def of(cls, c: _Compiled, index: int, move: Move) -> _Step:
        """Check ``move`` exactly as transition() would; raises its refusal."""
        expect, changes = move.expect, move.changes
        fenced = move.fence is not None
        key = (move.event, not fenced, tuple(expect) if expect else (), tuple(changes or ()))
        fast = c.fast.get(key)
        if fast is not None:
            # A shape planned before, and plain values: admitted by the same checks (see
            # _FastUpdate), so the plan is made only if the move misses.
            values = fast.values(move.entity_id, move.fence, expect, changes, bulk=True)
            if values is not None:
                return cls(index, move, None, _shape_of(move.event, fenced, key[3], key[2]), values)
        plan = plan_transition(
            c.kind, move.entity_id, move.event, fence=move.fence, expect=expect, changes=changes
        )
        if fast is None:
            learned = _learn(c.kind, plan, c.update_sql(plan))
            if learned is not None:
                c.fast[key] = learned
        shape = _bulk_shape(plan)
        if shape is None:
            return cls(index, move, plan, None, [])
        values = [plan.entity_id]
        if plan.fence is not None:
            values.append(plan.fence)
        values.extend(plan.changes.values())
        values.extend(cmp.value for _, cmp in plan.expect)
        return cls(index, move, plan, shape, values)

    def planned(self, kind: EntityKind[Any]) -> TransitionPlan[Any]:
        """The move's plan (made now if the fast check admitted it)."""
        if self.plan is None:
            m = self.move
            self.plan = plan_transition(
                kind, m.entity_id, m.event, fence=m.fence, expect=m.expect, changes=m.changes
            )
        return self.plan


class _Local(threading.local):
    conn: sqlite3.Connection | None = None
    depth = 0


class _Txn:
    """One (possibly nested) transaction on the calling thread's connection.

    A plain class rather than a generator context manager: it sits on every write's hot path.
    Driver errors anywhere inside are translated to StoreError after the rollback.  With
    ``savepoint=False`` a nested use adds nothing to the enclosing transaction: a single
    guarded write either matches (and writes) or changes nothing, and a driver error fails the
    enclosing block anyway.
    """

    __slots__ = ("conn", "depth", "joined", "savepoint", "store", "what")

    def __init__(self, store: SQLiteStore, what: str, *, savepoint: bool = True) -> None:
        self.store = store
        self.what = what
        self.savepoint = savepoint

    def __enter__(self) -> None:
        store = self.store
        local = store._local
        try:
            conn = local.conn or store._conn()
            depth = local.depth
            self.joined = depth > 0 and not self.savepoint
            if not self.joined:
                conn.execute("BEGIN IMMEDIATE" if depth == 0 else f"SAVEPOINT sp{depth}")
        except sqlite3.Error as exc:
            raise store._error(exc, f"{self.what} (begin)") from exc
        self.conn, self.depth = conn, depth
        if not self.joined:
            local.depth = depth + 1

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        store, conn, depth = self.store, self.conn, self.depth
        if self.joined:
            if isinstance(exc, sqlite3.Error | OSError):
                raise store._error(exc, self.what) from exc
            return
        store._local.depth = depth
        if kind is None:
            try:
                conn.execute("COMMIT" if depth == 0 else f"RELEASE sp{depth}")
                return
            except sqlite3.Error as error:
                self._rollback()
                raise store._error(error, f"{self.what} (commit)") from error
        self._rollback()
        if isinstance(exc, sqlite3.Error | OSError):
            raise store._error(exc, self.what) from exc

    def _rollback(self) -> None:
        conn, depth = self.conn, self.depth
        with contextlib.suppress(sqlite3.Error):
            if depth == 0:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            else:
                conn.execute(f"ROLLBACK TO sp{depth}")
                conn.execute(f"RELEASE sp{depth}")


class SQLiteStore:
    """A :class:`~statecore.store.Store` in one SQLite file (see the module docs).

    ``SQLiteStore(path, synchronous="NORMAL" | "FULL", busy_timeout_s=5.0)``.  Opening checks
    that the file is a SQLite database of a version this code knows; raises ``StoreError``
    naming the path otherwise.  Safe to share between threads; each thread gets its own
    connection, all closed by :meth:`close`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout_s: float = 5.0,
    ) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        if not isinstance(busy_timeout_s, int | float) or busy_timeout_s < 0:
            raise ValueError(f"busy_timeout_s must be a non-negative number: {busy_timeout_s!r}")
        self.path = os.fspath(path)
        self.synchronous = synchronous
        self._busy_ms = int(busy_timeout_s * 1000)
        self._local = _Local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._kinds: dict[str, _Compiled] = {}
        self._closed = False
        _check_header(self.path)
        with self._guard("open"):
            conn = self._conn()
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: schema version {version} is newer than this code "
                    f"understands ({SCHEMA_VERSION}); upgrade statecore"
                )
        with self.atomic():
            conn = self._conn()
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {_AUDIT_TABLE} ("
                "seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, entity_id TEXT NOT NULL, "
                "event TEXT NOT NULL, from_state TEXT, to_state TEXT NOT NULL, "
                "at REAL NOT NULL, owner TEXT, attempts INTEGER, reason TEXT)"
            )
            conn.execute(
                f"CREATE INDEX IF NOT EXISTS {_AUDIT_TABLE}_entity "
                f"ON {_AUDIT_TABLE}(kind, entity_id, seq)"
            )
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, synchronous={self.synchronous!r})"

    # -- connections and transactions ----------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn = self._local.conn
        if conn is not None:
            return conn
        conn = sqlite3.connect(
            self.path,
            timeout=self._busy_ms / 1000,
            isolation_level=None,  # we issue BEGIN IMMEDIATE / COMMIT ourselves
            check_same_thread=False,  # only so close() may close every thread's connection
            cached_statements=256,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: cannot use WAL journaling (got {mode!r})")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
        except BaseException:
            conn.close()
            raise
        with self._lock:
            if self._closed:
                conn.close()
                raise StoreError(f"{self.path}: the store is closed")
            self._connections.append(conn)
        self._local.conn = conn
        return conn

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """Translate driver errors into StoreError naming the path; let ours through."""
        try:
            yield
        except StatecoreError:
            raise
        except (sqlite3.Error, OSError) as exc:
            raise self._error(exc, what) from exc

    def _error(self, exc: BaseException, what: str) -> StoreError:
        """The StoreError for a driver failure during ``what`` (chain it with ``from``)."""
        message = str(exc)
        if "not a database" in message or "malformed" in message:
            return StoreError(f"{self.path}: not a usable SQLite database ({message})")
        if "locked" in message or "busy" in message:
            return StoreError(
                f"{self.path}: database locked for longer than the busy timeout "
                f"({self._busy_ms} ms) during {what}"
            )
        return StoreError(f"{self.path}: {what} failed: {message}")

    def atomic(self) -> _Txn:
        """A transaction on this thread's connection (``BEGIN IMMEDIATE``); nested blocks are
        savepoints.  Raises ``StoreError`` if the database stays locked past the busy timeout."""
        return _Txn(self, "transaction")

    def close(self) -> None:
        """Close every thread's connection; later calls raise ``StoreError``.  Idempotent."""
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        for conn in connections:
            with contextlib.suppress(sqlite3.Error):  # closing is best effort
                conn.close()
        self._local = _Local()

    # -- schema -------------------------------------------------------------------------------

    def register(self, kind: EntityKind[Any]) -> None:
        """Create ``kind``'s table and indexes, or add the columns an older table lacks."""
        if self._closed:
            raise StoreError(f"{self.path}: the store is closed")
        existing = self._kinds.get(kind.name)
        if existing is not None:
            if existing.kind != kind:
                raise StoreError(f"a different entity kind named {kind.name!r} is registered")
            return
        with _Txn(self, f"register {kind.name}"):
            conn = self._conn()
            have = {r[1] for r in conn.execute(f"PRAGMA table_info({kind.table})")}
            if not have:
                columns = [
                    f"{kind.id_field} TEXT PRIMARY KEY NOT NULL",
                    "state TEXT NOT NULL",
                    "fence INTEGER NOT NULL DEFAULT 0",
                    "prev_state TEXT",
                    *(_column_sql(f, new_table=True) for f in kind.fields),
                ]
                conn.execute(f"CREATE TABLE {kind.table} ({', '.join(columns)})")
            else:
                if kind.id_field not in have or "state" not in have:
                    raise StoreError(
                        f"{self.path}: table {kind.table} exists without "
                        f"{kind.id_field}/state columns; it is not a {kind.name} table"
                    )
                if "fence" not in have:
                    conn.execute(
                        f"ALTER TABLE {kind.table} ADD COLUMN fence INTEGER NOT NULL DEFAULT 0"
                    )
                if "prev_state" not in have:
                    conn.execute(f"ALTER TABLE {kind.table} ADD COLUMN prev_state TEXT")
                for f in kind.fields:
                    if f.name not in have:
                        if not f.nullable and f.default is None:
                            raise StoreError(
                                f"{self.path}: cannot add required column {kind.table}.{f.name} "
                                "to existing rows: it has no default"
                            )
                        conn.execute(
                            f"ALTER TABLE {kind.table} ADD COLUMN {_column_sql(f, new_table=False)}"
                        )
            for index in kind.indexes:
                name = f"{kind.table}_{'_'.join(index.fields)}"
                partial = ""
                if index.states:
                    name += "_" + "_".join(sorted(s.value for s in index.states))
                    partial = f" WHERE state IN ({_literals(index.states)})"
                conn.execute(
                    f"CREATE INDEX IF NOT EXISTS {name} ON {kind.table}"
                    f"({', '.join(index.fields)}){partial}"
                )
        self._kinds[kind.name] = _Compiled(kind)

    def _compiled(self, kind: EntityKind[Any]) -> _Compiled:
        compiled = self._kinds.get(kind.name)
        if compiled is None:
            raise StoreError(f"entity kind {kind.name!r} is not registered with this store")
        if compiled.kind is not kind and compiled.kind != kind:
            raise StoreError(f"a different entity kind named {kind.name!r} is registered")
        if self._closed:
            raise StoreError(f"{self.path}: the store is closed")
        return compiled

    # -- reads --------------------------------------------------------------------------------

    def get(self, kind: EntityKind[S], entity_id: str) -> Row[S] | None:
        """The entity, or None."""
        c = self._compiled(kind)
        with self._guard("get"):
            return self._current(self._conn(), c, entity_id)

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
        clause, params = _where_sql(wanted, normalize_where(kind, where))
        order_key(kind, order_by)  # validates the column
        order = kind.id_field if order_by is None else f"{order_by}, {kind.id_field}"
        sql = f"SELECT {c.select_cols} FROM {kind.table}{clause} ORDER BY {order}"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._guard("select"):
            raws = self._conn().execute(sql, params).fetchall()
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
        clause, params = _where_sql(wanted, normalize_where(kind, where))
        with self._guard("count"):
            row = self._conn().execute(f"SELECT COUNT(*) FROM {kind.table}{clause}", params)
            return int(row.fetchone()[0])

    def history(self, kind: EntityKind[S], entity_id: str) -> list[TransitionRecord]:
        """The entity's audit entries, oldest first."""
        c = self._compiled(kind)
        with self._guard("history"):
            raws = (
                self._conn()
                .execute(
                    "SELECT event, from_state, to_state, at, owner, attempts, reason "
                    f"FROM {_AUDIT_TABLE} WHERE kind = ? AND entity_id = ? ORDER BY seq",
                    (kind.name, entity_id),
                )
                .fetchall()
            )
        return [
            TransitionRecord(
                entity_id,
                event,
                None if source is None else c.states[source],
                c.states[target],
                at,
                owner,
                attempts,
                reason,
            )
            for event, source, target, at, owner, attempts, reason in raws
        ]

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
        params = [entity_id, state.value, 0, *c.column_values(checked)]
        with _Txn(self, "insert", savepoint=False):
            conn = self._conn()
            if conn.execute(c.insert_sql, params).rowcount == 0:  # the id exists: untouched
                existing = self._current(conn, c, entity_id)
                assert existing is not None  # the conflict was on this id, in this transaction
                return existing, False
            conn.execute(
                _AUDIT_INSERT, _audit_row(kind, entity_id, event, None, state.value, audit=audit)
            )
        # Exactly what was written: the checked values are in the form a read returns.
        return _new_row(entity_id, state, 0, checked), True

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
        key = (event, fence is None, tuple(expect) if expect else (), tuple(changes or ()))
        fast = c.fast.get(key)
        params = (
            None if fast is None else fast.values(entity_id, fence, expect, changes, bulk=False)
        )
        if fast is not None and params is not None:
            with _Txn(self, "transition", savepoint=False):
                conn = self._conn()
                row = self._write_one(
                    conn, c, fast.sql, params, entity_id=entity_id, event=event, audit=audit
                )
                if row is not None:
                    return row
                current = self._current(conn, c, entity_id)
            # A miss: the full plan names the refusal.
            plan = plan_transition(
                kind, entity_id, event, fence=fence, expect=expect, changes=changes
            )
            raise plan.miss(current)
        plan = plan_transition(kind, entity_id, event, fence=fence, expect=expect, changes=changes)
        if fast is None:
            learned = _learn(kind, plan, c.update_sql(plan))
            if learned is not None:
                c.fast[key] = learned
        with _Txn(self, "transition", savepoint=False):
            outcome = self._one_planned(self._conn(), c, plan, audit)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def _write_one(
        self,
        conn: sqlite3.Connection,
        c: _Compiled,
        sql: str,
        params: list[Any],
        *,
        entity_id: str,
        event: str,
        audit: Audit,
    ) -> Row[Any] | None:
        """One guarded UPDATE and its audit entry; None when the guard matched nothing."""
        raw = conn.execute(sql, params).fetchone()
        if raw is None:
            return None
        # raw[-1] is prev_state (the state left), raw[1] the new state, both as stored.
        conn.execute(
            _AUDIT_INSERT, _audit_row(c.kind, entity_id, event, raw[-1], raw[1], audit=audit)
        )
        return c.row(raw, self.path)

    def _current(self, conn: sqlite3.Connection, c: _Compiled, entity_id: str) -> Row[Any] | None:
        """The entity as stored now (on this connection, in its transaction), or None."""
        raw = conn.execute(c.get_sql, (entity_id,)).fetchone()
        return None if raw is None else c.row(raw, self.path)

    # -- batches (statecore.batch.BatchStore) ------------------------------------------------

    def insert_each(
        self, kind: EntityKind[S], creations: Sequence[Creation]
    ) -> list[tuple[Row[S], bool] | Exception]:
        """Every creation as :meth:`insert` would, in one transaction, with one multi-row
        ``INSERT ... RETURNING`` per run of distinct ids (see BatchStore)."""
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
            params = [creation.entity_id, state.value, 0, *c.column_values(checked)]
            ready.append((i, creation, state, params))
        with _Txn(self, "insert_each", savepoint=False):
            conn = self._conn()
            for run in _distinct_runs(ready, lambda item: (item[1].entity_id, "insert")):
                for chunk in _pieces(run):
                    sql = c.insert_rows_sql(len(chunk))
                    raws = conn.execute(sql, [p for item in chunk for p in item[3]]).fetchall()
                    created = {raw[0]: raw for raw in raws}
                    audits = []
                    for i, creation, initial, _ in chunk:
                        raw = created.get(creation.entity_id)
                        if raw is None:  # it existed: returned untouched, as insert() does
                            outcomes[i] = (self._current(conn, c, creation.entity_id), False)
                            continue
                        outcomes[i] = (c.row(raw, self.path), True)
                        audits.append(
                            _audit_row(
                                kind,
                                creation.entity_id,
                                creation.event,
                                None,
                                initial.value,
                                audit=creation.audit,
                            )
                        )
                    conn.executemany(_AUDIT_INSERT, audits)
        return outcomes

    def transition_each(
        self, kind: EntityKind[S], moves: Sequence[Move]
    ) -> list[Row[S] | Exception]:
        """Every move as :meth:`transition` would, in one transaction (see BatchStore).

        Runs of moves of one shape (event, fenced or not, the changed fields, the compared
        fields, equality only) on distinct entities share one ``UPDATE ... FROM (VALUES ...)
        RETURNING``: each row is guarded by its own id, fence and values, exactly as its own
        UPDATE would be.  Any other move runs alone.
        """
        c = self._compiled(kind)
        outcomes: list[Any] = [None] * len(moves)
        steps: list[_Step] = []
        for i, move in enumerate(moves):
            try:
                steps.append(_Step.of(c, i, move))
            except REFUSALS as exc:
                outcomes[i] = exc
        with _Txn(self, "transition_each", savepoint=False):
            conn = self._conn()
            for run in _distinct_runs(steps, lambda step: (step.move.entity_id, step.shape)):
                first = run[0]
                if first.shape is None:  # such a step is always a run of its own
                    assert first.plan is not None
                    outcomes[first.index] = self._one_planned(conn, c, first.plan, first.move.audit)
                    continue
                for chunk in _pieces(run):
                    self._bulk_update(conn, c, chunk, outcomes)
        return outcomes

    def _one_planned(
        self, conn: sqlite3.Connection, c: _Compiled, plan: TransitionPlan[Any], audit: Audit
    ) -> Row[Any] | Exception:
        """The plan's single-row UPDATE and audit entry: the row written, or the refusal."""
        params: list[Any] = [*plan.changes.values(), plan.entity_id]
        if plan.fence is not None:
            params.append(plan.fence)
        params.extend(_params(plan.expect))
        row = self._write_one(
            conn,
            c,
            c.update_sql(plan),
            params,
            entity_id=plan.entity_id,
            event=plan.event,
            audit=audit,
        )
        return row if row is not None else plan.miss(self._current(conn, c, plan.entity_id))

    def _bulk_update(
        self, conn: sqlite3.Connection, c: _Compiled, chunk: list[_Step], outcomes: list[Any]
    ) -> None:
        """One UPDATE ... FROM (VALUES ...) for a chunk of same-shape moves on distinct ids."""
        shape = chunk[0].shape
        assert shape is not None
        key = ("bulk", shape, len(chunk))
        sql = c.updates.get(key)
        if sql is None:
            sql = c.updates[key] = _bulk_update_sql(c.kind, shape, c.select_cols, len(chunk))
        params = [value for step in chunk for value in step.values]
        written = {raw[0]: raw for raw in conn.execute(sql, params).fetchall()}
        audits = []
        for step in chunk:
            move = step.move
            raw = written.get(move.entity_id)
            if raw is None:
                current = self._current(conn, c, move.entity_id)
                outcomes[step.index] = step.planned(c.kind).miss(current)
                continue
            outcomes[step.index] = c.row(raw, self.path)
            audits.append(
                _audit_row(c.kind, move.entity_id, move.event, raw[-1], raw[1], audit=move.audit)
            )
        conn.executemany(_AUDIT_INSERT, audits)

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
        audit entries, all in one transaction; entities the guard does not admit are skipped."""
        c = self._compiled(kind)
        if isinstance(entity_ids, str):
            raise TypeError("entity_ids must be a sequence of ids, not one str")
        ids = list(dict.fromkeys(entity_ids))
        for entity_id in ids:
            check_id(entity_id)
        plan = plan_transition(kind, "-", event, expect=expect, changes=changes)
        added = check_increments(kind, increments, changes)
        head, _, tail = _update_sql(plan, c.select_cols).partition(f" WHERE {kind.id_field} = ?")
        for name in added:
            head += f", {name} = {name} + ?"
        rows: dict[str, Row[S]] = {}
        with _Txn(self, "transition_many", savepoint=False):
            conn = self._conn()
            for start in range(0, len(ids), _BULK_CHUNK):
                chunk = ids[start : start + _BULK_CHUNK]
                where = f" WHERE {kind.id_field} IN ({', '.join('?' * len(chunk))})"
                params: list[Any] = [*plan.changes.values(), *added.values(), *chunk]
                params.extend(_params(plan.expect))
                raws = conn.execute(head + where + tail, params).fetchall()
                conn.executemany(
                    _AUDIT_INSERT,
                    [_audit_row(kind, raw[0], event, raw[-1], raw[1], audit=audit) for raw in raws],
                )
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
        clause, params = _where_sql(sources, normalize_where(kind, where))
        inner = f"SELECT {kind.id_field} FROM {kind.table}{clause} ORDER BY {kind.id_field}"
        if limit is not None:
            inner += " LIMIT ?"
            params.append(limit)
        with _Txn(self, "prune"):
            conn = self._conn()
            ids = [
                r[0]
                for r in conn.execute(
                    f"DELETE FROM {kind.table} WHERE {kind.id_field} IN ({inner}) "
                    f"RETURNING {kind.id_field}",
                    params,
                )
            ]
            conn.executemany(
                f"DELETE FROM {_AUDIT_TABLE} WHERE kind = ? AND entity_id = ?",
                [(kind.name, i) for i in ids],
            )
        return len(ids)


def _shape(where: Where) -> tuple[tuple[str, str, bool, int], ...]:
    """What of a condition list decides its SQL text (values are bound, not inlined)."""
    return tuple(
        (col, cmp.op, cmp.value is None, len(cmp.value) if cmp.op == "in" else 1)
        for col, cmp in where
    )


def _learn(kind: EntityKind[Any], plan: TransitionPlan[Any], sql: str) -> _FastUpdate | None:
    """The fast path for a plan's shape, when every value it binds is a plain, non-NULL value of
    a declared field compared by equality (the shape a ledger's writes take)."""
    fields = kind.by_name
    if not all(v is not None for v in plan.changes.values()):
        return None
    for column, cmp in plan.expect:
        if column not in fields or cmp.op != "=" or cmp.value is None:
            return None
    return _FastUpdate(
        sql,
        tuple(fields[name].type for name in plan.changes),
        tuple(fields[col].type for col, _ in plan.expect),
    )


def _params(where: Where) -> list[Any]:
    """The bound values of a condition list, in the order _cmp_sql places them."""
    params: list[Any] = []
    for _, cmp in where:
        if cmp.op == "in":
            params.extend(sorted(cmp.value, key=repr))
        elif cmp.value is not None:
            params.append(cmp.value)
    return params


def _update_sql(plan: TransitionPlan[Any], select_cols: str) -> str:
    """The guarded UPDATE for a plan's shape (values are bound, states inlined)."""
    kind = plan.kind
    targets = set(plan.targets.values())
    if len(targets) == 1:
        sets = [f"state = '{next(iter(targets)).value}'"]
    else:
        cases = " ".join(f"WHEN '{s.value}' THEN '{t.value}'" for s, t in plan.targets.items())
        sets = [f"state = CASE state {cases} END"]
    # Every SET expression reads the old row, so prev_state receives the state being left:
    # the audit entry learns its source without a second read.
    sets += ["fence = fence + 1", "prev_state = state", *(f"{n} = ?" for n in plan.changes)]
    # The id finds the row(s); the state is only a guard. Its unary + keeps SQLite from
    # scanning a partial index on state instead of looking each id up (a bulk IN list would
    # otherwise visit every owed row per statement).
    conditions = [f"{kind.id_field} = ?", f"+state IN ({_literals(plan.targets)})"]
    if plan.fence is not None:
        conditions.append("fence = ?")
    conditions.extend(_conditions_sql(plan.expect)[0])
    return (
        f"UPDATE {kind.table} SET {', '.join(sets)} WHERE {' AND '.join(conditions)} "
        f"RETURNING {select_cols}, prev_state"
    )


_BATCH_PIECE = 64
"""Rows per multi-row statement of a batch (parameters stay well under any SQLite limit)."""

_T = TypeVar("_T")


def _distinct_runs(items: list[_T], key: Callable[[_T], tuple[str, object]]) -> list[list[_T]]:
    """Split ``items`` into consecutive runs of one shape (``key``'s second part) without a
    repeated id (its first part): a later write of the same entity must see the earlier one."""
    runs: list[list[_T]] = []
    ids: set[str] = set()
    shape: object = None
    for item in items:
        entity_id, item_shape = key(item)
        if not runs or entity_id in ids or item_shape != shape or item_shape is None:
            runs.append([])
            ids = set()
            shape = item_shape
        runs[-1].append(item)
        ids.add(entity_id)
    return runs


def _pieces(run: list[_T]) -> list[list[_T]]:
    """A run cut into statements of at most _BATCH_PIECE rows, the largest power of two first
    (statement texts then repeat, and stay cached)."""
    pieces: list[list[_T]] = []
    start = 0
    while start < len(run):
        left = len(run) - start
        size = _BATCH_PIECE if left >= _BATCH_PIECE else 1 << (left.bit_length() - 1)
        pieces.append(run[start : start + size])
        start += size
    return pieces


def _bulk_shape(plan: TransitionPlan[Any]) -> tuple[Any, ...] | None:
    """What a bulk UPDATE of this plan depends on, or None when it must run alone (a
    comparison other than equality)."""
    if any(cmp.op != "=" for _, cmp in plan.expect):
        return None
    return _shape_of(
        plan.event, plan.fence is not None, tuple(plan.changes), tuple(c for c, _ in plan.expect)
    )


def _shape_of(
    event: str, fenced: bool, changed: tuple[str, ...], compared: tuple[str, ...]
) -> tuple[Any, ...]:
    """The one layout of a bulk shape; a bulk row's values follow it (see _bulk_update_sql):
    id, fence when fenced, the changed values, the compared values."""
    return (event, fenced, changed, compared)


def _bulk_update_sql(
    kind: EntityKind[Any], shape: tuple[Any, ...], select_cols: str, rows: int
) -> str:
    """``UPDATE ... FROM (VALUES ...)`` guarding each row by its own values: column1 is the id,
    then the fence (when fenced), the changed values and the compared values, in shape order
    (see _bulk_shape).  Comparisons use IS, which is the store's equality (``= None`` means IS
    NULL)."""
    event, fenced, changed, compared = shape
    moves = kind.lifecycle.moves(event)
    targets = set(moves.values())
    if len(targets) == 1:
        sets = [f"state = '{next(iter(targets)).value}'"]
    else:
        cases = " ".join(f"WHEN '{s.value}' THEN '{t.value}'" for s, t in moves.items())
        sets = [f"state = CASE state {cases} END"]
    sets += ["fence = fence + 1", "prev_state = state"]
    conditions = [f"{kind.id_field} = v.column1", f"+state IN ({_literals(moves)})"]
    column = 2
    if fenced:
        conditions.append(f"fence = v.column{column}")
        column += 1
    for name in changed:
        sets.append(f"{name} = v.column{column}")
        column += 1
    for name in compared:
        conditions.append(f"{name} IS v.column{column}")
        column += 1
    one = f"({', '.join('?' * (column - 1))})"
    return (
        f"UPDATE {kind.table} SET {', '.join(sets)} FROM (VALUES {', '.join([one] * rows)}) AS v "
        f"WHERE {' AND '.join(conditions)} RETURNING {select_cols}, prev_state"
    )


def _check_header(path: str) -> None:
    """Refuse a file that exists, is non-empty and is not a SQLite database."""
    try:
        with open(path, "rb") as fh:
            header = fh.read(len(_SQLITE_MAGIC))
    except FileNotFoundError:
        parent = Path(path).parent
        if not parent.is_dir():
            raise StoreError(f"{path}: directory {parent} does not exist") from None
        return
    except OSError as exc:
        raise StoreError(f"{path}: cannot read: {exc}") from exc
    if header and header != _SQLITE_MAGIC:
        raise StoreError(f"{path}: not a SQLite database")


def _column_sql(f: Field, *, new_table: bool) -> str:
    sql = f"{f.name} {_SQL_TYPES[f.type]}"
    if not f.nullable and (new_table or f.default is not None):
        sql += " NOT NULL"
    if f.default is not None:
        sql += f" DEFAULT {_literal(f.default)}"
    return sql


def _literal(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).replace("'", "''")
    return f"'{text}'"


def _literals(states: Iterable[Enum]) -> str:
    # State values are validated identifiers (see Lifecycle), so inlining them is safe; it is
    # also what lets SQLite prove a query matches a partial index.
    return ", ".join(sorted(f"'{s.value}'" for s in states))


def _conditions_sql(where: Where) -> tuple[list[str], list[Any]]:
    return [_cmp_sql(column, cmp) for column, cmp in where], _params(where)


def _cmp_sql(column: str, cmp: Cmp) -> str:
    if cmp.op == "=" and cmp.value is None:
        return f"{column} IS NULL"
    if cmp.op == "!=" and cmp.value is None:
        return f"{column} IS NOT NULL"
    if cmp.op == "in":
        return f"{column} IN ({', '.join('?' * len(cmp.value))})" if cmp.value else "0"
    return f"{column} {cmp.op} ?"


def _where_sql(states: Iterable[Enum] | None, where: Where) -> tuple[str, list[Any]]:
    parts, params = _conditions_sql(where)
    if states is not None:
        states = list(states)
        parts.insert(0, f"state IN ({_literals(states)})" if states else "0")
    return (" WHERE " + " AND ".join(parts) if parts else ""), params

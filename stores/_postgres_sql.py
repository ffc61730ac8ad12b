"""The SQL text of the PostgreSQL store: every statement it executes, built from a kind or a plan.

This is the store's one SQL seam, as ``stores._sqlite_sql`` is SQLite's: pure functions (no driver
calls, no caches) that return statement text and, where the order of the bound values is part of
the statement, the values in that order.  Values are always bound (``%s``); state names, validated
identifiers, are inlined as sorted literals (one shape, one text; partial indexes usable).  Every
identifier is quoted, so a field may be named like an SQL keyword.  Text columns use the ``"C"``
collation, so ordering and comparisons of text are by code point, as Python compares ``str``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

from statecore.entity import EntityKind, Field
from statecore.lifecycle import Timer
from statecore.store import Cmp, TransitionPlan, Where

__all__ = [
    "AUDIT_DELETE",
    "AUDIT_TABLE",
    "BEGIN",
    "COMMIT",
    "HISTORY",
    "KINDS_TABLE",
    "NOTIFY",
    "READ_KINDS",
    "READ_VERSION",
    "ROLLBACK",
    "VERSION_TABLE",
    "add_field_sql",
    "add_managed_sql",
    "audit_schema_sql",
    "claim_sql",
    "columns_sql",
    "count_sql",
    "create_table_sql",
    "due_sql",
    "fill_entered_sql",
    "get_sql",
    "index_sql",
    "insert_rows_sql",
    "kinds_schema_sql",
    "listen_sql",
    "lock_sql",
    "prune_sql",
    "quote",
    "release_sql",
    "rollback_to_sql",
    "savepoint_sql",
    "select_cols",
    "select_sql",
    "timer_index_sql",
    "update_many_sql",
    "update_params",
    "update_run_sql",
    "update_sql",
    "version_schema_sql",
    "where_params",
    "write_kind_sql",
    "write_version_sql",
]

AUDIT_TABLE = "statecore_audit"
"""The one audit table every kind's moves are recorded in."""
VERSION_TABLE = "statecore_schema"
"""One row: the layout version the tables of this schema were written with."""
KINDS_TABLE = "statecore_kinds"
"""One row per kind registered in this schema: its lifecycle, version and declaration."""

_SQL_TYPES = {str: 'TEXT COLLATE "C"', int: "BIGINT", float: "DOUBLE PRECISION", bool: "BOOLEAN"}
_NOW = "extract(epoch FROM now())::double precision"
_MANAGED = {
    "fence": '"fence" BIGINT NOT NULL DEFAULT 0',
    "prev_state": '"prev_state" TEXT',
    # The ``at`` of the audit entry of the write that last set the state (every write of the
    # store binds it); the default only serves a writer that does not know the column.
    "entered_at": f'"entered_at" DOUBLE PRECISION NOT NULL DEFAULT {_NOW}',
}

BEGIN = "BEGIN"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"


def quote(name: str) -> str:
    """An identifier (already checked by the declaration: no quotes in it) quoted."""
    return f'"{name}"'


def savepoint_sql(depth: int) -> str:
    """Opens the savepoint of a block nested ``depth`` deep."""
    return f"SAVEPOINT sp{depth}"


def release_sql(depth: int) -> str:
    """Keeps the work of the block nested ``depth`` deep."""
    return f"RELEASE SAVEPOINT sp{depth}"


def rollback_to_sql(depth: int) -> str:
    """Undoes the work of the block nested ``depth`` deep (release it afterwards)."""
    return f"ROLLBACK TO SAVEPOINT sp{depth}"


# -- schema -----------------------------------------------------------------------------------


def lock_sql() -> str:
    """Takes the schema's advisory lock until the transaction ends (bound: the schema name):
    creations and migrations of one schema run one at a time, across processes and hosts."""
    return "SELECT pg_advisory_xact_lock(hashtext(%s))"


def version_schema_sql() -> str:
    """The version table, if absent."""
    return f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version INTEGER NOT NULL)"


READ_VERSION = f"SELECT max(version) FROM {VERSION_TABLE}"
"""The layout version recorded (NULL: a new schema)."""


def write_version_sql(version: int) -> tuple[str, str]:
    """Records ``version`` as the layout version (the table keeps one row)."""
    return (f"DELETE FROM {VERSION_TABLE}", f"INSERT INTO {VERSION_TABLE} VALUES ({int(version)})")


def audit_schema_sql() -> tuple[str, str]:
    """The audit table and its index (by kind and entity, in write order), if absent."""
    return (
        f"CREATE TABLE IF NOT EXISTS {AUDIT_TABLE} ("
        "seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, kind TEXT NOT NULL, "
        'entity_id TEXT COLLATE "C" NOT NULL, event TEXT NOT NULL, from_state TEXT, '
        "to_state TEXT NOT NULL, at DOUBLE PRECISION NOT NULL, owner TEXT, attempts BIGINT, "
        "reason TEXT)",
        f"CREATE INDEX IF NOT EXISTS {AUDIT_TABLE}_entity ON {AUDIT_TABLE}(kind, entity_id, seq)",
    )


def kinds_schema_sql() -> str:
    """The catalog of registered kinds, if absent (one row per kind, by name)."""
    return (
        f"CREATE TABLE IF NOT EXISTS {KINDS_TABLE} ("
        'name TEXT COLLATE "C" PRIMARY KEY, lifecycle TEXT NOT NULL, version INTEGER NOT NULL, '
        "declaration TEXT NOT NULL, registered_at DOUBLE PRECISION NOT NULL)"
    )


def write_kind_sql() -> str:
    """Records a registered kind (bound: name, lifecycle name, lifecycle version, declaration
    JSON, time).  An existing row is replaced only when the declaration differs and the version
    is not older than the one recorded: registering an unchanged kind writes nothing, and a
    process running an older declaration does not take the catalog back."""
    return (
        f"INSERT INTO {KINDS_TABLE} AS k (name, lifecycle, version, declaration, registered_at) "
        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET "
        "lifecycle = EXCLUDED.lifecycle, version = EXCLUDED.version, "
        "declaration = EXCLUDED.declaration, registered_at = EXCLUDED.registered_at "
        "WHERE k.declaration IS DISTINCT FROM EXCLUDED.declaration "
        "AND k.version <= EXCLUDED.version"
    )


READ_KINDS = (
    f"SELECT name, lifecycle, version, declaration, registered_at FROM {KINDS_TABLE} ORDER BY name"
)
"""Every recorded kind, by name (code point order)."""


def columns_sql() -> str:
    """The columns a table of the current schema has now (bound: the table's name)."""
    return (
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = %s"
    )


def create_table_sql(kind: EntityKind[Any]) -> str:
    """``kind``'s table: id, state, the managed columns, then one column per field."""
    columns = [
        f'{quote(kind.id_field)} TEXT COLLATE "C" PRIMARY KEY',
        '"state" TEXT NOT NULL',
        *_MANAGED.values(),
        *(_column_sql(f, new_table=True) for f in kind.fields),
    ]
    return f"CREATE TABLE {quote(kind.table)} ({', '.join(columns)})"


def add_managed_sql(kind: EntityKind[Any], column: str) -> str:
    """Adds the managed ``column`` (``fence``, ``prev_state`` or ``entered_at``) to an older
    table (``entered_at``: the time of this statement's transaction in every existing row; fill
    it with :func:`fill_entered_sql` afterwards)."""
    return f"ALTER TABLE {quote(kind.table)} ADD COLUMN IF NOT EXISTS {_MANAGED[column]}"


def fill_entered_sql(kind: EntityKind[Any]) -> str:
    """Sets ``entered_at`` of every row of an older table, just given the column, to the ``at``
    of the row's latest audit entry (a row without one keeps the time the column was added)."""
    table, key = quote(kind.table), quote(kind.id_field)
    latest = (
        f"SELECT a.at FROM {AUDIT_TABLE} a WHERE a.kind = {_literal(kind.name)} "
        f"AND a.entity_id = t.{key} ORDER BY a.seq DESC LIMIT 1"
    )
    return f'UPDATE {table} AS t SET "entered_at" = COALESCE(({latest}), t."entered_at")'


def add_field_sql(kind: EntityKind[Any], field: Field) -> str:
    """Adds a declared field to an older table; existing rows get the field's default."""
    column = _column_sql(field, new_table=False)
    return f"ALTER TABLE {quote(kind.table)} ADD COLUMN IF NOT EXISTS {column}"


def index_sql(kind: EntityKind[Any]) -> list[str]:
    """The declared indexes, if absent; an index over some states only is a partial index."""
    statements = []
    for index in kind.indexes:
        name = f"{kind.table}_{'_'.join(index.fields)}"
        partial = ""
        if index.states:
            name += "_" + "_".join(sorted(s.value for s in index.states))
            partial = f" WHERE state IN ({_literals(index.states)})"
        fields = ", ".join(quote(f) for f in index.fields)
        statements.append(
            f"CREATE INDEX IF NOT EXISTS {quote(name[:63])} ON {quote(kind.table)}({fields})"
            f"{partial}"
        )
    return statements


def timer_index_sql(kind: EntityKind[Any]) -> list[str]:
    """One partial index per timer of ``kind`` (none for a kind without timers), if absent:
    over ``(entered_at, id)`` of the rows in the timer's source state for a fixed duration
    (shared by the fixed timers of one state), over ``(entered_at + field, id)`` for a duration
    a field holds -- so finding due rows is a range scan over due rows only."""
    statements: dict[str, str] = {}
    for timer in kind.lifecycle.timers:
        source = timer.source.value
        name = _index_name(f"{kind.table}_timer_{source}", timer.field)
        statements[name] = (
            f"CREATE INDEX IF NOT EXISTS {quote(name)} ON {quote(kind.table)}"
            f"({_due_expression(timer.field, None)}, {quote(kind.id_field)}) "
            f'WHERE "state" = {_literal(source)}'
        )
    return list(statements.values())


def _index_name(base: str, field: str | None) -> str:
    """An index name of at most 63 characters, distinct for distinct ``base``/``field``."""
    name = base if field is None else f"{base}_{field}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"{name[:54]}_{digest}"


def _due_expression(field: str | None, seconds: str | None) -> str:
    """A timer's due time: entered time plus the field (``field``), else the entered time
    itself (``seconds`` None: the index's key) or plus a bound duration."""
    if field is not None:
        return f'("entered_at" + {quote(field)})'
    return '"entered_at"' if seconds is None else f'("entered_at" + {seconds})'


# -- reads ------------------------------------------------------------------------------------


def select_cols(kind: EntityKind[Any]) -> str:
    """The columns every row is read with: id, state, fence, then the fields in order."""
    names = (kind.id_field, "state", "fence", *(f.name for f in kind.fields))
    return ", ".join(quote(c) for c in names)


def get_sql(kind: EntityKind[Any]) -> str:
    """Reads one entity by id (one bound value)."""
    return f"SELECT {select_cols(kind)} FROM {quote(kind.table)} WHERE {quote(kind.id_field)} = %s"


def select_sql(
    kind: EntityKind[Any],
    states: Iterable[Enum] | None,
    where: Where,
    order_by: str | None,
    limit: int | None,
) -> tuple[str, list[Any]]:
    """Entities in ``states`` (None: any) matching ``where``, ordered by ``order_by`` (NULLs
    first) then id, at most ``limit``; with its bound values."""
    clause, params = _where_sql(states, where)
    order = quote(kind.id_field)
    if order_by is not None:
        order = f"{quote(order_by)} NULLS FIRST, {order}"
    text = f"SELECT {select_cols(kind)} FROM {quote(kind.table)}{clause} ORDER BY {order}"
    if limit is not None:
        text += " LIMIT %s"
        params.append(limit)
    return text, params


def count_sql(
    kind: EntityKind[Any], states: Iterable[Enum] | None, where: Where
) -> tuple[str, list[Any]]:
    """How many entities :func:`select_sql` would read without a limit; with its bound values."""
    clause, params = _where_sql(states, where)
    return f"SELECT count(*) FROM {quote(kind.table)}{clause}", params


def claim_sql(
    kind: EntityKind[Any],
    states: Iterable[Enum] | None,
    where: Where,
    order_by: str | None,
    limit: int | None,
) -> tuple[str, list[Any]]:
    """:func:`select_sql` locking what it returns until the transaction ends, skipping rows
    another transaction holds locked (``FOR UPDATE SKIP LOCKED``): concurrent claimers get
    disjoint rows.  A row changed and committed by another transaction after this statement's
    snapshot is re-checked against the conditions before it is locked (READ COMMITTED), so no
    row that stopped matching is returned -- and following it to its new version is where the
    server may still wait on another transaction's id, which ``stores._postgres_claim`` bounds."""
    text, params = select_sql(kind, states, where, order_by, limit)
    return f"{text} FOR UPDATE SKIP LOCKED", params


def due_sql(
    kind: EntityKind[Any], timer: Timer[Any], now: float, limit: int, *, lock: bool
) -> tuple[str, list[Any]]:
    """The rows of ``kind`` in ``timer.source`` whose due time is at or before ``now`` (a row
    whose duration field is NULL or NaN has none), soonest first then by id, at most ``limit``,
    each read with its entered and due times after the :func:`select_cols`; with its bound
    values.  ``lock``: locking them, skipping rows another transaction holds
    (``FOR UPDATE SKIP LOCKED``, inside a transaction only).

    The scan is the timer's partial index (:func:`timer_index_sql`): for a fixed duration a
    range over ``entered_at`` up to a bound a few ulps above ``now - seconds`` (so that no
    row the exact test ``entered_at + seconds <= now`` admits is missed by rounding), then the
    exact test; the order is by entered time, which is the order of due times.
    """
    table, key = quote(kind.table), quote(kind.id_field)
    where = f'"state" = {_literal(timer.source.value)}'
    if timer.field is not None:
        due = _due_expression(timer.field, None)
        text = (
            f'SELECT {select_cols(kind)}, "entered_at", {due} FROM {table} '
            f"WHERE {where} AND {due} <= %s ORDER BY {due}, {key} LIMIT %s"
        )
        params: list[Any] = [now, limit]
    else:
        seconds = timer.seconds
        assert seconds is not None  # a timer has a field or a fixed duration
        due = _due_expression(None, "%s::double precision")
        bound = now - seconds + 4 * math.ulp(max(abs(now), seconds))
        text = (
            f'SELECT {select_cols(kind)}, "entered_at", {due} FROM {table} '
            f'WHERE {where} AND "entered_at" <= %s AND {due} <= %s '
            f'ORDER BY "entered_at", {key} LIMIT %s'
        )
        params = [seconds, bound, seconds, now, limit]
    if lock:
        text += " FOR UPDATE SKIP LOCKED"
    return text, params


HISTORY = (
    "SELECT event, from_state, to_state, at, owner, attempts, reason "
    f"FROM {AUDIT_TABLE} WHERE kind = %s AND entity_id = %s ORDER BY seq"
)
"""One entity's audit entries, oldest first (bound: kind name, entity id)."""


# -- writes -----------------------------------------------------------------------------------

AUDIT_DELETE = f"DELETE FROM {AUDIT_TABLE} WHERE kind = %s AND entity_id = ANY(%s::text[])"
"""Pruned entities' audit history (bound: kind name, the list of entity ids)."""


def insert_rows_sql(kind: EntityKind[Any], count: int) -> str:
    """Creates ``count`` entities, skipping ids that exist, and returns the rows created
    (bound: the :func:`select_cols` values of each row then its creation's audit time, row
    after row)."""
    one = f"({', '.join(['%s'] * (4 + len(kind.fields)))})"
    cols = select_cols(kind)
    return (
        f'INSERT INTO {quote(kind.table)} ({cols}, "entered_at") '
        f"VALUES {', '.join([one] * count)} "
        f"ON CONFLICT ({quote(kind.id_field)}) DO NOTHING RETURNING {cols}"
    )


def update_sql(plan: TransitionPlan[Any]) -> str:
    """The guarded single-row UPDATE of a plan's shape; bound as :func:`update_params` says.

    It sets the row's ``entered_at`` to the audit time, and returns the row written plus its
    ``prev_state``, or nothing when the guard (id, source states, fence, expected values) does
    not hold.
    """
    return _guarded_update(plan, f"{quote(plan.kind.id_field)} = %s")


def update_params(plan: TransitionPlan[Any], at: float) -> list[Any]:
    """The bound values of :func:`update_sql`: the audit time ``at``, changed values, id, fence
    (when fenced), then the compared values."""
    params: list[Any] = [at, *plan.changes.values(), plan.entity_id]
    if plan.fence is not None:
        params.append(plan.fence)
    params.extend(where_params(plan.expect))
    return params


def update_many_sql(plan: TransitionPlan[Any], increments: Iterable[str]) -> str:
    """The guarded UPDATE of many entities at once (``transition_many``), adding to the
    ``increments`` fields.  Bound: the audit time, changed values, increments, the id list,
    compared values."""
    return _guarded_update(
        plan, f"{quote(plan.kind.id_field)} = ANY(%s::text[])", increments=increments
    )


def prune_sql(
    kind: EntityKind[Any], sources: Iterable[Enum], where: Where, limit: int | None
) -> tuple[str, list[Any]]:
    """Deletes up to ``limit`` entities in the removable ``sources`` states matching ``where``,
    lowest ids first, returning their ids; with its bound values."""
    clause, params = _where_sql(sources, where)
    table, key = quote(kind.table), quote(kind.id_field)
    inner = f"SELECT {key} FROM {table}{clause} ORDER BY {key}"
    if limit is not None:
        inner += " LIMIT %s"
        params.append(limit)
    return f"DELETE FROM {table} WHERE {key} IN ({inner}) RETURNING {key}", params


def where_params(where: Where) -> list[Any]:
    """The bound values of a condition list, in the order its SQL places them."""
    params: list[Any] = []
    for _, cmp in where:
        if cmp.op == "in":
            params.extend(sorted(cmp.value, key=repr))
        elif cmp.value is not None:
            params.append(cmp.value)
    return params


# -- notifications --------------------------------------------------------------------------

NOTIFY = "SELECT pg_notify(%s, %s)"
"""Sends a notification (bound: channel, payload); in a transaction, sent when it commits."""


def listen_sql(channel: str) -> str:
    """Subscribes the connection to ``channel`` (a lower-case identifier, already checked)."""
    return f"LISTEN {quote(channel)}"


# -- pieces -----------------------------------------------------------------------------------


def update_run_sql(plan: TransitionPlan[Any]) -> str:
    """The guarded UPDATE of a run of moves of ``plan``'s shape and compared values
    (``transition_each``), each row found by its id, with its own audit time, (when fenced) its
    own fence and its own changed values, all from bound arrays.  Bound: the arrays of ids,
    audit times, fences (when fenced) and of each changed column's values, then compared
    values; returns as :func:`update_sql`."""
    run = "statecore_run"
    types = {f.name: f.type for f in plan.kind.fields}
    fenced = plan.fence is not None
    # Column names no declared field takes (a field named like them would be ambiguous).
    names = ["statecore_run_id", "statecore_run_at"] + (["statecore_run_fence"] if fenced else [])
    arrays = ["%s::text[]", "%s::float8[]"] + (["%s::bigint[]"] if fenced else [])
    values = []
    for n, name in enumerate(plan.changes):
        names.append(f"statecore_run_v{n}")
        arrays.append(f"%s::{_ARRAY_TYPES[types[name]]}[]")
        values.append(f"{run}.statecore_run_v{n}")
    return _guarded_update(
        plan,
        f"{quote(plan.kind.id_field)} = {run}.statecore_run_id",
        entered=f"{run}.statecore_run_at",
        fence=f"{run}.statecore_run_fence",
        source=f" FROM unnest({', '.join(arrays)}) AS {run}({', '.join(names)})",
        values=values,
    )


_ARRAY_TYPES = {str: "text", int: "bigint", float: "float8", bool: "boolean"}


def _guarded_update(
    plan: TransitionPlan[Any],
    find: str,
    *,
    increments: Iterable[str] = (),
    entered: str = "%s",
    fence: str = "%s",
    source: str = "",
    values: list[str] | None = None,
) -> str:
    kind = plan.kind
    # Every SET expression reads the old row, so prev_state receives the state being left: the
    # audit entry learns its source without a second read.
    sets = [
        _set_state(plan.targets),
        '"fence" = "fence" + 1',
        '"prev_state" = "state"',
        f'"entered_at" = {entered}',
    ]
    bound = values if values is not None else ["%s"] * len(plan.changes)
    sets += [f"{quote(name)} = {value}" for name, value in zip(plan.changes, bound, strict=True)]
    sets += [f"{quote(name)} = {quote(name)} + %s" for name in increments]
    conditions = [find, f'"state" IN ({_literals(plan.targets)})']
    if plan.fence is not None:
        conditions.append(f'"fence" = {fence}')
    conditions.extend(_cmp_sql(column, cmp) for column, cmp in plan.expect)
    return (
        f"UPDATE {quote(kind.table)} SET {', '.join(sets)}{source} "
        f"WHERE {' AND '.join(conditions)} "
        f'RETURNING {select_cols(kind)}, "prev_state"'
    )


def _set_state(moves: Mapping[Enum, Enum]) -> str:
    """The new state: a literal, or a CASE over the source states (sorted, so one shape always
    has one text) when the event moves different sources to different targets."""
    targets = set(moves.values())
    if len(targets) == 1:
        return f"\"state\" = '{next(iter(targets)).value}'"
    cases = " ".join(
        f"WHEN '{s.value}' THEN '{t.value}'"
        for s, t in sorted(moves.items(), key=lambda move: str(move[0].value))
    )
    return f'"state" = CASE "state" {cases} END'


def _column_sql(f: Field, *, new_table: bool) -> str:
    text = f"{quote(f.name)} {_SQL_TYPES[f.type]}"
    if not f.nullable and (new_table or f.default is not None):
        text += " NOT NULL"
    if f.default is not None:
        text += f" DEFAULT {_literal(f.default)}"
    return text


def _literal(value: object) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return f"'{value!r}'::double precision" if isinstance(value, float) else repr(value)
    text = str(value).replace("'", "''")
    return f"'{text}'"


def _literals(states: Iterable[Enum]) -> str:
    return ", ".join(sorted(f"'{s.value}'" for s in states))


def _cmp_sql(column: str, cmp: Cmp) -> str:
    name = quote(column)
    if cmp.op == "=" and cmp.value is None:
        return f"{name} IS NULL"
    if cmp.op == "!=" and cmp.value is None:
        return f"{name} IS NOT NULL"
    if cmp.op == "in":
        return f"{name} IN ({', '.join(['%s'] * len(cmp.value))})" if cmp.value else "FALSE"
    return f"{name} {cmp.op} %s"


def _where_sql(states: Iterable[Enum] | None, where: Where) -> tuple[str, list[Any]]:
    parts = [_cmp_sql(column, cmp) for column, cmp in where]
    if states is not None:
        states = list(states)
        parts.insert(0, f'"state" IN ({_literals(states)})' if states else "FALSE")
    return (" WHERE " + " AND ".join(parts) if parts else ""), where_params(where)

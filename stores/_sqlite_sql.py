"""The SQL text of the SQLite store: every statement it executes on its tables, built from a
kind or a plan.

This is the store's one SQL seam (the pragmas and transaction statements of its connections are
beside it, in ``stores._sqlite_pragmas``).  Its functions are pure (no driver calls, no caches):
given an entity kind, a transition plan or a bulk shape they return the statement text, and,
where the order of the bound values is part of the statement, the values in that order.  The
text is pinned as golden files by ``tests/test_sqlite_sql_golden.py``, so a change to any
statement shows up as a reviewed diff.  The store's speed shortcuts (``stores._sqlite_shortcuts``)
cache this text per kind and shape; they never write SQL of their own.

Values are always bound (``?``).  State names are the exception: they are validated identifiers
(see :class:`~statecore.lifecycle.Lifecycle`), inlined as sorted literals so that SQLite can prove
a query matches the partial indexes a kind declares, and so that the text of one shape is always
the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from typing import Any

from statecore.entity import EntityKind, Field
from statecore.lifecycle import Timer
from statecore.store import Cmp, TransitionPlan, Where

__all__ = [
    "AUDIT_CHAIN_DELETE",
    "AUDIT_COLUMNS",
    "AUDIT_TABLE",
    "MANAGED_COLUMNS",
    "BulkShape",
    "add_field_sql",
    "add_managed_sql",
    "audit_schema_sql",
    "audit_trigger_sql",
    "bulk_row",
    "bulk_shape",
    "bulk_update_sql",
    "count_sql",
    "create_table_sql",
    "due_timers_sql",
    "get_sql",
    "history_sql",
    "index_sql",
    "insert_rows_sql",
    "insert_sql",
    "literal",
    "literals",
    "member_columns",
    "member_values",
    "prune_sql",
    "select_cols",
    "select_sql",
    "table_info_named_sql",
    "table_info_sql",
    "timer_index_sql",
    "update_many_sql",
    "update_params",
    "update_sql",
    "where_params",
]

AUDIT_TABLE = "statecore_audit"
"""The one audit table every kind's moves are recorded in."""

_SQL_TYPES = {str: "TEXT", int: "INTEGER", float: "REAL", bool: "INTEGER"}

# Columns the store manages besides the id and state, as declared when a table is created and
# when an older table lacks them.  fence: bumped by every transition; prev_state: the state a
# transition left, read back by RETURNING for its audit entry; audit_head: the seq of the row's
# latest audit entry (each entry names the one before it: the row's history is that chain).
_MANAGED = {
    "fence": "fence INTEGER NOT NULL DEFAULT 0",
    "prev_state": "prev_state TEXT",
    "audit_head": "audit_head INTEGER",
    "audit_event": "audit_event TEXT",
    "audit_at": "audit_at REAL",
    "audit_owner": "audit_owner TEXT",
    "audit_attempts": "audit_attempts INTEGER",
    "audit_reason": "audit_reason TEXT",
}
MANAGED_COLUMNS = tuple(_MANAGED)
"""The managed columns, in the order a table declares them (a migration adds those missing)."""

AUDIT_COLUMNS = ("audit_event", "audit_at", "audit_owner", "audit_attempts", "audit_reason")
"""The row's copy of its last audit entry: every write sets them, in the same statement, and
the table's triggers copy them into the audit table (see :func:`audit_trigger_sql`).  Bound in
this order: event, at, owner, attempts, reason."""


# -- schema -----------------------------------------------------------------------------------


def audit_schema_sql() -> str:
    """The audit table, if absent: append-only, in write order, with no index besides its
    seq -- each entry names the entity's previous entry (``prev``), and the entity's row names
    its latest (``audit_head``), so that a write appends to the table's last page instead of
    also updating an index at a random place."""
    return (
        f"CREATE TABLE IF NOT EXISTS {AUDIT_TABLE} ("
        "seq INTEGER PRIMARY KEY, prev INTEGER, kind TEXT NOT NULL, entity_id TEXT NOT NULL, "
        "event TEXT NOT NULL, from_state TEXT, to_state TEXT NOT NULL, "
        "at REAL NOT NULL, owner TEXT, attempts INTEGER, reason TEXT)"
    )


def member_columns(kind: EntityKind[Any]) -> dict[frozenset[Enum], str]:
    """The membership columns of ``kind``: one per set of states some partial index covers,
    1 while the row is in one of those states, NULL otherwise.

    The partial index is declared over that column, not over ``state``: SQLite updates an
    index only when a statement sets a column the index reads, and a transition always sets
    ``state`` -- so an index over ``state`` is rewritten by every move, while one over its
    membership column only by the moves that enter or leave the set."""
    columns: dict[frozenset[Enum], str] = {}
    for index in kind.indexes:
        if index.states:
            states = frozenset(index.states)
            columns[states] = "in_" + "_".join(sorted(str(s.value) for s in states))
    return columns


def table_info_sql(kind: EntityKind[Any]) -> str:
    """Lists the columns ``kind``'s table has now (no rows when there is no table)."""
    return table_info_named_sql(kind.table)


def table_info_named_sql(table: str) -> str:
    """Lists the columns the table ``table`` (one of the store's own) has now."""
    return f"PRAGMA table_info({table})"


def create_table_sql(kind: EntityKind[Any]) -> str:
    """``kind``'s table: id, state, the managed and membership columns, then one column per
    field."""
    columns = [
        f"{kind.id_field} TEXT PRIMARY KEY NOT NULL",
        "state TEXT NOT NULL",
        *_MANAGED.values(),
        *(f"{column} INTEGER" for column in member_columns(kind).values()),
        *(_column_sql(f, new_table=True) for f in kind.fields),
    ]
    return f"CREATE TABLE {kind.table} ({', '.join(columns)})"


def add_managed_sql(kind: EntityKind[Any], column: str) -> str:
    """Adds the managed ``column`` (one of :data:`MANAGED_COLUMNS`) to an older table."""
    return f"ALTER TABLE {kind.table} ADD COLUMN {_MANAGED[column]}"


def add_field_sql(kind: EntityKind[Any], field: Field) -> str:
    """Adds a declared field to an older table; existing rows get the field's default."""
    return f"ALTER TABLE {kind.table} ADD COLUMN {_column_sql(field, new_table=False)}"


def audit_trigger_sql(kind: EntityKind[Any]) -> tuple[tuple[str, str], ...]:
    """The triggers that write ``kind``'s audit entries, as (name, ``CREATE TRIGGER`` text):
    after a creation (from state NULL) and after every transition (an UPDATE of ``fence``, which
    only a transition makes), each copying the row's :data:`AUDIT_COLUMNS` and its states and
    chaining the entry to the row's previous one.  A trigger runs inside the statement that
    fired it, so an entry is written exactly when its write is: one statement per write,
    atomic on its own.

    Each write comes in two kinds.  The store's own statements name the entry's seq in the
    row's ``audit_head`` (see :func:`insert_sql`, :func:`update_sql`, :func:`bulk_update_sql`),
    and an insert also sets the row's membership columns (see :func:`member_columns`): their
    trigger only appends the entry.  Any other statement (``transition_many``'s, which moves
    several ids under one guard, or a write from outside the store) leaves them to its trigger,
    which then writes the row a second time.  The store replaces a trigger whose text differs
    from this one when the kind is registered."""
    table, name = kind.table, literal(kind.name)
    columns = "prev, kind, entity_id, event, from_state, to_state, at, owner, attempts, reason"
    new = "NEW.audit_event, {source}, NEW.state, NEW.audit_at, NEW.audit_owner, " + (
        "NEW.audit_attempts, NEW.audit_reason"
    )
    members = "".join(
        f", {column} = CASE WHEN NEW.state IN ({literals(states)}) THEN 1 END"
        for states, column in member_columns(kind).items()
    )
    entry = f"{name}, NEW.{kind.id_field}"
    named = f"INSERT INTO {AUDIT_TABLE} (seq, {columns}) VALUES (NEW.audit_head"
    unnamed = f"INSERT INTO {AUDIT_TABLE} ({columns}) VALUES ("
    head = f"UPDATE {table} SET audit_head = last_insert_rowid()"
    return (
        (
            f"{table}_audit_create",
            f"CREATE TRIGGER {table}_audit_create AFTER INSERT ON {table} "
            f"WHEN NEW.audit_head IS NOT NULL BEGIN {named}, "
            f"NULL, {entry}, {new.format(source='NULL')}); END",
        ),
        (
            f"{table}_audit_create_bare",
            f"CREATE TRIGGER {table}_audit_create_bare AFTER INSERT ON {table} "
            f"WHEN NEW.audit_head IS NULL BEGIN {unnamed}"
            f"NULL, {entry}, {new.format(source='NULL')}); "
            f"{head}{members} WHERE rowid = NEW.rowid; END",
        ),
        (
            f"{table}_audit_move",
            f"CREATE TRIGGER {table}_audit_move AFTER UPDATE OF fence ON {table} "
            f"WHEN NEW.audit_head IS NOT OLD.audit_head BEGIN {named}, "
            f"OLD.audit_head, {entry}, {new.format(source='OLD.state')}); END",
        ),
        (
            f"{table}_audit_move_many",
            f"CREATE TRIGGER {table}_audit_move_many AFTER UPDATE OF fence ON {table} "
            f"WHEN NEW.audit_head IS OLD.audit_head BEGIN {unnamed}"
            f"OLD.audit_head, {entry}, {new.format(source='OLD.state')}); "
            f"{head} WHERE rowid = NEW.rowid; END",
        ),
    )


def index_sql(kind: EntityKind[Any]) -> list[str]:
    """The declared indexes, if absent; an index over some states only is a partial index
    over that set's membership column (see :func:`member_columns`)."""
    members = member_columns(kind)
    statements = []
    for index in kind.indexes:
        name = f"{kind.table}_{'_'.join(index.fields)}"
        partial = ""
        if index.states:
            column = members[frozenset(index.states)]
            name += f"_{column}"
            partial = f" WHERE {column} IS NOT NULL"
        statements.append(
            f"CREATE INDEX IF NOT EXISTS {name} ON {kind.table}({', '.join(index.fields)}){partial}"
        )
    return statements


def timer_index_sql(kind: EntityKind[Any]) -> list[str]:
    """The indexes of ``kind``'s timers, if absent (none without timers): per source state a
    partial index over the entered time and id ``WHERE state = '<source>'`` (for a field
    timer over ``audit_at + <field>``), which :func:`due_timers_sql` scans as a range."""
    statements: dict[str, str] = {}
    for timer in kind.lifecycle.timers:
        source = str(timer.source.value)
        name = f"{kind.table}_timer_{source}" + (f"_{timer.field}" if timer.field else "")
        statements[name] = (
            f"CREATE INDEX IF NOT EXISTS {name} ON {kind.table}"
            f"({_entered_plus(timer)}, {kind.id_field}) WHERE state = {literal(source)}"
        )
    return list(statements.values())


def _entered_plus(timer: Timer[Any]) -> str:
    return "audit_at" if timer.field is None else f"audit_at + {timer.field}"


# -- reads ------------------------------------------------------------------------------------


def select_cols(kind: EntityKind[Any]) -> str:
    """The columns every row is read with: id, state, fence, then the fields in order."""
    return ", ".join((kind.id_field, "state", "fence", *(f.name for f in kind.fields)))


def get_sql(kind: EntityKind[Any]) -> str:
    """Reads one entity by id (one bound value)."""
    return f"SELECT {select_cols(kind)} FROM {kind.table} WHERE {kind.id_field} = ?"


def select_sql(
    kind: EntityKind[Any],
    states: Iterable[Enum] | None,
    where: Where,
    order_by: str | None,
    limit: int | None,
) -> tuple[str, list[Any]]:
    """Entities in ``states`` (None: any) matching ``where``, ordered by ``order_by`` (NULLs
    first, SQLite's order) then id, at most ``limit``; with its bound values."""
    clause, params = _where_sql(kind, states, where)
    order = kind.id_field if order_by is None else f"{order_by}, {kind.id_field}"
    sql = f"SELECT {select_cols(kind)} FROM {kind.table}{clause} ORDER BY {order}"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return sql, params


def count_sql(
    kind: EntityKind[Any], states: Iterable[Enum] | None, where: Where
) -> tuple[str, list[Any]]:
    """How many entities :func:`select_sql` would read without a limit; with its bound values."""
    clause, params = _where_sql(kind, states, where)
    return f"SELECT COUNT(*) FROM {kind.table}{clause}", params


def history_sql(kind: EntityKind[Any]) -> str:
    """One entity's audit entries, oldest first: its chain, from the row's ``audit_head``
    back (bound: entity id, kind name)."""
    return (
        f"WITH RECURSIVE chain(seq) AS (SELECT audit_head FROM {kind.table} "
        f"WHERE {kind.id_field} = ?1 UNION ALL SELECT a.prev FROM {AUDIT_TABLE} AS a "
        "JOIN chain ON a.seq = chain.seq WHERE a.prev IS NOT NULL) "
        "SELECT event, from_state, to_state, at, owner, attempts, reason "
        f"FROM {AUDIT_TABLE} WHERE seq IN (SELECT seq FROM chain) "
        "AND kind = ?2 AND entity_id = ?1 ORDER BY seq"
    )


def due_timers_sql(kind: EntityKind[Any], timer: Timer[Any], *, bounded: bool) -> str:
    """The due rows of ``timer``, soonest first, then by id: the :func:`select_cols`, the
    entered and the due time.  Bound: the limit, after (when ``bounded``) ``now`` -- for a
    fixed duration after the index bound too, ``now`` less the duration rounded up: it
    finds the range, the exact ``audit_at + duration <= now`` decides.  A NULL field: none."""
    entered = _entered_plus(timer)
    source = literal(str(timer.source.value))
    if timer.field is None:
        due = f"audit_at + {literal(float(timer.after))}"
        find = "audit_at <= ? AND " + due + " <= ?" if bounded else "audit_at IS NOT NULL"
    else:
        due = entered
        find = f"{entered} <= ?" if bounded else f"{entered} IS NOT NULL"
    return (
        f"SELECT {select_cols(kind)}, audit_at, {due} FROM {kind.table} "
        f"WHERE state = {source} AND {find} ORDER BY {entered}, {kind.id_field} LIMIT ?"
    )


# -- writes -----------------------------------------------------------------------------------

AUDIT_CHAIN_DELETE = (
    f"WITH RECURSIVE chain(seq) AS (SELECT ? UNION ALL SELECT a.prev FROM {AUDIT_TABLE} AS a "
    "JOIN chain ON a.seq = chain.seq WHERE a.prev IS NOT NULL) "
    f"DELETE FROM {AUDIT_TABLE} WHERE seq IN (SELECT seq FROM chain)"
)
"""A pruned entity's audit history: its chain (bound: the row's ``audit_head``)."""


def insert_sql(kind: EntityKind[Any]) -> str:
    """Creates one entity unless its id exists.  Bound: the :func:`select_cols` values, the
    :data:`AUDIT_COLUMNS` values, then the membership columns' values (see
    :func:`member_values`).  The row names its audit entry's seq, the next after the audit
    table's last, and its trigger appends the entry (see :func:`audit_trigger_sql`)."""
    return (
        f"INSERT INTO {kind.table} ({_insert_cols(kind)}) "
        f"VALUES ({_insert_row(kind, _seq_after_last(1))}) "
        f"ON CONFLICT({kind.id_field}) DO NOTHING"
    )


def insert_rows_sql(kind: EntityKind[Any], count: int) -> str:
    """Creates ``count`` entities, skipping ids that exist, and returns the ids created (each
    row bound as :func:`insert_sql` binds one; the n-th names the seq n after the audit
    table's last)."""
    rows = ", ".join(f"({_insert_row(kind, _seq_after_last(n))})" for n in range(1, count + 1))
    return (
        f"INSERT INTO {kind.table} ({_insert_cols(kind)}) VALUES {rows} "
        f"ON CONFLICT({kind.id_field}) DO NOTHING RETURNING {kind.id_field}"
    )


def member_values(kind: EntityKind[Any], state: Enum) -> tuple[int | None, ...]:
    """The membership columns' values of a row created in ``state``, in the order
    :func:`member_columns` lists them (1 inside the column's set, None outside)."""
    return tuple(1 if state in states else None for states in member_columns(kind))


def _insert_cols(kind: EntityKind[Any]) -> str:
    members = member_columns(kind).values()
    return ", ".join((select_cols(kind), *AUDIT_COLUMNS, "audit_head", *members))


def _insert_row(kind: EntityKind[Any], head: str) -> str:
    bound = 3 + len(kind.fields) + len(AUDIT_COLUMNS)
    return ", ".join(["?"] * bound + [head] + ["?"] * len(member_columns(kind)))


def _seq_after_last(offset: int | str) -> str:
    """The audit seq ``offset`` after the table's last (what SQLite itself would pick next, for
    1; one writer at a time): a row's ``audit_head`` names its entry's seq before the trigger
    writes it.  The rows of one statement each have their own offset: whether the subquery runs
    once per statement or once per row (after the entries of the rows before), they name
    distinct seqs, each after every entry written before it."""
    return f"(SELECT IFNULL(MAX(seq), 0) FROM {AUDIT_TABLE}) + {offset}"


def update_sql(plan: TransitionPlan[Any]) -> str:
    """The guarded single-row UPDATE of a plan's shape; bound as :func:`update_params` says.

    It returns the row written plus its ``prev_state``, or nothing when the guard (id, source
    states, fence, expected values) does not hold.
    """
    return _guarded_update(plan, f"{plan.kind.id_field} = ?", head=True)


def proved_update_sql(plan: TransitionPlan[Any], compared: Sequence[str]) -> str:
    """:func:`update_sql` returning nothing, and also requiring the row to be exactly one the
    writer knows: its state, its fence and each of ``compared`` (``IS``).  Bound: as
    :func:`update_params`, then the known state, fence and ``compared`` values."""
    text, _, _ = update_sql(plan).partition(" RETURNING ")
    return text + " AND +state = ? AND fence = ?" + "".join(f" AND {c} IS ?" for c in compared)


def update_params(plan: TransitionPlan[Any], audit: Sequence[Any]) -> list[Any]:
    """The bound values of :func:`update_sql`: changed values, the audit values (see
    :data:`AUDIT_COLUMNS`), id, fence (when fenced), then the compared values."""
    params: list[Any] = [*plan.changes.values(), *audit, plan.entity_id]
    if plan.fence is not None:
        params.append(plan.fence)
    params.extend(where_params(plan.expect))
    return params


def update_many_sql(plan: TransitionPlan[Any], increments: Iterable[str], ids: int) -> str:
    """The guarded UPDATE of ``ids`` entities at once (``transition_many``), adding to the
    ``increments`` fields.  Bound: changed values, increments, the audit values, the ids, the
    compared values."""
    return _guarded_update(
        plan, f"{plan.kind.id_field} IN ({', '.join('?' * ids)})", increments=increments
    )


BulkShape = tuple[str, bool, tuple[str, ...], tuple[str, ...]]
"""What a bulk UPDATE's text depends on: (event, fenced?, changed fields, compared fields)."""


def bulk_shape(plan: TransitionPlan[Any]) -> BulkShape | None:
    """The bulk shape a plan's move may share a statement under, or None when it must run alone
    (it compares other than by equality)."""
    if any(cmp.op != "=" for _, cmp in plan.expect):
        return None
    return (
        plan.event,
        plan.fence is not None,
        tuple(plan.changes),
        tuple(c for c, _ in plan.expect),
    )


def bulk_row(plan: TransitionPlan[Any], audit: Sequence[Any]) -> list[Any]:
    """A plan's row of :func:`bulk_update_sql`: id, fence (when fenced), the changed values, the
    audit values, the compared values."""
    row: list[Any] = [plan.entity_id]
    if plan.fence is not None:
        row.append(plan.fence)
    row.extend(plan.changes.values())
    row.extend(audit)
    row.extend(cmp.value for _, cmp in plan.expect)
    return row


def bulk_update_sql(kind: EntityKind[Any], shape: BulkShape, rows: int) -> str:
    """``UPDATE ... FROM (VALUES ...) RETURNING`` moving ``rows`` distinct entities of one shape.

    Each row is guarded by its own values, exactly as its own :func:`update_sql` would be: column1
    is the id, then the fence (when fenced), the changed values and the compared values, in shape
    order (see :func:`bulk_row`), and last the row's ordinal (a literal).  Comparisons use IS,
    which is the store's equality (``= None`` means IS NULL).
    """
    event, fenced, changed, compared = shape
    moves = kind.lifecycle.moves(event)
    sets = [
        _set_state(moves),
        *_set_members(kind, moves),
        "fence = fence + 1",
        "prev_state = state",
    ]
    conditions = [f"{kind.id_field} = v.column1", f"+state IN ({literals(moves)})"]
    column = 2
    if fenced:
        conditions.append(f"fence = v.column{column}")
        column += 1
    for name in (*changed, *AUDIT_COLUMNS):
        sets.append(f"{name} = v.column{column}")
        column += 1
    for name in compared:
        conditions.append(f"{name} IS v.column{column}")
        column += 1
    # Each row's audit entry gets the seq its ordinal (inlined as the last column) after the
    # table's last, so the trigger need not write the row again (see audit_trigger_sql).
    sets.append(f"audit_head = {_seq_after_last(f'v.column{column}')}")
    bound = ", ".join("?" * (column - 1))
    values = ", ".join(f"({bound}, {n})" for n in range(1, rows + 1))
    return (
        f"UPDATE {kind.table} SET {', '.join(sets)} FROM (VALUES {values}) AS v "
        f"WHERE {' AND '.join(conditions)} RETURNING {select_cols(kind)}, prev_state"
    )


def prune_sql(
    kind: EntityKind[Any], sources: Iterable[Enum], where: Where, limit: int | None
) -> tuple[str, list[Any]]:
    """Deletes up to ``limit`` entities in the removable ``sources`` states matching ``where``,
    lowest ids first, returning their ids and audit heads; with its bound values."""
    clause, params = _where_sql(kind, sources, where)
    inner = f"SELECT {kind.id_field} FROM {kind.table}{clause} ORDER BY {kind.id_field}"
    if limit is not None:
        inner += " LIMIT ?"
        params.append(limit)
    sql = (
        f"DELETE FROM {kind.table} WHERE {kind.id_field} IN ({inner}) "
        f"RETURNING {kind.id_field}, audit_head"
    )
    return sql, params


def where_params(where: Where) -> list[Any]:
    """The bound values of a condition list, in the order its SQL places them."""
    params: list[Any] = []
    for _, cmp in where:
        if cmp.op == "in":
            params.extend(sorted(cmp.value, key=repr))
        elif cmp.value is not None:
            params.append(cmp.value)
    return params


# -- pieces -----------------------------------------------------------------------------------


def _guarded_update(
    plan: TransitionPlan[Any], find: str, *, increments: Iterable[str] = (), head: bool = False
) -> str:
    kind = plan.kind
    # Every SET expression reads the old row, so prev_state receives the state being left: the
    # audit entry learns its source without a second read.
    sets = [_set_state(plan.targets), *_set_members(kind, plan.targets)]
    sets += ["fence = fence + 1", "prev_state = state"]
    if head:  # one row: it names its audit entry's seq (see audit_trigger_sql)
        sets.append(f"audit_head = {_seq_after_last(1)}")
    sets += [f"{name} = ?" for name in plan.changes]
    sets += [f"{name} = {name} + ?" for name in increments]
    sets += [f"{name} = ?" for name in AUDIT_COLUMNS]  # read by the audit trigger
    # The id finds the row(s); the state is only a guard.  Its unary + keeps SQLite from
    # scanning a partial index on state instead of looking each id up (a bulk IN list would
    # otherwise visit every owed row per statement).
    conditions = [find, f"+state IN ({literals(plan.targets)})"]
    if plan.fence is not None:
        conditions.append("fence = ?")
    conditions.extend(_cmp_sql(column, cmp) for column, cmp in plan.expect)
    return (
        f"UPDATE {kind.table} SET {', '.join(sets)} WHERE {' AND '.join(conditions)} "
        f"RETURNING {select_cols(kind)}, prev_state"
    )


def _set_state(moves: Mapping[Enum, Enum]) -> str:
    """The new state: a literal, or a CASE over the source states (sorted, so one shape always
    has one text) when the event moves different sources to different targets."""
    targets = set(moves.values())
    if len(targets) == 1:
        return f"state = '{next(iter(targets)).value}'"
    cases = " ".join(
        f"WHEN '{s.value}' THEN '{t.value}'"
        for s, t in sorted(moves.items(), key=lambda move: str(move[0].value))
    )
    return f"state = CASE state {cases} END"


def _set_members(kind: EntityKind[Any], moves: Mapping[Enum, Enum]) -> list[str]:
    """The membership columns a move changes: set only when some source enters or leaves the
    column's set of states (a literal when every source does alike, else a CASE over the
    source states), so that the move rewrites no index it leaves as it was."""
    sets = []
    for states, column in member_columns(kind).items():
        changed = {s: t in states for s, t in moves.items() if (s in states) != (t in states)}
        if not changed:
            continue
        values = set(changed.values())
        if len(changed) == len(moves) and len(values) == 1:
            sets.append(f"{column} = {'1' if values.pop() else 'NULL'}")
            continue
        cases = " ".join(
            f"WHEN '{s.value}' THEN {'1' if inside else 'NULL'}"
            for s, inside in sorted(changed.items(), key=lambda item: str(item[0].value))
        )
        sets.append(f"{column} = CASE state {cases} ELSE {column} END")
    return sets


def _column_sql(f: Field, *, new_table: bool) -> str:
    sql = f"{f.name} {_SQL_TYPES[f.type]}"
    if not f.nullable and (new_table or f.default is not None):
        sql += " NOT NULL"
    if f.default is not None:
        sql += f" DEFAULT {literal(f.default)}"
    return sql


def literal(value: object) -> str:
    """A value as an SQL literal (text quoted; for names and defaults the store declares)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).replace("'", "''")
    return f"'{text}'"


def literals(states: Iterable[Enum]) -> str:
    """States as a sorted list of SQL literals (one set, one text)."""
    return ", ".join(sorted(f"'{s.value}'" for s in states))


def _cmp_sql(column: str, cmp: Cmp) -> str:
    if cmp.op == "=" and cmp.value is None:
        return f"{column} IS NULL"
    if cmp.op == "!=" and cmp.value is None:
        return f"{column} IS NOT NULL"
    if cmp.op == "in":
        return f"{column} IN ({', '.join('?' * len(cmp.value))})" if cmp.value else "0"
    return f"{column} {cmp.op} ?"


def _where_sql(
    kind: EntityKind[Any], states: Iterable[Enum] | None, where: Where
) -> tuple[str, list[Any]]:
    parts = [_cmp_sql(column, cmp) for column, cmp in where]
    if states is not None:
        states = list(states)
        parts.insert(0, f"state IN ({literals(states)})" if states else "0")
        # Within a membership set: say so, so that the planner may use its partial indexes.
        wanted = set(states)
        for member_states, column in sorted(member_columns(kind).items(), key=lambda m: m[1]):
            if wanted and wanted <= member_states:
                parts.insert(1, f"{column} IS NOT NULL")
    return (" WHERE " + " AND ".join(parts) if parts else ""), where_params(where)

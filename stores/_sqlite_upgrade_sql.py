"""The SQL of the SQLite store's bookkeeping at open and at register(), never on a write's
path: part of the store's SQL seam (``stores._sqlite_sql``), kept apart because it runs once
per file or per registration, and pinned by the same golden files.

* The catalog of the kinds registered with a file (:data:`KINDS_TABLE`).
* The upgrade of a file written by an older layout of the store (schema versions 1 and 2) to
  the current one (a version 3 file differs only by its creation triggers, which the store
  replaces as it does any trigger whose text is not the current one).

The current layout chains each entity's audit entries (the audit table has no secondary index)
and declares partial indexes over membership columns (see
:func:`stores._sqlite_sql.member_columns`).  An older file has an audit table indexed by kind,
entity and seq, partial indexes over ``state`` and neither ``audit_head`` nor membership
columns; these statements chain its audit table once, at open, and bring each table up to date
when its kind is registered, every history kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from statecore.entity import EntityKind
from stores._sqlite_sql import AUDIT_TABLE, literal, literals, member_columns

__all__ = [
    "AUDIT_HEADS",
    "AUDIT_LAST",
    "KINDS_ALL",
    "KINDS_SCHEMA",
    "KINDS_TABLE",
    "KIND_DECLARATION",
    "KIND_RECORD",
    "KIND_UPSERT",
    "OLD_PARTIAL_INDEXES",
    "STALE_MARK",
    "TRIGGER_TEXT",
    "add_member_sql",
    "audit_chain_sql",
    "drop_index_sql",
    "drop_trigger_sql",
    "entered_at_sql",
    "heads_sql",
    "migrate_sql",
    "states_sql",
    "version_trigger_sql",
]

KINDS_TABLE = "statecore_kinds"
"""The catalog of registered kinds: name, lifecycle, version, declaration (JSON of
:func:`statecore.catalog.declaration_json`), when last (re)declared."""

KINDS_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {KINDS_TABLE} (name TEXT PRIMARY KEY, lifecycle TEXT, "
    "version INTEGER, declaration TEXT, registered_at REAL)"
)
KIND_RECORD = (
    f"SELECT name, lifecycle, version, declaration, registered_at FROM {KINDS_TABLE} WHERE name = ?"
)
"""A kind's catalog row (bound: its name; no row when never registered)."""

KIND_DECLARATION = f"SELECT declaration FROM {KINDS_TABLE} WHERE name = ?"
"""A kind's recorded declaration (bound: its name; no row when never registered)."""

KIND_UPSERT = (
    f"INSERT INTO {KINDS_TABLE} (name, lifecycle, version, declaration, registered_at) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET lifecycle = excluded.lifecycle, "
    "version = excluded.version, declaration = excluded.declaration, "
    "registered_at = excluded.registered_at"
)
"""Records a kind, replacing its record (bound: the columns in :data:`KINDS_TABLE` order)."""

KINDS_ALL = f"SELECT name, lifecycle, version, declaration, registered_at FROM {KINDS_TABLE}"
KINDS_ALL += " ORDER BY name"


AUDIT_HEADS = "statecore_audit_heads"
"""While a file written before the chains is being upgraded: each entity's latest entry, read
once from the old index so that each kind's rows can be given their ``audit_head`` when the
kind is registered (then its rows leave this table)."""


def audit_chain_sql() -> tuple[str, ...]:
    """Turns an audit table of the older layout (indexed by kind, entity and seq, no chain)
    into chains: every entry gets its ``prev``, the latest entry of each entity is noted in
    :data:`AUDIT_HEADS`, and the old index goes.  Run once, when the table lacks ``prev``."""
    return (
        f"ALTER TABLE {AUDIT_TABLE} ADD COLUMN prev INTEGER",
        f"UPDATE {AUDIT_TABLE} SET prev = (SELECT MAX(b.seq) FROM {AUDIT_TABLE} AS b "
        f"WHERE b.kind = {AUDIT_TABLE}.kind AND b.entity_id = {AUDIT_TABLE}.entity_id "
        f"AND b.seq < {AUDIT_TABLE}.seq)",
        f"CREATE TABLE IF NOT EXISTS {AUDIT_HEADS} (kind TEXT NOT NULL, entity_id TEXT NOT NULL, "
        "head INTEGER NOT NULL, PRIMARY KEY (kind, entity_id)) WITHOUT ROWID",
        f"INSERT OR REPLACE INTO {AUDIT_HEADS} (kind, entity_id, head) "
        f"SELECT kind, entity_id, MAX(seq) FROM {AUDIT_TABLE} GROUP BY kind, entity_id",
        f"DROP INDEX IF EXISTS {AUDIT_TABLE}_entity",
    )


def heads_sql(kind: EntityKind[Any]) -> tuple[str, str]:
    """Gives the rows of an upgraded table of ``kind`` their ``audit_head`` from
    :data:`AUDIT_HEADS`, then forgets those heads."""
    name = literal(kind.name)
    return (
        f"UPDATE {kind.table} SET audit_head = (SELECT h.head FROM {AUDIT_HEADS} AS h "
        f"WHERE h.kind = {name} AND h.entity_id = {kind.table}.{kind.id_field}) "
        "WHERE audit_head IS NULL",
        f"DELETE FROM {AUDIT_HEADS} WHERE kind = {name}",
    )


def entered_at_sql(kind: EntityKind[Any]) -> str:
    """Gives the rows of an older table of ``kind`` that has just gained ``audit_at`` their
    entered time (what a timer counts from): the ``at`` of the audit entry at their head."""
    return (
        f"UPDATE {kind.table} SET audit_at = (SELECT a.at FROM {AUDIT_TABLE} AS a "
        f"WHERE a.seq = {kind.table}.audit_head) "
        "WHERE audit_at IS NULL AND audit_head IS NOT NULL"
    )


def add_member_sql(kind: EntityKind[Any], states: frozenset[Enum], column: str) -> tuple[str, str]:
    """Adds a membership column to an older table and fills it from the rows' states."""
    return (
        f"ALTER TABLE {kind.table} ADD COLUMN {column} INTEGER",
        f"UPDATE {kind.table} SET {column} = 1 WHERE state IN ({literals(states)})",
    )


OLD_PARTIAL_INDEXES = (
    "SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = ? "
    "AND sql LIKE '% WHERE state IN (%'"
)
"""The partial indexes over ``state`` an older layout declared on a table (bound: the table):
this layout replaces them with indexes over membership columns."""


def drop_index_sql(name: str) -> str:
    """Drops an index of an older layout (a name read from the schema)."""
    return f'DROP INDEX IF EXISTS "{name}"'


TRIGGER_TEXT = "SELECT sql FROM sqlite_schema WHERE type = 'trigger' AND name = ?"
"""The text a trigger was created with (bound: its name; no row when there is none): a
trigger of an older layout is found by its text differing from the current one."""


def drop_trigger_sql(name: str) -> str:
    """Drops a trigger of an older layout (a name from
    :func:`stores._sqlite_sql.audit_trigger_sql`), to be created again as it is now."""
    return f"DROP TRIGGER IF EXISTS {name}"


# -- versioned lifecycles (see stores._versions) -----------------------------------------------

STALE_MARK = "statecore: stale lifecycle "
"""How a version trigger's refusal begins (then ``<lifecycle>@<version>``): the store reads
it back as :class:`~statecore.errors.StaleVersion` (see ``stores._sqlite_conn``)."""

AUDIT_LAST = f"SELECT COALESCE(MAX(seq), 0) FROM {AUDIT_TABLE}"
"""The audit table's last seq (0 when empty): entries after it were written since."""


def states_sql(kind: EntityKind[Any]) -> str:
    """The distinct states ``kind``'s rows are in (persisted values)."""
    return f"SELECT DISTINCT state FROM {kind.table}"


def migrate_sql(
    kind: EntityKind[Any], moves: Mapping[str, Enum], reasons: Mapping[str, str]
) -> tuple[str, str]:
    """The two statements migrating ``kind``'s rows: every row in an old state (a key of
    ``moves``) moves to its new state, its fence + 1, its membership columns set for the new
    state and its audit columns to a migration's (bound: event, at, owner; the reason per old
    state from ``reasons``) -- the table's trigger appends each row's audit entry and chains
    it.  The second gives each moved row back its entered time (the ``at`` of the entry before
    the migration's; bound: the audit table's last seq before the first statement)."""
    olds = sorted(moves)
    new = " ".join(f"WHEN {literal(o)} THEN {literal(moves[o].value)}" for o in olds)
    why = " ".join(f"WHEN {literal(o)} THEN {literal(reasons[o])}" for o in olds)
    sets = [f"state = CASE state {new} END", "fence = fence + 1", "prev_state = state"]
    for states, column in member_columns(kind).items():
        inside = [literal(o) for o in olds if moves[o] in states]
        sets.append(
            f"{column} = CASE WHEN state IN ({', '.join(inside)}) THEN 1 END"
            if inside
            else f"{column} = NULL"
        )
    sets += ["audit_event = ?", "audit_at = ?", "audit_owner = ?", "audit_attempts = NULL"]
    sets.append(f"audit_reason = CASE state {why} END")
    table = kind.table
    targets = literals(set(moves.values()))
    return (
        f"UPDATE {table} SET {', '.join(sets)} WHERE state IN ({', '.join(map(literal, olds))})",
        f"UPDATE {table} SET audit_at = COALESCE((SELECT p.at FROM {AUDIT_TABLE} AS m "
        f"JOIN {AUDIT_TABLE} AS p ON p.seq = m.prev WHERE m.seq = {table}.audit_head), audit_at) "
        f"WHERE audit_head > ? AND state IN ({targets})",
    )


def version_trigger_sql(kind: EntityKind[Any]) -> tuple[tuple[str, str], ...]:
    """The triggers refusing a write of a state ``kind``'s lifecycle does not declare (a
    process still on an older version), as (name, ``CREATE TRIGGER`` text): none for a
    version 1 lifecycle, which therefore pays nothing."""
    lifecycle = kind.lifecycle
    if lifecycle.version < 2:
        return ()
    table, states = kind.table, literals(lifecycle.states)
    refusal = literal(f"{STALE_MARK}{lifecycle.name}@{lifecycle.version}")
    return tuple(
        (
            f"{table}_version_{name}",
            f"CREATE TRIGGER {table}_version_{name} BEFORE {event} ON {table} "
            f"WHEN NEW.state NOT IN ({states}) BEGIN SELECT RAISE(ABORT, {refusal}); END",
        )
        for name, event in (("insert", "INSERT"), ("update", "UPDATE OF state"))
    )

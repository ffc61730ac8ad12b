"""What the PostgreSQL store's register() does about a kind's lifecycle version, in register()'s
transaction and under the schema's advisory lock (:func:`register_kind`):

* read the kind's catalog record and the distinct states its table holds, and decide with
  :func:`stores._versions.plan_versions` -- a ``StaleVersion`` (the schema holds a newer
  version) or ``MigrationError`` (states nothing maps) propagates before anything is written;
* move the rows of every old state to its new state in one statement that also bumps each moved
  row's fence by 1 and writes one ``migrate`` audit entry per row (owner
  :data:`~stores._versions.MIGRATION_OWNER`, at the registration's wall time).  A moved row
  keeps its ``entered_at`` (its timers still count from when it entered the state it had);
* for a lifecycle of version 2 or later, (re)place the named CHECK constraint
  ``statecore_states_v<N>`` (``state IN (...)`` of version N) on the kind's table, so that a
  process still running an older declaration cannot write a state version N does not declare:
  the server's refusal reaches that process as ``StaleVersion`` (``stores._postgres_conn``).
  A version-1 kind gets no constraint and its writes no extra cost;
* record the kind in the ``statecore_kinds`` catalog.

Statement texts of these steps are here, beside the only code that runs them (at registration
only); those of the rest of the store are in ``stores._postgres_sql``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg

import stores._postgres_sql as sql
from statecore.entity import EntityKind
from statecore.store import KindRecord
from stores._versions import (
    MIGRATE_EVENT,
    MIGRATION_OWNER,
    VersionPlan,
    migration_reason,
    plan_versions,
)

__all__ = ["CONSTRAINT", "register_kind", "stored_version"]

Conn = psycopg.Connection[Any]

CONSTRAINT = "statecore_states_v"
"""The prefix of the CHECK constraint a kind of version >= 2 gets (the version follows)."""

READ_RECORD = (
    f"SELECT name, lifecycle, version, declaration, registered_at FROM {sql.KINDS_TABLE} "
    "WHERE name = %s"
)
"""One kind's catalog row (bound: its name)."""

READ_STORED_VERSION = f"SELECT version FROM {sql.KINDS_TABLE} WHERE name = %s"
"""The lifecycle version recorded for a kind (bound: its name)."""

CONSTRAINTS = (
    "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(%s) AND contype = 'c' "
    f"AND conname LIKE '{CONSTRAINT}%%' ORDER BY conname"
)
"""The names of the version constraints of a table (bound: its quoted name)."""


def register_kind(
    conn: Conn,
    kind: EntityKind[Any],
    schema: str | None,
    record: tuple[Any, ...],
    upgrade: Callable[[set[str]], list[str]],
) -> None:
    """Create or upgrade ``kind``'s table (``upgrade(columns it has)``: the statements adding
    what an older table lacks), its indexes, migrate its rows to the lifecycle's version, place
    its version constraint and record it (``record``: the parameters of
    :func:`~stores._postgres_sql.write_kind_sql`; its time is the migration entries' ``at``).
    The caller must run this in one transaction.  Raises ``StaleVersion`` or
    ``MigrationError`` before any write; psycopg errors as the server reports them."""
    conn.execute(sql.lock_sql(), (schema or "",))
    have = {r[0] for r in conn.execute(sql.columns_sql(), (kind.table,))}
    raw = conn.execute(READ_RECORD, (kind.name,)).fetchone()
    stored = None
    if raw is not None:
        name, lifecycle, version, declaration, at = raw
        stored = KindRecord(name, lifecycle, int(version), json.loads(declaration), float(at))
    present = [r[0] for r in conn.execute(_distinct_sql(kind))] if have else []
    plan = plan_versions(kind, stored, present)  # raises before anything is written
    statements = [sql.create_table_sql(kind)] if not have else upgrade(have)
    if have and "entered_at" not in have:
        statements.append(sql.fill_entered_sql(kind))
    for statement in (*statements, *sql.index_sql(kind), *sql.timer_index_sql(kind)):
        conn.execute(statement)
    if plan.moves:
        text, params = _migrate_sql(kind, plan, float(record[4]))
        conn.execute(text, params)
    if kind.lifecycle.version >= 2:
        _constrain(conn, kind, None if raw is None else raw[3], record[3])
    conn.execute(sql.write_kind_sql(), record)


def _distinct_sql(kind: EntityKind[Any]) -> str:
    return f'SELECT DISTINCT "state" FROM {sql.quote(kind.table)}'


def _migrate_sql(kind: EntityKind[Any], plan: VersionPlan, at: float) -> tuple[str, list[Any]]:
    """One statement: every row in an old state moved to its new state (fence + 1, prev_state
    the old value, entered_at kept), and one audit entry per moved row, in id order."""
    table, key = sql.quote(kind.table), sql.quote(kind.id_field)
    olds = sorted(plan.moves)
    states = " ".join("WHEN %s THEN %s" for _ in olds)
    reasons = " ".join("WHEN %s THEN %s" for _ in olds)
    params: list[Any] = []
    for old in olds:
        params += [old, plan.moves[old].value]
    params += olds
    params += [kind.name, MIGRATE_EVENT, at, MIGRATION_OWNER]
    for old in olds:
        params += [old, migration_reason(kind, plan, old)]
    text = (
        f'WITH moved AS (UPDATE {table} SET "state" = CASE "state" {states} END, '
        '"fence" = "fence" + 1, "prev_state" = "state" '
        f'WHERE "state" IN ({", ".join(["%s"] * len(olds))}) '
        f'RETURNING {key} AS id, "prev_state" AS old, "state" AS new) '
        f"INSERT INTO {sql.AUDIT_TABLE} (kind, entity_id, event, from_state, to_state, at, "
        "owner, attempts, reason) "
        f"SELECT %s, id, %s, old, new, %s, %s, NULL::bigint, CASE old {reasons} END "
        "FROM moved ORDER BY id"
    )
    return text, params


def _constrain(
    conn: Conn, kind: EntityKind[Any], stored_declaration: str | None, declaration: str
) -> None:
    """Replace the table's version constraint unless it is the one of this declaration."""
    table = sql.quote(kind.table)
    name = f"{CONSTRAINT}{kind.lifecycle.version}"
    existing = [r[0] for r in conn.execute(CONSTRAINTS, (table,))]
    if existing == [name] and stored_declaration == declaration:
        return  # re-registering the recorded declaration: nothing to replace
    for old in existing:
        conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {sql.quote(old)}")
    values = ", ".join(sorted(f"'{s.value}'" for s in kind.lifecycle.states))
    conn.execute(
        f'ALTER TABLE {table} ADD CONSTRAINT {sql.quote(name)} CHECK ("state" IN ({values}))'
    )


def stored_version(conninfo: str, kwargs: dict[str, Any], name: str) -> int | None:
    """The version the catalog records for kind ``name``, read on a connection of its own (for
    an error message, where the caller's connection may be in a failed transaction); None when
    it cannot be read."""
    try:
        with psycopg.connect(conninfo, **kwargs) as conn:
            found = conn.execute(READ_STORED_VERSION, (name,)).fetchone()
    except psycopg.Error:
        return None
    return None if found is None else int(found[0])

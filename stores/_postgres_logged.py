"""Logged writes of the PostgreSQL store: a guarded write and its audit entries in ONE statement.

Every statement here is ``WITH moved AS (<write> RETURNING ...), logged AS (INSERT INTO
statecore_audit ... SELECT ... FROM moved) SELECT * FROM moved``: the write's rows come back as
the bare write's ``RETURNING`` gives them, and each row written has its audit entry in the same
statement (one round trip instead of two).  A write that matches nothing (a guard refused, an id
that exists) returns no row and logs nothing: both halves see the same ``moved`` rows.

* :func:`logged_update_sql` -- one guarded single-row UPDATE (``transition``) and its entry.
* :func:`logged_many_sql` -- the guarded UPDATE of many ids (``transition_many``), one entry
  per row written.
* :func:`logged_insert_sql` -- one creation (``insert``) and its entry.
* :func:`logged_rows_sql` -- a multi-row creation (``insert_each``) or the guarded UPDATE of a
  run of moves (``transition_each``), each row's entry taken from bound arrays, joined on id.

Pure functions of a plan or kind, as ``stores._postgres_sql`` is: texts and bound values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from statecore.entity import EntityKind
from statecore.store import Audit, TransitionPlan
from stores._postgres_sql import (
    AUDIT_TABLE,
    insert_rows_sql,
    quote,
    update_many_sql,
    update_sql,
    where_params,
)

__all__ = [
    "XACT_ID",
    "audit_arrays",
    "logged_insert_sql",
    "logged_many_sql",
    "logged_rows_sql",
    "logged_update_sql",
    "run_params",
    "scalar_audit",
]

XACT_ID = "SELECT pg_current_xact_id()::text"
"""The transaction id of a write's own transaction, sent in the same round trip as its BEGIN and
first statement: what ``stores._postgres_faults.commit_outcome`` asks about when the commit is
lost."""

_COLUMNS = "kind, entity_id, event, from_state, to_state, at, owner, attempts, reason"
# Explicit casts: a None owner, attempts or reason is bound untyped, and an untyped value in an
# INSERT ... SELECT list would be resolved as text (wrong for the BIGINT attempts column).
_SCALARS = (
    '%s::text, {key}, %s::text, {source}, "state", %s::float8, %s::text, %s::bigint, %s::text'
)


def _logged(kind: EntityKind[Any], write: str, source: str) -> str:
    select = _SCALARS.format(key=quote(kind.id_field), source=source)
    return (
        f"WITH moved AS ({write}), logged AS (INSERT INTO {AUDIT_TABLE} ({_COLUMNS}) "
        f"SELECT {select} FROM moved) SELECT * FROM moved"
    )


def scalar_audit(kind: EntityKind[Any], event: str, audit: Audit) -> list[Any]:
    """The bound values of the audit half of :func:`logged_update_sql` / :func:`logged_insert_sql`
    (after the write's own)."""
    return [kind.name, event, audit.at, audit.owner, audit.attempts, audit.reason]


def logged_update_sql(plan: TransitionPlan[Any]) -> str:
    """``stores._postgres_sql.update_sql`` of the plan plus its audit entry (source: the row's
    ``prev_state``).  Bound: :func:`~stores._postgres_sql.update_params`, then
    :func:`scalar_audit`.  Returns the row written plus ``prev_state``, or nothing."""
    return _logged(plan.kind, update_sql(plan), '"prev_state"')


def logged_many_sql(plan: TransitionPlan[Any], increments: Iterable[str]) -> str:
    """``stores._postgres_sql.update_many_sql`` (``transition_many``) plus one audit entry per
    row written, all with the same event and Audit.  Bound: the bare statement's values, then
    :func:`scalar_audit`."""
    return _logged(plan.kind, update_many_sql(plan, increments), '"prev_state"')


def logged_insert_sql(kind: EntityKind[Any]) -> str:
    """One creation (``insert_rows_sql(kind, 1)``) plus its audit entry (no source).  Bound: the
    row's values, then :func:`scalar_audit`.  Returns the row created, or nothing (the id
    exists: then nothing was written)."""
    return _logged(kind, insert_rows_sql(kind, 1), "NULL")


def logged_rows_sql(kind: EntityKind[Any], write: str, *, source: str) -> str:
    """``write`` (a multi-row INSERT or UPDATE returning the kind's columns) plus one audit
    entry per row it returns, the entry's event and Audit fields taken from six bound arrays
    (:func:`audit_arrays`, after the write's own values) at the row's id; ``source`` is the SQL
    of the entry's source state (``NULL`` or ``"prev_state"``)."""
    key = quote(kind.id_field)
    return (
        f"WITH moved AS ({write}), logged AS (INSERT INTO {AUDIT_TABLE} ({_COLUMNS}) "
        f'SELECT %s::text, m.{key}, a.event, {source}, m."state", a.at, a.owner, a.attempts, '
        "a.reason FROM moved m JOIN unnest(%s::text[], %s::text[], %s::float8[], %s::text[], "
        "%s::bigint[], %s::text[]) AS a(id, event, at, owner, attempts, reason) "
        f"ON a.id = m.{key}) SELECT * FROM moved"
    )


def audit_arrays(kind: EntityKind[Any], entries: Sequence[tuple[str, str, Audit]]) -> list[Any]:
    """The bound values of :func:`logged_rows_sql`'s audit half, for ``(id, event, audit)``
    entries of distinct ids."""
    return [
        kind.name,
        [e[0] for e in entries],
        [e[1] for e in entries],
        [e[2].at for e in entries],
        [e[2].owner for e in entries],
        [e[2].attempts for e in entries],
        [e[2].reason for e in entries],
    ]


def run_params(plans: Sequence[TransitionPlan[Any]], ats: Sequence[float]) -> list[Any]:
    """The bound values of ``stores._postgres_sql.update_run_sql`` for ``plans`` of one shape
    and one set of compared values (the first's), distinct ids, audit times ``ats``."""
    first = plans[0]
    params: list[Any] = [[p.entity_id for p in plans], list(ats)]
    if first.fence is not None:
        params.append([p.fence for p in plans])
    params.extend([p.changes[name] for p in plans] for name in first.changes)
    params.extend(where_params(first.expect))
    return params

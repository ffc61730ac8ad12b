"""The batched writes of the PostgreSQL store, each inside the caller's one transaction.

* :func:`create_all` (``insert_each``): one multi-row ``INSERT ... ON CONFLICT DO NOTHING
  RETURNING`` per run of distinct ids, the created rows' audit entries in the same statement
  (``stores._postgres_logged``); an id that existed is read back and returned untouched.
* :func:`move_all` (``transition_each``): consecutive moves of one shape with the same compared
  values and distinct ids form a run, moved by ONE guarded ``UPDATE ... FROM unnest(ids,
  audit times, fences, changed values)`` whose audit entries are written in the same statement; a
  move the run's statement did not write takes the single move's refusal path (a read of the
  row decides the typed error), so every move's outcome is what :meth:`PostgresStore.transition`
  would give in that order.  A run of one is the single move's statement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

import psycopg

import stores._postgres_logged as logged
import stores._postgres_sql as sql
from statecore.batch import Creation, Move
from statecore.store import Row, TransitionPlan
from stores._postgres_rows import Kind, distinct_chunks, shape
from stores._postgres_target import Target

__all__ = ["create_all", "move_all"]

Conn = psycopg.Connection[Any]
Current = Callable[[Conn, Kind, str], Row[Any] | None]
One = Callable[[Conn, Kind, TransitionPlan[Any], Any], Row[Any] | Exception]


def create_all(
    conn: Conn,
    c: Kind,
    where: Target,
    ready: list[tuple[int, Creation, Enum, list[Any]]],
    outcomes: list[Any],
    *,
    current: Current,
) -> list[Any]:
    """``outcomes`` with every ready creation's ``(row, created)`` filled in (see the module
    docs).  Raises what the driver raises (the caller's transaction then keeps nothing)."""
    done = list(outcomes)
    for chunk in distinct_chunks(ready):
        params = [p for item in chunk for p in item[3]]
        if len(chunk) == 1:
            _, creation, _, _ = chunk[0]
            params += logged.scalar_audit(c.kind, creation.event, creation.audit)
        else:
            entries = [(cr.entity_id, cr.event, cr.audit) for _, cr, _, _ in chunk]
            params += logged.audit_arrays(c.kind, entries)
        raws = conn.execute(c.logged_insert_sql(len(chunk)), params).fetchall()
        created = {raw[0]: raw for raw in raws}
        for i, creation, _, _ in chunk:
            raw = created.get(creation.entity_id)
            if raw is None:  # it existed: returned untouched, as insert() does
                done[i] = (current(conn, c, creation.entity_id), False)
            else:
                done[i] = (c.row(raw, where), True)
    return done


def move_all(
    conn: Conn,
    c: Kind,
    where: Target,
    planned: Sequence[TransitionPlan[Any] | Exception],
    moves: Sequence[Move],
    *,
    current: Current,
    one: One,
) -> list[Any]:
    """Every move's outcome, in order (see the module docs): the row written or the refusal.
    Raises what the driver raises (the caller's transaction then keeps nothing)."""
    done: list[Any] = list(planned)
    for run in _runs(planned):
        if len(run) == 1:
            i = run[0]
            plan = planned[i]
            assert not isinstance(plan, Exception)
            done[i] = one(conn, c, plan, moves[i].audit)
            continue
        plans = [planned[i] for i in run]
        first = plans[0]
        assert not isinstance(first, Exception)
        typed: list[TransitionPlan[Any]] = [p for p in plans if not isinstance(p, Exception)]
        params = logged.run_params(typed, [moves[i].audit.at for i in run])
        params += logged.audit_arrays(
            c.kind, [(moves[i].entity_id, first.event, moves[i].audit) for i in run]
        )
        raws = conn.execute(c.update_sql(first, run=True), params).fetchall()
        moved = {raw[0]: raw for raw in raws}
        for i, plan in zip(run, typed, strict=True):
            raw = moved.get(plan.entity_id)
            if raw is None:  # the guard refused it: decide which error, as transition() does
                done[i] = plan.miss(current(conn, c, plan.entity_id))
            else:
                done[i] = c.row(raw, where)
    return done


def _runs(planned: Sequence[TransitionPlan[Any] | Exception]) -> list[list[int]]:
    """The indexes of the planned moves, in order, cut into runs one statement can move:
    one shape, the same compared values, distinct ids (refusals made before any
    query are in no run)."""
    runs: list[list[int]] = []
    key: object = None
    ids: set[str] = set()
    for i, plan in enumerate(planned):
        if isinstance(plan, Exception):
            continue
        # The changed values are bound per row; compared values are the statement's own.
        values = sql.where_params(plan.expect)
        this = (shape(plan), repr(values))  # repr: 1, 1.0 and True are different values
        if runs and this == key and plan.entity_id not in ids:
            runs[-1].append(i)
        else:
            runs.append([i])
            key, ids = this, set()
        ids.add(plan.entity_id)
    return runs

"""How the PostgreSQL store encodes and decodes one kind's rows: each registered kind's cached
statement texts and row decoder (:class:`Kind`, its writes logged in the same statement by
``stores._postgres_logged``), the pieces a batch of creations is inserted in
(:func:`distinct_chunks`), the compiled shape of a plan (:func:`shape`), the checks of a
due-timer query (:func:`due_bound`) and the rows of the kind catalog (:func:`catalog_row`,
:func:`kind_records`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

import stores._postgres_logged as logged
import stores._postgres_sql as sql
from statecore.batch import Creation
from statecore.catalog import declaration_json
from statecore.entity import EntityKind
from statecore.errors import StaleVersion, StoreError
from statecore.store import Due, KindRecord, Row, TransitionPlan, check_due_query
from stores._postgres_conn import Target

__all__ = [
    "INSERT_PIECE",
    "MANAGED",
    "Kind",
    "catalog_row",
    "distinct_chunks",
    "due_bound",
    "kind_records",
    "shape",
]

INSERT_PIECE = 64
"""Rows per multi-row INSERT of ``insert_each``."""

MANAGED = ("fence", "prev_state", "entered_at")
"""The columns the store keeps on every kind's table besides id and state."""


def shape(plan: TransitionPlan[Any]) -> tuple[Any, ...]:
    """What one compiled guarded UPDATE text serves: event, fenced or not, changed columns and
    the form of each expected comparison."""
    expect = tuple(
        (col, cmp.op, cmp.value is None, len(cmp.value) if cmp.op == "in" else 1)
        for col, cmp in plan.expect
    )
    return (plan.event, plan.fence is not None, tuple(plan.changes), expect)


class Kind:
    """One registered kind's statement texts and row decoder."""

    def __init__(
        self, kind: EntityKind[Any], stored: Callable[[], int | None] | None = None
    ) -> None:
        self.kind = kind
        self.stored = stored  # the catalog's version of the kind, read when a state is unknown
        self.columns = tuple(f.name for f in kind.fields)
        self.states: dict[str, Enum] = {s.value: s for s in kind.lifecycle.states}
        self.get_sql = sql.get_sql(kind)
        self.texts: dict[Any, str] = {}

    def insert_sql(self, count: int) -> str:
        """The multi-row INSERT of ``count`` rows (cached per count)."""
        text = self.texts.get(count)
        if text is None:
            text = self.texts[count] = sql.insert_rows_sql(self.kind, count)
        return text

    def update_sql(self, plan: TransitionPlan[Any], *, run: bool = False) -> str:
        """The guarded UPDATE of ``plan`` with its audit entry in the same statement
        (``stores._postgres_logged``), or (``run``) of a run of moves of its shape, compiled
        once per shape (event, fence, changed and expected columns)."""
        key = ("run" if run else "update", *shape(plan))
        text = self.texts.get(key)
        if text is None:
            if run:
                write = sql.update_run_sql(plan)
                text = logged.logged_rows_sql(self.kind, write, source='m."prev_state"')
            else:
                text = logged.logged_update_sql(plan)
            self.texts[key] = text
        return text

    def logged_insert_sql(self, count: int) -> str:
        """:meth:`insert_sql` with each created row's audit entry in the same statement, the
        entries from bound arrays (``stores._postgres_logged``); one row: scalars."""
        key = ("logged insert", count)
        text = self.texts.get(key)
        if text is None:
            text = self.texts[key] = (
                logged.logged_insert_sql(self.kind)
                if count == 1
                else logged.logged_rows_sql(self.kind, self.insert_sql(count), source="NULL")
            )
        return text

    def row(self, raw: Sequence[Any], where: Target) -> Row[Any]:
        """The Row a statement read or returned (trailing columns after the fields -- a
        prev_state, an entered and a due time -- ignored)."""
        try:
            state = self.states[raw[1]]
        except KeyError:
            raise self.unknown(raw[0], raw[1], where) from None
        return Row(raw[0], state, raw[2], dict(zip(self.columns, raw[3:], strict=False)))

    def decode(self, entity_id: str, value: str, where: Target) -> Enum:
        """The state an audit entry's persisted ``value`` names (the slow path, for a value not
        of this version: through the lifecycle's migrations).  Raises as :meth:`unknown`."""
        try:
            state: Enum = self.kind.lifecycle.decode(value)
            return state
        except ValueError:
            raise self.unknown(entity_id, value, where) from None

    def unknown(self, entity_id: str, value: object, where: Target) -> StoreError:
        """The error for a stored state this version does not know: ``StaleVersion`` when the
        catalog records a newer version of the lifecycle, else ``StoreError``."""
        lifecycle = self.kind.lifecycle
        stored = None if self.stored is None else self.stored()
        if stored is not None and stored > lifecycle.version:
            return StaleVersion(
                lifecycle.name,
                lifecycle.version,
                stored,
                f"{where}: {self.kind.name} {entity_id!r} is in state {value!r}, which "
                f"version {lifecycle.version} does not declare; run the new declaration",
            )
        return StoreError(f"{where}: {self.kind.name} {entity_id!r} has unknown state {value!r}")

    def due(self, raw: Sequence[Any], where: Target) -> Due[Any]:
        """The Due a :func:`~stores._postgres_sql.due_sql` row describes."""
        return Due(self.row(raw, where), float(raw[-2]), float(raw[-1]))


def due_bound(kind: EntityKind[Any], timer: object, now: object, limit: object) -> float:
    """Check a ``due_timers`` call; return the time up to which rows are due (``now``, or
    infinity for None).  Raises ``TypeError`` for a ``timer`` that is not a Timer, a ``limit``
    not an int or a ``now`` not a number; ``ValueError`` for a negative ``limit``, a NaN
    ``now`` or a timer not of ``kind``'s lifecycle."""
    check_due_query(kind, timer, now, limit)
    assert now is None or isinstance(now, int | float)
    return math.inf if now is None else float(now)


def catalog_row(kind: EntityKind[Any]) -> tuple[Any, ...]:
    """The parameters of :func:`~stores._postgres_sql.write_kind_sql` recording ``kind`` now.
    Raises ``StoreError`` for a kind with a field named like a :data:`MANAGED` column (it
    would be the store's column)."""
    if any(f.name in MANAGED for f in kind.fields):
        raise StoreError(
            f"entity kind {kind.name!r}: a field may not be named "
            f"{' or '.join(MANAGED)}: the store keeps that column itself"
        )
    declaration = json.dumps(declaration_json(kind), sort_keys=True, separators=(",", ":"))
    return (kind.name, kind.lifecycle.name, kind.lifecycle.version, declaration, time.time())


def kind_records(raws: Sequence[Sequence[Any]], where: Target) -> list[KindRecord]:
    """The catalog's records from the rows of ``READ_KINDS``.  Raises ``StoreError`` for a
    row that cannot be read (not written by this store)."""
    try:
        return [
            KindRecord(name, lifecycle, int(version), json.loads(declaration), float(at))
            for name, lifecycle, version, declaration, at in raws
        ]
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{where}: unreadable kind catalog: {exc}") from exc


def distinct_chunks(
    items: list[tuple[int, Creation, Enum, list[Any]]],
) -> list[list[tuple[int, Creation, Enum, list[Any]]]]:
    """Consecutive chunks of at most INSERT_PIECE creations without a repeated id (a later
    creation of the same id must see the earlier one)."""
    chunks: list[list[tuple[int, Creation, Enum, list[Any]]]] = []
    ids: set[str] = set()
    for item in items:
        entity_id = item[1].entity_id
        if not chunks or entity_id in ids or len(chunks[-1]) >= INSERT_PIECE:
            chunks.append([])
            ids = set()
        chunks[-1].append(item)
        ids.add(entity_id)
    return chunks

"""How the PostgreSQL store encodes and decodes one kind's rows: each registered kind's cached
statement texts and row decoder (:class:`Kind`), the parameters of an audit entry
(:func:`audit_row`) and the pieces a batch of creations is inserted in (:func:`distinct_chunks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any

import stores._postgres_sql as sql
from statecore.batch import Creation
from statecore.entity import EntityKind
from statecore.errors import StoreError
from statecore.store import Audit, Row
from stores._postgres_conn import Target

__all__ = ["INSERT_PIECE", "Kind", "audit_row", "distinct_chunks"]

INSERT_PIECE = 64
"""Rows per multi-row INSERT of ``insert_each``."""


def audit_row(
    kind: EntityKind[Any], entity_id: str, event: str, source: str | None, target: str, *, a: Audit
) -> tuple[Any, ...]:
    """The parameters of one AUDIT_INSERT (``source`` None for a creation)."""
    return (kind.name, entity_id, event, source, target, a.at, a.owner, a.attempts, a.reason)


class Kind:
    """One registered kind's statement texts and row decoder."""

    def __init__(self, kind: EntityKind[Any]) -> None:
        self.kind = kind
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

    def row(self, raw: Sequence[Any], where: Target) -> Row[Any]:
        """The Row a statement read or returned (a trailing prev_state ignored)."""
        try:
            state = self.states[raw[1]]
        except KeyError:
            raise StoreError(
                f"{where}: {self.kind.name} {raw[0]!r} has unknown state {raw[1]!r}"
            ) from None
        return Row(raw[0], state, raw[2], dict(zip(self.columns, raw[3:], strict=False)))


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

"""Contract-testing a store of your own (docs/stores.md).

``CountingStore`` is a store that counts the guarded writes it performed, per event (metrics a
deployment could export).  It is built on ``InMemoryStore``; a store over another database is
tested exactly the same way.  Run the whole contract against it with::

    .venv/bin/pytest docs/contract_example.py -q
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import TypeVar

import pytest

from statecore import Audit, EntityKind, Row
from stores import InMemoryStore
from stores.testing import StoreContract, StoreFactory

S = TypeVar("S", bound=Enum)


class CountingStore(InMemoryStore):
    """An in-memory store that counts its successful guarded writes, by event."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: collections.Counter[str] = collections.Counter()

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
        row = super().transition(
            kind, entity_id, event, audit=audit, fence=fence, expect=expect, changes=changes
        )
        self.writes[event] += 1  # only reached when the guarded write matched
        return row

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
        rows = super().transition_many(
            kind,
            entity_ids,
            event,
            audit=audit,
            expect=expect,
            changes=changes,
            increments=increments,
        )
        self.writes[event] += len(rows)
        return rows


class TestCountingStore(StoreContract):
    """CountingStore passes the whole Store contract."""

    @pytest.fixture
    def store(self) -> StoreFactory:
        """A fresh, empty, unregistered store per call."""
        return CountingStore

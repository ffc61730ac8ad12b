"""Batched writes: many independent guarded writes in one call, each with its own outcome.

A store that can run a batch of creations or transitions with fewer statements than one per
write implements :class:`BatchStore` on top of :class:`~statecore.store.Store`; group commit
(:class:`~statecore.AsyncLedger`) then hands it whole batches.  The contract is exactly that of
calling :meth:`~statecore.store.Store.insert` / :meth:`~statecore.store.Store.transition` once
per item, in order, inside one transaction, catching each item's refusal: a refused item writes
nothing and does not affect the others.  A store without the capability is driven one write at
a time (:func:`insert_each_sequentially`, :func:`transition_each_sequentially`, which a store
may also use to implement the protocol).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar, runtime_checkable

import attrs

from statecore.entity import EntityKind
from statecore.errors import InvalidTransition, StaleState, UnknownEntity
from statecore.store import Audit, Row, S, Store

__all__ = [
    "REFUSALS",
    "BatchStore",
    "Creation",
    "Move",
    "insert_each_sequentially",
    "transition_each_sequentially",
]


T = TypeVar("T")

REFUSALS: tuple[type[Exception], ...] = (
    InvalidTransition,
    StaleState,
    UnknownEntity,
    TypeError,
    ValueError,
    KeyError,
)
"""What a single write raises before writing anything (a refused move, bad input): in a batch,
these become the item's outcome instead of failing the batch."""


@attrs.frozen
class Creation:
    """One requested :meth:`~statecore.store.Store.insert`: ``entity_id`` created through the
    creation ``event`` with ``values``, audited with ``audit``."""

    entity_id: str
    values: Mapping[str, object]
    event: str
    audit: Audit

    def apply(self, store: Store, kind: EntityKind[S]) -> tuple[Row[S], bool]:
        """``store.insert(...)`` with these arguments; raises as insert does."""
        return store.insert(kind, self.entity_id, self.values, event=self.event, audit=self.audit)


@attrs.frozen
class Move:
    """One requested :meth:`~statecore.store.Store.transition` of ``entity_id`` through
    ``event``, with the same guard arguments."""

    entity_id: str
    event: str
    audit: Audit
    fence: int | None = None
    expect: Mapping[str, object] | None = None
    changes: Mapping[str, object] | None = None

    def apply(self, store: Store, kind: EntityKind[S]) -> Row[S]:
        """``store.transition(...)`` with these arguments; raises as transition does."""
        return store.transition(
            kind,
            self.entity_id,
            self.event,
            audit=self.audit,
            fence=self.fence,
            expect=self.expect,
            changes=self.changes,
        )


@runtime_checkable
class BatchStore(Store, Protocol):
    """A :class:`~statecore.store.Store` that runs batches of writes as a whole."""

    def insert_each(
        self, kind: EntityKind[S], creations: Sequence[Creation]
    ) -> list[tuple[Row[S], bool] | Exception]:
        """Run :meth:`insert` for every creation, in order, in one transaction.

        Returns one outcome per creation, in order: ``(row, created)`` as ``insert`` returns
        it, or the refusal (one of :data:`REFUSALS`) it would have raised, having written
        nothing for that creation.  Raises ``StoreError`` -- nothing of the batch written --
        when the transaction itself fails.
        """
        ...

    def transition_each(
        self, kind: EntityKind[S], moves: Sequence[Move]
    ) -> list[Row[S] | Exception]:
        """Run :meth:`transition` for every move, in order, in one transaction.

        Returns one outcome per move, in order: the row as written, or the refusal (one of
        :data:`REFUSALS`) it would have raised, having written nothing for that move.  Later
        moves of the same entity see the earlier ones' writes.  Raises ``StoreError`` --
        nothing of the batch written -- when the transaction itself fails.
        """
        ...


def insert_each_sequentially(
    store: Store, kind: EntityKind[S], creations: Sequence[Creation]
) -> list[tuple[Row[S], bool] | Exception]:
    """:meth:`BatchStore.insert_each` by one :meth:`~statecore.store.Store.insert` per item."""
    return _one_by_one(store, [functools.partial(c.apply, store, kind) for c in creations])


def transition_each_sequentially(
    store: Store, kind: EntityKind[S], moves: Sequence[Move]
) -> list[Row[S] | Exception]:
    """:meth:`BatchStore.transition_each` by one :meth:`~statecore.store.Store.transition`
    per item."""
    return _one_by_one(store, [functools.partial(m.apply, store, kind) for m in moves])


def _one_by_one(store: Store, calls: Sequence[Callable[[], T]]) -> list[T | Exception]:
    """Each call in order inside one transaction; a refusal becomes that call's outcome."""
    outcomes: list[T | Exception] = []
    with store.atomic():
        for call in calls:
            try:
                outcomes.append(call())
            except REFUSALS as exc:
                outcomes.append(exc)
    return outcomes

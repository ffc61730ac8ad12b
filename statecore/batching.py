"""Batching the ledger's work: many calls as one store batch, many rows in chunks.

Group commit (:class:`~statecore.AsyncLedger`) hands the ledger runs of calls: :func:`batched`
prepares each one, writes the prepared ones as one store batch (:func:`insert_each`,
:func:`transition_each`) and gives every call the outcome its single call would have had;
:func:`distinct_runs` cuts a run where an id repeats, so a repeated id is planned after its
earlier write.  The sweeps claim their candidates :func:`chunks` at a time, one transaction
each.  The store's side of a batch (:class:`~statecore.batch.BatchStore` and its sequential
fallbacks) is :mod:`statecore.batch`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import TypeVar

from statecore.batch import (
    REFUSALS,
    BatchStore,
    Creation,
    Move,
    insert_each_sequentially,
    transition_each_sequentially,
)
from statecore.entity import EntityKind
from statecore.errors import StoreError
from statecore.store import Row, S, Store

__all__ = ["batched", "chunks", "distinct_runs", "insert_each", "transition_each"]

_PENDING = StoreError("no outcome yet")
"""Holds a batch item's place until the store's outcome for it is filled in."""

_T = TypeVar("_T")
_In = TypeVar("_In")
_Req = TypeVar("_Req")
_Out = TypeVar("_Out")
_Kept = TypeVar("_Kept")


def batched(
    requests: Iterable[_In],
    prepare: Callable[[_In], _Req],
    write: Callable[[list[_Req]], Sequence[_Out | Exception]],
    keep: Callable[[_Out], _Kept],
) -> list[_Kept | Exception]:
    """Prepare every request (a refusal is its outcome), write the prepared ones as one store
    batch, and turn each written result into what the caller keeps -- outcomes in request
    order."""
    outcomes: list[_Kept | Exception] = []
    prepared: list[_Req] = []
    slots: list[int] = []
    for request in requests:
        try:
            item = prepare(request)
        except REFUSALS as exc:
            outcomes.append(exc)
            continue
        slots.append(len(outcomes))
        outcomes.append(_PENDING)
        prepared.append(item)
    for slot, result in zip(slots, write(prepared), strict=True):
        outcomes[slot] = result if isinstance(result, Exception) else keep(result)
    return outcomes


def insert_each(
    store: Store, kind: EntityKind[S], creations: list[Creation]
) -> list[tuple[Row[S], bool] | Exception]:
    """The creations as one batch: the store's own batch when it has one, else one insert
    after the other in one transaction (see :mod:`statecore.batch`)."""
    if isinstance(store, BatchStore):
        return store.insert_each(kind, creations)
    return insert_each_sequentially(store, kind, creations)


def transition_each(
    store: Store, kind: EntityKind[S], moves: list[Move]
) -> list[Row[S] | Exception]:
    """The moves as one batch, as :func:`insert_each` writes creations."""
    if isinstance(store, BatchStore):
        return store.transition_each(kind, moves)
    return transition_each_sequentially(store, kind, moves)


def distinct_runs(requests: Sequence[_T], key: Callable[[_T], Hashable]) -> Iterator[Sequence[_T]]:
    """Consecutive slices of ``requests``, in order, each as long as possible without two
    requests of the same ``key``."""
    start = 0
    while start < len(requests):
        seen: set[Hashable] = set()
        end = start
        while end < len(requests) and key(requests[end]) not in seen:
            seen.add(key(requests[end]))
            end += 1
        yield requests[start:end]
        start = end


def chunks(rows: list[_T], size: int) -> Iterator[list[_T]]:
    """``rows`` in consecutive slices of ``size`` (at least one), in order."""
    step = max(1, size)
    for start in range(0, len(rows), step):
        yield rows[start : start + step]

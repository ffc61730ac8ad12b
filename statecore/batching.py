"""Batching the ledger's work: many calls as one store batch, many rows in chunks.

Group commit (:class:`~statecore.AsyncLedger`) hands the ledger runs of calls: :func:`batched`
prepares each one, writes the prepared ones as one store batch (:func:`insert_each`,
:func:`transition_each`) and gives every call the outcome its single call would have had;
:func:`distinct_runs` cuts a run where an id repeats, so a repeated id is planned after its
earlier write.  The sweeps claim their candidates :func:`chunks` at a time, one transaction
each.  The store's side of a batch (:class:`~statecore.batch.BatchStore` and its sequential
fallbacks) is :mod:`statecore.batch`.

A batch must never bypass what a store's subclass or wrapper does in its single writes (count
them, log them, feed them elsewhere).  Two rules keep it so, both decided here:

* the ledger hands a store a batch (``insert_each``, ``transition_each``, and the sweeps'
  ``transition_many``) only when the store's *class* defines the batch method
  (:func:`has_batch`): a wrapper that merely delegates everything through ``__getattr__`` is
  driven one write at a time, through its own ``insert`` / ``transition``;
* a store whose batch methods are faster than one write each runs them through its single
  writes instead once a subclass overrides those (:func:`routes_through_overrides`,
  :func:`transition_many_one_by_one`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Literal, TypeVar, cast

from statecore.batch import (
    REFUSALS,
    BatchStore,
    Creation,
    Move,
    insert_each_sequentially,
    transition_each_sequentially,
)
from statecore.entity import EntityKind
from statecore.errors import InvalidTransition, StaleState, StoreError, UnknownEntity
from statecore.store import Audit, Row, S, Store, check_increments, plan_transition

__all__ = [
    "batched",
    "chunks",
    "distinct_runs",
    "has_batch",
    "insert_each",
    "routes_through_overrides",
    "transition_each",
    "transition_many",
    "transition_many_one_by_one",
]

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
    """The creations as one batch: the store's own batch when its class has one
    (:func:`has_batch`), else one insert after the other in one transaction (see
    :mod:`statecore.batch`).  Raises ``StoreError`` when the transaction fails."""
    if has_batch(store, "insert_each"):
        return cast(BatchStore, store).insert_each(kind, creations)
    return insert_each_sequentially(store, kind, creations)


def transition_each(
    store: Store, kind: EntityKind[S], moves: list[Move]
) -> list[Row[S] | Exception]:
    """The moves as one batch, as :func:`insert_each` writes creations."""
    if has_batch(store, "transition_each"):
        return cast(BatchStore, store).transition_each(kind, moves)
    return transition_each_sequentially(store, kind, moves)


def transition_many(
    store: Store,
    kind: EntityKind[S],
    entity_ids: Sequence[str],
    event: str,
    *,
    audit: Audit,
    expect: Mapping[str, object] | None = None,
    changes: Mapping[str, object] | None = None,
    increments: Mapping[str, int] | None = None,
) -> list[Row[S]]:
    """``store.transition_many(...)`` when the store's class defines it (:func:`has_batch`),
    else :func:`transition_many_one_by_one` through the store's own ``transition``; raises as
    ``transition_many`` does."""
    if has_batch(store, "transition_many"):
        return store.transition_many(
            kind,
            entity_ids,
            event,
            audit=audit,
            expect=expect,
            changes=changes,
            increments=increments,
        )
    return transition_many_one_by_one(
        store,
        kind,
        entity_ids,
        event,
        audit=audit,
        expect=expect,
        changes=changes,
        increments=increments,
    )


def has_batch(
    store: object, method: Literal["insert_each", "transition_each", "transition_many"]
) -> bool:
    """Whether ``store`` runs batches of ``method``'s kind itself: the one decision every
    caller of a batch makes (the ledger's group commit, the connector's buffer).

    True only when the store's class defines ``method`` (itself or through a base class).  A
    wrapper that delegates everything through ``__getattr__`` reaches its inner store's batch
    method by instance lookup, but that method would bypass the wrapper's own ``insert`` /
    ``transition``: such a store gets False and is driven one single write at a time.  Cheap
    enough to call per batch; never raises.
    """
    return callable(getattr(type(store), method, None))


def routes_through_overrides(store: object, batch: str, *singles: str) -> bool:
    """Whether ``store``'s ``batch`` method must run as calls of its single-write methods
    ``singles`` (``"insert"``, ``"transition"``) because a subclass overrides one of them.

    True when some single write is defined by a class strictly below the class that defines
    ``batch``: that override (counting writes, say) was written for a class whose batch
    method knows nothing of it.  A subclass that overrides ``batch`` as well has taken charge
    of it, and a store's own methods are not overrides: both give False, and the batch keeps
    its fast path.  A store calls this at the top of each fast batch method and, when True,
    runs the batch through ``insert_each_sequentially(self, ...)``,
    ``transition_each_sequentially(self, ...)`` or :func:`transition_many_one_by_one`.
    Decided once per class (cached); never raises.
    """
    key = (type(store), batch, singles)
    found = _ROUTES.get(key)
    if found is None:
        if len(_ROUTES) >= _ROUTES_MAX:
            _ROUTES.clear()  # classes made on the fly (tests) must not grow it forever
        found = _ROUTES[key] = _overridden_below(*key)
    return found


_ROUTES: dict[tuple[type, str, tuple[str, ...]], bool] = {}
""":func:`routes_through_overrides`'s answers per (class, batch, singles): a class's methods do
not change after it is made, so each is decided once (a racing thread decides it again, alike)."""
_ROUTES_MAX = 1024


def _overridden_below(cls: type, batch: str, singles: tuple[str, ...]) -> bool:
    owner = _defining_class(cls, batch)
    if owner is None:
        return False
    for single in singles:
        defined_by = _defining_class(cls, single)
        if defined_by is not None and defined_by is not owner and issubclass(defined_by, owner):
            return True
    return False


def _defining_class(cls: type, name: str) -> type | None:
    """The class of ``cls``'s MRO whose own namespace defines ``name``, or None."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


def transition_many_one_by_one(
    store: Store,
    kind: EntityKind[S],
    entity_ids: Sequence[str],
    event: str,
    *,
    audit: Audit,
    expect: Mapping[str, object] | None = None,
    changes: Mapping[str, object] | None = None,
    increments: Mapping[str, int] | None = None,
) -> list[Row[S]]:
    """:meth:`~statecore.store.Store.transition_many` as one ``store.transition`` per entity
    the guard admits, in one ``store.atomic()`` block: what a store's ``transition_many``
    does when :func:`routes_through_overrides` says so.

    Each listed entity is read and moved under the fence just read (inside the transaction no
    other writer can change it in between), its ``increments`` added to the values read; an
    entity the guard does not admit (unknown, another state, failing ``expect``) is skipped.
    Returns the rows written, in the order of ``entity_ids`` (repeats dropped).  Raises as
    ``transition_many`` for bad input, before any write; ``StoreError`` when the store fails.
    """
    if isinstance(entity_ids, str):
        raise TypeError("entity_ids must be a sequence of ids, not one str")
    ids = list(dict.fromkeys(entity_ids))
    for entity_id in ids:
        plan_transition(kind, entity_id, event, expect=expect, changes=changes)
    added = check_increments(kind, increments, changes)
    written: list[Row[S]] = []
    with store.atomic():
        for entity_id in ids:
            row = store.get(kind, entity_id)
            if row is None:
                continue
            values = dict(changes or {})
            for name, amount in added.items():
                values[name] = row[name] + amount
            try:
                written.append(
                    store.transition(
                        kind,
                        entity_id,
                        event,
                        audit=audit,
                        fence=row.fence,
                        expect=expect,
                        changes=values,
                    )
                )
            except (InvalidTransition, StaleState, UnknownEntity):
                continue  # not admitted by the guard: skipped, unchanged
    return written


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

"""Optional store capabilities for sweepers on a shared server: claims that never queue behind
each other, and notifications that wake sweepers instead of polling.

* :class:`ClaimingStore` -- :meth:`~ClaimingStore.claim_candidates` reads the rows a sweep may
  claim and locks them for the current :meth:`~statecore.store.Store.atomic` block, skipping
  rows another transaction holds (PostgreSQL: ``SELECT ... FOR UPDATE SKIP LOCKED``).  Two
  sweepers running at once get disjoint rows and never wait for each other.  The locks only
  divide the work: the sweep must still claim each row with a guarded transition under the fence
  it was read with (a row may have changed between two reads of the same sweeper, and a store
  without the capability gives no locks at all).
* :class:`NotifyingStore` -- :meth:`~NotifyingStore.notify` sends a wake-up on a named channel
  (inside ``atomic()``: sent when the block commits, never when it rolls back), and
  :meth:`~NotifyingStore.listen` calls back on every wake-up sent on a channel, from any process
  on the same server.  Wake-ups are hints, not a queue: one sent while a listener reconnects is
  lost, so a woken sweeper must still sweep on a slow timer.

:func:`candidates` is what a sweep calls: the locked read when the store can, a plain
:meth:`~statecore.store.Store.select` otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, runtime_checkable

from statecore.entity import EntityKind
from statecore.errors import StatecoreError
from statecore.store import Row, S, Store

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "ClaimingStore",
    "NoTransaction",
    "NotifyingStore",
    "candidates",
    "check_notification",
]

MAX_PAYLOAD_BYTES = 7999
"""The longest notification payload, in UTF-8 bytes (PostgreSQL's limit is under 8000)."""
_CHANNEL = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class NoTransaction(StatecoreError, RuntimeError):
    """A call that only makes sense inside ``store.atomic()`` was made outside one (a
    programming error: the locks it takes would be released before the caller could use
    them).  Nothing was read or written."""


@runtime_checkable
class ClaimingStore(Store, Protocol):
    """A :class:`~statecore.store.Store` whose sweeps can lock their candidates, skipping rows
    another transaction holds."""

    def claim_candidates(
        self,
        kind: EntityKind[S],
        *,
        states: Iterable[S] | None = None,
        where: Mapping[str, object] | None = None,
        order_by: str | None = None,
        limit: int | None = None,
    ) -> list[Row[S]]:
        """The rows :meth:`~statecore.store.Store.select` would return, minus those another
        transaction holds locked, each locked for the calling thread's ``atomic()`` block until
        it ends.

        Call it inside ``store.atomic()``, then claim each row there with a guarded transition
        under ``row.fence``; a row the block does not move is free again when the block ends.
        Pass a ``limit`` (a sweep's chunk): every row returned stays locked.  Raises
        :class:`NoTransaction` outside a block, ``StoreError`` when the server fails (let it
        escape the block), and ``KeyError``/``TypeError``/``ValueError`` for bad input, as
        ``select`` does.
        """
        ...


@runtime_checkable
class NotifyingStore(Store, Protocol):
    """A :class:`~statecore.store.Store` that carries wake-ups between the processes sharing
    it."""

    def notify(self, channel: str, payload: str = "") -> None:
        """Send ``payload`` to every listener of ``channel``.

        Inside ``store.atomic()`` it is sent when the outermost block commits and never if it
        rolls back; outside one, at once.  Identical wake-ups of one transaction may be
        delivered once.  Raises ``ValueError`` for a bad channel or payload (see
        :func:`check_notification`) and ``StoreError`` when the server fails.
        """
        ...

    def listen(self, channel: str, callback: Callable[[str], object]) -> Callable[[], None]:
        """Call ``callback(payload)`` for every notification on ``channel`` sent after this
        returns, on a background thread of the store, in the order they were committed.

        Returns ``unsubscribe``: call it (idempotent, bounded; from any thread, the callback
        included) to stop delivery and release what the subscription holds; closing the store
        does it too.  The callback must be quick (hand the work to another thread); an exception
        it raises is logged, not propagated.  Raises ``ValueError`` for a bad channel and
        ``StoreError`` when the server cannot be reached or the store is closed.
        """
        ...


def check_notification(channel: str, payload: str = "") -> None:
    """Refuse a channel that is not a lower-case identifier of at most 63 characters, or a
    payload that is not a str of at most :data:`MAX_PAYLOAD_BYTES` UTF-8 bytes (``TypeError``
    or ``ValueError``, naming which)."""
    if not isinstance(channel, str):
        raise TypeError(f"channel must be a str, not {type(channel).__name__}")
    if not _CHANNEL.fullmatch(channel):
        raise ValueError(f"channel must be a lower-case identifier (63 chars max): {channel!r}")
    if not isinstance(payload, str):
        raise TypeError(f"payload must be a str, not {type(payload).__name__}")
    if len(payload.encode("utf-8")) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"payload longer than {MAX_PAYLOAD_BYTES} bytes")


def candidates(
    store: Store,
    kind: EntityKind[S],
    *,
    states: Iterable[S] | None = None,
    where: Mapping[str, object] | None = None,
    order_by: str | None = None,
    limit: int | None = None,
) -> list[Row[S]]:
    """A sweep's candidates: :meth:`ClaimingStore.claim_candidates` when ``store`` has the
    capability (rows locked, none another sweeper holds), else ``store.select`` (rows a
    concurrent sweeper may also read: the fence guard of the claim picks one winner).

    Call it inside ``store.atomic()`` and claim the rows there, each under ``row.fence``.
    Raises as the method called does (:class:`NoTransaction` outside a block, when locking).
    """
    if isinstance(store, ClaimingStore):
        return store.claim_candidates(
            kind, states=states, where=where, order_by=order_by, limit=limit
        )
    return store.select(kind, states=states, where=where, order_by=order_by, limit=limit)

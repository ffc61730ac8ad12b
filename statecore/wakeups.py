"""Wake-ups between the ledgers sharing a store: work a peer could take is announced at once.

On a :class:`~statecore.claims.NotifyingStore` (PostgreSQL: ``LISTEN/NOTIFY``) a ledger sends
one notification on :data:`CHANNEL` when it leaves rows for others, and a gateway's recovery
loop listens on it, so a peer runs its dead-owner recovery at once instead of on its next
recover tick.  Today one write leaves rows for others: a ledger's :meth:`~statecore.Ledger.leave`
on a clean stop, when its incarnation still owes rows (peers on other hosts may reclaim them at
once).  Other writes do not: a failed or released row stays its owner's, retried by the owner's
own runtime sweep, and rows a recovery could not deliver stay with their dead owner, found by
every peer's next tick (announcing those would wake every peer in a loop).

The notification is sent in the same transaction as the write (``notify`` inside
``store.atomic()``: delivered when it commits, never when it rolls back), one per transaction.
Wake-ups are hints, not a queue: one sent while a listener reconnects is lost, and a lease that
expires sends nothing, so a listener still sweeps on its timer.  On a store without the
capability nothing is sent and nothing listens: the timer alone drives the recovery, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from statecore.claims import NotifyingStore
from statecore.errors import StoreError
from statecore.lifecycles import OBLIGATION
from statecore.obligation import OBLIGATION_KIND
from statecore.store import Store

__all__ = ["CHANNEL", "leave_announced", "listen_for_work"]

log = logging.getLogger("statecore.ledger")

CHANNEL = "statecore_obligations"
"""The channel ledgers announce rows left for others on (the payload: the leaving owner's
token, for the logs; listeners need not read it)."""

_OWED = frozenset(OBLIGATION.states) - OBLIGATION.terminal


def leave_announced(store: Store, leave: Callable[[], bool], token: str) -> bool:
    """Run ``leave()`` (ending an owner record of the owner ``token``; returns whether it
    ended one) and, on a :class:`~statecore.claims.NotifyingStore`, announce on
    :data:`CHANNEL` in the same transaction when it ended one and ``token`` still owes rows.
    Returns what ``leave()`` returned.  On any other store this is ``leave()`` alone.  Raises
    ``StoreError`` when the store fails (nothing written, nothing sent)."""
    if not isinstance(store, NotifyingStore):
        return leave()
    with store.atomic():
        ended = leave()
        if ended and store.select(
            OBLIGATION_KIND, states=_OWED, where={"owner_token": token}, limit=1
        ):
            store.notify(CHANNEL, token)
    return ended


def listen_for_work(store: Store, wake: Callable[[], object]) -> Callable[[], None] | None:
    """Call ``wake()`` (on a thread of the store: it must be quick and thread-safe) on every
    announcement on :data:`CHANNEL`; returns ``unsubscribe`` (idempotent, bounded).  None --
    nothing listens -- when ``store`` is not a :class:`~statecore.claims.NotifyingStore`, or
    when the subscription fails (logged at WARNING: the caller's timer still runs)."""
    if not isinstance(store, NotifyingStore):
        return None
    try:
        return store.listen(CHANNEL, lambda _payload: wake())
    except StoreError:
        log.warning(
            "cannot listen for work left by peers; recovering on the timer only", exc_info=True
        )
        return None

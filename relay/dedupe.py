"""The gateway's durable memory of handled buffered deliveries.

A buffered inbound event is acked only after its handler returned; if the gateway dies between
the handler and the ack, the connector replays it.  Remembering each handled bufferId durably
(before the ack) lets the transport ack such a replay without handling it a second time, even
after a restart.  The keys are persisted entities like any other, with a lifecycle of their own.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum

from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind, Field, Index
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit, Store, lt

__all__ = ["DEDUPE", "DEDUPE_KIND", "DedupeState", "StoreBufferDedupe"]


class DedupeState(StrEnum):
    """One handled buffered delivery, as the gateway remembers it."""

    HANDLED = "handled"
    """Handled (and about to be, or already, acked)."""
    FORGOTTEN = "forgotten"
    """Terminal: older than the memory's horizon; the connector cannot replay it any more."""


_D = DedupeState

DEDUPE: Lifecycle[DedupeState] = Lifecycle(
    "dedupe",
    DedupeState,
    initial=_D.HANDLED,
    terminal=(_D.FORGOTTEN,),
    description="A handled bufferId, remembered so a replay is not handled twice.",
    transitions=(
        Transition("handle", None, _D.HANDLED),
        Transition("forget", _D.HANDLED, _D.FORGOTTEN),
        Transition("prune", _D.FORGOTTEN, None),
    ),
)

DEDUPE_KIND: EntityKind[DedupeState] = EntityKind(
    "inbound_dedupe",
    DEDUPE,
    table="relay_inbound_dedupe",
    id_field="buffer_id",
    fields=(Field("handled_at", float, nullable=False, immutable=True),),
    indexes=(Index(("handled_at",)),),
)


class StoreBufferDedupe:
    """:class:`relay.transport.BufferDedupe` over any Store; store work runs off the loop.

    Pass it to ``WebSocketRelayTransport(..., dedupe=StoreBufferDedupe(store))``.
    """

    def __init__(self, store: Store, *, clock: Clock | None = None) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        store.register(DEDUPE_KIND)

    async def seen(self, buffer_id: str) -> bool:
        """True when ``buffer_id`` was handled before (by this gateway, in any run)."""
        row = await asyncio.to_thread(self.store.get, DEDUPE_KIND, buffer_id)
        return row is not None

    async def remember(self, buffer_id: str) -> None:
        """Record ``buffer_id`` as handled (idempotent)."""
        now = self.clock.now()
        await asyncio.to_thread(
            self.store.insert,
            DEDUPE_KIND,
            buffer_id,
            {"handled_at": now},
            event="handle",
            audit=Audit(now),
        )

    def forget_older_than(self, seconds: float) -> int:
        """Drop keys handled more than ``seconds`` ago (longer than the connector's buffer
        retention, so no replay can still carry them); returns how many were dropped."""
        cutoff = self.clock.now() - seconds
        stale = self.store.select(
            DEDUPE_KIND, states=(_D.HANDLED,), where={"handled_at": lt(cutoff)}
        )
        now = self.clock.now()
        with self.store.atomic():
            for row in stale:
                self.store.transition(
                    DEDUPE_KIND, row.id, "forget", audit=Audit(now), fence=row.fence
                )
        return self.store.prune(DEDUPE_KIND, "prune")

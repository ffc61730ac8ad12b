"""Releasing held inbound events to the gateway that says hello for their platform.

An event no gateway listens to is held (:mod:`relay.connector.held`).  A hello for a platform
(its subscription recorded first) releases every held event of that platform whose audience
now includes the gateway: appended to that gateway's buffer in the order held, and released,
in one transaction, before the connection's replay starts -- so the gateway receives them
through the normal replay, in order, and with acked live delivery loses nothing if it dies.

:attr:`Holding.lock` orders the two: the intake decides to hold an event, and holds it, under
the lock; a hello records its subscription and releases under the same lock.  So an event is
either held before the release reads the hold, or finds the new subscriber in its audience.
(Across the nodes of a cluster there is no such lock: an event one node holds while another
node answers the platform's first hello waits for the next hello of its audience, or expires.)
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from relay.connector._delivery import Delivery
from relay.connector._instance import Instance
from relay.connector._settings import GuardSettings, StoreSettings
from relay.connector._store_thread import StoreThread
from relay.connector._tasks import Tasks
from relay.connector.held import HeldEvent
from relay.wire.frames import InboundEvent

__all__ = ["Holding"]

# Every part of the connector logs to the one logger docs/configuration.md names.
log = logging.getLogger("relay.connector.server")

_Line = tuple[str, int, str]


class HoldingSettings(StoreSettings, GuardSettings, Protocol):
    """What the release reads of the connector: the hold and the buffer, and the guard's
    settings (a released event teaches the provenance, as a routed one does)."""


class Holding:
    """The connector's release of held events (see the module docs).

    ``audience`` is the inbound router's: the gateways an event goes to now.
    """

    def __init__(
        self,
        connector: HoldingSettings,
        *,
        store: StoreThread,
        delivery: Delivery,
        tasks: Tasks,
    ) -> None:
        self._connector = connector
        self._store = store
        self._delivery = delivery
        self._tasks = tasks
        self.lock = asyncio.Lock()
        """Held by a hold decision and by a hello's subscription and release (module docs)."""
        self.audience: Callable[[str, InboundEvent], list[str]] = lambda platform, event: []
        """The gateways an event of a platform goes to now (set by the inbound router)."""

    async def release(self, instance: Instance, platform: str) -> int:
        """Release to ``instance``'s gateway the held events of ``platform`` whose audience
        includes it; return how many.  Call it holding :attr:`lock`, after the subscription
        is recorded and before the connection's replay starts (a connection already live is
        handed them here).  Raises ``StoreError`` when the store fails (nothing released)."""
        held = self._connector.hold
        waiting = await self._store.run(functools.partial(held.waiting, platform))
        gateway_id = instance.gateway_id
        mine = [h for h in waiting if gateway_id in self.audience(platform, h.event)]
        if not mine:
            return 0
        connector = self._connector
        if connector.tenants is None and not connector.open_egress:
            # Provenance first, durably, as for a routed event: the gateway may answer these
            # chats (and users) as soon as it sees the events.
            targets = [t for h in mine for t in (h.event.source.chat_id, h.event.source.user_id)]
            fresh = connector.provenance.unknown(gateway_id, platform, targets)
            if fresh:
                await self._store.run(
                    functools.partial(connector.provenance.learn, gateway_id, platform, fresh)
                )
        if instance.is_replaying():
            # Counted before the write is queued: the replay then knows to read again.
            instance.appended += 1
        lines = await self._store.run(
            functools.partial(self._release_into, gateway_id, platform, mine)
        )
        if lines:
            log.info(
                "connector: released %d held events of %s to %s",
                len(lines),
                platform,
                gateway_id,
                extra={"gateway_id": gateway_id, "platform": platform, "released": len(lines)},
            )
            self._hand_over(instance, lines)
        return len(lines)

    def _release_into(
        self, gateway_id: str, platform: str, mine: Sequence[HeldEvent]
    ) -> list[_Line]:
        """On the store thread: the release and the appends, in one transaction."""
        connector = self._connector
        with connector.buffer.store.atomic():
            released = set(connector.hold.release([h.held_id for h in mine], gateway_id))
            items = [(gateway_id, platform, h.event) for h in mine if h.held_id in released]
            lines = connector.buffer.append_many(items)
            if items and self._store.on_appended is not None:
                self._store.on_appended([gateway_id] * len(items))
        self._store.report_held(platform)
        return lines

    def _hand_over(self, instance: Instance, lines: list[_Line]) -> None:
        """Released entries for a connection that already receives live: the windowed pump
        takes them (acked live delivery), else a replay from its cursor sends them.  A
        connection before its replay, or replaying, reads them from the buffer itself."""
        if not instance.live:
            return
        if instance.acked_live:
            for line in lines:
                self._delivery.offer(instance, *line)
        elif instance.machine.can("fall_behind"):
            instance.machine.fire("fall_behind")
            self._tasks.spawn(self._delivery.replay(instance, after=instance.last_sent_seq))

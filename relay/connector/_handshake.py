"""Answering a served connection's hellos: the platform's descriptor, the durable subscription,
the release of the events held for the platform (:mod:`relay.connector._hold`) and the replay a
first hello starts; a hello for a platform not fronted here is refused."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from relay.connector._delivery import Delivery
from relay.connector._hold import Holding
from relay.connector._instance import Instance
from relay.connector._log import limited
from relay.connector._settings import HandshakeSettings
from relay.connector._store_thread import StoreThread
from relay.connector._tasks import Tasks
from relay.wire.codec import encode
from relay.wire.compat import ERROR_FRAMES
from relay.wire.frames import DescriptorFrame, ErrorFrame, Hello
from relay.wire.logtext import peer_text
from relay.wire.urls import CLOSE_PROTOCOL, CLOSE_REVOKED

__all__ = ["Handshake"]

# Every part of the connector logs to the one logger docs/configuration.md names.
log = logging.getLogger("relay.connector.server")


class Handshake:
    """The hellos of the connector's served connections.

    ``subscribed`` is the connector's table of the platforms each gateway said hello for (kept
    durably in ``connector.subscriptions`` too); descriptors and drivers are the connector's.
    """

    def __init__(
        self,
        connector: HandshakeSettings,
        *,
        subscribed: dict[str, set[str]],
        store: StoreThread,
        delivery: Delivery,
        tasks: Tasks,
        holding: Holding,
    ) -> None:
        self._connector = connector
        self._holding = holding
        self._subscribed = subscribed
        self._store = store
        self._delivery = delivery
        self._tasks = tasks
        self.subscribe: Callable[[str, str], object] | None = None
        """What records a new subscription on the store thread (default: the connector's
        ``subscriptions.add``; a cluster node's also announces it)."""

    async def hello(self, instance: Instance, hello: Hello) -> None:
        """Answer one hello: the platform's descriptor (the subscription recorded first, then
        the events held for the platform released into the gateway's buffer); the
        connection's first one also starts the replay of its backlog, which delivers them."""
        connector = self._connector
        descriptor = connector.descriptors.get(hello.platform)
        if descriptor is None or hello.platform not in connector.drivers:
            await self._unfronted(instance, hello)
            return
        instance.identities.append((hello.platform, hello.bot_id))
        async with self._holding.lock:
            # Under the lock a hold decision takes (relay.connector._hold): no event is held
            # between the subscription and the release.
            if hello.platform not in self._subscribed[instance.gateway_id]:
                self._subscribed[instance.gateway_id].add(hello.platform)
                subscribe = self.subscribe or connector.subscriptions.add
                await self._store.run(
                    functools.partial(subscribe, instance.gateway_id, hello.platform)
                )
            try:
                await self._holding.release(instance, hello.platform)
            except Exception as exc:
                # The events stay held (nothing was released): the next hello releases them.
                log.warning(
                    "connector: releasing the held events of %s to %s failed (%s)",
                    hello.platform,
                    instance.gateway_id,
                    peer_text(str(exc)),
                )
        await instance.send(encode(DescriptorFrame(descriptor)))
        if instance.machine.can("hello"):
            instance.machine.fire("hello")
            self._tasks.spawn(self._delivery.replay(instance))

    async def answer_held_hellos(self, instance: Instance) -> None:
        """Answer, in order, the hellos a standby said while it waited (it was just promoted)."""
        held, instance.held_hellos = instance.held_hellos, []
        for hello in held:
            if instance.is_closed() or instance.is_standby():
                return
            await self.hello(instance, hello)

    async def _unfronted(self, instance: Instance, hello: Hello) -> None:
        """Answer a hello for a platform this connector does not front, so that no gateway
        waits out a handshake timeout: a connection's first hello closes it with a reason naming
        the platform (4400 to a gateway that announced itself; 4401 to an original gateway,
        which backs off on an early 4401 instead of redialing in a tight loop).  A later hello
        gets an ``error`` frame (announced gateways) or a log line."""
        platform = hello.platform[:64]
        reason = f"unknown platform {platform!r}"
        # Later hellos are as many as the peer sends: rate-limited, with counts.
        more = limited(instance.log_limit, "hellos for platforms not fronted", logging.WARNING)
        if more is not None:
            shown = peer_text(platform, limit=80)
            log.warning(
                "connector: %s said hello for %s, which this connector does not front%s",
                instance.gateway_id,
                shown,
                more,
                extra={"gateway_id": instance.gateway_id, "platform": shown},
            )
        if not instance.identities:
            code = CLOSE_PROTOCOL if instance.announced else CLOSE_REVOKED
            await instance.close(code, reason.encode("utf-8")[:120].decode("utf-8", "ignore"))
        elif ERROR_FRAMES in instance.features:
            await instance.send(
                encode(ErrorFrame("unknown_platform", f"no {reason} here", "hello"))
            )

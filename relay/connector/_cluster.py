"""Connector nodes sharing one store: a cluster behind one URL.

Several connectors (nodes) on one :class:`~statecore.claims.NotifyingStore` (PostgreSQL) share
the durable buffer, the subscriptions and the provenance memory.  A gateway's socket is held by
one node; a platform's inbound event may be accepted by any node.  What makes that work:

* **Announced appends.**  A node that appends inbound entries announces each gateway it
  appended for on :data:`CHANNEL`, in the same transaction (the notification is sent when the
  entries are committed, never for a rolled-back write).  The node holding that gateway's
  socket, if any, delivers the entries other nodes appended (:meth:`Delivery.catch_up
  <relay.connector._delivery.Delivery.catch_up>`); the others ignore the notice.  A node never
  acts on its own notices: its own entries it delivers itself, live or by a replay.
* **Announced subscriptions.**  A hello recorded by one node is announced, so that every node
  routes that platform's traffic to the gateway from then on, without a restart.
* **Provenance read through.**  A node that does not hold a target in memory asks the store
  before it declines an egress (another node may have learned it).
* **A sweep on a timer** (``cluster_sweep_s``): notifications are hints (one sent while a
  listener reconnects is lost), so every node also catches up each gateway it serves and
  re-reads the subscriptions every sweep.  A lost notice costs latency, never an entry.

A node killed mid-replay loses nothing: what it sent and what was not acked stays unacked in
the shared buffer, and the gateway's next connection -- to whichever node the URL leads it --
replays exactly that tail.  Acks retire entries in the shared buffer, whichever node took them.

The notices are JSON objects: ``{"o": origin, "g": gateway_id}`` (entries appended) and
``{"o": origin, "g": gateway_id, "p": platform}`` (a subscription), where ``origin`` is the
announcing node's buffer origin (:attr:`~relay.connector.buffer.InboundBuffer.origin`).
Anything else on the channel is ignored (logged at DEBUG): the channel is readable and writable
by every client of the database, and a notice only ever makes a node read the store.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from relay.connector._delivery import Delivery
from relay.connector._instance import Instance
from relay.connector._store_thread import StoreThread
from relay.connector._tasks import Tasks
from relay.connector.buffer import InboundBuffer
from relay.connector.subscriptions import Subscriptions
from relay.wire.logtext import peer_text
from statecore.claims import NotifyingStore
from statecore.clock import Clock

__all__ = ["CHANNEL", "Cluster", "ClusterSettings"]

# Every part of the connector logs to the one logger docs/configuration.md names.
log = logging.getLogger("relay.connector.server")

CHANNEL = "statecore_relay"
"""The channel connector nodes announce appended entries and subscriptions on."""


class ClusterSettings(Protocol):
    """What the cluster reads of the connector."""

    @property
    def buffer(self) -> InboundBuffer:
        """The durable inbound buffer (on the shared store)."""

    @property
    def subscriptions(self) -> Subscriptions:
        """The durable subscriptions (on the shared store)."""

    @property
    def clock(self) -> Clock:
        """The connector's clock (the sweep's timer)."""

    @property
    def cluster_sweep_s(self) -> float:
        """Seconds between two sweeps (0: none)."""


class Cluster:
    """One node's part in a connector cluster (see the module docs).

    ``served`` is the connector's table of served connections, ``subscribed`` its table of the
    platforms each gateway said hello for (updated from peers' notices and sweeps).
    """

    def __init__(
        self,
        connector: ClusterSettings,
        *,
        store: NotifyingStore,
        served: Mapping[str, Instance],
        subscribed: dict[str, set[str]],
        delivery: Delivery,
        store_thread: StoreThread,
        tasks: Tasks,
    ) -> None:
        self._connector = connector
        self._store = store
        self._served = served
        self._subscribed = subscribed
        self._delivery = delivery
        self._store_thread = store_thread
        self._tasks = tasks
        self._unsubscribe: Callable[[], None] | None = None
        self._timer: asyncio.Task[None] | None = None
        self.notices = 0
        """Peers' notices this node acted on (entries appended, subscriptions)."""

    # -- sending (on the store thread, inside the write's transaction) --------------------------

    def announce_appended(self, gateway_ids: Iterable[str]) -> None:
        """Announce entries appended for ``gateway_ids``: call it inside the ``atomic()`` block
        that appends them (sent on commit).  Raises ``StoreError`` when the server fails."""
        origin = self._connector.buffer.origin
        for gateway_id in sorted(set(gateway_ids)):
            self._store.notify(CHANNEL, json.dumps({"o": origin, "g": gateway_id}))

    def subscribe(self, gateway_id: str, platform: str) -> bool:
        """Record a subscription durably and announce it in the same transaction (on the store
        thread); returns whether it was new.  Raises ``StoreError`` when the store fails."""
        with self._store.atomic():
            added = self._connector.subscriptions.add(gateway_id, platform)
            payload = {"o": self._connector.buffer.origin, "g": gateway_id, "p": platform}
            self._store.notify(CHANNEL, json.dumps(payload))
        return added

    # -- receiving ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen for peers' notices and start the sweep timer.  Raises ``StoreError`` when the
        store cannot listen (a node that cannot hear its peers must not serve)."""
        loop = asyncio.get_running_loop()

        def heard(payload: str) -> None:  # on the store's listener thread
            loop.call_soon_threadsafe(self._heard, payload)

        self._unsubscribe = await loop.run_in_executor(
            None, functools.partial(self._store.listen, CHANNEL, heard)
        )
        if self._connector.cluster_sweep_s > 0:
            self._timer = self._tasks.spawn(self._sweeps())

    async def stop(self) -> None:
        """Stop listening and sweeping (bounded)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            await asyncio.get_running_loop().run_in_executor(None, unsubscribe)

    def _heard(self, payload: str) -> None:
        """On the loop: act on one notice (see the module docs for its shape)."""
        try:
            notice = json.loads(payload)
        except ValueError:
            notice = None
        if not isinstance(notice, dict) or not all(
            isinstance(notice.get(key), str) for key in ("o", "g")
        ):
            log.debug(
                "connector: ignored a notice on %s: %s", CHANNEL, peer_text(payload, limit=80)
            )
            return
        if notice["o"] == self._connector.buffer.origin:
            return  # our own: delivered by this node already
        gateway_id: str = notice["g"]
        platform = notice.get("p")
        if platform is not None:
            if isinstance(platform, str):
                self.notices += 1
                self._subscribed.setdefault(gateway_id, set()).add(platform)
            return
        instance = self._served.get(gateway_id)
        if instance is not None and instance.is_handshaken():
            self.notices += 1
            self._delivery.catch_up(instance)

    async def _sweeps(self) -> None:
        """Every ``cluster_sweep_s``: re-read the subscriptions and catch up every gateway
        served here (what a lost notice would have triggered)."""
        clock = self._connector.clock
        while True:
            await clock.sleep(self._connector.cluster_sweep_s)
            try:
                await self.refresh_subscriptions()
            except Exception:
                log.warning("connector: re-reading the subscriptions failed", exc_info=True)
            for instance in list(self._served.values()):
                if instance.is_handshaken():
                    self._delivery.catch_up(instance)

    async def refresh_subscriptions(self) -> None:
        """Merge the durable subscriptions (peers' included) into this node's table.  Raises
        ``StoreError`` when the store cannot be read."""
        active = await self._store_thread.run(self._connector.subscriptions.active)
        for gateway_id, platforms in active.items():
            self._subscribed.setdefault(gateway_id, set()).update(platforms)

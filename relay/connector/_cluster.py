"""Connector nodes sharing one store: a cluster behind one URL.

Several connectors (nodes) on one :class:`~statecore.claims.NotifyingStore` (PostgreSQL) share
the durable buffer, the subscriptions, the provenance memory and the chat tenants.  A gateway's
socket is held by one node; a platform's inbound event may be accepted by any node.  What makes
that work:

* **Announced appends.**  A node that appends inbound entries announces each gateway it
  appended for on :data:`CHANNEL`, in the same transaction (the notification is sent when the
  entries are committed, never for a rolled-back write).  The node holding that gateway's
  socket, if any, delivers the entries other nodes appended (:meth:`Delivery.catch_up
  <relay.connector._delivery.Delivery.catch_up>`); the others ignore the notice.  A node never
  acts on its own notices: its own entries it delivers itself, live or by a replay.
* **Announced subscriptions.**  A hello recorded by one node is announced, so that every node
  routes that platform's traffic to the gateway from then on, without a restart.
* **Provenance read through.**  A node that does not hold a target in memory asks the store
  before it declines an egress (another node may have learned it).  A target forgotten on one
  node is announced in the forget's transaction; every peer reads that row again and stops
  allowing it.
* **Chat tenants read through.**  With a tenants table, a node that does not hold a chat's
  tenant reads it from the store before the tenant guard decides (a miss costs one read, a hit
  that allows is one dictionary lookup), and reads it again before the guard declines.  A chat
  another node learns, moves or forgets is announced; every peer reads that row again.
* **The roster** (:mod:`relay.connector.nodes`): every node writes the gateway ids it serves to
  its row on each heartbeat and whenever one comes or goes; :meth:`Cluster.roster` reads every
  live node's part.  A node silent longer than the bound (three heartbeats, at least
  :data:`MIN_BOUND_S`) is out of it: give every node the same ``cluster_sweep_s``, and clocks
  that agree to well within the bound.
* **A sweep on a timer** (``cluster_sweep_s``): notifications are hints (one sent while a
  listener reconnects is lost), so every node also catches up each gateway it serves, re-reads
  the subscriptions, and re-reads the chat tenants and the forgotten targets a page
  (:data:`PAGE`) per sweep, every sweep.  A lost notice costs latency, never an entry: a moved
  or forgotten chat, or a forgotten target, is seen at the latest when the sweep's pages come
  round to it (one sweep per :data:`PAGE` rows of its table).

A node killed mid-replay loses nothing: what it sent and what was not acked stays unacked in
the shared buffer, and the gateway's next connection -- to whichever node the URL leads it --
replays exactly that tail.  Acks retire entries in the shared buffer, whichever node took them.

The notices are JSON objects, ``origin`` being the announcing node's buffer origin
(:attr:`~relay.connector.buffer.InboundBuffer.origin`):

* ``{"o": origin, "g": gateway_id}`` -- entries appended;
* ``{"o": origin, "g": gateway_id, "p": platform}`` -- a subscription;
* ``{"o": origin, "t": [platform, chat_id]}`` -- a chat's tenant learned, moved or forgotten;
* ``{"o": origin, "f": [gateway_id, platform, target]}`` -- a provenance target forgotten.

The last two carry no ``"g"``: a node of an earlier release ignores them.  Anything else on the
channel is ignored (logged at DEBUG): the channel is readable and writable by every client of
the database, and a notice only ever makes a node read the store (the rows a notice names are
read again, at most :data:`MAX_PENDING` waiting at once; beyond that the sweep reads them).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from relay.connector._delivery import Delivery
from relay.connector._instance import Instance
from relay.connector._store_thread import StoreThread
from relay.connector._tasks import Tasks
from relay.connector.buffer import InboundBuffer
from relay.connector.chat_tenants import ChatTenants
from relay.connector.nodes import ClusterRoster
from relay.connector.provenance import Provenance
from relay.connector.subscriptions import Subscriptions
from relay.wire.logtext import peer_text
from statecore.claims import MAX_PAYLOAD_BYTES, NotifyingStore
from statecore.clock import Clock

__all__ = ["CHANNEL", "MAX_PENDING", "MIN_BOUND_S", "PAGE", "Cluster", "ClusterSettings"]

# Every part of the connector logs to the one logger docs/configuration.md names.
log = logging.getLogger("relay.connector.server")

CHANNEL = "statecore_relay"
"""The channel connector nodes announce appended entries and subscriptions on."""

PAGE = 1000
"""Rows of the chat tenants, and of the forgotten targets, one sweep re-reads."""

MAX_PENDING = 10_000
"""Rows named by notices waiting to be read again at most; a notice beyond is dropped (the
sweep reads its row in its turn)."""

MIN_BOUND_S = 2.0
"""The shortest liveness bound of the roster (a busy node may miss a heartbeat or two)."""

_HEARTBEAT_S = 5.0
"""How often a node with no sweep (``cluster_sweep_s`` 0) still writes its roster heartbeat."""

_BATCH = 100
"""Rows named by notices read again in one call on the store thread."""

_Reread = tuple[str, ...]
"""A row a notice named: ``("t", platform, chat_id)`` or ``("f", gateway, platform, target)``."""


class ClusterSettings(Protocol):
    """What the cluster reads of the connector."""

    @property
    def buffer(self) -> InboundBuffer:
        """The durable inbound buffer (on the shared store)."""

    @property
    def subscriptions(self) -> Subscriptions:
        """The durable subscriptions (on the shared store)."""

    @property
    def provenance(self) -> Provenance:
        """The durable provenance memory (on the shared store)."""

    @property
    def chat_tenants(self) -> ChatTenants:
        """The durable chat tenants (on the shared store)."""

    @property
    def clock(self) -> Clock:
        """The connector's clock (the sweep's timer)."""

    @property
    def cluster_sweep_s(self) -> float:
        """Seconds between two sweeps (0: none)."""

    @property
    def buffer_retention_s(self) -> float:
        """How long a silent node's roster row is kept before it is deleted."""

    @property
    def url(self) -> str:
        """Where the node listens (written in its roster row)."""


class Cluster:
    """One node's part in a connector cluster (see the module docs).

    ``served`` is the connector's table of served connections, ``subscribed`` its table of the
    platforms each gateway said hello for (updated from peers' notices and sweeps).  Building
    it makes the connector's provenance and chat tenants announce their changes, and registers
    the roster's kind in ``store``.
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
        """Peers' notices this node acted on (entries appended, subscriptions, rows read
        again)."""
        self.dropped = 0
        """Notices dropped because :data:`MAX_PENDING` rows were waiting to be read again."""
        self._pending: dict[_Reread, None] = {}  # rows notices named, oldest first
        self._drainer: asyncio.Task[None] | None = None
        self._publisher: asyncio.Task[None] | None = None
        self._roster_dirty = False
        self._cursors = {"t": "", "f": ""}  # where the sweep's next page of each table starts
        self.heartbeat_s = connector.cluster_sweep_s or _HEARTBEAT_S
        """How often this node writes its roster row."""
        self.nodes = ClusterRoster(
            store,
            node_id=connector.buffer.origin,
            bound_s=max(3 * self.heartbeat_s, MIN_BOUND_S),
            clock=connector.clock,
        )
        """The cluster's durable roster, this node's row written by it."""
        connector.chat_tenants.announce = self._announce_tenant
        connector.provenance.announce_forget = self._announce_forget

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

    def _announce_tenant(self, platform: str, chat_id: str) -> None:
        self._announce({"t": [platform, chat_id]})

    def _announce_forget(self, gateway_id: str, platform: str, target: str) -> None:
        self._announce({"f": [gateway_id, platform, target]})

    def _announce(self, notice: dict[str, Any]) -> None:
        """Send one notice inside the caller's transaction; one too long for a notification
        is not sent (the peers' sweeps read the row in their turn)."""
        payload = json.dumps({"o": self._connector.buffer.origin, **notice})
        if len(payload.encode("utf-8")) > MAX_PAYLOAD_BYTES:
            log.debug("connector: a notice too long to send; the peers' sweeps will read it")
            return
        self._store.notify(CHANNEL, payload)

    # -- the roster ---------------------------------------------------------------------------

    def roster_changed(self) -> None:
        """The served table changed (on the loop): publish this node's part soon."""
        self._roster_dirty = True
        if self._timer is not None and (self._publisher is None or self._publisher.done()):
            self._publisher = self._tasks.spawn(self._publish_changes())

    async def _publish_changes(self) -> None:
        while self._roster_dirty:
            try:
                await self.publish()
            except Exception:
                log.warning("connector: publishing this node's roster failed", exc_info=True)
                return  # the next heartbeat writes it

    async def publish(self) -> None:
        """Write this node's roster row now (the gateway ids it serves).  Raises
        ``StoreError`` when the store fails."""
        self._roster_dirty = False
        gateways = sorted(self._served)
        await self._store_thread.run(
            functools.partial(self.nodes.publish, gateways, url=self._connector.url)
        )

    async def roster(self) -> dict[str, list[str]]:
        """The cluster-wide roster: node id (its buffer origin) -> the gateway ids it serves,
        every live node (this one as it is now, its peers as their last heartbeat said).
        Raises ``StoreError`` when the store cannot be read."""
        found = await self._store_thread.run(self.nodes.read)
        found[self._connector.buffer.origin] = sorted(self._served)
        return dict(sorted(found.items()))

    # -- receiving ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen for peers' notices, join the roster and start the sweep timer.  Raises
        ``StoreError`` when the store cannot listen or be written (a node that cannot hear its
        peers must not serve)."""
        loop = asyncio.get_running_loop()

        def heard(payload: str) -> None:  # on the store's listener thread
            loop.call_soon_threadsafe(self._heard, payload)

        self._unsubscribe = await loop.run_in_executor(
            None, functools.partial(self._store.listen, CHANNEL, heard)
        )
        await self._store_thread.run(
            functools.partial(self.nodes.prune, older_than_s=self._connector.buffer_retention_s)
        )
        await self.publish()
        self._timer = self._tasks.spawn(self._sweeps())

    async def stop(self) -> None:
        """Stop listening and sweeping, and leave the roster (bounded; a failure to write that
        is logged: the row then drops out after the bound)."""
        joined = self._timer is not None
        for task in (self._timer, self._publisher, self._drainer):
            if task is not None:
                task.cancel()
        self._timer = self._publisher = self._drainer = None
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            await asyncio.get_running_loop().run_in_executor(None, unsubscribe)
        if joined:
            try:
                await self._store_thread.run(self.nodes.leave)
            except Exception:
                log.warning("connector: leaving the cluster's roster failed", exc_info=True)

    def _heard(self, payload: str) -> None:
        """On the loop: act on one notice (see the module docs for its shape)."""
        try:
            notice = json.loads(payload)
        except ValueError:
            notice = None
        if not isinstance(notice, dict) or not isinstance(notice.get("o"), str):
            self._ignored(payload)
            return
        if notice["o"] == self._connector.buffer.origin:
            return  # our own: delivered (or applied) by this node already
        row = _named_row(notice)
        if row is not None:
            self._reread(row)
            return
        gateway_id = notice.get("g")
        if not isinstance(gateway_id, str):
            self._ignored(payload)
            return
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

    @staticmethod
    def _ignored(payload: str) -> None:
        log.debug("connector: ignored a notice on %s: %s", CHANNEL, peer_text(payload, limit=80))

    def _reread(self, row: _Reread) -> None:
        """Queue one row a peer changed to be read again (coalesced, bounded)."""
        if row not in self._pending and len(self._pending) >= MAX_PENDING:
            self.dropped += 1
            return
        self._pending[row] = None
        if self._drainer is None or self._drainer.done():
            self._drainer = self._tasks.spawn(self._drain())

    async def _drain(self) -> None:
        """Read again the rows notices named, a batch per call on the store thread."""
        while self._pending:
            batch = list(self._pending)[:_BATCH]
            for row in batch:
                del self._pending[row]
            try:
                await self._store_thread.run(functools.partial(self._read_rows, batch))
            except Exception:
                log.warning("connector: reading rows a peer changed failed", exc_info=True)
                self._pending.clear()  # the store fails: the sweep reads them in their turn
                return
            self.notices += len(batch)

    def _read_rows(self, rows: list[_Reread]) -> None:
        """On the store thread: each row into memory as the store has it now."""
        connector = self._connector
        for row in rows:
            if row[0] == "t":
                connector.chat_tenants.reread(row[1], row[2])
            else:
                connector.provenance.reread(row[1], row[2], row[3])

    async def read_tenant(self, platform: str, chat_id: str) -> str | None:
        """Read one chat's tenant through to the shared store (the tenant guard's look before
        it decides on a chat this node does not hold, or declines); returns it (None: the
        platform never showed the chat).  Raises ``StoreError`` when the store cannot be
        read."""
        return await self._store_thread.run(
            functools.partial(self._connector.chat_tenants.reread, platform, chat_id)
        )

    async def _sweeps(self) -> None:
        """Every heartbeat: write this node's roster row; and when sweeping
        (``cluster_sweep_s`` > 0): re-read the subscriptions and a page of the chat tenants and
        of the forgotten targets, and catch up every gateway served here (what a lost notice
        would have triggered)."""
        clock = self._connector.clock
        while True:
            await clock.sleep(self.heartbeat_s)
            try:
                await self.publish()
            except Exception:
                log.warning("connector: writing this node's roster row failed", exc_info=True)
            if not self._connector.cluster_sweep_s:
                continue
            try:
                await self.refresh_subscriptions()
                await self._store_thread.run(self._read_pages)
            except Exception:
                log.warning("connector: re-reading the shared tables failed", exc_info=True)
            for instance in list(self._served.values()):
                if instance.is_handshaken():
                    self._delivery.catch_up(instance)

    def _read_pages(self) -> None:
        """On the store thread: the next page of the chat tenants and of the forgotten
        targets, into memory."""
        connector = self._connector
        cursors = self._cursors
        cursors["t"] = connector.chat_tenants.reread_page(cursors["t"], limit=PAGE)
        cursors["f"] = connector.provenance.reread_forgotten(cursors["f"], limit=PAGE)

    async def refresh_subscriptions(self) -> None:
        """Merge the durable subscriptions (peers' included) into this node's table.  Raises
        ``StoreError`` when the store cannot be read."""
        active = await self._store_thread.run(self._connector.subscriptions.active)
        for gateway_id, platforms in active.items():
            self._subscribed.setdefault(gateway_id, set()).update(platforms)


def _named_row(notice: Mapping[str, Any]) -> _Reread | None:
    """The row a tenant or forget notice names (None: it is neither)."""
    for key, size in (("t", 2), ("f", 3)):
        value = notice.get(key)
        if (
            isinstance(value, list)
            and len(value) == size
            and all(isinstance(part, str) for part in value)
        ):
            return (key, *value)
    return None

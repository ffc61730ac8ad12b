"""The reference connector: the relay's server side, in front of the chat platforms.

It holds the platform credentials (its drivers), authenticates each gateway at the upgrade,
answers every hello with that platform's descriptor, performs outbound actions for the
identities a connection said hello for (through the tenant guard, or provenance when there is no
tenants table), and buffers inbound events durably for an instance that is asleep, replaying
them in order on its next handshake.  With a tenants table the tenant each chat belongs to, as
the platform's inbound traffic said it, is kept in the store too
(:mod:`relay.connector.chat_tenants`) and read back into memory at start.

One authenticated gateway id is served on at most one connection.  A second one never makes the
two fight (docs/wire-contract.md, "Compatibility"): while the served connection answers a ping
within the liveness probe time it stays served and the newer one waits as a *standby* (unserved,
not closed; its hellos held); the moment the served one goes -- or fails a probe -- the newest
standby is promoted.  Toward a gateway that did not announce our additions (an original one)
nothing but the original contract is used.  Store work runs on one dedicated thread, never on
the event loop.

This module holds the public face: :class:`Connector` (configuration, start and stop).  The
connection lifecycle (:data:`CONNECTION`, :class:`ConnectionState`) is declared in
:mod:`relay.connector.connection` and re-exported here.  The work is done by private
collaborators, one concept each:

* :mod:`relay.connector._instance` -- the record of one connection (its CONNECTION machine);
* :mod:`relay.connector._admission` -- the upgrade: the relay path and the token;
* :mod:`relay.connector._roster` -- which connection serves a gateway id (standbys, probes);
* :mod:`relay.connector._reader` -- reading a connection's frames and dispatching them;
* :mod:`relay.connector._handshake` -- answering hellos (descriptors, subscriptions, replay);
* :mod:`relay.connector._egress` -- outbound actions: tenant guard, idempotency, drivers;
* :mod:`relay.connector._inbound` -- routing a platform's inbound events to gateways (a copy
  of an event taken before skipped, an event no gateway listens to held);
* :mod:`relay.connector._hold` -- releasing held events to the gateway that says hello;
* :mod:`relay.connector._intake_handle` -- what a driver's ``attach`` gets
  (:class:`~relay.connector.intake.DriverIntake`: the intake, rejected events, notes);
* :mod:`relay.connector._delivery` -- replay, the windowed live pump, acks, replay records;
* :mod:`relay.connector._store_thread` -- the store thread and its grouped write rounds;
* :mod:`relay.connector._housekeeping` -- expiring and pruning old rows (buffer entries,
  targets, dedupe keys, held events, rejected records, notes);
* :mod:`relay.connector._http` -- ``GET /healthz`` and ``GET /metrics`` on the same port;
* :mod:`relay.connector._cluster` -- nodes sharing one store: announced appends, catch-up,
  provenance and chat tenants read through, the cluster's roster (:meth:`Connector.roster`);
* :mod:`relay.connector._tasks` -- the background tasks the connector owns.

The collaborators never import this module: each reads the connector through a small protocol
of :mod:`relay.connector._settings` naming exactly what it uses.

Every part logs to the logger named ``relay.connector.server`` (docs/configuration.md).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import math
from collections.abc import Iterable, Mapping, Sequence

import attrs
from websockets.asyncio.server import Server, ServerConnection, serve

from relay.connector._admission import authenticate
from relay.connector._cluster import Cluster
from relay.connector._delivery import Delivery
from relay.connector._egress import EGRESS_DECLINED_MESSAGE, Egress
from relay.connector._handshake import Handshake
from relay.connector._hold import Holding
from relay.connector._housekeeping import Housekeeping
from relay.connector._http import HttpEndpoints
from relay.connector._inbound import InboundRouter
from relay.connector._instance import Instance
from relay.connector._intake_handle import ConnectorIntake
from relay.connector._log import log, report_suppressed
from relay.connector._reader import Reader
from relay.connector._roster import Roster
from relay.connector._settings import MetricsText, WakeHook
from relay.connector._store_thread import StoreThread
from relay.connector._tasks import Tasks
from relay.connector._tracing import traced
from relay.connector.buffer import InboundBuffer
from relay.connector.chat_tenants import ChatTenants
from relay.connector.connection import CONNECTION, ConnectionState
from relay.connector.driver_notes import DriverNotes
from relay.connector.held import HeldEvents
from relay.connector.intake import RunningDriver
from relay.connector.platform import PlatformDriver
from relay.connector.provenance import Provenance
from relay.connector.rejected import RejectedEvents
from relay.connector.seen import SeenKeys
from relay.connector.subscriptions import Subscriptions
from relay.wire.auth import DEFAULT_MAX_TTL_S
from relay.wire.compat import OUR_FEATURES, TRACE_CONTEXT
from relay.wire.descriptor import CapabilityDescriptor
from relay.wire.frames import InboundEvent
from relay.wire.logtext import peer_text
from relay.wire.throttle import LogLimits
from statecore.claims import NotifyingStore
from statecore.clock import Clock, SystemClock
from statecore.metrics import NO_METRICS, Metrics
from statecore.store import Store
from statecore.tracing import refresh as tracing_on

__all__ = [
    "CONNECTION",
    "DRIVER_BOUND_S",
    "EGRESS_DECLINED_MESSAGE",
    "MIN_SEEN_RETENTION_S",
    "ConnectionState",
    "Connector",
    "MetricsText",
    "WakeHook",
]


class Connector:
    """The reference connector server (see the module docs).

    ``Connector(store, *, secrets, descriptors=None, drivers, tenants=None, open_egress=False,
    wake_hook=None, wake_interval_s=30.0, retention_s=86400.0, max_frame_bytes=1 MiB,
    liveness_probe_s=5.0, max_token_ttl_s=3600, clock=None, buffer_retention_s=86400.0,
    prune_interval_s=3600.0, metrics=NO_METRICS, http_metrics=None, cluster=False,
    cluster_sweep_s=5.0, store_threads=True, buffer_origin=None, seen_retention_s=172800.0,
    max_held=10000)``:

    * ``secrets``: gateway id → its secrets, newest first (rotation);
    * ``descriptors``: platform → descriptor (default: each driver's own); the connector adds
      its own announcement (:data:`~relay.wire.compat.OUR_FEATURES`) to each;
    * ``drivers``: platform → :class:`~relay.connector.platform.PlatformDriver`;
    * ``tenants``: gateway id → approved scope ids (and user ids).  With it, inbound events go
      only to gateways approved for their scope (or user), and egress is refused
      (``egress_declined``) for targets not approved.  Without it, every gateway that said hello
      for a platform receives that platform's traffic, and may address only the chats and users
      it received inbound from (provenance, kept durably) -- unless ``open_egress`` is set;
    * ``liveness_probe_s``: how long a served connection has to answer a ping when another
      connection of its gateway waits (and how often it is probed meanwhile);
    * ``max_token_ttl_s``: tokens living longer than this are refused;
    * ``retention_s``: how long an unacked buffered entry waits before it expires (counted and
      logged, never delivered); ``buffer_retention_s``: how long an acked or expired entry (and
      a forgotten provenance target) is kept before the housekeeping deletes it, every
      ``prune_interval_s`` on ``clock`` (0: never; see :mod:`relay.connector._housekeeping`);
    * ``metrics`` (:mod:`statecore.metrics`) gets the buffer's depth and replay lag and each
      prune; ``http_metrics`` (a callable returning Prometheus text) is what ``GET /metrics``
      answers with, else 404; ``GET /healthz`` answers always (:mod:`relay.connector._http`);
    * ``cluster``: this connector is one node of several sharing ``store`` (which must carry
      notifications: PostgreSQL), usually started with ``reuse_port`` behind one URL; an event
      any node accepts reaches the gateway whose socket another node holds, and every node
      re-checks the shared tables every ``cluster_sweep_s`` (:mod:`relay.connector._cluster`);
    * ``store_threads=False``: store work in turns of the event loop (:mod:`relay.sim.loop`);
    * ``buffer_origin``: the prefix of the bufferIds this connector hands out
      (:attr:`~relay.connector.buffer.InboundBuffer.origin`), 1 to 32 ASCII letters and digits;
      ``None`` (the default): random per connector, which is what nodes of a cluster need (each
      tells its own entries by it, so no two may share one).  Give a fixed one only where runs
      must repeat exactly (a seeded simulation);
    * ``seen_retention_s``: how long the durable inbound dedupe key of an event (its platform
      and ``message_id``) is kept; at least a day (:data:`MIN_SEEN_RETENTION_S`), and it must
      exceed the longest redelivery window of the platforms fronted;
    * ``max_held``: the most events no gateway listened to that are held for the first one
      that says hello (every platform together); past it the intake raises
      :class:`~relay.connector.intake.IntakeFull` and writes nothing.

    Every driver's ``attach`` gets :attr:`driver_intake` (a
    :class:`~relay.connector.intake.DriverIntake`); drivers that are
    :class:`~relay.connector.intake.RunningDriver` are started once the connector listens and
    stopped first when it stops.

    Raises ``ValueError`` for an option out of its range and ``TypeError`` for one of the wrong
    kind (``buffer_origin`` not a str, ``cluster`` without a notifying store), before anything
    is built or registered in ``store``.

    ``async with Connector(...) as connector:`` starts it (any free port on 127.0.0.1, unless
    it was started already) and stops it.

    The class is long because this docstring is the one reference of every option and the
    constructor wires the connector's parts together; what each part does lives in its own
    module (roster, reader, delivery, egress, store thread, housekeeping, HTTP, cluster).
    """

    def __init__(
        self,
        store: Store,
        *,
        secrets: Mapping[str, Sequence[str | bytes]],
        drivers: Mapping[str, PlatformDriver],
        descriptors: Mapping[str, CapabilityDescriptor] | None = None,
        tenants: Mapping[str, Iterable[str]] | None = None,
        open_egress: bool = False,
        wake_hook: WakeHook | None = None,
        wake_interval_s: float = 30.0,
        retention_s: float = 86_400.0,
        max_frame_bytes: int = 1_048_576,
        liveness_probe_s: float = 5.0,
        max_token_ttl_s: float = DEFAULT_MAX_TTL_S,
        clock: Clock | None = None,
        buffer_retention_s: float = 86_400.0,
        prune_interval_s: float = 3600.0,
        metrics: Metrics = NO_METRICS,
        http_metrics: MetricsText | None = None,
        cluster: bool = False,
        cluster_sweep_s: float = 5.0,
        store_threads: bool = True,
        buffer_origin: str | None = None,
        seen_retention_s: float = 172_800.0,
        max_held: int = 10_000,
    ) -> None:
        _check_options(
            seen_retention_s=seen_retention_s,
            max_held=max_held,
            liveness_probe_s=liveness_probe_s,
            buffer_retention_s=buffer_retention_s,
            prune_interval_s=prune_interval_s,
            cluster_sweep_s=cluster_sweep_s,
            http_metrics=http_metrics,
            store_threads=store_threads,
            buffer_origin=buffer_origin,
        )
        if cluster and not isinstance(store, NotifyingStore):
            raise TypeError(
                "cluster=True needs a store that carries notifications between processes "
                f"(PostgreSQL), not {type(store).__name__}"
            )
        self.buffer_retention_s = float(buffer_retention_s)
        self.seen_retention_s = float(seen_retention_s)
        self.max_held = max_held
        self.prune_interval_s = float(prune_interval_s)
        self.metrics = metrics
        self.http_metrics = http_metrics
        self.secrets = {gateway: list(values) for gateway, values in secrets.items()}
        self.drivers = dict(drivers)
        fronted = dict(descriptors or {})
        for platform, driver in self.drivers.items():
            fronted.setdefault(platform, driver.descriptor())
        # The connector announces itself in every descriptor it sends (relay.wire.compat).
        self.descriptors = {
            platform: attrs.evolve(
                descriptor,
                features=[
                    *OUR_FEATURES,
                    *((TRACE_CONTEXT,) if tracing_on() else ()),  # only while tracing is on
                    *(f for f in descriptor.features if f not in OUR_FEATURES),
                ],
            )
            for platform, descriptor in fronted.items()
        }
        self.open_egress = open_egress
        self.liveness_probe_s = float(liveness_probe_s)
        self.max_token_ttl_s = max_token_ttl_s
        self.tenants = None if tenants is None else {g: frozenset(s) for g, s in tenants.items()}
        self.wake_hook = wake_hook
        self.wake_interval_s = wake_interval_s
        self.max_frame_bytes = max_frame_bytes
        self.clock: Clock = clock or SystemClock()
        self.buffer = InboundBuffer(
            store, retention_s=retention_s, clock=self.clock, origin=buffer_origin
        )
        self.subscriptions = Subscriptions(store, clock=self.clock)
        self.provenance = Provenance(store, clock=self.clock)
        self._open_intake(store)
        self._server: Server | None = None
        self._instances: dict[str, Instance] = {}  # the served connection of each gateway
        self._standbys: dict[str, list[Instance]] = {}  # waiting connections, oldest first
        # Platforms each gateway said hello for: durable, so a restart keeps buffering for a
        # gateway that is asleep.
        self._subscriptions: dict[str, set[str]] = collections.defaultdict(set)
        self._subscriptions.update(self.subscriptions.active())
        # (platform, chat_id) -> the tenant key (scope id, or the user id of a DM) learned from
        # the platform's own inbound traffic, durably: it outranks whatever a gateway claims.
        self.chat_tenants = ChatTenants(store, clock=self.clock)
        # The collaborators are handed this connector and read its public settings (tenants,
        # drivers, ...) and parts (clock, buffer, provenance) when they use them, never a copy,
        # so that all of them always agree with its attributes; each sees it through its
        # protocol in relay.connector._settings.  What they share besides are the tables above,
        # passed explicitly.
        self._tasks = Tasks()
        # Rate limits of the lines no one connection causes (refused upgrades, undeliverable
        # events, failed HTTP reads); each connection has its own (Instance.log_limit).
        self._log_limits = LogLimits(clock=self.clock)
        self._store_thread = StoreThread(self, threads=store_threads)
        self._delivery = Delivery(
            self, served=self._instances, store=self._store_thread, tasks=self._tasks
        )
        holding = Holding(
            self, store=self._store_thread, delivery=self._delivery, tasks=self._tasks
        )
        handshake = Handshake(
            self,
            subscribed=self._subscriptions,
            store=self._store_thread,
            delivery=self._delivery,
            tasks=self._tasks,
            holding=holding,
        )
        self._roster = Roster(
            self,
            served=self._instances,
            standbys=self._standbys,
            delivery=self._delivery,
            tasks=self._tasks,
            on_promoted=handshake.answer_held_hellos,
        )
        self._inbound = InboundRouter(
            self,
            served=self._instances,
            subscribed=self._subscriptions,
            chat_tenants=self.chat_tenants,
            delivery=self._delivery,
            store=self._store_thread,
            tasks=self._tasks,
            log_limits=self._log_limits,
            holding=holding,
        )
        egress = Egress(self, chat_tenants=self.chat_tenants)
        traced(self._inbound, egress, "connector")  # a no-op while tracing is off
        self._reader = Reader(
            self,
            roster=self._roster,
            delivery=self._delivery,
            handshake=handshake,
            egress=egress,
            tasks=self._tasks,
        )
        self.cluster_sweep_s = float(cluster_sweep_s)
        self._cluster = (
            self._join_cluster(store, handshake, egress)
            if isinstance(store, NotifyingStore) and cluster
            else None
        )
        self._housekeeping = Housekeeping(self, store=self._store_thread)
        self._http = HttpEndpoints(
            self, served=self._instances, store=self._store_thread, log_limits=self._log_limits
        )
        self.url = ""
        """``ws://host:port`` once started; gateways dial it (``/relay`` is appended)."""
        self._attach_drivers()

    def _open_intake(self, store: Store) -> None:
        """The durable parts of the drivers' intake, registered in ``store``."""
        self.seen = SeenKeys(store, clock=self.clock)
        """The durable inbound dedupe keys (:mod:`relay.connector.seen`)."""
        self.hold = HeldEvents(store, clock=self.clock)
        """The events held for a gateway that has not said hello (:mod:`relay.connector.held`)."""
        self.rejected = RejectedEvents(store, clock=self.clock)
        """The events drivers could not map (:mod:`relay.connector.rejected`)."""
        self.notes = DriverNotes(store, clock=self.clock)
        """The drivers' own notes (:mod:`relay.connector.driver_notes`)."""

    def _attach_drivers(self) -> None:
        """Hand every driver the connector's intake."""
        self.driver_intake = ConnectorIntake(
            self.intake,
            store=self._store_thread,
            notes=self.notes,
            rejected=self.rejected,
            metrics=lambda: self.metrics,
            log_limits=self._log_limits,
        )
        """What every driver's ``attach`` gets: a :class:`~relay.connector.intake.DriverIntake`
        (callable as the plain intake)."""
        self._running: list[str] = []  # the running drivers started, in start order
        self.driver_failures: dict[str, str] = {}
        """Platform -> why its running driver's ``start`` failed (logged at ERROR too); the
        connector serves the other platforms.  A runner may refuse to go on with failures."""
        for driver in self.drivers.values():
            driver.attach(self.driver_intake)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, *, reuse_port: bool = False
    ) -> None:
        """Listen on ``host:port`` (0: any free port); ``url`` then says where.  The same port
        answers ``GET /healthz`` and ``GET /metrics``; the housekeeping timer starts.

        ``reuse_port`` lets several connector processes of a cluster listen on one port (the
        kernel spreads new connections among them: one URL, and a node that dies only takes
        its own connections with it).  A cluster node hears its peers before it accepts a
        connection; raises ``StoreError`` when it cannot, ``OSError`` when the port is taken.
        Then every driver that is a :class:`~relay.connector.intake.RunningDriver` is started,
        each within :data:`DRIVER_BOUND_S`: one that raises or takes longer is logged at ERROR
        and the others start all the same.
        """
        if self._cluster is not None:
            await self._cluster.start()
        self._server = await serve(
            self._serve,
            host,
            port,
            process_request=self._http.process_request,
            compression=None,
            max_size=self.max_frame_bytes + 1024,
            reuse_port=reuse_port,
        )
        sockname = next(iter(self._server.sockets)).getsockname()
        self.url = f"ws://{sockname[0]}:{sockname[1]}"
        self._housekeeping.start()
        await self._start_drivers()

    async def stop(self) -> None:
        """Stop the running drivers (each within :data:`DRIVER_BOUND_S`; a failure is
        logged), close every connection and stop listening; buffered and held entries stay in
        the store."""
        await self._stop_drivers()
        self._housekeeping.stop()
        if self._cluster is not None:
            await self._cluster.stop()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self._tasks.cancel_all()
        self._roster.clear()
        report_suppressed(self._log_limits, "this connector")
        await self._store_thread.stop()

    async def _start_drivers(self) -> None:
        """Start every running driver not started yet, concurrently, each bounded and
        isolated."""
        due = [
            platform
            for platform, driver in self.drivers.items()
            if isinstance(driver, RunningDriver) and platform not in self._running
        ]
        self._running.extend(due)  # a start that fails is stopped too (it may be half done)
        await asyncio.gather(*(self._driver_call(p, "start") for p in due))

    async def _stop_drivers(self) -> None:
        """Stop the drivers started, concurrently, each bounded and isolated."""
        due, self._running = self._running, []
        await asyncio.gather(*(self._driver_call(p, "stop") for p in due))

    async def _driver_call(self, platform: str, what: str) -> None:
        driver = self.drivers[platform]
        assert isinstance(driver, RunningDriver)
        call = driver.start if what == "start" else driver.stop
        try:
            await asyncio.wait_for(call(), DRIVER_BOUND_S)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if what == "start":
                self.driver_failures[platform] = f"{type(exc).__name__}: {str(exc)[:300]}"
            # One line, the text escaped: a driver's error may quote what its platform said.
            log.error(
                "connector: the %s driver failed to %s: %s: %s",
                platform,
                what,
                type(exc).__name__,
                peer_text(str(exc)),
            )

    async def __aenter__(self) -> Connector:
        """``async with Connector(...) as connector:`` starts it (unless started already); a
        start that raises (the port is taken) stops it again and the error propagates."""
        if self._server is None:
            try:
                await self.start()
            except BaseException:
                await self.stop()
                raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Stops it when the block ends, however it ends."""
        await self.stop()

    async def housekeep(self) -> dict[str, int]:
        """Run one housekeeping round now (the timer runs one every ``prune_interval_s``):
        expire unacked entries and held events past ``retention_s``, delete settled entries,
        forgotten targets, settled held events, dismissed rejected records and dropped notes
        past ``buffer_retention_s`` and dedupe keys past ``seen_retention_s``; returns the
        deletions by table (``buffer``, ``provenance``, ``seen``, ``held``, ``rejected``,
        ``notes``), each also reported to ``metrics.pruned`` and logged.  Raises
        ``StoreError`` when the store fails."""
        return await self._housekeeping.run()

    def buffered(self, gateway_id: str) -> int:
        """Unacked buffered entries for ``gateway_id``."""
        return self.buffer.count(gateway_id)

    def connected(self, gateway_id: str) -> bool:
        """True while ``gateway_id`` has a handshaken connection."""
        instance = self._instances.get(gateway_id)
        return instance is not None and instance.is_handshaken()

    async def roster(self) -> dict[str, list[str]]:
        """Node id -> the gateway ids it serves, of every live node of the cluster (read from
        the store: raises ``StoreError``); a lone connector answers ``{"": its own}``."""
        lone = {"": sorted(self._instances)}
        return lone if self._cluster is None else await self._cluster.roster()

    @property
    def cluster_notices(self) -> int:
        """Peers' notices this cluster node acted on (entries another node appended for a
        gateway served here, subscriptions another node recorded); 0 when not a cluster node."""
        return 0 if self._cluster is None else self._cluster.notices

    @property
    def undeliverable(self) -> int:
        """Inbound events no gateway listened to when they arrived (each logged at WARNING,
        rate-limited), since this connector was built: held for the first gateway that says
        hello (see :meth:`held`), or refused with ``IntakeFull`` because the hold was full."""
        return self._inbound.undeliverable

    @property
    def duplicates(self) -> int:
        """Copies of inbound events taken before (same platform and ``message_id``) that were
        not routed again, since this connector was built."""
        return self._inbound.duplicates

    @property
    def rejections(self) -> int:
        """Events drivers recorded as rejected through this connector (copies not counted)."""
        return self.driver_intake.rejections

    def held(self, platform: str | None = None) -> int:
        """Events held for a gateway that has not said hello (of ``platform``; None: all).
        Reads the store (as :meth:`buffered` does); raises ``StoreError``."""
        return self.hold.count(platform)

    # -- traffic -------------------------------------------------------------------------------

    async def intake(self, platform: str, event: InboundEvent) -> None:
        """Route one inbound event from ``platform`` to the gateways that should see it.

        Delivered live to a listening instance; appended to the durable buffer for one that is
        asleep, disconnected, buffered-only or still replaying its backlog (so order holds);
        held durably when no gateway listens.  A copy of an event taken before (same
        ``message_id``) is skipped; the key is written with the event's buffer appends.
        Raises :class:`~relay.connector.intake.IntakeFull` when the hold is full and
        ``StoreError`` when the store fails: nothing of the event was written, offer it
        again.  Drivers get :attr:`driver_intake`, which raises ``IntakeFull`` for both.
        """
        await self._inbound.intake(platform, event)

    def _join_cluster(self, store: NotifyingStore, handshake: Handshake, egress: Egress) -> Cluster:
        """Make this connector a cluster node: its appends and subscriptions are announced on
        the shared store, its peers' are heard, provenance is read through."""
        cluster = Cluster(
            self,
            store=store,
            served=self._instances,
            subscribed=self._subscriptions,
            delivery=self._delivery,
            store_thread=self._store_thread,
            tasks=self._tasks,
        )
        self._store_thread.on_appended = cluster.announce_appended
        handshake.subscribe = cluster.subscribe
        egress.recheck = self._recheck_provenance
        egress.read_tenant = cluster.read_tenant
        self._roster.on_change = cluster.roster_changed
        self._inbound.refresh = cluster.refresh_subscriptions
        return cluster

    async def _recheck_provenance(self, gateway_id: str, platform: str, target: str) -> bool:
        """A cluster node's read of the shared provenance for one target (store thread)."""
        return await self._store_thread.run(
            functools.partial(self.provenance.recheck, gateway_id, platform, target)
        )

    async def _serve(self, ws: ServerConnection) -> None:
        """One upgraded connection, from its authentication to its end."""
        authenticated = await authenticate(
            ws,
            secrets=self.secrets,
            clock=self.clock,
            max_ttl_s=self.max_token_ttl_s,
            log_limits=self._log_limits,
        )
        if authenticated is None:
            return
        gateway_id, features = authenticated
        instance = Instance(gateway_id, ws, features, self.clock)
        self._roster.admit(instance)
        await self._reader.read(instance)


_MAX_ORIGIN = 32
"""The longest ``buffer_origin`` a connector accepts."""

DRIVER_BOUND_S = 30.0
"""How long a running driver's ``start`` or ``stop`` may take before the connector gives up on
it (logged) and goes on."""

MIN_SEEN_RETENTION_S = 86_400.0
"""The shortest ``seen_retention_s``: the longest redelivery window of the platforms in view
(Telegram keeps an unconfirmed update 24 h; Matrix's transaction record lives 24 h)."""


def _check_options(
    *,
    seen_retention_s: float,
    max_held: int,
    liveness_probe_s: float,
    buffer_retention_s: float,
    prune_interval_s: float,
    cluster_sweep_s: float,
    http_metrics: MetricsText | None,
    store_threads: bool,
    buffer_origin: str | None,
) -> None:
    """Refuse a connector option out of its range (``ValueError``) or of the wrong kind
    (``TypeError``), before anything is built."""
    if not liveness_probe_s > 0:
        raise ValueError(f"liveness_probe_s must be positive, not {liveness_probe_s!r}")
    if isinstance(seen_retention_s, bool) or not isinstance(seen_retention_s, (int, float)):
        raise TypeError(f"seen_retention_s must be a number, not {seen_retention_s!r}")
    if not (math.isfinite(seen_retention_s) and seen_retention_s >= MIN_SEEN_RETENTION_S):
        raise ValueError(
            f"seen_retention_s must be at least {MIN_SEEN_RETENTION_S:g} s (longer than any "
            f"platform's redelivery window), not {seen_retention_s!r}"
        )
    if isinstance(max_held, bool) or not isinstance(max_held, int):
        raise TypeError(f"max_held must be an int, not {max_held!r}")
    if max_held < 1:
        raise ValueError(f"max_held must be at least 1, not {max_held!r}")
    if isinstance(buffer_retention_s, bool) or not buffer_retention_s > 0:
        raise ValueError(f"buffer_retention_s must be positive, not {buffer_retention_s!r}")
    if isinstance(prune_interval_s, bool) or not prune_interval_s >= 0:
        raise ValueError(f"prune_interval_s must be non-negative, not {prune_interval_s!r}")
    if isinstance(cluster_sweep_s, bool) or not cluster_sweep_s >= 0:
        raise ValueError(f"cluster_sweep_s must be non-negative, not {cluster_sweep_s!r}")
    if http_metrics is not None and not callable(http_metrics):
        raise TypeError("http_metrics must be a callable returning the metrics text")
    if not isinstance(store_threads, bool):
        raise TypeError(f"store_threads must be a bool, not {store_threads!r}")
    if buffer_origin is not None:
        if not isinstance(buffer_origin, str):
            raise TypeError(f"buffer_origin must be a str or None, not {buffer_origin!r}")
        # The origin and a seq in hex make each bufferId; 32 characters keep every id well
        # inside what the plain-ack fast path reads (relay.wire.codec.plain_acks).
        if not (
            0 < len(buffer_origin) <= _MAX_ORIGIN
            and buffer_origin.isascii()
            and buffer_origin.isalnum()
        ):
            raise ValueError(
                f"buffer_origin must be 1 to {_MAX_ORIGIN} ASCII letters and digits, "
                f"not {buffer_origin[:40]!r}"
            )

"""The reference connector: the relay's server side, in front of the chat platforms.

It holds the platform credentials (its drivers), authenticates each gateway at the upgrade,
answers every hello with that platform's descriptor, performs outbound actions for the
identities a connection said hello for (through the tenant guard, or provenance when there is no
tenants table), and buffers inbound events durably for an instance that is asleep, replaying
them in order on its next handshake.

One authenticated gateway id is served on at most one connection.  A second one never makes the
two fight (docs/wire-contract.md, "Compatibility"): while the served connection answers a ping
within the liveness probe time it stays served and the newer one waits as a *standby* (unserved,
not closed; its hellos held); the moment the served one goes -- or fails a probe -- the newest
standby is promoted.  Toward a gateway that did not announce our additions (an original one)
nothing but the original contract is used.  Store work runs on one dedicated thread, never on
the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any, TypeVar

import attrs
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from relay.connector.buffer import InboundBuffer
from relay.connector.platform import PlatformDriver, target_chat
from relay.connector.provenance import Provenance
from relay.connector.subscriptions import Subscriptions
from relay.wire.auth import DEFAULT_MAX_TTL_S, token_from_header, verify_token
from relay.wire.codec import PLAIN_ACK_LINE_MAX, FrameDecoder, encode, error_frame_for, plain_acks
from relay.wire.compat import (
    ACKED_LIVE,
    ERROR_FRAMES,
    EXPIRED_4419,
    FEATURES_HEADER,
    OUR_FEATURES,
    REPLACED_4409,
    parse_features,
)
from relay.wire.descriptor import CapabilityDescriptor
from relay.wire.errors import AuthError, ProtocolError
from relay.wire.frames import (
    EGRESS_DECLINED,
    DescriptorFrame,
    ErrorFrame,
    GoingIdle,
    GoingIdleAck,
    Hello,
    Inbound,
    InboundAck,
    InboundEvent,
    Interrupt,
    Outbound,
    OutboundOutcome,
    OutboundResult,
)
from relay.wire.throttle import LogThrottle
from relay.wire.urls import (
    CLOSE_EXPIRED,
    CLOSE_PROTOCOL,
    CLOSE_REPLACED,
    CLOSE_REVOKED,
    RELAY_PATH,
    clock_skew_reason,
)
from statecore.clock import Clock, SystemClock
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Store

__all__ = ["CONNECTION", "EGRESS_DECLINED_MESSAGE", "ConnectionState", "Connector", "WakeHook"]

log = logging.getLogger(__name__)

T = TypeVar("T")

WakeHook = Callable[[str], Awaitable[None]]
"""``await hook(gateway_id)``: called when the first event is buffered for a sleeping
instance, so a deployment can wake it (rate-limited per instance)."""

EGRESS_DECLINED_MESSAGE = "egress declined: target not approved for this connection"
"""The one refusal text of the tenant guard: it says nothing about other tenants."""

_MAX_VIOLATIONS = 20
_MAX_STANDBYS = 4
"""Standby connections kept per gateway id; a newer one beyond this closes the oldest."""
_MAX_HELD_HELLOS = 16
DEFAULT_WINDOW = 64
"""Unacked deliveries a gateway that acks live deliveries is sent at once, unless its hello
announced another ``window``."""
_OUTBOX_MAX = 1000
"""Lines waiting for one gateway's socket before it counts as behind (then it is served from the
durable buffer instead, and the connector's memory stays bounded)."""
_REPLAY_FIRST_CHUNK = 1000
_REPLAY_CHUNK = 5000
_SENT_GRACE_S = 1.0
"""A replayed entry still unacked this long after it was sent is recorded as ``sent``."""
_IDEMPOTENCY_CACHE = 10_000


class ConnectionState(StrEnum):
    """One authenticated gateway connection, as the connector serves it."""

    AWAITING_HELLO = "awaiting_hello"
    """Authenticated and served; no identity announced yet: nothing is delivered to it."""
    STANDBY = "standby"
    """Another connection of the same gateway is served and alive: this one waits, unserved
    and not closed (its hellos are held), until that one goes."""
    REPLAYING = "replaying"
    """Said hello; its buffered backlog is being replayed: new inbound is buffered behind it."""
    LIVE = "live"
    """Caught up: inbound is delivered live."""
    BUFFERED_ONLY = "buffered_only"
    """It said going_idle: inbound is buffered durably until its next connection."""
    CLOSED = "closed"
    """Terminal: the connection ended."""


_C = ConnectionState

CONNECTION: Lifecycle[ConnectionState] = Lifecycle(
    "connection",
    ConnectionState,
    initial=_C.AWAITING_HELLO,
    terminal=(_C.CLOSED,),
    description="One gateway connection at the connector: standby, hello, replay, live, buffered.",
    transitions=(
        # A second connection of a gateway whose served one is alive waits; promoted when it goes.
        Transition("stand_by", _C.AWAITING_HELLO, _C.STANDBY),
        Transition("promote", _C.STANDBY, _C.AWAITING_HELLO),
        Transition("hello", _C.AWAITING_HELLO, _C.REPLAYING),
        Transition("caught_up", _C.REPLAYING, _C.LIVE),
        # A gateway that acks live deliveries stopped keeping up (it stopped reading): what it
        # has not been sent is delivered from the durable buffer, as a replay, until caught up.
        Transition("fall_behind", _C.LIVE, _C.REPLAYING),
        # going_idle: stop live delivery (and any replay); a repeat is acked again.
        Transition(
            "go_idle",
            (_C.AWAITING_HELLO, _C.REPLAYING, _C.LIVE, _C.BUFFERED_ONLY),
            _C.BUFFERED_ONLY,
        ),
        Transition(
            "close",
            (_C.AWAITING_HELLO, _C.STANDBY, _C.REPLAYING, _C.LIVE, _C.BUFFERED_ONLY),
            _C.CLOSED,
        ),
    ),
)


class _Instance:
    """One authenticated connection of one gateway; its state is the CONNECTION machine."""

    def __init__(
        self, gateway_id: str, ws: ServerConnection, features: frozenset[str], clock: Clock
    ) -> None:
        self.gateway_id = gateway_id
        self.ws = ws
        # What the gateway announced (upgrade header, then hellos); empty: an original gateway,
        # which is sent nothing the original contract did not have.
        self.features = features
        self.protocol_hello = False  # a hello carried ``protocol``: not an original gateway
        self.identities: list[tuple[str, str]] = []
        self.machine = CONNECTION.track()  # many per connector: the table alone
        self.held_hellos: list[Hello] = []  # said while on standby, answered once promoted
        self.appended = 0  # events buffered for this instance while it replays
        self.violations = 0
        self.log_limit = LogThrottle(clock=clock)  # what the peer controls never floods the log
        # Replayed bufferIds, in send order, with when they were sent (loop time), whose replay
        # is not recorded yet and that have not been acked on this connection.
        self.unrecorded: dict[str, float] = {}
        self.record_timer: asyncio.Task[None] | None = None
        # Durable live delivery (ACKED_LIVE): buffered lines waiting for the pump, the seq of
        # the newest line handed to the socket (never sent twice), the pump and its wake-up.
        self.outbox: collections.deque[tuple[str, int, str]] = collections.deque()
        self.last_sent_seq: int | None = None
        self.pump: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()
        # The window: bufferIds sent on this connection and not acked yet; with ACKED_LIVE no
        # more than ``window`` of them at once (the gateway's bound on what it holds).
        self.window = DEFAULT_WINDOW
        self.unacked: set[str] = set()
        self.window_open = asyncio.Event()

    @property
    def acked_live(self) -> bool:
        """True when the gateway acks live deliveries: every event goes through the buffer."""
        return ACKED_LIVE in self.features

    @property
    def state(self) -> ConnectionState:
        """Where the connection is in its lifecycle."""
        return self.machine.state

    def current(self) -> ConnectionState:
        """The state now (a call: it changes across awaits, and must not be narrowed)."""
        return self.machine.state

    @property
    def live(self) -> bool:
        """True when inbound may be delivered live (not buffered) to this connection."""
        return self.machine.state is _C.LIVE

    @property
    def awake(self) -> bool:
        """True when the gateway said hello and has not asked to be buffered for."""
        return self.machine.state in (_C.REPLAYING, _C.LIVE)

    @property
    def announced(self) -> bool:
        """True when the gateway announced itself (features on the upgrade, or ``protocol`` in a
        hello): not an original-contract gateway."""
        return self.protocol_hello or bool(self.features)

    def platforms(self) -> set[str]:
        return {platform for platform, _ in self.identities}


class Connector:
    """The reference connector server (see the module docs).

    ``Connector(store, *, secrets, descriptors=None, drivers, tenants=None, open_egress=False,
    wake_hook=None, wake_interval_s=30.0, retention_s=86400.0, max_frame_bytes=1 MiB,
    liveness_probe_s=5.0, max_token_ttl_s=3600, clock=None)``:

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
    * ``max_token_ttl_s``: tokens living longer than this are refused.
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
    ) -> None:
        if not liveness_probe_s > 0:
            raise ValueError(f"liveness_probe_s must be positive, not {liveness_probe_s!r}")
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
        self.buffer = InboundBuffer(store, retention_s=retention_s, clock=self.clock)
        self.subscriptions = Subscriptions(store, clock=self.clock)
        self.provenance = Provenance(store, clock=self.clock)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="connector-store"
        )
        self._server: Server | None = None
        self._instances: dict[str, _Instance] = {}  # the served connection of each gateway
        self._standbys: dict[str, list[_Instance]] = {}  # waiting connections, oldest first
        self._watchers: dict[str, asyncio.Task[None]] = {}  # liveness probes, per gateway
        # One write round at a time on the store thread carries every queued append and ack.
        self._write_lock = threading.Lock()
        self._append_queue: list[
            tuple[str, str, InboundEvent, asyncio.Future[tuple[str, int, str]]]
        ] = []
        self._ack_queue: list[tuple[_Instance, list[str]]] = []
        self._drain_pending = False
        # Platforms each gateway said hello for: durable, so a restart keeps buffering for a
        # gateway that is asleep.
        self._subscriptions: dict[str, set[str]] = collections.defaultdict(set)
        self._subscriptions.update(self.subscriptions.active())
        self.undeliverable = 0
        """Inbound events no gateway was subscribed to (each logged at WARNING)."""
        # (platform, chat_id) -> the tenant key (scope id, or the user id of a DM) learned from
        # the platform's own inbound traffic: it outranks whatever a gateway claims.
        self._chat_tenants: dict[tuple[str, str], str] = {}
        self._outcomes: dict[tuple[str, str], asyncio.Future[OutboundOutcome]] = {}
        self._outcome_order: collections.deque[tuple[str, str]] = collections.deque()
        self._last_wake: dict[str, float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.url = ""
        """``ws://host:port`` once started; gateways dial it (``/relay`` is appended)."""
        for driver in self.drivers.values():
            driver.attach(self.intake)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on ``host:port`` (0: any free port); ``url`` then says where."""
        self._server = await serve(
            self._serve,
            host,
            port,
            process_request=self._check_path,
            compression=None,
            max_size=self.max_frame_bytes + 1024,
        )
        sockname = next(iter(self._server.sockets)).getsockname()
        self.url = f"ws://{sockname[0]}:{sockname[1]}"

    async def stop(self) -> None:
        """Close every connection and stop listening; buffered entries stay in the store."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        self._instances.clear()
        self._standbys.clear()
        self._watchers.clear()
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="connector-store"
        )

    def buffered(self, gateway_id: str) -> int:
        """Unacked buffered entries for ``gateway_id``."""
        return self.buffer.count(gateway_id)

    def connected(self, gateway_id: str) -> bool:
        """True while ``gateway_id`` has a handshaken connection."""
        instance = self._instances.get(gateway_id)
        return instance is not None and instance.state in (
            _C.REPLAYING,
            _C.LIVE,
            _C.BUFFERED_ONLY,
        )

    async def _store(self, fn: Callable[[], T]) -> T:
        """Run store work on the connector's store thread (ordered, off the event loop)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def _background(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- connections ---------------------------------------------------------------------------

    def _check_path(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.path.split("?", 1)[0] != RELAY_PATH:
            return connection.respond(404, "the relay lives at /relay\n")
        return None

    async def _serve(self, ws: ServerConnection) -> None:
        authenticated = await self._authenticate(ws)
        if authenticated is None:
            return
        gateway_id, features = authenticated
        instance = _Instance(gateway_id, ws, features, self.clock)
        if gateway_id in self._instances:
            self._stand_by(instance)
        else:
            self._instances[gateway_id] = instance
        decoder = FrameDecoder(max_frame_bytes=self.max_frame_bytes)
        plain_acks_ok = self.max_frame_bytes >= PLAIN_ACK_LINE_MAX
        aligned = True  # every message so far ended with a newline: the decoder holds nothing
        try:
            async for message in ws:
                # The bulk of a replay's return traffic: messages made only of acks in their
                # plain canonical form, which the decoder would turn into exactly these ids.
                if aligned and plain_acks_ok:
                    acked = plain_acks(message)
                    if acked is not None:
                        self._acked(instance, acked)
                        continue
                aligned = message[-1:] in ("\n", b"\n")
                for item in decoder.feed(message):
                    if isinstance(item, ProtocolError):
                        if await self._violation(instance, item):
                            break  # closing: the rest of this message is not processed
                    else:
                        await self._on_frame(instance, item)
        except ConnectionClosed:
            pass
        finally:
            self._closed(instance)

    def _closed(self, instance: _Instance) -> None:
        """The connection ended: settle its bookkeeping and, if it was the served one, promote
        a standby of its gateway."""
        if instance.machine.can("close"):
            instance.machine.fire("close")
        instance.outbox.clear()
        instance.wake.set()  # the pump sees the connection closed and ends
        instance.window_open.set()  # and so does a replay waiting for the window
        self._record_sent(instance, True)  # what it was shown and did not ack
        gateway_id = instance.gateway_id
        standbys = self._standbys.get(gateway_id)
        if standbys is not None and instance in standbys:
            standbys.remove(instance)
            if not standbys:
                del self._standbys[gateway_id]
        if self._instances.get(gateway_id) is instance:
            del self._instances[gateway_id]
            self._promote(gateway_id)

    # -- two connections of one gateway --------------------------------------------------------

    def _stand_by(self, instance: _Instance) -> None:
        """Hold a second connection of a served gateway: unserved, not closed (closing it would
        make an original gateway redial at once, for ever), and probe the served one."""
        gateway_id = instance.gateway_id
        instance.machine.fire("stand_by")
        standbys = self._standbys.setdefault(gateway_id, [])
        standbys.append(instance)
        if len(standbys) > _MAX_STANDBYS:
            oldest = standbys.pop(0)
            # 4409 to a gateway that knows it (it stops); an original gateway knows no 4409 and
            # redials at once after any other close -- except an early 4401, a start-up race it
            # backs off from, so that is what it gets.
            code = CLOSE_REPLACED if REPLACED_4409 in oldest.features else CLOSE_REVOKED
            log.warning(
                "connector: %s has more than %d waiting connections; closing the oldest (%d)",
                gateway_id,
                _MAX_STANDBYS,
                code,
            )
            self._background(self._close(oldest, code, "replaced by a newer connection"))
        log.info(
            "connector: %s connected again while its connection is served; holding the new one "
            "until the served one goes (probing it every %g s)",
            gateway_id,
            self.liveness_probe_s,
            extra={"gateway_id": gateway_id},
        )
        watcher = self._watchers.get(gateway_id)
        if watcher is None or watcher.done():
            self._watchers[gateway_id] = asyncio.ensure_future(self._watch(gateway_id))
            self._tasks.add(self._watchers[gateway_id])
            self._watchers[gateway_id].add_done_callback(self._tasks.discard)

    async def _watch(self, gateway_id: str) -> None:
        """While a standby waits, probe the served connection: one that does not answer a ping
        within the probe time is dead (or unreachable) and is cut, and the standby served."""
        try:
            while self._standbys.get(gateway_id):
                served = self._instances.get(gateway_id)
                if served is None:
                    self._promote(gateway_id)
                    continue
                if await self._answers_ping(served.ws):
                    await self.clock.sleep(self.liveness_probe_s)
                    continue
                log.warning(
                    "connector: the served connection of %s did not answer a ping within %g s; "
                    "serving its newer connection",
                    gateway_id,
                    self.liveness_probe_s,
                    extra={"gateway_id": gateway_id},
                )
                served.ws.transport.abort()  # dead or unreachable: no close handshake to wait for
                self._closed(served)  # promotes now; its own reader's cleanup is then a no-op
        finally:
            if self._watchers.get(gateway_id) is asyncio.current_task():
                del self._watchers[gateway_id]

    async def _answers_ping(self, ws: ServerConnection) -> bool:
        """True when ``ws`` answers a ping within the liveness probe time."""
        try:
            pong = asyncio.ensure_future(await ws.ping())
        except ConnectionClosed:
            return False
        sleeper = asyncio.ensure_future(self.clock.sleep(self.liveness_probe_s))
        try:
            await asyncio.wait({pong, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
        if not pong.done():
            pong.cancel()
            return False
        return not pong.cancelled() and pong.exception() is None

    def _promote(self, gateway_id: str) -> None:
        """Serve the newest standby of ``gateway_id`` (if any): it gets the descriptors for the
        hellos it said while waiting, then its replay -- as if it had just connected."""
        standbys = self._standbys.get(gateway_id)
        while standbys:
            candidate = standbys.pop()
            if candidate.state is not _C.STANDBY:
                continue
            if not standbys:
                del self._standbys[gateway_id]
            candidate.machine.fire("promote")
            self._instances[gateway_id] = candidate
            log.info(
                "connector: serving the waiting connection of %s",
                gateway_id,
                extra={"gateway_id": gateway_id},
            )
            self._background(self._answer_held_hellos(candidate))
            return
        self._standbys.pop(gateway_id, None)

    async def _answer_held_hellos(self, instance: _Instance) -> None:
        held, instance.held_hellos = instance.held_hellos, []
        for hello in held:
            if instance.state in (_C.CLOSED, _C.STANDBY):
                return
            await self._hello(instance, hello)

    async def _close(self, instance: _Instance, code: int, reason: str) -> None:
        with contextlib.suppress(ConnectionClosed):
            await instance.ws.close(code, reason)

    # -- authentication and violations ---------------------------------------------------------

    async def _authenticate(self, ws: ServerConnection) -> tuple[str, frozenset[str]] | None:
        """The gateway id the upgrade's token proves, and the features it announced; or None
        after closing a refused upgrade (4401; an expired token 4419 only to a gateway that
        announced it, else 4401 + ``expired`` as the original contract says)."""
        request = ws.request
        values = request.headers.get_all("Authorization") if request is not None else []
        features = (
            parse_features(request.headers.get_all(FEATURES_HEADER))
            if request is not None
            else frozenset()
        )
        try:
            if len(values) > 1:
                raise AuthError("malformed", "more than one Authorization header")
            token = token_from_header(values[0] if values else None)
            gateway_id = verify_token(
                token, self.secrets, now=self.clock.now(), max_ttl_s=self.max_token_ttl_s
            )
        except AuthError as exc:
            code = CLOSE_REVOKED
            if exc.reason == "expired" and EXPIRED_4419 in features:
                code = CLOSE_EXPIRED
            reason: str = exc.reason
            now = self.clock.now()
            if exc.timing and features:
                # A genuine token refused for its times: the clocks disagree.  Say so, with this
                # connector's time, so that the gateway can measure the offset (an original
                # gateway gets the bare reason it knows).
                reason = clock_skew_reason(exc.reason, now)
            log.warning(
                "connector: refused an upgrade (%s%s); closing %d",
                exc.reason,
                f", {exc.detail}; connector time {now:.0f}" if exc.timing else "",
                code,
                extra={"reason": exc.reason},
            )
            with contextlib.suppress(ConnectionClosed):
                await ws.close(code, reason)
            return None
        return gateway_id, features

    async def _violation(self, instance: _Instance, error: ProtocolError) -> bool:
        """Count, log (rate-limited) and -- to a gateway that announced them -- answer an invalid
        frame; True when the limit was passed and the connection is being closed (4400)."""
        instance.violations += 1
        suppressed = instance.log_limit.allow()
        if suppressed is not None:
            log.warning(
                "connector: %s sent an invalid frame (%s): %s%s",
                instance.gateway_id,
                error.code,
                error,
                f" ({suppressed} more not logged)" if suppressed else "",
                extra={"gateway_id": instance.gateway_id, "code": error.code},
            )
        if ERROR_FRAMES in instance.features:
            await self._send(instance, encode(error_frame_for(error)))
        if instance.violations > _MAX_VIOLATIONS:
            log.warning(
                "connector: %s sent %d invalid frames; closing (4400)",
                instance.gateway_id,
                instance.violations,
            )
            await self._close(instance, CLOSE_PROTOCOL, "too many protocol violations")
            return True
        return False

    async def _send(self, instance: _Instance, text: str) -> bool:
        try:
            await instance.ws.send(text)
        except ConnectionClosed:
            return False
        return True

    async def _on_frame(self, instance: _Instance, frame: object) -> None:
        try:
            if isinstance(frame, Hello) and frame.announced:
                instance.protocol_hello = True
                instance.features = instance.features | frozenset(frame.features)
                if frame.window is not None:
                    instance.window = frame.window
            if instance.state is _C.STANDBY:
                # Unserved: a hello is held for the promotion, anything else is dropped (it was
                # shown nothing, and what it would send belongs to the served connection).
                if isinstance(frame, Hello) and len(instance.held_hellos) < _MAX_HELD_HELLOS:
                    instance.held_hellos.append(frame)
                else:
                    log.debug("connector: dropping %s from a waiting connection", type(frame))
            elif isinstance(frame, InboundAck):
                self._acked(instance, [frame.buffer_id])
            elif isinstance(frame, Outbound):
                self._background(self._outbound(instance, frame))
            elif isinstance(frame, Hello):
                await self._hello(instance, frame)
            elif isinstance(frame, GoingIdle):
                # Identity comes from the upgrade, never from the frame.
                if instance.machine.can("go_idle"):
                    instance.machine.fire("go_idle")
                await self._send(instance, encode(GoingIdleAck(frame.request_id)))
            elif isinstance(frame, Interrupt):
                log.info("connector: interrupt for %s (%s)", frame.session_key, frame.reason)
            else:
                log.debug("connector: ignoring %s", type(frame).__name__)
        except Exception:
            log.exception("connector: handling a %s failed", type(frame).__name__)

    def _acked(self, instance: _Instance, buffer_ids: list[str]) -> None:
        """Queue acked bufferIds for retirement: they are retired by the next write round on
        the store thread, with whatever else is queued (see :meth:`_drain_writes`)."""
        if instance.state is _C.STANDBY:
            return  # it was shown nothing: what it acks is not its to retire
        unrecorded = instance.unrecorded
        if unrecorded:
            for buffer_id in buffer_ids:
                unrecorded.pop(buffer_id, None)  # acked: its replay needs no separate record
        unacked = instance.unacked
        if unacked:
            unacked.difference_update(buffer_ids)
            if len(unacked) < instance.window:
                instance.window_open.set()
        with self._write_lock:
            self._ack_queue.append((instance, buffer_ids))
            submit = not self._drain_pending
            self._drain_pending = True
        if submit:
            self._executor.submit(self._drain_writes, asyncio.get_running_loop())

    def _ignored_acks(self, instance: _Instance, ignored: int) -> None:
        """On the loop: report acks that retired nothing (a peer decides how many there are:
        one line per round, rate-limited)."""
        suppressed = instance.log_limit.allow()
        if suppressed is not None:
            log.info(
                "connector: ignored %d acks from %s of bufferIds that are not its unacked "
                "entries%s",
                ignored,
                instance.gateway_id,
                f" ({suppressed} more lines not logged)" if suppressed else "",
                extra={"gateway_id": instance.gateway_id, "ignored": ignored},
            )

    async def _hello(self, instance: _Instance, hello: Hello) -> None:
        descriptor = self.descriptors.get(hello.platform)
        if descriptor is None or hello.platform not in self.drivers:
            await self._unfronted(instance, hello)
            return
        instance.identities.append((hello.platform, hello.bot_id))
        if hello.platform not in self._subscriptions[instance.gateway_id]:
            self._subscriptions[instance.gateway_id].add(hello.platform)
            await self._store(
                functools.partial(self.subscriptions.add, instance.gateway_id, hello.platform)
            )
        await self._send(instance, encode(DescriptorFrame(descriptor)))
        if instance.machine.can("hello"):
            instance.machine.fire("hello")
            self._background(self._replay(instance))

    async def _unfronted(self, instance: _Instance, hello: Hello) -> None:
        """Answer a hello for a platform this connector does not front, so that no gateway
        waits out a handshake timeout: a connection's first hello closes it with a reason naming
        the platform (4400 to a gateway that announced itself; 4401 to an original gateway,
        which backs off on an early 4401 instead of redialing in a tight loop).  A later hello
        gets an ``error`` frame (announced gateways) or a log line."""
        platform = hello.platform[:64]
        reason = f"unknown platform {platform!r}"
        log.warning(
            "connector: %s said hello for %s, which this connector does not front",
            instance.gateway_id,
            reason[len("unknown platform ") :],
            extra={"gateway_id": instance.gateway_id, "platform": platform},
        )
        if not instance.identities:
            code = CLOSE_PROTOCOL if instance.announced else CLOSE_REVOKED
            await self._close(
                instance, code, reason.encode("utf-8")[:120].decode("utf-8", "ignore")
            )
        elif ERROR_FRAMES in instance.features:
            await self._send(
                instance, encode(ErrorFrame("unknown_platform", f"no {reason} here", "hello"))
            )

    # -- outbound ------------------------------------------------------------------------------

    async def _outbound(self, instance: _Instance, frame: Outbound) -> None:
        outcome = await self._perform(instance, frame)
        await self._send(instance, encode(OutboundResult(frame.request_id, outcome)))

    async def _perform(self, instance: _Instance, frame: Outbound) -> OutboundOutcome:
        if not instance.identities:
            return OutboundOutcome(False, None, "say hello first", "no_hello")
        platform = frame.platform or instance.identities[0][0]
        if platform not in instance.platforms():
            return OutboundOutcome(
                False, None, f"no hello for platform {platform!r}", "unknown_identity"
            )
        if not self._egress_allowed(instance.gateway_id, platform, frame.action):
            log.info(
                "connector: declined egress of %s to a chat on %s", instance.gateway_id, platform
            )
            return OutboundOutcome(False, None, EGRESS_DECLINED_MESSAGE, EGRESS_DECLINED)
        if frame.idempotency_key is None:
            return await self._drive(platform, frame.action)
        key = (instance.gateway_id, frame.idempotency_key)
        earlier = self._outcomes.get(key)
        if earlier is not None:
            # A retry of a request we executed (or are executing): never perform it twice.
            return await asyncio.shield(earlier)
        future: asyncio.Future[OutboundOutcome] = asyncio.get_running_loop().create_future()
        self._remember_outcome(key, future)
        outcome = await self._drive(platform, frame.action)
        future.set_result(outcome)
        if not outcome.success:
            self._outcomes.pop(key, None)  # a definite failure may be retried for real
        return outcome

    async def _drive(self, platform: str, action: Mapping[str, Any]) -> OutboundOutcome:
        try:
            return await self.drivers[platform].perform(action)
        except Exception as exc:
            log.exception("connector: driver %s failed", platform)
            return OutboundOutcome(False, None, f"driver error: {exc}", "driver_error")

    def _remember_outcome(
        self, key: tuple[str, str], future: asyncio.Future[OutboundOutcome]
    ) -> None:
        self._outcomes[key] = future
        self._outcome_order.append(key)
        while len(self._outcome_order) > _IDEMPOTENCY_CACHE:
            self._outcomes.pop(self._outcome_order.popleft(), None)

    def _egress_allowed(self, gateway_id: str, platform: str, action: Mapping[str, Any]) -> bool:
        """The tenant guard: the target chat's tenant must be approved for this gateway; with no
        tenants table, the target must be a chat or user it received inbound from (provenance),
        unless egress is explicitly open."""
        if self.tenants is None:
            if self.open_egress:
                return True
            target = target_chat(action)
            return target is not None and self.provenance.allows(gateway_id, platform, target)
        approved = self.tenants.get(gateway_id, frozenset())
        chat_id = target_chat(action)
        known = None if chat_id is None else self._chat_tenants.get((platform, chat_id))
        if known is not None:
            # What the platform told us about the chat outranks what the gateway claims.
            return known in approved
        # A chat the platform never showed us: the gateway's metadata, scope first, then user.
        metadata = action.get("metadata")
        meta = metadata if isinstance(metadata, Mapping) else {}
        # Ids are text on the wire; anything else (a list, an object) is never approved.
        scope = meta.get("scope_id")
        if scope is not None:
            return isinstance(scope, str) and scope in approved
        user = meta.get("user_id")
        return isinstance(user, str) and user in approved

    # -- inbound -------------------------------------------------------------------------------

    async def intake(self, platform: str, event: InboundEvent) -> None:
        """Route one inbound event from ``platform`` to the gateways that should see it.

        Delivered live to a listening instance; appended to the durable buffer for one that is
        asleep, disconnected, buffered-only or still replaying its backlog (so order holds).
        """
        source = event.source
        tenant = source.scope_id
        if tenant is None and source.chat_type == "dm":
            tenant = source.user_id  # a DM belongs to its user
        if tenant is not None:
            self._chat_tenants[(platform, source.chat_id)] = tenant
        audience = self._audience(platform, event)
        if not audience:
            self.undeliverable += 1
            log.warning(
                "connector: no gateway listens to %s chat %s; event %s not delivered",
                platform,
                source.chat_id,
                event.message_id,
            )
        for gateway_id in audience:
            if self.tenants is None and not self.open_egress:
                # Provenance first, durably: the gateway may answer this chat (and user) as soon
                # as it sees the event, so the permission must exist before the event goes out.
                fresh = self.provenance.unknown(
                    gateway_id, platform, (source.chat_id, source.user_id)
                )
                if fresh:
                    await self._store(
                        functools.partial(self.provenance.learn, gateway_id, platform, fresh)
                    )
            instance = self._instances.get(gateway_id)
            if instance is not None and instance.live and platform in instance.platforms():
                if instance.acked_live:
                    # Durable first: in the buffer before it goes out; only the gateway's ack
                    # (after its handler) retires it, so a gateway that dies with it loses
                    # nothing.
                    self._offer(instance, *await self._append(gateway_id, platform, event))
                    continue
                if await self._send(instance, encode(Inbound(event))):
                    continue  # delivered live (a failed live send falls back to the buffer)
            if instance is not None and instance.state is _C.REPLAYING:
                # Counted before the append is queued: the replay then knows to read again
                # (the store thread runs the append before that read).
                instance.appended += 1
            await self._append(gateway_id, platform, event)
            self._maybe_wake(gateway_id)

    async def _append(
        self, gateway_id: str, platform: str, event: InboundEvent
    ) -> tuple[str, int, str]:
        """Buffer one event durably; return its ``(bufferId, seq, line)``.

        Writes are grouped (see :meth:`_drain_writes`): an append joins the write round that is
        queued on the store thread, or queues one, so it keeps its place among the store work
        submitted around it (a replay's read submitted after it sees it).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[str, int, str]] = loop.create_future()
        with self._write_lock:
            self._append_queue.append((gateway_id, platform, event, future))
            submit = not self._drain_pending
            self._drain_pending = True
        if submit:
            self._executor.submit(self._drain_writes, loop)
        return await future

    def _drain_writes(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the store thread: one write round -- every queued append and ack -- in one
        transaction (group commit: under load one commit carries many events).

        A round that fails writes nothing: its appends fail to their callers (who have not
        delivered them), its acks are not retired (those entries are delivered again).
        """
        with self._write_lock:
            appends, self._append_queue = self._append_queue, []
            acks, self._ack_queue = self._ack_queue, []
            self._drain_pending = False  # from now on a new write queues a new round
        if not appends and not acks:
            return
        by_instance: dict[_Instance, list[str]] = {}
        for instance, ids in acks:
            by_instance.setdefault(instance, []).extend(ids)
        ignored: list[tuple[_Instance, int]] = []
        try:
            with self.buffer.store.atomic():
                lines = self.buffer.append_many([(g, p, e) for g, p, e, _ in appends])
                for instance, ids in by_instance.items():
                    retired = self.buffer.ack(instance.gateway_id, ids)
                    if retired < len(set(ids)):
                        ignored.append((instance, len(set(ids)) - retired))
        except Exception as exc:
            if acks:
                log.warning("connector: retiring acks failed (%s); they will be replayed", exc)
            loop.call_soon_threadsafe(_fail_all, [f for *_, f in appends], exc)
            return
        loop.call_soon_threadsafe(_resolve_all, [f for *_, f in appends], lines)
        for instance, count in ignored:
            loop.call_soon_threadsafe(self._ignored_acks, instance, count)

    def _offer(self, instance: _Instance, buffer_id: str, seq: int, line: str) -> None:
        """Hand one buffered line to the instance's pump (live delivery with a bufferId)."""
        if not instance.live or (
            instance.last_sent_seq is not None and seq <= instance.last_sent_seq
        ):
            return  # a replay (behind, or a new connection) delivers it from the buffer
        if len(instance.outbox) >= _OUTBOX_MAX:
            # Not keeping up: stop holding lines for it in memory; the buffer has them all.
            log.info(
                "connector: %s is not keeping up; delivering from the buffer until it catches up",
                instance.gateway_id,
                extra={"gateway_id": instance.gateway_id},
            )
            instance.outbox.clear()
            instance.machine.fire("fall_behind")
            self._background(self._replay(instance, after=instance.last_sent_seq))
            return
        instance.outbox.append((buffer_id, seq, line))
        instance.wake.set()
        if instance.pump is None or instance.pump.done():
            instance.pump = asyncio.ensure_future(self._pump(instance))
            self._tasks.add(instance.pump)
            instance.pump.add_done_callback(self._tasks.discard)

    async def _window(self, instance: _Instance) -> None:
        """Wait until the instance's window has room (an ack came back) or it closed."""
        instance.window_open.clear()
        if len(instance.unacked) < instance.window or instance.state is _C.CLOSED:
            return
        await instance.window_open.wait()

    async def _pump(self, instance: _Instance) -> None:
        """Send the instance's live lines in order; a send that blocks (the gateway stopped
        reading) blocks only this instance."""
        outbox, send, unrecorded = instance.outbox, instance.ws.send, instance.unrecorded
        while instance.state is not _C.CLOSED:
            if not outbox or not instance.live:
                instance.wake.clear()
                await instance.wake.wait()
                continue
            if len(instance.unacked) >= instance.window:
                await self._window(instance)  # the gateway holds a full window: wait for acks
                continue
            buffer_id, seq, line = outbox.popleft()
            # Claimed before the send: a replay starting meanwhile reads after it.
            instance.last_sent_seq = seq
            instance.unacked.add(buffer_id)
            unrecorded[buffer_id] = self.clock.monotonic()
            try:
                await send(line)
            except ConnectionClosed:
                return  # unacked: replayed on the next connection
            self._record_sent_later(instance)

    def _audience(self, platform: str, event: InboundEvent) -> list[str]:
        if self.tenants is None:
            return sorted(
                g for g, platforms in self._subscriptions.items() if platform in platforms
            )
        scope, user = event.source.scope_id, event.source.user_id
        return sorted(
            gateway_id
            for gateway_id, approved in self.tenants.items()
            if (scope is not None and scope in approved)
            or (scope is None and user is not None and user in approved)
        )

    def _maybe_wake(self, gateway_id: str) -> None:
        if self.wake_hook is None:
            return
        instance = self._instances.get(gateway_id)
        if instance is not None and instance.awake:
            return  # awake, just replaying
        now = self.clock.monotonic()
        last = self._last_wake.get(gateway_id)
        if last is not None and now - last < self.wake_interval_s:
            return
        self._last_wake[gateway_id] = now
        self._background(self._wake(gateway_id))

    async def _wake(self, gateway_id: str) -> None:
        assert self.wake_hook is not None
        try:
            await self.wake_hook(gateway_id)
        except Exception:
            log.warning("connector: wake hook for %s failed", gateway_id, exc_info=True)

    async def _replay(self, instance: _Instance, after: int | None = None) -> None:
        """Send the instance's backlog in order with bufferIds, then switch it to live.

        ``after``: the seq of the last line already sent on this connection (a gateway that
        fell behind); None replays the whole unacked backlog (a new connection), expiring the
        entries past retention first.
        """
        gateway_id = instance.gateway_id
        windowed = instance.acked_live  # a gateway that acks live traffic announced a window
        # A small first chunk starts the replay quickly; larger ones then keep the store calls
        # (and, on a store without an ordered index, the scans) few.
        limit = _REPLAY_FIRST_CHUNK
        try:
            while instance.state is _C.REPLAYING:  # going_idle or a close ends the replay
                instance.appended = 0
                chunk = await self._store(
                    functools.partial(
                        self.buffer.replay_lines, gateway_id, limit=limit, after_seq=after
                    )
                )
                if not chunk:
                    if instance.appended == 0 and instance.machine.can("caught_up"):
                        instance.machine.fire("caught_up")  # nothing slipped in: go live
                        return
                    continue
                after, limit = chunk[-1][1], _REPLAY_CHUNK
                send, unrecorded = instance.ws.send, instance.unrecorded
                now = self.clock.monotonic()
                buffer_id = ""
                try:
                    for buffer_id, seq, line in chunk:
                        while windowed and len(instance.unacked) >= instance.window:
                            await self._window(instance)  # a full window: wait for acks
                            if instance.current() is not _C.REPLAYING:
                                return  # closed or idle meanwhile: the rest stays buffered
                        # Registered before its send, so that its ack always finds it.
                        unrecorded[buffer_id] = now
                        instance.last_sent_seq = seq
                        if windowed:
                            instance.unacked.add(buffer_id)
                        await send(line)
                except ConnectionClosed:
                    unrecorded.pop(buffer_id, None)  # this one never went out
                    return  # gone mid-replay: the unacked tail is replayed next time
                finally:
                    # Recording the replay is left to the grace timer: the next chunk is read
                    # at once, with no store write queued ahead of it.
                    self._record_sent_later(instance)
        finally:
            if self._instances.get(gateway_id) is not instance and instance.machine.can("close"):
                instance.machine.fire("close")  # replaced while replaying: this one is done

    # -- recording replays ---------------------------------------------------------------------

    def _record_sent_later(self, instance: _Instance) -> None:
        """Arm the timer that records the replayed entries still unacked after the grace."""
        if instance.record_timer is None and instance.unrecorded:
            instance.record_timer = asyncio.ensure_future(self._record_after_grace(instance))

    async def _record_after_grace(self, instance: _Instance) -> None:
        await self.clock.sleep(_SENT_GRACE_S)
        instance.record_timer = None  # this timer is done: _record_sent must not cancel it
        self._record_sent(instance, False)

    def _record_sent(self, instance: _Instance, everything: bool) -> None:
        """Record as ``sent`` the replayed entries of ``instance`` that are still unacked: those
        past the grace (all of them when ``everything``, as the connection ends).

        An entry acked within the grace goes straight from ``buffered`` to ``acked`` (the
        lifecycle allows it), so a prompt replay costs one write per entry, not two.  Only an
        ack retires an entry either way: recording ``sent`` is bookkeeping (the replay count,
        and which entries a gateway was shown but did not ack), never a condition of delivery.
        """
        if instance.record_timer is not None:
            instance.record_timer.cancel()
            instance.record_timer = None
        pending = instance.unrecorded
        due: list[str] = []
        if everything:
            due = list(pending)
            pending.clear()
        else:
            cutoff = self.clock.monotonic() - _SENT_GRACE_S
            for buffer_id, at in pending.items():  # in send order, so oldest first
                if at > cutoff:
                    break
                due.append(buffer_id)
            for buffer_id in due:
                del pending[buffer_id]
            self._record_sent_later(instance)
        if due:
            # Submitted without awaiting (connector.stop waits for the store thread): the
            # write must not be lost to a task cancelled as the connector stops.
            try:
                self._executor.submit(self._mark_sent_logged, instance.gateway_id, due)
            except RuntimeError:  # the store thread is already shut down
                log.warning(
                    "connector: %d replays of %s not recorded (stopping)",
                    len(due),
                    instance.gateway_id,
                )

    def _mark_sent_logged(self, gateway_id: str, buffer_ids: list[str]) -> None:
        """On the store thread: record replays, logging (not raising) a failure."""
        try:
            self.buffer.mark_sent_ids(gateway_id, buffer_ids)
        except Exception:
            log.warning(
                "connector: recording %d replays of %s failed",
                len(buffer_ids),
                gateway_id,
                exc_info=True,
            )


def _resolve_all(
    futures: list[asyncio.Future[tuple[str, int, str]]], lines: list[tuple[str, int, str]]
) -> None:
    for future, line in zip(futures, lines, strict=True):
        if not future.done():
            future.set_result(line)


def _fail_all(futures: list[asyncio.Future[tuple[str, int, str]]], error: Exception) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(error)

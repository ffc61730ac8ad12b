"""The gateway side of the relay: one WebSocket to a connector, driven by the TRANSPORT lifecycle.

The transport's state is one :class:`~relay.client.lifecycle.TransportState`, held by a live
``transitions`` machine attached from :data:`~relay.client.lifecycle.TRANSPORT`; every method
is legal or illegal per state, and an illegal call fails fast with a definite result instead of
waiting on a dead socket.

Tasks (at most one of each is live):

* the **reader** of the current connection only parses and routes frames;
* the **dispatcher** (:mod:`relay.client.dispatch`) runs the inbound handler outside the
  reader, each chat's deliveries in order and different chats concurrently, and acks a buffered
  delivery only after its handler returned normally;
* the **supervisor** is the one dialer after the first connection: it re-dials after an
  unexpected close (jittered exponential backoff, ladder reset after a stable connection) and,
  after :meth:`WebSocketRelayTransport.go_dormant`, on the dormant cadence.

A deliberate :meth:`~WebSocketRelayTransport.disconnect` never re-dials, is bounded by the
caller's budget, and fails every pending request in a ``finally`` so that no cancellation can
strand a caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from relay.client.delivery import (
    BufferDedupe,
    Deliveries,
    Delivery,
    DeliveryHandler,
    InboundHandler,
    lane_of,
)
from relay.client.dispatch import DEFAULT_MAX_IN_FLIGHT, InboundDispatcher
from relay.client.lifecycle import TRANSPORT, TransportState
from relay.client.redial import RedialPolicy
from relay.client.requests import RequestOutcome, RequestResult
from relay.client.teardown import (
    MAX_TEARDOWN_S,
    TEARDOWN_AWAIT_S,
    bounded,
    cancel,
    default_disconnect_budget_s,
    drain_grace_s,
    wait_event,
    wait_future,
)
from relay.wire.auth import bearer_header, mint_token
from relay.wire.codec import FrameDecoder, ack_lines, encode, error_frame_for
from relay.wire.compat import ACKED_LIVE, ERROR_FRAMES, OUR_FEATURES, features_header
from relay.wire.descriptor import CONTRACT_VERSION, CapabilityDescriptor
from relay.wire.errors import (
    ContractVersionError,
    ProtocolError,
    RelayBroken,
    RelayClosed,
    UndeliverableEvent,
)
from relay.wire.frames import (
    DescriptorFrame,
    ErrorFrame,
    GoingIdle,
    GoingIdleAck,
    Hello,
    Inbound,
    InterruptInbound,
    Outbound,
    OutboundOutcome,
    OutboundResult,
    PassthroughForward,
)
from relay.wire.throttle import LogThrottle
from relay.wire.urls import CLOSE_PROTOCOL, CloseKind, relay_url
from statecore.checks import require_text
from statecore.clock import Clock, Deadline, SystemClock
from statecore.errors import InvalidTransition

__all__ = ["SERVING", "WebSocketRelayTransport"]

log = logging.getLogger(__name__)

T = TransportState

SERVING = frozenset({T.CONNECTED, T.GOING_IDLE})
"""The states in which a transport sends requests (and acks): connected or going idle."""
_FINISHED = TRANSPORT.terminal
_DIALING = frozenset({T.CONNECTING, T.HANDSHAKING})
_WAITING = frozenset({T.RECONNECTING, T.DORMANT})
_MAX_VIOLATIONS = 50
_LEFT_SERVING = {T.DORMANT: "relay transport went dormant"}
"""Why pending requests fail when the transport leaves serving for a state (default: lost)."""


class WebSocketRelayTransport:
    """One relay connection to a connector (see the module docs).

    ``WebSocketRelayTransport(url, platform, bot_id, *, gateway_id=None, secret=None,
    reconnect=True, reconnect_backoff_s=1.0, reconnect_max_s=30.0, dormant_redial_s=1.0,
    request_timeout_s=30.0, clock=None, ...)``.  ``url`` is normalised by
    :func:`relay.wire.urls.relay_url` (``ValueError`` for an unusable one).  With ``secret``, every
    dial carries a freshly minted bearer token for ``gateway_id`` (default: ``bot_id``).

    Compatibility (docs/wire-contract.md): ``features`` (default
    :data:`~relay.wire.compat.OUR_FEATURES`) are announced on the upgrade and in every hello;
    ``error`` frames go only to a connector whose descriptor announced ``error_frames``.  A 4401
    (or HTTP 401/403) before the first successful handshake is retried with backoff for
    ``refusal_grace_s`` before the transport ends ``revoked``.  ``dedupe`` remembers handled
    bufferIds and records undeliverable ones.

    Time: ``clock`` drives every protocol timer (backoff, dormant cadence, request and
    handshake timeouts, token minting).  ``teardown_clock`` (default: the system clock) bounds
    :meth:`disconnect`, whose waits are on real I/O (a socket's closing handshake) and must end
    in real time even when ``clock`` is a test's fake one.

    The class is long because it is the one owner of the connection's state: every method
    that changes it goes through the one live machine; the reader, the redial decisions
    (:mod:`relay.client.redial`), the delivery rules (:mod:`relay.client.delivery`) and the
    teardown budget (:mod:`relay.client.teardown`) live in their own modules.
    """

    # Timing settings, validated and set from the constructor's keywords.
    reconnect_backoff_s: float
    reconnect_max_s: float
    dormant_redial_s: float
    request_timeout_s: float
    handshake_timeout_s: float
    open_timeout_s: float
    stable_after_s: float
    refusal_grace_s: float

    def __init__(
        self,
        url: str,
        platform: str,
        bot_id: str,
        *,
        gateway_id: str | None = None,
        secret: str | bytes | None = None,
        reconnect: bool = True,
        reconnect_backoff_s: float = 1.0,
        reconnect_max_s: float = 30.0,
        dormant_redial_s: float = 1.0,
        request_timeout_s: float = 30.0,
        clock: Clock | None = None,
        handshake_timeout_s: float = 10.0,
        open_timeout_s: float = 10.0,
        stable_after_s: float = 60.0,
        max_frame_bytes: int = 1_048_576,
        token_ttl_s: int = 300,
        identities: Iterable[tuple[str, str]] = (),
        features: Iterable[str] = OUR_FEATURES,
        dedupe: BufferDedupe | None = None,
        rng: random.Random | None = None,
        refusal_grace_s: float = 120.0,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        teardown_clock: Clock | None = None,
    ) -> None:
        for name, value in (
            ("reconnect_backoff_s", reconnect_backoff_s),
            ("reconnect_max_s", reconnect_max_s),
            ("dormant_redial_s", dormant_redial_s),
            ("request_timeout_s", request_timeout_s),
            ("handshake_timeout_s", handshake_timeout_s),
            ("open_timeout_s", open_timeout_s),
            ("stable_after_s", stable_after_s),
            ("refusal_grace_s", refusal_grace_s),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a non-negative number, not {value!r}")
            setattr(self, name, float(value))
        require_text("platform", platform)
        require_text("bot_id", bot_id)
        self.url = relay_url(url)
        self.platform = platform
        self.bot_id = bot_id
        self.gateway_id = gateway_id or bot_id
        self._secret = secret
        self.reconnect = reconnect
        self.max_frame_bytes = max_frame_bytes
        self.token_ttl_s = token_ttl_s
        self._identities = ((platform, bot_id), *tuple(identities))
        self._features = tuple(features)
        self._announcement = [features_header(self._features)] if self._features else []
        self._clock: Clock = clock or SystemClock()
        self._teardown_clock: Clock = teardown_clock or SystemClock()
        self._redial = RedialPolicy(
            self._clock,
            rng or random.Random(),
            backoff_s=self.reconnect_backoff_s,
            max_s=self.reconnect_max_s,
            dormant_s=self.dormant_redial_s,
            stable_after_s=self.stable_after_s,
            refusal_grace_s=self.refusal_grace_s,
            label=self.url,
        )
        # What entering and leaving states must do hangs on the machine itself: a waiting
        # state arms the one dialer; leaving the serving states for anything but a deliberate
        # close fails what is pending (a disconnect drains first and fails the rest itself).
        self._machine = TRANSPORT.attach(
            on_change=self._on_change,
            on_enter={T.RECONNECTING: self._arm, T.DORMANT: self._arm},
            on_exit={T.CONNECTED: self._left_serving, T.GOING_IDLE: self._left_serving},
        )
        self._changed = asyncio.Event()
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._torn_down: asyncio.Event | None = None
        # What the connector of the current connection announced (empty until its descriptor:
        # an original connector announces nothing and is sent nothing it does not know).
        self._peer_features: frozenset[str] = frozenset()
        self._log_limit = LogThrottle(clock=self._clock)
        self._deliveries = Deliveries(self.url, dedupe, self._log_limit)
        self._inbound: InboundDispatcher[Delivery] = InboundDispatcher(
            lane_of=lane_of,
            handle=self._deliveries.handle,
            send_acks=self._ack,
            max_in_flight=max_in_flight,
        )
        self._pending: dict[str, asyncio.Future[OutboundOutcome]] = {}
        self._idle_waiters: dict[str, asyncio.Future[bool]] = {}
        self._ids = itertools.count(1)
        self._prefix = secrets.token_hex(4)
        self._violations = 0
        self.descriptor: CapabilityDescriptor | None = None
        """The descriptor of the first hello of the current (or last) connection."""
        self.descriptors: dict[str, CapabilityDescriptor] = {}
        """Every descriptor received, by platform."""
        self.close_reason: str | None = None
        """Why the transport ended (closed or revoked), for operators."""
        self.listeners: list[Callable[[TransportState, TransportState, str], None]] = []
        """Observers of every state change ``(from, to, event)``; they must not raise."""

    @property
    def connections(self) -> int:
        """Successful handshakes so far (reconnects included)."""
        return self._redial.connections

    @property
    def undeliverable(self) -> int:
        """Deliveries that could never be handled: recorded and acked when buffered, logged
        and counted when live."""
        return self._deliveries.undeliverable_count

    @property
    def clock_offset_s(self) -> float:
        """The connector's clock minus ours, measured from a refusal that named its time (0
        until one did); tokens are minted on the connector's time."""
        return self._redial.clock_offset_s

    @property
    def last_close(self) -> tuple[int | None, str | None]:
        """The most recent close received from the connector (code, reason), for operators."""
        return self._redial.last_close

    # -- state ---------------------------------------------------------------------------------

    @property
    def state(self) -> TransportState:
        """The current :class:`~statecore.TransportState`."""
        return self._machine.state

    def _current(self) -> TransportState:
        # A call, not an attribute: the state changes across awaits, and type narrowing of an
        # attribute would pretend it cannot.
        return self._machine.state

    @property
    def auth_revoked(self) -> bool:
        """True once the connector refused our credentials (the ``revoked`` state)."""
        return self._current() is T.REVOKED

    def _fire(self, event: str) -> None:
        self._machine.fire(event)

    def _on_change(self, before: TransportState, after: TransportState, event: str) -> None:
        # Wake everyone waiting for a state: each waiter re-checks its own condition.
        self._changed.set()
        self._changed = asyncio.Event()
        log.debug("relay %s: %s -> %s (%s)", self.url, before.value, after.value, event)
        for listener in tuple(self.listeners):
            try:
                listener(before, after, event)
            except Exception:
                log.exception("transport listener failed")

    async def _wait_leave(self, passing: frozenset[TransportState], timeout_s: float) -> bool:
        """Wait until the state is not in ``passing`` (True) or ``timeout_s`` passed (False)."""
        deadline = Deadline.after(self._clock, timeout_s)
        while self._current() in passing:
            if deadline.expired:
                return False
            if not await wait_event(self._clock, self._changed, deadline.remaining()):
                return self._current() not in passing
        return True

    # -- connecting ----------------------------------------------------------------------------

    async def connect(self) -> None:
        """Dial the connector and say hello (state: handshaking); then call :meth:`handshake`.

        Raises :class:`RelayClosed` once closed or revoked, ``InvalidTransition`` when already
        connected or connecting, and :class:`RelayBroken` when the dial fails -- after which
        the supervisor keeps re-dialing if ``reconnect`` is on.
        """
        if self._current() in _FINISHED or self._current() is T.CLOSING:
            raise RelayClosed(f"relay transport is {self._current().value}")
        if self._current() is not T.NEW:
            raise InvalidTransition(TRANSPORT.name, self._current(), "connect", "dial only once")
        # A failed first dial enters reconnecting, which arms the supervisor (reconnect on).
        await self._dial_or_fail(waking=False)

    async def handshake(self, timeout_s: float | None = None) -> CapabilityDescriptor:
        """Wait for the first descriptor of the connection (state: connected) and return it.

        Raises :class:`RelayBroken` if it does not arrive within ``timeout_s`` (default: the
        handshake timeout) and :class:`RelayClosed` if the transport ends meanwhile.
        """
        wait = self.handshake_timeout_s if timeout_s is None else timeout_s
        await self._wait_leave(_DIALING, wait)
        state = self._current()
        if state in SERVING:
            assert self.descriptor is not None
            return self.descriptor
        if state in _FINISHED or state is T.CLOSING:
            raise RelayClosed(f"relay transport is {state.value}")
        if state is T.HANDSHAKING and self._ws is not None:
            # A connector that accepted but never answers: cut this socket (a silent peer
            # would not finish a closing handshake either), so the loss is handled like any
            # other -- re-dial with backoff, or end when reconnect is off.
            self._ws.transport.abort()
            raise RelayBroken(f"no descriptor within {wait:g} s")
        raise RelayBroken(f"the connection was lost before the handshake (state {state.value})")

    async def _dial_or_fail(self, *, waking: bool) -> None:
        """One dial.  On failure leave connecting: dormant again (a wake-up dial), reconnecting
        (the caller arms the next dial) or closed (reconnect off); then re-raise."""
        try:
            await self._dial()
        except RelayBroken:
            if self._current() is T.CONNECTING:
                if waking:
                    self._fire("sleep")
                elif self.reconnect:
                    self._fire("drop")
                else:
                    self.close_reason = "could not connect and reconnect is off"
                    self._fire("end")
            raise

    async def _dial(self) -> None:
        self._fire("dial")
        headers: list[tuple[str, str]] = list(self._announcement)
        self._peer_features = frozenset()
        if self._secret is not None:
            token = mint_token(
                self.gateway_id,
                self._secret,
                ttl_s=self.token_ttl_s,
                now=self._redial.token_time(),
            )
            headers.append(bearer_header(token))
        try:
            ws = await connect(
                self.url,
                additional_headers=headers,
                compression=None,  # no gain on small frames, 27-45 % of throughput lost
                proxy=None,
                open_timeout=self.open_timeout_s,
                max_size=self.max_frame_bytes + 1024,
                ping_interval=20,
                ping_timeout=20,
                close_timeout=TEARDOWN_AWAIT_S,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            if (
                status in (401, 403)
                and self._current() is T.CONNECTING
                and not self._redial.refusal_may_be_a_race()
            ):
                self.close_reason = f"connector refused the upgrade with HTTP {status}"
                self._fire("revoke")
                raise RelayClosed(self.close_reason) from exc
            raise RelayBroken(f"upgrade refused with HTTP {status}") from exc
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            raise RelayBroken(f"cannot reach {self.url}: {exc}") from exc
        if self._current() is not T.CONNECTING:
            # A disconnect() started while we were dialing: this socket is not wanted.
            await bounded(ws.close(), TEARDOWN_AWAIT_S)
            raise RelayClosed(f"relay transport is {self._current().value}")
        self._ws = ws
        self._violations = 0  # counted per connection, as the connector counts them
        decoder = FrameDecoder(max_frame_bytes=self.max_frame_bytes)
        self._fire("open")
        self._reader = asyncio.create_task(self._read(ws, decoder), name="relay-reader")
        try:
            # Announced: protocol + features.  With no features the hello is the original's.
            protocol = CONTRACT_VERSION if self._features else None
            window = self._inbound.max_in_flight if ACKED_LIVE in self._features else None
            for platform, bot_id in self._identities:
                await ws.send(encode(Hello(platform, bot_id, protocol, self._features, window)))
        except ConnectionClosed:
            pass  # the reader sees the close and handles it

    # -- reading and routing -------------------------------------------------------------------

    async def _read(self, ws: ClientConnection, decoder: FrameDecoder) -> None:
        try:
            # Never stops reading (the replies' results come on this socket too): the bound on
            # inbound in hand is the window the connector keeps (see relay.client.dispatch).
            enqueue, recv, feed = self._inbound.put, ws.recv, decoder.feed
            while True:
                # recv() directly rather than ``async for``: no async generator per message.
                message = await recv()
                for item in feed(message):
                    if type(item) is Inbound:
                        # The bulk of the traffic: straight to the dispatcher.
                        enqueue(item if item.event.source.platform else self._on_own_platform(item))
                    elif isinstance(
                        item, UndeliverableEvent | InterruptInbound | PassthroughForward
                    ):
                        enqueue(item)  # settled in order with the inbound events around it
                    elif isinstance(item, ContractVersionError):
                        await self._incompatible(ws, item)
                        return
                    elif isinstance(item, ProtocolError):
                        if await self._violation(ws, item):
                            break  # closing: the rest of this message is not processed
                    else:
                        self._route(item)
        except ConnectionClosed:
            pass
        except Exception:  # never let a bug in routing strand the transport
            log.exception("relay reader failed; dropping the connection")
            with contextlib.suppress(Exception):
                await bounded(ws.close(), TEARDOWN_AWAIT_S)
        finally:
            if self._ws is ws:
                self._connection_lost(ws)

    async def _incompatible(self, ws: ClientConnection, error: ContractVersionError) -> None:
        """A connector of another contract version: re-dialing cannot help, so end (closed)
        with the reason, tell the peer, and close the socket."""
        self.close_reason = f"the connector speaks another contract version: {error}"
        log.warning("relay %s: %s; not re-dialing", self.url, self.close_reason)
        if self._machine.can("end"):
            self._fire("end")
        with contextlib.suppress(ConnectionClosed):
            await ws.send(encode(error_frame_for(error)))
        await bounded(ws.close(CLOSE_PROTOCOL, "contract version"), TEARDOWN_AWAIT_S)

    async def _violation(self, ws: ClientConnection, error: ProtocolError) -> bool:
        """Count, log (rate-limited) and -- to a connector that announced them -- answer one
        invalid frame; True when the limit was passed and the connection is being closed."""
        self._violations += 1
        suppressed = self._log_limit.allow()
        if suppressed is not None:
            more = f" ({suppressed} more not logged)" if suppressed else ""
            log.warning("relay peer sent an invalid frame (%s): %s%s", error.code, error, more)
        with contextlib.suppress(ConnectionClosed):
            if ERROR_FRAMES in self._peer_features:
                await ws.send(encode(error_frame_for(error)))
            if self._violations > _MAX_VIOLATIONS:
                log.warning("relay %s: too many invalid frames; closing (4400)", self.url)
                await ws.close(CLOSE_PROTOCOL, "too many protocol violations")
                return True
        return False

    def _on_own_platform(self, frame: Inbound) -> Inbound:
        """An event whose source names no platform came from this connection's platform."""
        source = attrs.evolve(frame.event.source, platform=self.platform)
        return Inbound(attrs.evolve(frame.event, source=source), frame.buffer_id)

    def _route(self, frame: object) -> None:
        """Route one decoded frame other than an inbound event (the reader queues those
        itself); an error in one frame never affects another."""
        try:
            if isinstance(frame, OutboundResult):
                future = self._pending.get(frame.request_id)
                if future is not None and not future.done():
                    future.set_result(frame.result)
            elif isinstance(frame, DescriptorFrame):
                self._adopt(frame.descriptor)
            elif isinstance(frame, GoingIdleAck):
                self._idle_acked(frame.request_id)
            elif isinstance(frame, ErrorFrame):
                self._peer_error(frame)
            else:
                log.debug("relay: ignoring %s from the connector", type(frame).__name__)
        except Exception:
            log.exception("relay: routing a %s failed", type(frame).__name__)

    def _adopt(self, descriptor: CapabilityDescriptor) -> None:
        self.descriptors[descriptor.platform] = descriptor
        if self._current() is T.HANDSHAKING:
            # The first descriptor of a connection completes the handshake.
            self.descriptor = descriptor
            self._peer_features = frozenset(descriptor.features)
            self._redial.established()
            self._fire("establish")

    def _idle_acked(self, request_id: str | None) -> None:
        waiters = (
            list(self._idle_waiters.values())
            if request_id is None or request_id not in self._idle_waiters
            else [self._idle_waiters[request_id]]
        )
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(True)

    def _peer_error(self, frame: ErrorFrame) -> None:
        log.warning("connector reported %s: %s (ref %s)", frame.code, frame.message, frame.ref)
        future = self._pending.get(frame.ref or "")
        if future is not None and not future.done():
            future.set_result(OutboundOutcome(False, None, frame.message, frame.code))

    # -- inbound -------------------------------------------------------------------------------

    def set_inbound_handler(self, handler: InboundHandler | None) -> None:
        """Call ``await handler(event)`` for every inbound event, in order, outside the reader.

        A buffered delivery is acked only after the handler returned normally; one whose handler
        raised stays unacked and is replayed by the connector.
        """
        self._deliveries.handler = handler

    def set_interrupt_handler(self, handler: DeliveryHandler | None) -> None:
        """Call ``await handler(frame)`` for every :class:`~relay.wire.frames.InterruptInbound`.

        Without a handler a buffered one is recorded as undeliverable ("no handler") and acked,
        a live one is logged and counted: it never blocks the deliveries behind it.
        """
        self._deliveries.interrupt_handler = handler

    def set_passthrough_handler(self, handler: DeliveryHandler | None) -> None:
        """Call ``await handler(frame)`` for every :class:`~relay.wire.frames.PassthroughForward`
        (same rules as :meth:`set_interrupt_handler`)."""
        self._deliveries.passthrough_handler = handler

    async def _ack(self, buffer_ids: list[str]) -> None:
        ws = self._ws
        if ws is None or self._current() not in SERVING:
            return  # unacked: the connector replays them on the next handshake
        with contextlib.suppress(ConnectionClosed):
            await ws.send(ack_lines(buffer_ids))

    # -- requests ------------------------------------------------------------------------------

    async def request(
        self,
        action: Mapping[str, Any],
        *,
        timeout_s: float | None = None,
        idempotency_key: str | None = None,
        platform: str | None = None,
        bot_id: str | None = None,
    ) -> RequestResult:
        """Send one outbound action and wait for its result (never raises for the network).

        Fails fast with ``NOT_SENT`` (registering nothing) while closing, closed, revoked or not
        connected; while handshaking it waits (bounded) for the handshake.  A timeout, a lost
        connection or a teardown gives ``UNKNOWN``.  ``idempotency_key`` (default: a new
        random key) lets the connector de-duplicate a retry of an ambiguous request: reuse it
        across retries.  Raises ``TypeError`` for an action without a string ``op``.
        """
        if not isinstance(action, Mapping) or not isinstance(action.get("op"), str):
            raise TypeError("an action is a mapping with a str 'op'")
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        # One budget for the whole request: waiting for a handshake spends from it.
        deadline = Deadline.after(self._clock, timeout)
        state = self._current()
        if state is T.HANDSHAKING:
            await self._wait_leave(_DIALING, min(timeout, self.handshake_timeout_s))
            state = self._current()
        if state not in SERVING:
            closed = state in _FINISHED or state is T.CLOSING
            reason = "relay transport closed" if closed else "relay not connected"
            if state is T.REVOKED:
                reason = "relay credentials revoked"
            return RequestResult(RequestOutcome.NOT_SENT, error=reason)
        ws = self._ws
        assert ws is not None
        request_id = f"{self._prefix}-{next(self._ids)}"
        frame = Outbound(
            request_id,
            dict(action),
            idempotency_key or f"{self._prefix}-k{request_id}",
            platform,
            bot_id,
        )
        future: asyncio.Future[OutboundOutcome] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            try:
                await ws.send(encode(frame))
            except ConnectionClosed:
                return RequestResult(RequestOutcome.UNKNOWN, request_id, error="connection lost")
            if not await wait_future(self._clock, future, deadline.remaining()):
                return RequestResult(
                    RequestOutcome.UNKNOWN, request_id, error=f"no result within {timeout:g} s"
                )
            try:
                outcome = future.result()
            except (RelayClosed, RelayBroken) as exc:
                return RequestResult(RequestOutcome.UNKNOWN, request_id, error=str(exc))
        finally:
            self._pending.pop(request_id, None)
        if outcome.success:
            return RequestResult(RequestOutcome.OK, request_id, outcome.message_id)
        kind = RequestOutcome.DECLINED if outcome.declined else RequestOutcome.FAILED
        return RequestResult(kind, request_id, None, outcome.error, outcome.code)

    def _fail_pending(self, error: Exception) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved here: nobody may be waiting any more
        for waiter in self._idle_waiters.values():
            if not waiter.done():
                waiter.set_result(False)

    # -- idle and dormancy ---------------------------------------------------------------------

    async def go_idle(self, timeout_s: float = 10) -> bool:
        """Ask the connector to buffer new inbound (going_idle); True once it acked.

        False on timeout or when not connected.  The socket stays up either way and requests
        keep flowing.
        """
        if not self._machine.can("begin_idle"):
            return False
        acked = await self._going_idle(timeout_s)
        if self._current() is T.GOING_IDLE:
            self._fire("resume")
        return acked

    async def go_dormant(self, timeout_s: float = 10) -> bool:
        """Flip the connector to buffered-only, then close the socket without ending.

        Not connected → False (a no-op).  No ack within ``timeout_s`` → False and the transport
        stays connected: the caller must not suspend.  Ack → state dormant, socket closed,
        pending requests failed as ``UNKNOWN``, and the supervisor armed on the dormant cadence
        so the next wake re-dials promptly and the connector replays its buffer.
        """
        if not self._machine.can("begin_idle"):
            return False
        if not await self._going_idle(timeout_s):
            if self._current() is T.GOING_IDLE:
                self._fire("resume")
            return False
        if self._current() is not T.GOING_IDLE:
            return False  # lost or closed while waiting for the ack
        ws, self._ws = self._ws, None
        # Leaving going-idle fails what is pending; entering dormant arms the dialer.
        self._fire("sleep")
        if ws is not None:
            await bounded(ws.close(1000, "dormant"), TEARDOWN_AWAIT_S)
        return True

    async def _going_idle(self, timeout_s: float) -> bool:
        ws = self._ws
        if ws is None:
            return False
        self._fire("begin_idle")
        request_id = f"{self._prefix}-idle{next(self._ids)}"
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._idle_waiters[request_id] = waiter
        try:
            await ws.send(encode(GoingIdle(request_id)))
            if not await wait_future(self._clock, waiter, timeout_s):
                return False
            return waiter.result()
        except ConnectionClosed:
            return False
        finally:
            self._idle_waiters.pop(request_id, None)

    # -- losing and re-dialing -----------------------------------------------------------------

    def _connection_lost(self, ws: ClientConnection) -> None:
        self._ws = None
        if not self._machine.can("drop"):
            return  # deliberate: closing, dormant or already finished
        verdict = self._redial.lost(*_close_of(ws))
        code, reason = verdict.code, verdict.reason
        if verdict.kind is CloseKind.REVOKED:
            self.close_reason = f"credentials revoked by the connector ({code} {reason})"
            if self.connections == 0:
                self.close_reason += (
                    f", refused for {self.refusal_grace_s:g} s before any handshake"
                )
            self._fire("revoke")
            log.warning("relay %s: %s", self.url, self.close_reason)
            return
        if verdict.kind is CloseKind.REPLACED:
            self.close_reason = "replaced by a newer connection of this gateway (4409)"
            self._fire("end")
            log.warning("relay %s: %s; not re-dialing", self.url, self.close_reason)
            return
        if not self.reconnect:
            self.close_reason = f"connection closed ({code} {reason}) and reconnect is off"
            self._fire("end")
            return
        self._fire("drop")  # reconnecting: entering it arms the dialer

    def _left_serving(self, before: TransportState, after: TransportState, event: str) -> None:
        """Leaving connected or going-idle: whatever is pending can no longer be answered on
        this connection, unless the move stays within serving or is a deliberate close
        (a disconnect drains in-flight requests first and fails the rest itself)."""
        del before, event
        if after in SERVING or after is T.CLOSING:
            return
        self._fail_pending(RelayBroken(_LEFT_SERVING.get(after, "relay connection lost")))

    def _arm(self, *_: object) -> None:
        """Start the supervisor unless one is live: exactly one dialer at a time (entering
        reconnecting or dormant).  A live supervisor needs no nudge: it re-reads the state
        after every dial."""
        if self._current() not in _WAITING:
            return
        if self._supervisor is not None and not self._supervisor.done():
            return
        self._supervisor = asyncio.create_task(self._supervise(), name="relay-dialer")

    async def _supervise(self) -> None:
        # Each turn reads the state afresh, without an await between the read and the dial's
        # first state change: a loss anywhere before the next turn is this dialer's to retry.
        while self._current() in _WAITING:
            await self._clock.sleep(self._redial.next_wait(dormant=self._current() is T.DORMANT))
            state = self._current()
            if state not in _WAITING:
                return
            try:
                await self._dial_or_fail(waking=state is T.DORMANT)
                await self.handshake()
            except RelayClosed:
                return
            except RelayBroken as exc:
                log.info("relay %s: re-dial failed: %s", self.url, exc)

    # -- teardown ------------------------------------------------------------------------------

    async def disconnect(self, budget_s: float | None = None) -> None:
        """Close deliberately, within ``budget_s`` (default: the environment's); never re-dials.

        Enters closing first (so racing requests fail fast), drains in-flight requests for
        :func:`drain_grace_s` of the budget, stops the supervisor, socket, reader and
        dispatcher with bounded waits, and -- in a ``finally`` no cancellation can skip --
        fails every still-pending request with "relay transport closed".  A second call is a
        safe no-op (it waits, bounded, for the first to finish).
        """
        if self._current() in _FINISHED:
            return
        if self._current() is T.CLOSING:
            if self._torn_down is not None:
                await wait_event(self._teardown_clock, self._torn_down, MAX_TEARDOWN_S)
            return
        self._fire("close")
        self._torn_down = asyncio.Event()
        budget = default_disconnect_budget_s() if budget_s is None else max(0.0, budget_s)
        deadline = Deadline.after(self._teardown_clock, budget)
        try:
            grace = drain_grace_s(budget)
            pending = [f for f in self._pending.values() if not f.done()]
            if pending and grace > 0:
                await asyncio.wait(pending, timeout=grace)
            await cancel(self._supervisor, min(TEARDOWN_AWAIT_S, deadline.remaining()))
            ws = self._ws
            if ws is not None:
                await bounded(
                    ws.close(1000, "disconnect"), min(TEARDOWN_AWAIT_S, deadline.remaining())
                )
            await cancel(self._reader, min(TEARDOWN_AWAIT_S, deadline.remaining()))
            await self._inbound.close(min(TEARDOWN_AWAIT_S, deadline.remaining()))
        finally:
            self._fail_pending(RelayClosed("relay transport closed"))
            for task in (self._supervisor, self._reader):
                if task is not None and not task.done():
                    task.cancel()
            if self._ws is not None:
                self._ws.transport.abort()  # the bounded close did not finish: cut it
                self._ws = None
            if self.close_reason is None:
                self.close_reason = "disconnected"
            if self._current() is T.CLOSING:
                self._fire("finish")
            if self._torn_down is not None:
                self._torn_down.set()

    def __repr__(self) -> str:
        where = f"{self.url} {self.platform}/{self.bot_id}"
        return f"<WebSocketRelayTransport {where} {self._current().value}>"


def _close_of(ws: ClientConnection) -> tuple[int | None, str | None]:
    """The close code and reason the peer sent, if any."""
    received = getattr(ws.protocol, "close_rcvd", None)
    if received is None:
        return None, None
    return received.code, received.reason

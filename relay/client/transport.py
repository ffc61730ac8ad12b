"""The gateway side of the relay: one WebSocket to a connector, driven by the TRANSPORT lifecycle.

The transport's state is one :class:`~relay.client.lifecycle.TransportState` held by a live
machine attached from :data:`~relay.client.lifecycle.TRANSPORT`; every method is legal or illegal
per state, and an illegal call fails fast with a definite result.  At most one of each task is
live: the **reader** (:mod:`relay.client.reader`) parses and routes; the **dispatcher**
(:mod:`relay.client.dispatch`) handles deliveries outside it, each chat in order, and acks a
buffered one only after its handler returned; the **supervisor** is the one dialer after the
first connection (backoff after an unexpected close, the dormant cadence after
:meth:`~WebSocketRelayTransport.go_dormant`).  A deliberate
:meth:`~WebSocketRelayTransport.disconnect` never re-dials, is bounded by its budget, and fails
every pending request in a ``finally`` no cancellation can skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from relay.client.delivery import (
    BufferDedupe,
    Deliveries,
    Delivery,
    DeliveryHandler,
    InboundHandler,
    lane_of,
)
from relay.client.dialer import Dialer, UpgradeRefused
from relay.client.dispatch import DEFAULT_MAX_IN_FLIGHT, InboundDispatcher
from relay.client.lifecycle import SERVING, TRANSPORT, TransportState, unserved_reason
from relay.client.reader import ConnectionReader, close_of
from relay.client.redial import RedialPolicy, durations
from relay.client.requests import PendingRequests, RequestOutcome, RequestResult
from relay.client.teardown import (
    MAX_TEARDOWN_S,
    TEARDOWN_AWAIT_S,
    bounded,
    default_disconnect_budget_s,
    drain_grace_s,
    tear_down,
    wait_event,
    wait_future,
)
from relay.wire.codec import ack_lines, encode
from relay.wire.compat import OUR_FEATURES
from relay.wire.descriptor import CapabilityDescriptor
from relay.wire.errors import ContractVersionError, RelayBroken, RelayClosed
from relay.wire.frames import GoingIdle
from relay.wire.logtext import peer_text
from relay.wire.throttle import LogLimits
from relay.wire.urls import CloseKind, relay_url
from statecore.checks import require_text
from statecore.clock import Clock, Deadline, SystemClock
from statecore.errors import InvalidTransition
from statecore.metrics import NO_METRICS, Metrics

__all__ = ["WebSocketRelayTransport"]

log = logging.getLogger(__name__)

T = TransportState

_FINISHED = TRANSPORT.terminal
_DIALING = frozenset({T.CONNECTING, T.HANDSHAKING})
_WAITING = frozenset({T.RECONNECTING, T.DORMANT})
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
    bufferIds and records undeliverable ones.  Every loss, reconnection and wake-up is logged at
    INFO and reported to ``metrics`` (``reconnect``, ``dormant``; see :mod:`relay.client.redial`).

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
        metrics: Metrics = NO_METRICS,
    ) -> None:
        for name, value in durations(
            reconnect_backoff_s=reconnect_backoff_s,
            reconnect_max_s=reconnect_max_s,
            dormant_redial_s=dormant_redial_s,
            request_timeout_s=request_timeout_s,
            handshake_timeout_s=handshake_timeout_s,
            open_timeout_s=open_timeout_s,
            stable_after_s=stable_after_s,
            refusal_grace_s=refusal_grace_s,
        ).items():
            setattr(self, name, value)
        require_text("platform", platform)
        require_text("bot_id", bot_id)
        self.url = relay_url(url)
        self.platform = platform
        self.bot_id = bot_id
        self.gateway_id = gateway_id or bot_id
        self.reconnect = reconnect
        self.max_frame_bytes = max_frame_bytes
        self.token_ttl_s = token_ttl_s
        self._dialer = Dialer(
            self.url,
            gateway_id=self.gateway_id,
            secret=secret,
            token_ttl_s=token_ttl_s,
            features=tuple(features),
            identities=((platform, bot_id), *tuple(identities)),
            open_timeout_s=self.open_timeout_s,
            max_frame_bytes=max_frame_bytes,
        )
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
            metrics=metrics,
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
        self._log_limit = LogLimits(clock=self._clock)  # per kind of line a peer can cause
        self._deliveries = Deliveries(self.url, dedupe, self._log_limit, self._clock)
        self._inbound: InboundDispatcher[Delivery] = InboundDispatcher(
            lane_of=lane_of,
            handle=self._deliveries.handle,
            send_acks=self._ack,
            max_in_flight=max_in_flight,
        )
        self._pending = PendingRequests()
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
    def dedupe(self) -> BufferDedupe | None:
        """The memory of handled and undeliverable deliveries (None: none configured)."""
        return self._deliveries.dedupe

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
        try:
            ws = await self._dialer.open(self._redial.token_time())
        except UpgradeRefused as exc:
            if (
                exc.credentials
                and self._current() is T.CONNECTING
                and not self._redial.refusal_may_be_a_race()
            ):
                self.close_reason = f"connector refused the upgrade with HTTP {exc.status}"
                self._fire("revoke")
                raise RelayClosed(self.close_reason) from exc
            raise
        if self._current() is not T.CONNECTING:
            # A disconnect() started while we were dialing: this socket is not wanted.
            await bounded(ws.close(), TEARDOWN_AWAIT_S)
            raise RelayClosed(f"relay transport is {self._current().value}")
        self._ws = ws
        self._fire("open")
        reader = ConnectionReader(
            ws,
            max_frame_bytes=self.max_frame_bytes,
            platform=self.platform,
            label=self.url,
            enqueue=self._inbound.put,
            pending=self._pending,
            log_limit=self._log_limit,
            adopt=self._adopt,
            incompatible=self._incompatible,
            lost=self._lost,
        )
        self._reader = asyncio.create_task(reader.run(), name="relay-reader")
        await self._dialer.hello(ws, self._inbound.max_in_flight)

    # -- what the reader reports -------------------------------------------------------------

    def _adopt(self, descriptor: CapabilityDescriptor) -> bool:
        """A descriptor arrived; True when it is the first of the connection (handshake done)."""
        self.descriptors[descriptor.platform] = descriptor
        if self._current() is not T.HANDSHAKING:
            return False
        self.descriptor = descriptor
        self._redial.established()
        self._fire("establish")
        return True

    def _incompatible(self, error: ContractVersionError) -> None:
        """A connector of another contract version: re-dialing cannot help, so end (closed)."""
        self.close_reason = f"the connector speaks another contract version: {error}"
        log.warning("relay %s: %s; not re-dialing", self.url, peer_text(self.close_reason))
        if self._machine.can("end"):
            self._fire("end")

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
        reason = unserved_reason(state)
        if reason is not None:
            return RequestResult(RequestOutcome.NOT_SENT, error=reason)
        assert self._ws is not None
        outbound = dict(action)
        return await self._pending.perform(
            self._ws,
            outbound,
            idempotency_key,
            platform,
            bot_id,
            clock=self._clock,
            deadline=deadline,
            timeout_s=timeout,
        )

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
        self._redial.went_dormant()
        if ws is not None:
            await bounded(ws.close(1000, "dormant"), TEARDOWN_AWAIT_S)
        return True

    async def _going_idle(self, timeout_s: float) -> bool:
        ws = self._ws
        if ws is None:
            return False
        self._fire("begin_idle")
        request_id = self._pending.new_id("idle")
        waiter = self._pending.expect_idle_ack(request_id)
        try:
            await ws.send(encode(GoingIdle(request_id)))
            if not await wait_future(self._clock, waiter, timeout_s):
                return False
            return waiter.result()
        except ConnectionClosed:
            return False
        finally:
            self._pending.forget_idle(request_id)

    # -- losing and re-dialing -----------------------------------------------------------------

    def _lost(self, ws: ClientConnection) -> None:
        """The reader of ``ws`` ended: unless another connection replaced it (or a deliberate
        close or dormancy let it go), the connection was lost."""
        if self._ws is ws:
            self._connection_lost(ws)

    def _connection_lost(self, ws: ClientConnection) -> None:
        self._ws = None
        if not self._machine.can("drop"):
            return  # deliberate: closing, dormant or already finished
        verdict = self._redial.lost(*close_of(ws))
        code, reason = verdict.code, verdict.reason
        if verdict.kind is CloseKind.REVOKED:
            self.close_reason = f"credentials revoked by the connector ({code} {reason})"
            if self.connections == 0:
                self.close_reason += (
                    f", refused for {self.refusal_grace_s:g} s before any handshake"
                )
            self._fire("revoke")
            log.warning("relay %s: %s", self.url, peer_text(self.close_reason, limit=400))
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
        self._pending.fail_all(RelayBroken(_LEFT_SERVING.get(after, "relay connection lost")))

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
                log.info("relay %s: re-dial failed: %s", self.url, peer_text(str(exc), limit=400))

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
            await tear_down(
                deadline,
                drain=self._pending.unresolved(),
                grace_s=drain_grace_s(budget),
                supervisor=self._supervisor,
                ws=self._ws,
                reader=self._reader,
                dispatcher_close=self._inbound.close,
            )
        finally:
            self._pending.fail_all(RelayClosed("relay transport closed"))
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

"""The reader of one gateway connection: it parses every frame the connector sends and routes it.

Inbound deliveries (events, poison, the original contract's interrupts and forwarded webhooks)
go to the dispatcher in arrival order; request results and error frames resolve the waiting
request; going-idle acks resolve their waiter; descriptors go to the transport (the first one
completes the handshake).  Invalid frames are counted per connection, logged (rate-limited) and
answered with an error frame only to a connector that announced them; past the limit the
connection is closed with 4400.  A connector of another contract version is told so and the
socket closed.  The reader never stops reading while the socket is open (the replies' results
come on it too): the bound on inbound in hand is the window the connector keeps.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import attrs
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from relay.client.delivery import Delivery
from relay.client.requests import PendingRequests
from relay.client.teardown import TEARDOWN_AWAIT_S, bounded
from relay.wire.codec import FrameDecoder, encode, error_frame_for
from relay.wire.compat import ERROR_FRAMES, TRACE_CONTEXT
from relay.wire.descriptor import CapabilityDescriptor
from relay.wire.errors import ContractVersionError, ProtocolError, UndeliverableEvent
from relay.wire.frames import (
    DescriptorFrame,
    ErrorFrame,
    GoingIdleAck,
    Inbound,
    InterruptInbound,
    OutboundOutcome,
    OutboundResult,
    PassthroughForward,
)
from relay.wire.logtext import failure, peer_text
from relay.wire.throttle import LogLimits
from relay.wire.urls import CLOSE_PROTOCOL

__all__ = ["MAX_VIOLATIONS", "ConnectionReader", "close_of"]

log = logging.getLogger(__name__)

MAX_VIOLATIONS = 50
"""Invalid frames one connection may send before it is closed (4400)."""


class ConnectionReader:
    """Reads and routes the frames of one connection (see the module docs); :meth:`run` is the
    reader task's body.

    The transport supplies what routing needs: ``enqueue`` (the dispatcher's intake),
    ``pending`` (its request table), ``adopt(descriptor) -> bool`` (True when that descriptor
    completed the handshake), ``incompatible(error)`` (end the transport: re-dialing cannot
    help) and ``lost(ws)`` (called once when reading ends, whatever the reason).
    """

    def __init__(
        self,
        ws: ClientConnection,
        *,
        max_frame_bytes: int,
        platform: str,
        label: str,
        enqueue: Callable[[Delivery], None],
        pending: PendingRequests,
        log_limit: LogLimits,
        adopt: Callable[[CapabilityDescriptor], bool],
        incompatible: Callable[[ContractVersionError], None],
        lost: Callable[[ClientConnection], None],
    ) -> None:
        self._ws = ws
        self._decoder = FrameDecoder(max_frame_bytes=max_frame_bytes)
        self._platform = platform
        self._label = label
        self._enqueue = enqueue
        self._pending = pending
        self._log_limit = log_limit
        self._adopt = adopt
        self._incompatible = incompatible
        self._lost = lost
        self.violations = 0
        """Invalid frames received on this connection (counted per connection, as the
        connector counts them)."""
        self.peer_features: frozenset[str] = frozenset()
        """What the connector announced in the descriptor that completed the handshake (empty
        until then: an original connector announces nothing and is sent nothing it does not
        know)."""

    async def run(self) -> None:
        """Read until the connection closes, routing every frame; never raises."""
        ws = self._ws
        try:
            enqueue, recv, feed = self._enqueue, ws.recv, self._decoder.feed
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
                        await self._refuse_version(item)
                        return
                    elif isinstance(item, ProtocolError):
                        if await self._violation(item):
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
            self._log_limit.report(log, f"relay {self._label}: a connection ended")
            self._lost(ws)

    async def _refuse_version(self, error: ContractVersionError) -> None:
        """A connector of another contract version: end the transport, tell the peer, close."""
        self._incompatible(error)
        with contextlib.suppress(ConnectionClosed):
            await self._ws.send(encode(error_frame_for(error)))
        await bounded(self._ws.close(CLOSE_PROTOCOL, "contract version"), TEARDOWN_AWAIT_S)

    async def _violation(self, error: ProtocolError) -> bool:
        """Count, log (rate-limited) and -- to a connector that announced them -- answer one
        invalid frame; True when the limit was passed and the connection is being closed."""
        self.violations += 1
        more = self._log_limit.check(log, logging.WARNING, "invalid frames")
        if more is not None:
            ref = "" if error.ref is None else f" (ref {peer_text(error.ref, limit=80)})"
            log.warning(
                "relay peer sent an invalid frame (%s): %s%s%s",
                error.code,
                peer_text(error.message),
                ref,
                more,
            )
        with contextlib.suppress(ConnectionClosed):
            if ERROR_FRAMES in self.peer_features:
                await self._ws.send(encode(error_frame_for(error)))
            if self.violations > MAX_VIOLATIONS:
                log.warning("relay %s: too many invalid frames; closing (4400)", self._label)
                await self._ws.close(CLOSE_PROTOCOL, "too many protocol violations")
                return True
        return False

    def _on_own_platform(self, frame: Inbound) -> Inbound:
        """An event whose source names no platform came from this connection's platform."""
        source = attrs.evolve(frame.event.source, platform=self._platform)
        return Inbound(attrs.evolve(frame.event, source=source), frame.buffer_id, frame.traceparent)

    def _route(self, frame: object) -> None:
        """Route one decoded frame other than a delivery; an error in one frame never affects
        another."""
        # The connector decides how many frames there are and what they say: every line here
        # is rate-limited per kind (with counts) and carries its text escaped.
        limits = self._log_limit
        try:
            if isinstance(frame, OutboundResult):
                self._pending.resolve(frame.request_id, frame.result)
            elif isinstance(frame, DescriptorFrame):
                if self._adopt(frame.descriptor):
                    self.peer_features = frozenset(frame.descriptor.features)
                    self._pending.traced = TRACE_CONTEXT in self.peer_features
            elif isinstance(frame, GoingIdleAck):
                self._pending.idle_acked(frame.request_id)
            elif isinstance(frame, ErrorFrame):
                more = limits.check(log, logging.WARNING, "error frames")
                if more is not None:
                    log.warning(
                        "connector reported %s: %s (ref %s)%s",
                        peer_text(frame.code, limit=80),
                        peer_text(frame.message),
                        peer_text(frame.ref, limit=80),
                        more,
                    )
                failed = OutboundOutcome(False, None, frame.message, frame.code)
                self._pending.resolve(frame.ref or "", failed)
            elif (more := limits.check(log, logging.DEBUG, "ignored frames")) is not None:
                log.debug("relay: ignoring %s from the connector%s", type(frame).__name__, more)
        except Exception as exc:
            # One line, not a traceback: the exception's text may quote the connector's frame.
            if (more := limits.check(log, logging.ERROR, "failed routings")) is not None:
                log.error(
                    "relay: routing a %s failed: %s%s", type(frame).__name__, failure(exc), more
                )


def close_of(ws: ClientConnection) -> tuple[int | None, str | None]:
    """The close code and reason the peer sent, if any."""
    received = getattr(ws.protocol, "close_rcvd", None)
    if received is None:
        return None, None
    return received.code, received.reason

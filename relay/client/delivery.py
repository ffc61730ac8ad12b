"""How the gateway's transport handles each inbound delivery, and when it may ack it.

:class:`Deliveries` holds the handlers (inbound events, and the original contract's
interrupts and forwarded webhooks) and the optional durable :class:`BufferDedupe`; the
dispatcher (:mod:`relay.client.dispatch`) calls :meth:`Deliveries.handle` for each delivery in
its lane (:func:`lane_of`) and acks what it returns.  The rules: a buffered delivery is acked
only after its handler returned normally (and, with a dedupe, after it was remembered); nothing
may stall the buffer for good, so poison and unhandled original-contract frames are recorded as
undeliverable and acked.

A buffered delivery whose handling raised a store error (``StoreError``, the exception or one it
was raised from: the gateway's store briefly unreachable) is tried again on the same connection,
in its lane, after each wait of :data:`RETRY_S` (the step that raised: the handler, or only the
dedupe's ``remember`` when the handler had returned) -- the connector replays unacked entries
only to a *new* connection, so without this a delivery that failed while the gateway's store was
briefly unreachable stayed unanswered for as long as the connection lived. The tries stay in the
lane, so the chat's order holds and a replayed copy queues behind them (and is known by the
dedupe); a delivery that always raises holds its chat for the sum of the waits (under 8 s),
never the other chats. After the last wait it stays unacked until the next connection replays
it; closing the transport cancels the waits. Any other exception (the application's own bug) is
not tried again: the delivery stays unacked at once and the chat goes on, as a handler's side
effects may not bear repeating.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Final, Protocol

from relay.wire.codec import encode
from relay.wire.errors import UndeliverableEvent
from relay.wire.frames import Inbound, InboundEvent, InterruptInbound, PassthroughForward
from relay.wire.logtext import peer_text
from relay.wire.throttle import LogLimits
from statecore import tracing
from statecore.clock import Clock, SystemClock
from statecore.errors import StoreError

__all__ = [
    "RETRY_S",
    "BufferDedupe",
    "Deliveries",
    "Delivery",
    "DeliveryHandler",
    "InboundHandler",
    "lane_of",
]

log = logging.getLogger(__name__)


InboundHandler = Callable[[InboundEvent], Awaitable[None]]

DeliveryHandler = Callable[[Any], Awaitable[None]]
"""A handler of an original-contract delivery (:class:`~relay.wire.frames.InterruptInbound` or
:class:`~relay.wire.frames.PassthroughForward`): ``await handler(frame)``."""

Delivery = Inbound | UndeliverableEvent | InterruptInbound | PassthroughForward
"""What the dispatcher hands to :meth:`Deliveries.handle`, each in its lane."""

RETRY_S: Final = (0.25, 0.5, 1.0, 2.0, 4.0)
"""The waits (transport clock seconds) before a buffered delivery whose handling raised is
tried again on the same connection (see the module docs)."""


class BufferDedupe(Protocol):
    """Durable memory of handled buffered deliveries, so a replay is not handled twice, and of
    buffered deliveries that could never be handled (recorded, then acked)."""

    async def seen(self, buffer_id: str) -> bool:
        """True when ``buffer_id`` was handled (or recorded as undeliverable) before."""
        ...

    async def remember(self, buffer_id: str) -> None:
        """Record that ``buffer_id`` has been handled (before it is acked)."""
        ...

    async def record_undeliverable(
        self, buffer_id: str, *, frame_type: str, reason: str, raw_line: str
    ) -> None:
        """Durably record a delivery that can never be handled (before it is acked)."""
        ...


class Deliveries:
    """The handlers and dedupe one transport hands its deliveries to (see the module docs).

    ``label`` names the connection in log lines; ``log_limit`` throttles the lines a hostile
    or broken peer could otherwise flood.  The handlers and the dedupe are plain attributes:
    they may be replaced at any time, and each delivery reads them once, when it starts.
    """

    def __init__(
        self,
        label: str,
        dedupe: BufferDedupe | None,
        log_limit: LogLimits,
        clock: Clock | None = None,
    ) -> None:
        self.label = label
        self.clock: Clock = clock or SystemClock()
        """The clock of the waits between the tries of a failed buffered delivery."""
        self.retries = 0
        """Tries of failed buffered deliveries (for operators and tests)."""
        self.dedupe = dedupe
        self.handler: InboundHandler | None = None
        self.interrupt_handler: DeliveryHandler | None = None
        self.passthrough_handler: DeliveryHandler | None = None
        self.undeliverable_count = 0
        """Deliveries that could never be handled: recorded and acked when buffered, logged
        and counted when live."""
        self._log_limit = log_limit

    async def handle(self, frame: Delivery) -> str | None:
        """Handle one delivery in its lane; return the bufferId to ack, or None.

        A buffered delivery is acked only after its handler returned normally (and, with a
        dedupe, after it was remembered); one whose handling raised is tried again after each
        wait of :data:`RETRY_S`, then stays unacked, so the connector delivers it again on the
        next connection.  Nothing may stall the buffer for good: a poison entry, or an
        original-contract frame nobody handles, is recorded as undeliverable and acked (left
        unacked only when it cannot be recorded).  Never raises but for cancellation (the
        connection closed: the waits end with it).
        """
        handled = [False]  # the handler returned: a later try only remembers and acks
        waits = RETRY_S if frame.buffer_id is not None else ()
        for wait in (*waits, None):
            done, buffer_id = await self._try(frame, handled)
            if done or wait is None:
                return buffer_id
            self.retries += 1
            await self.clock.sleep(wait)
        return None  # not reached: the last wait is None

    async def _try(self, frame: Delivery, handled: list[bool]) -> tuple[bool, str | None]:
        """One try of :meth:`handle`: (False, None) when it raised, else (True, the bufferId
        to ack or None)."""
        buffer_id = frame.buffer_id
        # Read per try: the handlers and the dedupe may be replaced while one runs.
        dedupe = self.dedupe
        try:
            if handled[0]:
                if buffer_id is not None and dedupe is not None:
                    await dedupe.remember(buffer_id)
                return True, buffer_id
            if buffer_id is not None and dedupe is not None and await dedupe.seen(buffer_id):
                return True, buffer_id  # handled before (a restart, a lost ack): don't redo
            if isinstance(frame, UndeliverableEvent):
                await self.undeliverable(frame.frame_type, buffer_id, frame.message, frame.raw_line)
                return True, buffer_id
            if isinstance(frame, Inbound):
                if self.handler is None:
                    # Nobody handled it: leave a buffered delivery unacked (it is delivered
                    # again once a handler is set) rather than let the connector retire it.
                    return True, None
                if tracing.enabled:
                    await self._traced(self.handler, frame)
                else:
                    await self.handler(frame.event)
            else:
                handler = (
                    self.interrupt_handler
                    if isinstance(frame, InterruptInbound)
                    else self.passthrough_handler
                )
                if handler is None:
                    raw = encode(frame).rstrip("\n")
                    await self.undeliverable(
                        frame.TYPE, buffer_id, f"no handler for {frame.TYPE}", raw
                    )
                    return True, buffer_id
                await handler(frame)
            handled[0] = True
            if buffer_id is not None and dedupe is not None:
                await dedupe.remember(buffer_id)
            return True, buffer_id
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The failure is isolated to this delivery; a buffered one stays unacked (and is
            # tried again when the store failed, see the module docs).  The traceback is the
            # application's handler's; the bufferId is the connector's text.
            more = self._log_limit.check(log, logging.ERROR, "failed handlers")
            if more is not None:
                log.exception(
                    "relay: handling a %s failed (bufferId %s)%s",
                    type(frame).__name__,
                    peer_text(buffer_id, limit=80),
                    more,
                )
            return (False, None) if _from_store(exc) else (True, None)

    async def _traced(self, handler: InboundHandler, frame: Inbound) -> None:
        """Run ``handler`` inside the ``transport inbound`` span, a child of the connector's
        span when the frame carries its ``traceparent`` (a malformed one is ignored)."""
        event = frame.event
        source = event.source
        attributes = {
            "relay.connector": self.label,
            "relay.platform": source.platform,
            "relay.chat_id": source.chat_id,
            "relay.chat_type": source.chat_type,
            "relay.message_id": event.message_id,
            "relay.buffer_id": frame.buffer_id,
        }
        with tracing.span(
            "transport inbound",
            attributes,
            parent=frame.traceparent,
            kind=tracing.Kind.CONSUMER,
            source=f"connector {self.label}",
        ):
            await handler(event)

    async def undeliverable(
        self, frame_type: str, buffer_id: str | None, reason: str, raw_line: str
    ) -> None:
        """Record (buffered) or log and count (live) one delivery that cannot be handled; raises
        when a buffered one cannot be recorded (it must then stay unacked)."""
        self.undeliverable_count += 1
        # The bufferId, the reason (the decoder's words, which may quote a field) and the raw
        # line are the connector's text: every line below carries them escaped.
        if buffer_id is None:
            more = self._log_limit.check(log, logging.WARNING, "undeliverable live deliveries")
            if more is not None:
                log.warning(
                    "relay %s: dropped an undeliverable live %s (%s)%s: %s",
                    self.label,
                    frame_type,
                    peer_text(reason),
                    more,
                    peer_text(raw_line, limit=500),
                )
        elif self.dedupe is not None:
            await self.dedupe.record_undeliverable(
                buffer_id, frame_type=frame_type, reason=reason, raw_line=raw_line
            )
            # Recorded durably: the log line is only a notice, rate-limited.
            more = self._log_limit.check(log, logging.WARNING, "recorded undeliverables")
            if more is not None:
                shown_id, shown_reason = peer_text(buffer_id, limit=80), peer_text(reason)
                log.warning(
                    "relay %s: recorded undeliverable %s %s: %s%s",
                    self.label,
                    frame_type,
                    shown_id,
                    shown_reason,
                    more,
                    extra={
                        "buffer_id": shown_id,
                        "frame_type": frame_type,
                        "reason": shown_reason,
                    },
                )
        else:
            # No durable record is configured: the log is the record, so it is never throttled
            # (each line is bounded: the raw line is cut at 2,000 characters, escapes included).
            log.error(
                "relay %s: undeliverable %s %s (%s), acked without a durable record (configure a "
                "dedupe to keep one): %s",
                self.label,
                frame_type,
                peer_text(buffer_id, limit=80),
                peer_text(reason),
                peer_text(raw_line, limit=2000),
            )


def lane_of(frame: Delivery) -> Hashable:
    """The lane a delivery is handled in: its chat, so that one chat's messages keep their
    order.  An interrupt takes a lane of its own (it must not wait behind the turn it cancels);
    poison and forwarded webhooks share one."""
    if type(frame) is Inbound:
        source = frame.event.source
        return (source.platform, source.chat_id)
    if isinstance(frame, InterruptInbound):
        return ("interrupt", frame.session_key)
    return ("other",)


def _from_store(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``StoreError`` or was raised from one (its cause or context chain,
    or a member of an exception group, to a bounded depth): a failure worth another try."""
    seen: list[BaseException] = [exc]
    for _ in range(32):
        if not seen:
            return False
        current = seen.pop()
        if isinstance(current, StoreError):
            return True
        if isinstance(current, BaseExceptionGroup):
            seen.extend(current.exceptions)
        seen.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False

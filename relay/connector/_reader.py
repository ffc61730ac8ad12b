"""Reading one authenticated connection: its frames decoded and dispatched in order (acks, hellos,
outbound requests, going_idle), invalid frames counted and answered, and its end settled."""

from __future__ import annotations

import logging

from websockets.exceptions import ConnectionClosed

from relay.connector._delivery import Delivery
from relay.connector._egress import Egress
from relay.connector._handshake import Handshake
from relay.connector._instance import Instance
from relay.connector._log import limited, log, report_suppressed
from relay.connector._roster import Roster
from relay.connector._settings import ReaderSettings
from relay.connector._tasks import Tasks
from relay.wire.codec import PLAIN_ACK_LINE_MAX, FrameDecoder, encode, error_frame_for, plain_acks
from relay.wire.compat import ERROR_FRAMES
from relay.wire.errors import ProtocolError
from relay.wire.frames import GoingIdle, GoingIdleAck, Hello, InboundAck, Interrupt, Outbound
from relay.wire.logtext import failure, peer_text
from relay.wire.urls import CLOSE_PROTOCOL

__all__ = ["Reader"]

_MAX_VIOLATIONS = 20
"""Invalid frames a connection may send; the next one closes it (4400)."""
_MAX_HELD_HELLOS = 16
"""Hellos held for a standby's promotion; more are dropped."""


class Reader:
    """Reads the connector's connections (the frame limit is its ``max_frame_bytes``)."""

    def __init__(
        self,
        connector: ReaderSettings,
        *,
        roster: Roster,
        delivery: Delivery,
        handshake: Handshake,
        egress: Egress,
        tasks: Tasks,
    ) -> None:
        self._connector = connector
        self._roster = roster
        self._delivery = delivery
        self._handshake = handshake
        self._egress = egress
        self._tasks = tasks

    async def read(self, instance: Instance) -> None:
        """Read ``instance`` (admitted to the roster) until it closes, then settle its end."""
        max_frame_bytes = self._connector.max_frame_bytes
        decoder = FrameDecoder(max_frame_bytes=max_frame_bytes)
        plain_acks_ok = max_frame_bytes >= PLAIN_ACK_LINE_MAX
        aligned = True  # every message so far ended with a newline: the decoder holds nothing
        try:
            async for message in instance.ws:
                # The bulk of a replay's return traffic: messages made only of acks in their
                # plain canonical form, which the decoder would turn into exactly these ids.
                if aligned and plain_acks_ok:
                    acked = plain_acks(message)
                    if acked is not None:
                        self._delivery.acked(instance, acked)
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
            self._roster.closed(instance)
            report_suppressed(instance.log_limit, f"a connection of {instance.gateway_id} closed")

    async def _on_frame(self, instance: Instance, frame: object) -> None:
        # Every line below is one a peer causes frame by frame: each is rate-limited (with the
        # count of the rest), and what the peer wrote is escaped before it is logged.
        limits = instance.log_limit
        try:
            if isinstance(frame, Hello) and frame.announced:
                instance.protocol_hello = True
                instance.features = instance.features | frozenset(frame.features)
                if frame.window is not None:
                    instance.window = frame.window
            if instance.is_standby():
                # Unserved: a hello is held for the promotion, anything else is dropped (it was
                # shown nothing, and what it would send belongs to the served connection).
                if isinstance(frame, Hello) and len(instance.held_hellos) < _MAX_HELD_HELLOS:
                    instance.held_hellos.append(frame)
                elif (
                    more := limited(limits, "frames of waiting connections", logging.DEBUG)
                ) is not None:
                    log.debug(
                        "connector: %s: dropping a %s from a waiting connection%s",
                        instance.gateway_id,
                        type(frame).__name__,
                        more,
                    )
            elif isinstance(frame, InboundAck):
                self._delivery.acked(instance, [frame.buffer_id])
            elif isinstance(frame, Outbound):
                self._tasks.spawn(self._egress.outbound(instance, frame))
            elif isinstance(frame, Hello):
                await self._handshake.hello(instance, frame)
            elif isinstance(frame, GoingIdle):
                # Identity comes from the upgrade, never from the frame.
                if instance.machine.can("go_idle"):
                    instance.machine.fire("go_idle")
                await instance.send(encode(GoingIdleAck(frame.request_id)))
            elif isinstance(frame, Interrupt):
                if (more := limited(limits, "interrupts", logging.INFO)) is not None:
                    log.info(
                        "connector: %s: interrupt for session %s (reason %s)%s",
                        instance.gateway_id,
                        peer_text(frame.session_key),
                        peer_text(frame.reason),
                        more,
                    )
            elif (more := limited(limits, "ignored frames", logging.DEBUG)) is not None:
                log.debug(
                    "connector: %s: ignoring a %s%s",
                    instance.gateway_id,
                    type(frame).__name__,
                    more,
                )
        except Exception as exc:
            # One line, not a traceback: the exception's text may quote the peer's frame.
            if (more := limited(limits, "failed frame handlers", logging.ERROR)) is not None:
                log.error(
                    "connector: %s: handling a %s failed: %s%s",
                    instance.gateway_id,
                    type(frame).__name__,
                    failure(exc),
                    more,
                )

    async def _violation(self, instance: Instance, error: ProtocolError) -> bool:
        """Count, log (rate-limited) and -- to a gateway that announced them -- answer an invalid
        frame; True when the limit was passed and the connection is being closed (4400)."""
        instance.violations += 1
        more = limited(instance.log_limit, "invalid frames", logging.WARNING)
        if more is not None:
            ref = "" if error.ref is None else f" (ref {peer_text(error.ref, limit=80)})"
            log.warning(
                "connector: %s sent an invalid frame (%s): %s%s%s",
                instance.gateway_id,
                error.code,
                peer_text(error.message),
                ref,
                more,
                extra={"gateway_id": instance.gateway_id, "code": error.code},
            )
        if ERROR_FRAMES in instance.features:
            await instance.send(encode(error_frame_for(error)))
        if instance.violations > _MAX_VIOLATIONS:
            log.warning(
                "connector: %s sent %d invalid frames; closing (4400)",
                instance.gateway_id,
                instance.violations,
            )
            await instance.close(CLOSE_PROTOCOL, "too many protocol violations")
            return True
        return False

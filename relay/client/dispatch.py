"""The gateway's inbound dispatcher: concurrent across chats, in order within a chat.

Every delivery the transport's reader decodes goes into the *lane* of its chat.  Each lane has
at most one worker, so a chat's messages are handled one after another, in arrival order, while
different chats are handled concurrently: one slow turn no longer delays every other chat.

The bound is the connector's to keep, not the reader's: a gateway that acks live deliveries
announces a *window* (``max_in_flight``) and the connector never has more of its deliveries
unacked at once, keeping the rest in its durable buffer.  The reader itself never stops reading
-- the results of the handlers' own replies arrive on the same socket, and a reader that paused
would wait for them for ever.

A delivery is acked after its handling returned normally (the transport's ``handle`` says which
bufferId, if any, may be acked); acks that become due together go out in one message.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["DEFAULT_MAX_IN_FLIGHT", "InboundDispatcher"]

log = logging.getLogger(__name__)

D = TypeVar("D")

DEFAULT_MAX_IN_FLIGHT = 64
"""The window a gateway announces: deliveries it takes unacked at once, across all chats."""

_ACK_BATCH = 64  # acks per message at most, so a long replay is acked as it goes


class InboundDispatcher(Generic[D]):
    """Per-lane workers over the deliveries of one transport (see the module docs).

    ``lane_of(delivery)`` names its lane (a chat); ``handle(delivery)`` handles it and returns
    the bufferId to ack, or None (nothing to ack, or it must stay unacked); it must not raise
    (an exception is logged and the delivery left unacked).  ``send_acks(ids)`` sends acks; it
    must not raise for a closed connection.  Everything runs on the transport's event loop.
    """

    def __init__(
        self,
        *,
        lane_of: Callable[[D], Hashable],
        handle: Callable[[D], Awaitable[str | None]],
        send_acks: Callable[[list[str]], Awaitable[None]],
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
            raise TypeError(f"max_in_flight must be an int, not {type(max_in_flight).__name__}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {max_in_flight}")
        self.max_in_flight = max_in_flight
        self._lane_of = lane_of
        self._handle = handle
        self._send_acks = send_acks
        self._lanes: dict[Hashable, collections.deque[D]] = {}
        self._workers: dict[Hashable, asyncio.Task[None]] = {}
        self._in_flight = 0
        self._acks: list[str] = []
        self._acker: asyncio.Task[None] | None = None
        self.peak_in_flight = 0
        """The most deliveries ever queued or in hand at once (for operators and tests)."""

    @property
    def in_flight(self) -> int:
        """Deliveries queued or being handled now."""
        return self._in_flight

    def put(self, delivery: D) -> None:
        """Queue ``delivery`` in its lane; its lane's worker handles it in order.  Raises
        nothing."""
        key = self._lane_of(delivery)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = collections.deque()
        lane.append(delivery)
        self._in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self._in_flight)
        if key not in self._workers:
            self._workers[key] = asyncio.create_task(self._work(key, lane), name="relay-lane")

    async def _work(self, key: Hashable, lane: collections.deque[D]) -> None:
        try:
            while lane:
                delivery = lane[0]
                try:
                    buffer_id = await self._handle(delivery)
                except asyncio.CancelledError:
                    raise
                except Exception:  # the handler's contract says never; a bug stays contained
                    log.exception("relay: handling an inbound delivery failed")
                    buffer_id = None
                lane.popleft()
                self._done_one()
                if buffer_id is not None:
                    self._ack_later(buffer_id)
        finally:
            if self._workers.get(key) is asyncio.current_task():
                del self._workers[key]
            if not lane and self._lanes.get(key) is lane:
                del self._lanes[key]

    def _done_one(self) -> None:
        self._in_flight -= 1

    def _ack_later(self, buffer_id: str) -> None:
        """Queue an ack; those that become due together leave in one message."""
        self._acks.append(buffer_id)
        if self._acker is None or self._acker.done():
            self._acker = asyncio.create_task(self._flush_acks(), name="relay-acks")

    async def _flush_acks(self) -> None:
        while self._acks:
            batch, self._acks = self._acks[:_ACK_BATCH], self._acks[_ACK_BATCH:]
            await self._send_acks(batch)

    async def close(self, timeout_s: float) -> None:
        """Cancel every worker (bounded by ``timeout_s``) and drop what was queued: it stays
        unacked, so the connector delivers it again.  Acks already due are sent if the
        connection still carries them.  Idempotent."""
        workers = list(self._workers.values())
        for task in workers:
            task.cancel()
        if workers:
            await asyncio.wait(workers, timeout=max(0.0, timeout_s))
        self._lanes.clear()
        self._workers.clear()
        self._in_flight = 0
        if self._acks and (self._acker is None or self._acker.done()):
            self._acker = asyncio.create_task(self._flush_acks(), name="relay-acks")
        if self._acker is not None and not self._acker.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({self._acker}, timeout=max(0.0, timeout_s))

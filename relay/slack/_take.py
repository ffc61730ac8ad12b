"""Taking one delivered event into the connector, within Slack's ack window.

Slack counts a delivery as failed when its ack (an envelope ack, an Events API 2xx) has not come
within 3 s, and sends it again.  :meth:`Taker.take` answers whether to ack: True only once the
event is the connector's (its intake returned), recorded as rejected, or nobody's message
(passed over); False when the intake refused it (``IntakeFull``) or did not return within the
budget (``ack_budget_s`` from the delivery's arrival).  A late intake is not cancelled: it goes
on, and the copy Slack sends again is recognised by the connector's durable dedupe.

Events of one channel are offered to the intake in the order they arrived (each waits for the
previous one of its channel); channels go on side by side, so a slow one never holds back
another's acks.  At most ``max_pending`` intakes are under way; past that an event is not
acked (Slack sends it again later).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from relay.connector.intake import DriverIntake, IntakeFull
from relay.slack._events import Me, Message, Rejected, classify
from relay.wire.frames import ChatType, EventSource, InboundEvent
from statecore.clock import Clock

__all__ = ["Taker", "chat_type_by_prefix"]

log = logging.getLogger("relay.slack")

_PREFIX_TYPES: Final = {"D": "dm", "G": "group", "C": "channel"}


def chat_type_by_prefix(channel: str) -> str:
    """The kind of a channel by its id's first letter (``D`` direct, ``G`` private group,
    ``C`` channel): the fallback when neither the event nor ``conversations.info`` says."""
    return _PREFIX_TYPES.get(channel[:1], "channel")


class Taker:
    """Offers delivered events to the connector's intake (see the module docs)."""

    def __init__(
        self,
        *,
        platform: str,
        intake: Callable[[], DriverIntake],
        me: Callable[[], Me | None],
        chat_type_of: Callable[[str, float], Awaitable[str]],
        clock: Clock,
        ack_budget_s: float,
        max_pending: int = 512,
    ) -> None:
        self._platform = platform
        self._intake = intake
        self._me = me
        self._chat_type_of = chat_type_of
        self._clock = clock
        self.ack_budget_s = ack_budget_s
        self._max_pending = max_pending
        self._tails: dict[str, asyncio.Task[None]] = {}
        self._pending: set[asyncio.Task[None]] = set()
        self.taken = 0
        """Events the intake returned for (copies the connector recognised included)."""
        self.rejected = 0
        self.passed_over = 0
        self.unacked = 0
        """Deliveries left unacked: refused, too slow, or too many under way."""

    async def take(self, payload: Any, *, received_at: float) -> bool:
        """Offer one event callback; True when it may be acked (see the module docs).  Raises
        nothing but cancellation."""
        me = self._me()
        deadline = received_at + self.ack_budget_s
        if me is None:
            self.unacked += 1
            return False
        seen = classify(payload, me)
        if seen is None:
            self.passed_over += 1
            return True
        if isinstance(seen, Rejected):
            return await self._bounded(self._reject(seen), None, deadline)
        if len(self._pending) >= self._max_pending:
            self.unacked += 1
            log.warning(
                "slack: %d intakes under way; an event is left for Slack to resend",
                len(self._pending),
            )
            return False
        return await self._bounded(self._offer(seen, deadline), seen.channel, deadline)

    async def _bounded(self, work: Awaitable[None], channel: str | None, deadline: float) -> bool:
        previous = self._tails.get(channel) if channel is not None else None
        task = asyncio.get_running_loop().create_task(self._after(previous, work))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        task.add_done_callback(_retrieve)
        if channel is not None:
            self._tails[channel] = task
            task.add_done_callback(lambda t: self._forget_tail(channel, t))
        remaining = deadline - self._clock.monotonic()
        done, _ = await asyncio.wait({task}, timeout=max(0.0, remaining))
        if not done:
            self.unacked += 1
            return False  # it goes on; Slack's next copy is a duplicate the connector knows
        error = task.exception()
        if error is None:
            return True
        self.unacked += 1
        if not isinstance(error, IntakeFull):
            log.warning("slack: the intake failed (%s); Slack will resend", type(error).__name__)
        return False

    def _forget_tail(self, channel: str, task: asyncio.Task[None]) -> None:
        if self._tails.get(channel) is task:
            del self._tails[channel]

    @staticmethod
    async def _after(previous: asyncio.Task[None] | None, work: Awaitable[None]) -> None:
        if previous is not None:
            await asyncio.wait({previous})
        await work

    async def _reject(self, seen: Rejected) -> None:
        await self._intake().reject(self._platform, seen.raw, seen.reason, event_id=seen.event_id)
        self.rejected += 1

    async def _offer(self, message: Message, deadline: float) -> None:
        chat_type = message.chat_type or await self._chat_type_of(message.channel, deadline)
        event = InboundEvent(
            text=message.text,
            message_type=message.message_type,
            message_id=message.message_id,
            reply_to_message_id=message.reply_to,
            media_urls=message.media_urls,
            source=EventSource(
                platform=self._platform,
                chat_id=message.channel,
                chat_type=_chat_type(chat_type),
                user_id=message.user,
                thread_id=message.thread_ts,
                scope_id=message.team_id,
            ),
        )
        await self._intake()(self._platform, event)
        self.taken += 1

    async def drain(self, timeout_s: float) -> None:
        """Wait (bounded) for the intakes under way, then cancel what is left."""
        pending = set(self._pending)
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)
        for task in pending:
            task.cancel()
        for task in pending:
            if not task.done():
                await asyncio.wait({task}, timeout=1.0)


def _retrieve(task: asyncio.Task[None]) -> None:
    """A late intake's failure is read here (it was counted when its wait ran out)."""
    if not task.cancelled():
        task.exception()


def _chat_type(value: str) -> ChatType:
    if value == "dm":
        return "dm"
    if value == "group":
        return "group"
    return "channel"

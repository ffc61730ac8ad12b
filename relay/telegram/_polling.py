"""The inbound half of the Telegram driver: updates, the intake, and the cursor rule.

The Bot API keeps an update until ``getUpdates`` is called with an offset higher than its
``update_id`` (for up to 24 hours), so the offset *is* the cursor: the driver never calls
``getUpdates`` with an offset past an update the connector's intake has not taken.

One round (:meth:`Poller.round`): ask ``getUpdates`` from the stored offset; hand every update
to :class:`Taker` -- each chat's updates in order, chats side by side -- which maps it
(:mod:`relay.telegram._updates`) and gives it to the intake, records it as rejected, or passes
it over; save the new offset as the connector's note (``offset``) once all of that returned,
and only then ask again (that later call is what confirms the updates to Telegram).  When some
update could not be taken (the intake is full, the store fails) the offset saved stops at it:
it and everything after it come again, and the connector recognises the ones it already took
by their ids.  A webhook (:mod:`relay.telegram._webhook`) uses the same :class:`Taker`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, Final

from relay.connector.intake import DriverIntake
from relay.telegram._api import TelegramApi
from relay.telegram._updates import MESSAGE_KINDS, Message, Rejected, classify, update_id_of
from relay.wire.frames import EventSource, InboundEvent
from statecore.errors import StatecoreError

__all__ = ["NOTE_OFFSET", "MalformedUpdates", "Poller", "Taker"]

log = logging.getLogger("relay.telegram")

NOTE_OFFSET: Final = "offset"
"""The connector's note holding the next ``getUpdates`` offset."""
_SEEN_BAD: Final = 1024
"""Raw updates without an id remembered (rejected once each, not at every poll)."""


class MalformedUpdates(StatecoreError):
    """A ``getUpdates`` result that is not a list: the offset stays, the call is asked again."""


class Taker:
    """Hands updates to the connector: mapped, rejected or passed over (see the module docs)."""

    def __init__(
        self, *, platform: str, intake: Callable[[], DriverIntake], bot_id: Callable[[], int | None]
    ) -> None:
        self._platform = platform
        self._intake = intake
        self._bot_id = bot_id
        self._bad: dict[str, None] = {}
        self.taken = 0
        """Updates handed to the intake (copies the connector recognised included)."""
        self.rejected = 0
        """Updates recorded as rejected."""
        self.passed_over = 0

    async def take(self, update: Any) -> None:
        """Take one update; returns once it is the connector's (or recorded, or nobody's).
        Raises what the intake raised (``IntakeFull``, a store error): it is not taken."""
        seen = classify(update, bot_id=self._bot_id())
        intake = self._intake()
        if isinstance(seen, Rejected):
            if seen.update_id is None:
                key = hashlib.sha256(seen.raw.encode()).hexdigest()
                if key in self._bad:
                    return
                if len(self._bad) >= _SEEN_BAD:
                    self._bad.pop(next(iter(self._bad)))
                self._bad[key] = None
            event_id = None if seen.update_id is None else f"update:{seen.update_id}"
            await intake.reject(self._platform, seen.raw, seen.reason, event_id=event_id)
            self.rejected += 1
            return
        if seen is None:
            self.passed_over += 1
            return
        await intake(self._platform, self.event(seen))
        self.taken += 1

    async def reject(self, raw: str, reason: str) -> None:
        """Record a body that is no update at all (a webhook's); raises as the intake does."""
        await self._intake().reject(self._platform, raw, reason)
        self.rejected += 1

    def event(self, message: Message) -> InboundEvent:
        """The inbound event of a mapped message."""
        return InboundEvent(
            text=message.text,
            message_type=message.message_type,
            message_id=message.event_id,
            reply_to_message_id=message.reply_to,
            source=EventSource(
                platform=self._platform,
                chat_id=str(message.chat_id),
                chat_type=message.chat_type,
                chat_name=message.chat_name,
                user_id=message.user_id,
                user_name=message.user_name,
                thread_id=message.thread_id,
            ),
        )

    async def take_batch(
        self, updates: Sequence[Any], offset: int | None
    ) -> tuple[int | None, BaseException | None]:
        """Take a batch (each chat in order, chats side by side); returns the offset that
        covers exactly what was taken, and the first failure (None: all taken)."""
        chats: dict[object, list[tuple[int | None, Any]]] = {}
        seen_ids: set[int] = set()
        for update in updates:
            uid = update_id_of(update)
            if uid is not None:
                if uid in seen_ids or (offset is not None and uid < offset):
                    continue  # a copy within the batch, or one confirmed already
                seen_ids.add(uid)
            chats.setdefault(_chat_of(update), []).append((uid, update))
        failed: list[tuple[int, BaseException]] = []

        async def one_chat(items: list[tuple[int | None, Any]]) -> None:
            for uid, update in items:
                try:
                    await self.take(update)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # The rest of this chat waits: a person's messages are taken in order.
                    failed.append((uid if uid is not None else -1, exc))
                    return

        await asyncio.gather(*(one_chat(items) for items in chats.values()))
        top = max(seen_ids, default=None)
        next_offset = offset if top is None else max(offset or 0, top + 1)
        if failed:
            lowest, first = min(failed, key=lambda f: f[0])
            if lowest >= 0:
                next_offset = lowest if offset is None else max(offset, lowest)
            else:
                next_offset = offset
            return next_offset, first
        return next_offset, None


def _chat_of(update: Any) -> object:
    if isinstance(update, dict):
        for kind in MESSAGE_KINDS:
            message = update.get(kind)
            if isinstance(message, dict) and isinstance(message.get("chat"), dict):
                return message["chat"].get("id")
    return None


class Poller:
    """The ``getUpdates`` rounds of one driver (see the module docs)."""

    def __init__(
        self,
        api: TelegramApi,
        taker: Taker,
        *,
        platform: str,
        intake: Callable[[], DriverIntake],
        poll_timeout_s: int,
        limit: int = 100,
    ) -> None:
        self._api = api
        self._taker = taker
        self._platform = platform
        self._intake = intake
        self.poll_timeout_s = poll_timeout_s
        self.limit = limit
        self.offset: int | None = None
        self.loaded = False

    async def load(self) -> None:
        """Read the stored offset (a restart resumes there)."""
        stored = await self._intake().load(self._platform, NOTE_OFFSET)
        self.offset = int(stored) if stored is not None and stored.lstrip("-").isdigit() else None
        self.loaded = True

    async def skip_pending(self) -> None:
        """Confirm what waits now without taking it (a first start told to drop it)."""
        last = await self._api.call("getUpdates", {"offset": -1, "timeout": 0}, timeout_s=30)
        if isinstance(last, list) and last:
            uid = update_id_of(last[-1])
            if uid is not None:
                await self._save(uid + 1)
                return
        await self._save(0)

    async def round(self) -> int:
        """One ``getUpdates`` and its batch; returns how many updates came.  Raises what
        stopped it (the offset saved covers exactly what was taken)."""
        if not self.loaded:
            await self.load()
        params: dict[str, Any] = {
            "timeout": self.poll_timeout_s,
            "limit": self.limit,
            "allowed_updates": list(MESSAGE_KINDS),
        }
        if self.offset:
            params["offset"] = self.offset
        updates = await self._api.call(
            "getUpdates", params, timeout_s=self.poll_timeout_s + self._api.request_timeout_s
        )
        if not isinstance(updates, list):
            raise MalformedUpdates(f"getUpdates answered a {type(updates).__name__}, not a list")
        next_offset, failure = await self._taker.take_batch(updates, self.offset or None)
        if next_offset is not None and next_offset != self.offset:
            await self._save(next_offset)
        if failure is not None:
            raise failure
        return len(updates)

    async def _save(self, offset: int) -> None:
        # Saved before the next getUpdates: that call is what confirms the updates to Telegram.
        await self._intake().save(self._platform, NOTE_OFFSET, str(offset))
        self.offset = offset

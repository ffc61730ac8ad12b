"""The update queue of the fake Bot API server, with the Bot API's delivery rules.

* Updates are kept until confirmed.  ``getUpdates`` returns the unconfirmed ones from its
  ``offset`` on (at most ``limit``); an update is confirmed as soon as ``getUpdates`` is called
  with an offset higher than its ``update_id`` (a negative offset keeps only the last
  ``-offset`` updates).  A call that finds nothing waits up to ``timeout`` seconds (the long
  poll); a second call while one waits ends the first with ``409 Conflict: terminated by other
  getUpdates request``.
* ``allowed_updates`` is kept until changed and decides which updates are created from then on
  (updates created before the call are delivered as they are).  By default every kind but
  ``chat_member``, ``message_reaction`` and ``message_reaction_count``.
* With a webhook set, ``getUpdates`` answers ``409`` and the pusher
  (:meth:`UpdateQueue.push_loop`) POSTs every update, in order, to the webhook with the secret
  header, retrying (with backoff) until the answer is a 2xx; only then is it confirmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from typing import Any, Final

import aiohttp
import attrs

from relay.telegram._fakechat import ApiRefusal

__all__ = ["DEFAULT_ALLOWED", "Delivery", "UpdateQueue", "Webhook"]

DEFAULT_ALLOWED: Final = frozenset(
    (
        "message",
        "edited_message",
        "channel_post",
        "edited_channel_post",
        "business_connection",
        "business_message",
        "edited_business_message",
        "deleted_business_messages",
        "inline_query",
        "chosen_inline_result",
        "callback_query",
        "shipping_query",
        "pre_checkout_query",
        "purchased_paid_media",
        "poll",
        "poll_answer",
        "my_chat_member",
        "chat_join_request",
        "chat_boost",
        "removed_chat_boost",
    )
)
"""What the Bot API delivers when no ``allowed_updates`` was given."""
SECRET_HEADER: Final = "X-Telegram-Bot-Api-Secret-Token"


@attrs.define
class Webhook:
    """The webhook the bot set (``setWebhook``)."""

    url: str
    secret_token: str | None
    max_connections: int = 40
    last_error_date: int | None = None
    last_error_message: str | None = None


@attrs.frozen
class Delivery:
    """One POST of the pusher to the webhook, and how it ended."""

    update_id: int
    status: int | None
    """The webhook's answer, None when there was none (refused, reset, timed out)."""
    at: float


def kind_of(update: object) -> str | None:
    """The kind of an update (its one key besides ``update_id``), None if it has none."""
    if not isinstance(update, dict):
        return None
    return next((key for key in update if key != "update_id"), None)


class UpdateQueue:
    """The unconfirmed updates of one bot, in ``update_id`` order (see the module docs)."""

    def __init__(self, first_update_id: int, *, webhook_retry_s: float = 0.2) -> None:
        self.pending: list[Any] = []
        self.allowed: frozenset[str] = DEFAULT_ALLOWED
        self.webhook: Webhook | None = None
        self.deliveries: list[Delivery] = []
        self.confirmed_below = first_update_id
        """Every update_id below this is confirmed (forgotten)."""
        self.duplicate_next = 0
        """The next answers (or pushes) deliver their first update twice."""
        self.polls = 0
        """``getUpdates`` calls answered."""
        self.webhook_retry_s = webhook_retry_s
        self._next_id = first_update_id
        self._ids: dict[int, int] = {}
        self._changed = asyncio.Event()
        self._poller = 0  # the generation of the getUpdates call that may wait

    def add(self, update: Any, *, kind: str | None) -> Any | None:
        """Queue an update (its ``update_id`` assigned when it is a dict without one); None
        when ``allowed_updates`` says it is not created at all."""
        if kind is not None and kind not in self.allowed:
            return None
        if isinstance(update, dict) and "update_id" not in update:
            update = {"update_id": self._next_id, **update}
        # The queue's own id decides confirmation, whatever the body says (a hostile body may
        # carry no update_id, or a wrong one).
        self._ids[id(update)] = self._next_id
        self._next_id += 1
        self.pending.append(update)
        self._changed.set()
        return update

    def next_id(self) -> int:
        """The update_id the next update gets."""
        return self._next_id

    def _confirm(self, offset: int) -> None:
        if offset < 0:
            kept = self.pending[offset:]
        else:
            self.confirmed_below = max(self.confirmed_below, offset)
            kept = [u for u in self.pending if self._ids[id(u)] >= offset]
        alive = {id(update) for update in kept}
        for update in self.pending:
            if id(update) not in alive:
                self._ids.pop(id(update), None)
        self.pending = kept

    async def get_updates(
        self, offset: int | None, limit: int, timeout_s: float, allowed: Sequence[str] | None
    ) -> list[Any]:
        """The ``getUpdates`` answer; raises :class:`ApiRefusal` (409) as the Bot API does."""
        if self.webhook is not None:
            raise ApiRefusal(
                409,
                "Conflict: can't use getUpdates method while webhook is active; use "
                "deleteWebhook to delete the webhook first",
            )
        if allowed is not None:
            self.allowed = frozenset(allowed) if allowed else DEFAULT_ALLOWED
        if offset is not None and offset != 0:
            self._confirm(offset)
        self._poller += 1
        me = self._poller
        self._changed.set()  # a call still waiting ends (409)
        deadline = time.monotonic() + timeout_s
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
            if self._poller != me:
                raise ApiRefusal(
                    409,
                    "Conflict: terminated by other getUpdates request; make sure that only "
                    "one bot instance is running",
                )
        self.polls += 1
        answer = list(self.pending[:limit])
        if answer and self.duplicate_next:
            self.duplicate_next -= 1
            answer.insert(1, answer[0])
        return answer

    def close(self) -> None:
        """End every waiting ``getUpdates`` (the server stops)."""
        self._poller += 1
        self._changed.set()

    def set_webhook(self, webhook: Webhook | None, *, drop_pending: bool) -> None:
        """Set (or, with None, delete) the webhook; ``drop_pending`` forgets every update."""
        self.webhook = webhook
        if drop_pending:
            self.pending.clear()
            self._ids.clear()
        self._poller += 1  # a waiting getUpdates ends
        self._changed.set()

    def info(self) -> dict[str, Any]:
        """The ``getWebhookInfo`` answer."""
        hook = self.webhook
        info: dict[str, Any] = {
            "url": hook.url if hook else "",
            "has_custom_certificate": False,
            "pending_update_count": len(self.pending),
        }
        if hook is not None:
            info["max_connections"] = hook.max_connections
            if hook.last_error_date is not None:
                info["last_error_date"] = hook.last_error_date
                info["last_error_message"] = hook.last_error_message
        if self.allowed != DEFAULT_ALLOWED:
            info["allowed_updates"] = sorted(self.allowed)
        return info

    async def push_loop(self, session: aiohttp.ClientSession) -> None:
        """Deliver every pending update to the webhook while one is set (runs until
        cancelled): one at a time, in order, retried until a 2xx answer confirms it."""
        failures = 0
        while True:
            hook = self.webhook
            if hook is None or not self.pending:
                self._changed.clear()
                await self._changed.wait()
                continue
            update = self.pending[0]
            status = await self._post(session, hook, update)
            if status is not None and 200 <= status < 300:
                failures = 0
                if self.duplicate_next:
                    self.duplicate_next -= 1
                    await self._post(session, hook, update)  # a copy: as after a lost answer
                if self.pending and self.pending[0] is update:
                    self.pending.pop(0)
                    uid = self._ids.pop(id(update), None)
                    if uid is not None:
                        self.confirmed_below = max(self.confirmed_below, uid + 1)
                continue
            failures += 1
            hook.last_error_date = int(time.time())
            hook.last_error_message = (
                "Connection refused"
                if status is None
                else f"Wrong response from the webhook: {status}"
            )
            await asyncio.sleep(min(self.webhook_retry_s * 2 ** min(failures - 1, 5), 5.0))

    async def _post(self, session: aiohttp.ClientSession, hook: Webhook, update: Any) -> int | None:
        headers = {"Content-Type": "application/json"}
        if hook.secret_token is not None:
            headers[SECRET_HEADER] = hook.secret_token
        status: int | None = None
        try:
            async with session.post(
                hook.url,
                data=json.dumps(update, ensure_ascii=False).encode(),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=10),
            ) as response:
                await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError):
            status = None
        self.deliveries.append(Delivery(_id(update) or -1, status, time.monotonic()))
        return status


def _id(update: Any) -> int | None:
    uid = update.get("update_id") if isinstance(update, dict) else None
    return uid if isinstance(uid, int) and not isinstance(uid, bool) else None

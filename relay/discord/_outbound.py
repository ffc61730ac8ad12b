"""The outbound half of the Discord driver: one action, one request, asked again safely.

A send is ``POST /channels/{id}/messages`` with a ``nonce`` and ``enforce_nonce: true``:
Discord returns the message it already made for the same nonce within a few minutes instead
of making another, so asking again after a 429, a 5xx or a failure without an answer is the
same request.  A send in a thread goes to the thread's id (a thread is a channel); a reply
carries ``message_reference`` (``fail_if_not_exists: false``: a reply to a message deleted
since is still sent); mentions written in a reply ping nobody (``allowed_mentions``), except
the author of the message replied to.  An edit is ``PATCH /channels/{id}/messages/{mid}`` in
the channel the driver sent the message to; typing is ``POST /channels/{id}/typing``.  Every
action stops at ``send_budget_s``: what is left is a failed outcome, never an exception.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

from relay.connector.driver_kit import SEND_BACKOFF_S, Backoff
from relay.connector.platform import target_chat
from relay.discord._api import DiscordApi, DiscordError, DiscordUnreachable
from relay.wire.frames import OutboundOutcome
from statecore.clock import Clock

__all__ = ["MAX_MESSAGE_CHARS", "OPS", "SEND_ROUTE", "Sender"]

OPS: Final = ("send", "edit", "typing", "follow_up")
MAX_MESSAGE_CHARS: Final = 2000
SEND_ROUTE: Final = "POST /channels/{channel_id}/messages"
EDIT_ROUTE: Final = "PATCH /channels/{channel_id}/messages/{message_id}"
TYPING_ROUTE: Final = "POST /channels/{channel_id}/typing"
ALLOWED_MENTIONS: Final = {"parse": [], "replied_user": True}
_REMEMBERED: Final = 4096


def _snowflake(value: object) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    if isinstance(value, str) and value.isdigit() and 0 < len(value) <= 20:
        return value
    return None


class Sender:
    """Performs outbound actions for one driver (see the module docs)."""

    def __init__(self, api: DiscordApi, *, clock: Clock, send_budget_s: float) -> None:
        self._api = api
        self._clock = clock
        self._budget_s = send_budget_s
        self._channel_of: OrderedDict[str, str] = OrderedDict()
        """The channel each message the driver sent lives in (bounded): where an edit goes."""
        self.rate_limited = 0
        """429 answers waited out."""

    async def perform(self, action: Mapping[str, Any], nonce: str) -> OutboundOutcome:
        """Perform ``action``; a send under ``nonce``.  Never raises for refusals."""
        op = action.get("op")
        if op not in OPS:
            shown = str(op)[:40]
            return OutboundOutcome(False, None, f"unsupported op {shown!r}", "unsupported_op")
        chat = _snowflake(target_chat(action))
        if chat is None:
            return OutboundOutcome(
                False, None, "chat_id must be a Discord channel id", "bad_action"
            )
        thread = _snowflake(action.get("thread_id"))
        channel = thread or chat
        content = action.get("content")
        if op == "typing":
            if isinstance(content, str) and content == "":
                return OutboundOutcome(True)  # Discord's typing ends by itself
            outcome = await self._call("POST", f"/channels/{channel}/typing", TYPING_ROUTE, channel)
            return OutboundOutcome(True) if outcome.success else outcome
        if not isinstance(content, str) or not content:
            return OutboundOutcome(False, None, "content is required", "bad_action")
        if len(content) > MAX_MESSAGE_CHARS:
            return OutboundOutcome(
                False, None, f"message over {MAX_MESSAGE_CHARS} characters", "too_long"
            )
        if op == "edit":
            target = _snowflake(action.get("message_id"))
            if target is None:
                return OutboundOutcome(False, None, "message_id must be a message id", "bad_action")
            where = self._channel_of.get(target, channel)
            path = f"/channels/{where}/messages/{target}"
            outcome = await self._call("PATCH", path, EDIT_ROUTE, where, {"content": content})
            return OutboundOutcome(True, target) if outcome.success else outcome
        body: dict[str, Any] = {
            "content": content,
            "nonce": nonce,
            "enforce_nonce": True,
            "allowed_mentions": ALLOWED_MENTIONS,
        }
        reply_to = _snowflake(action.get("reply_to"))
        if reply_to is not None:
            body["message_reference"] = {"message_id": reply_to, "fail_if_not_exists": False}
        outcome = await self._call(
            "POST", f"/channels/{channel}/messages", SEND_ROUTE, channel, body
        )
        if outcome.success and outcome.message_id is not None:
            self._channel_of[outcome.message_id] = channel
            while len(self._channel_of) > _REMEMBERED:
                self._channel_of.popitem(last=False)
        return outcome

    async def _call(
        self, method: str, path: str, route: str, major: str, body: Any = None
    ) -> OutboundOutcome:
        """One request, asked again within the budget (module docs)."""
        clock = self._clock
        deadline = clock.monotonic() + self._budget_s
        backoff = Backoff(SEND_BACKOFF_S)
        while True:
            try:
                answer = await self._api.request(method, path, route=route, major=major, body=body)
            except DiscordUnreachable as exc:
                outcome = OutboundOutcome(False, None, str(exc)[:300], "platform_down")
            except DiscordError as exc:
                if exc.rate_limited:
                    self.rate_limited += 1
                    wait = exc.retry_after_s if exc.retry_after_s is not None else 1.0
                    if clock.monotonic() + wait > deadline:
                        return OutboundOutcome(False, None, "rate limited", "rate_limited")
                    continue  # the api holds the bucket (or every request) until then
                refused = refusal(exc)
                if refused is not None:
                    return refused
                outcome = OutboundOutcome(False, None, str(exc)[:300], "platform_down")
            else:
                message_id = answer.get("id") if isinstance(answer, dict) else None
                return OutboundOutcome(True, message_id if isinstance(message_id, str) else None)
            if not await backoff.sleep_within(clock, deadline):
                return outcome


def refusal(exc: DiscordError) -> OutboundOutcome | None:
    """The outcome of a definite refusal (None: a server error worth asking again)."""
    if exc.status >= 500:
        return None
    text = str(exc)[:300]
    if exc.status == 401:
        return OutboundOutcome(False, None, "Discord refused the bot's token", "auth")
    if exc.status == 403:
        return OutboundOutcome(False, None, text, "forbidden")
    if exc.status == 404:
        return OutboundOutcome(False, None, text, "not_found")
    content = exc.errors.get("content") if exc.code == 50035 else None
    if isinstance(content, dict) and "MAX_LENGTH" in str(content.get("_errors")):
        return OutboundOutcome(False, None, text, "too_long")
    return OutboundOutcome(False, None, text, "bad_action")

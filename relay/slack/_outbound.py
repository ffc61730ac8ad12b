"""The outbound half of the Slack driver: ``chat.postMessage`` and ``chat.update``.

Slack has no idempotent send: a ``chat.postMessage`` whose answer was lost may or may not have
posted.  So a send is asked again only when Slack surely did not act: after a 429 (its
``Retry-After`` waited out; the pause holds every call of that method, as Slack's limits are per
method) and after a connection that was never made.  A 5xx or a lost answer is returned as a
failed outcome (``platform_down``) for the relay's ledger, whose resend carries its "possible
repeat" label.  ``chat.update`` sets a text and may be asked again after any transient failure.
Everything stops at ``send_budget_s``: what is left is a failed outcome, never an exception.

Message ids are ``<channel>:<ts>`` (what the inbound side gives a person's message); a thread is
its parent's ``ts`` (the inbound ``thread_id``; ``<channel>:<ts>`` is read too).  Bots cannot
show typing in the Events API, so ``typing`` is not among :data:`OPS` and is answered
``unsupported_op``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from relay.connector.driver_kit import SEND_BACKOFF_S, Backoff
from relay.connector.platform import target_chat
from relay.slack._api import SlackError, SlackUnreachable, WebApi
from relay.wire.frames import OutboundOutcome
from statecore.clock import Clock

__all__ = ["OPS", "Sender", "refusal"]

OPS: Final = ("send", "edit", "follow_up")
"""What the driver performs (its descriptor's ``supported_ops``)."""
_NOT_FOUND: Final = frozenset(("channel_not_found", "message_not_found", "thread_not_found"))
_FORBIDDEN: Final = frozenset(
    (
        "not_in_channel",
        "is_archived",
        "restricted_action",
        "cant_update_message",
        "edit_window_closed",
        "missing_scope",
        "ekm_access_denied",
        "team_access_not_granted",
    )
)


def refusal(exc: SlackError) -> OutboundOutcome:
    """The outcome of a definite refusal by Slack."""
    text = str(exc)[:300]
    if exc.auth:
        return OutboundOutcome(False, None, text, "auth")
    if exc.error == "msg_too_long":
        return OutboundOutcome(False, None, text, "too_long")
    if exc.error in _NOT_FOUND:
        return OutboundOutcome(False, None, text, "not_found")
    if exc.error in _FORBIDDEN:
        return OutboundOutcome(False, None, text, "forbidden")
    return OutboundOutcome(False, None, text, "bad_action")


def _ts_of(value: object, channel: str) -> str | None:
    """The ``ts`` a thread or message id names (``ts`` or ``<channel>:<ts>[:edit:...]``)."""
    if not isinstance(value, str) or not value:
        return None
    parts = value.split(":")
    if len(parts) == 1:
        return parts[0]
    if parts[0] != channel:
        return None
    return parts[1] or None


class Sender:
    """Performs outbound actions for one driver (see the module docs)."""

    def __init__(
        self,
        api: WebApi,
        *,
        clock: Clock,
        send_budget_s: float,
        max_chars: int,
        reply_in_thread: bool,
    ) -> None:
        self._api = api
        self._clock = clock
        self._budget_s = send_budget_s
        self._max_chars = max_chars
        self._reply_in_thread = reply_in_thread
        self._paused_until: dict[str, float] = {}
        self.rate_limited = 0
        """429 answers waited out."""

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        """Perform ``action``; never raises for refusals (see the module docs)."""
        op = action.get("op")
        if op == "typing":
            return OutboundOutcome(
                False, None, "Slack shows no typing indicator for bots", "unsupported_op"
            )
        if op not in OPS:
            return OutboundOutcome(
                False, None, f"unsupported op {str(op)[:40]!r}", "unsupported_op"
            )
        channel = target_chat(action)
        content = action.get("content")
        if channel is None:
            return OutboundOutcome(False, None, "chat_id is required", "bad_action")
        if not isinstance(content, str) or not content.strip():
            return OutboundOutcome(False, None, "content is required", "bad_action")
        if len(content) > self._max_chars:
            return OutboundOutcome(False, None, f"over {self._max_chars} characters", "too_long")
        if op == "edit":
            target = action.get("message_id")
            if isinstance(target, str) and ":" in target:
                channel = target.split(":", 1)[0]
            ts = _ts_of(target, channel)
            if ts is None:
                return OutboundOutcome(
                    False, None, "message_id must be <channel>:<ts>", "bad_action"
                )
            args = {"channel": channel, "ts": ts, "text": content}
            outcome = await self._call("chat.update", args, repeatable=True)
            return OutboundOutcome(True, f"{channel}:{ts}") if outcome.success else outcome
        args = {"channel": channel, "text": content}
        thread_ts = _ts_of(action.get("thread_id"), channel)
        if thread_ts is None and self._reply_in_thread:
            thread_ts = _ts_of(action.get("reply_to"), channel)
        if thread_ts is not None:
            args["thread_ts"] = thread_ts
        return await self._call("chat.postMessage", args, repeatable=False)

    async def _call(
        self, method: str, args: Mapping[str, Any], *, repeatable: bool
    ) -> OutboundOutcome:
        """``method`` with ``args``, asked again only where the module docs say so."""
        clock = self._clock
        deadline = clock.monotonic() + self._budget_s
        backoff = Backoff(SEND_BACKOFF_S)
        while True:
            wait = self._paused_until.get(method, 0.0) - clock.monotonic()
            if wait > 0:
                if clock.monotonic() + wait > deadline:
                    return OutboundOutcome(False, None, f"{method}: rate limited", "rate_limited")
                await clock.sleep(wait)
            try:
                answer = await self._api.call(method, args)
            except SlackError as exc:
                if exc.rate_limited:
                    self.rate_limited += 1
                    pause = exc.retry_after_s if exc.retry_after_s is not None else 1.0
                    until = clock.monotonic() + pause
                    self._paused_until[method] = max(self._paused_until.get(method, 0.0), until)
                    continue
                if exc.status < 500:
                    return refusal(exc)
                outcome = OutboundOutcome(False, None, str(exc)[:300], "platform_down")
                if not repeatable:
                    return outcome  # Slack may have posted: the ledger's label decides
            except SlackUnreachable as exc:
                outcome = OutboundOutcome(False, None, str(exc)[:300], "platform_down")
                if exc.sent and not repeatable:
                    return outcome
            else:
                ts = answer.get("ts")
                channel = answer.get("channel") or args["channel"]
                message_id = f"{channel}:{ts}" if isinstance(ts, str) else None
                return OutboundOutcome(True, message_id)
            if not await backoff.sleep_within(clock, deadline):
                return outcome

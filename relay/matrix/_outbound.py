"""The outbound half of the Matrix driver: one action, one request, asked again safely.

Every send and edit is ``PUT /rooms/{room}/send/m.room.message/{txnId}``; the homeserver makes
one event of every request with the same txnId from one device, so asking again after a rate
limit or a failure without an answer is always the same request.  ``M_LIMIT_EXCEEDED`` holds
every request of the driver (the server's limit is per account) until ``retry_after_ms`` has
passed; a server that forgot the access token is logged in to again, once, on the same device.
Everything stops at ``send_budget_s``: what is left is a failed outcome, never an exception.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Final

from relay.connector.driver_kit import SEND_BACKOFF_S, Backoff
from relay.connector.platform import target_chat
from relay.matrix._api import MatrixApi, MatrixAuthError, MatrixError, MatrixUnreachable, path
from relay.matrix._content import edit_content, message_content
from relay.matrix._session import Session
from relay.wire.frames import OutboundOutcome
from statecore.clock import Clock

__all__ = ["OPS", "Sender"]

OPS: Final = ("send", "edit", "typing", "follow_up")
"""What the driver performs (its descriptor's ``supported_ops``)."""


class Sender:
    """Performs outbound actions for one driver (see the module docs)."""

    def __init__(
        self,
        api: MatrixApi,
        session: Session,
        *,
        clock: Clock,
        msgtype: str,
        markdown: bool,
        send_budget_s: float,
    ) -> None:
        self._api = api
        self._session = session
        self._clock = clock
        self._msgtype = msgtype
        self._markdown = markdown
        self._budget_s = send_budget_s
        self._paused_until = 0.0  # monotonic: a rate limit holds every request until then
        self.rate_limited = 0
        """Answers ``M_LIMIT_EXCEEDED`` waited out."""

    async def perform(self, action: Mapping[str, Any], txn: str) -> OutboundOutcome:
        """Perform ``action`` under the transaction id ``txn``; never raises for refusals."""
        op = action.get("op")
        if op not in OPS:
            shown = str(op)[:40]
            return OutboundOutcome(False, None, f"unsupported op {shown!r}", "unsupported_op")
        room = target_chat(action)
        if room is None or not room.startswith("!"):
            return OutboundOutcome(False, None, "chat_id must be a Matrix room id", "bad_action")
        content = action.get("content")
        if op == "typing":
            typing = not (isinstance(content, str) and content == "")
            body = {"typing": True, "timeout": 30_000} if typing else {"typing": False}
            return await self._call(path("rooms", room, "typing", self._session.user_id), body)
        if not isinstance(content, str) or not content:
            return OutboundOutcome(False, None, "content is required", "bad_action")
        url = path("rooms", room, "send", "m.room.message", txn)
        if op == "edit":
            target = action.get("message_id")
            if not isinstance(target, str) or not target.startswith("$"):
                return OutboundOutcome(False, None, "message_id must be an event id", "bad_action")
            edit = edit_content(target, content, msgtype=self._msgtype, markdown=self._markdown)
            outcome = await self._call(url, edit)
            return OutboundOutcome(True, target) if outcome.success else outcome
        message = message_content(
            content,
            msgtype=self._msgtype,
            reply_to=_event_id(action.get("reply_to")),
            thread_id=_event_id(action.get("thread_id")),
            markdown=self._markdown,
        )
        return await self._call(url, message)

    async def _call(self, url: str, body: Mapping[str, Any]) -> OutboundOutcome:
        """``PUT url`` with ``body``, asked again within the budget (module docs)."""
        clock = self._clock
        deadline = clock.monotonic() + self._budget_s
        relogged = False
        backoff = Backoff(SEND_BACKOFF_S)
        while True:
            wait = self._paused_until - clock.monotonic()
            if wait > 0:
                if clock.monotonic() + wait > deadline:
                    return OutboundOutcome(False, None, "rate limited", "rate_limited")
                await clock.sleep(wait)
            token = self._api.token
            try:
                answer = await self._api.request("PUT", url, body=body)
            except MatrixUnreachable as exc:
                outcome = OutboundOutcome(False, None, str(exc)[:300], "platform_down")
            except MatrixError as exc:
                if exc.rate_limited:
                    self.rate_limited += 1
                    pause = (exc.retry_after_ms or 1000) / 1000
                    self._paused_until = max(self._paused_until, clock.monotonic() + pause)
                    continue
                if exc.unknown_token and not relogged:
                    relogged = True
                    with contextlib.suppress(MatrixError, MatrixUnreachable, MatrixAuthError):
                        if await self._session.relogin(token):
                            continue
                    return OutboundOutcome(False, None, "the bot's credentials are gone", "auth")
                refused = refusal(exc)
                if refused is not None:
                    return refused
                outcome = OutboundOutcome(False, None, str(exc)[:300], "platform_down")
            else:
                event_id = answer.get("event_id")
                return OutboundOutcome(True, event_id if isinstance(event_id, str) else None)
            if not await backoff.sleep_within(clock, deadline):
                return outcome


def refusal(exc: MatrixError) -> OutboundOutcome | None:
    """The outcome of a definite refusal (None: a server error worth asking again)."""
    if exc.status >= 500:
        return None
    text = str(exc)[:300]
    if exc.status == 413 or exc.errcode == "M_TOO_LARGE":
        return OutboundOutcome(False, None, text, "too_long")
    if exc.status == 403 or exc.errcode == "M_FORBIDDEN":
        return OutboundOutcome(False, None, text, "forbidden")
    if exc.status == 404 or exc.errcode == "M_NOT_FOUND" or "unknown event" in (exc.error or ""):
        # An edit of (or a reply in a thread of) an event the server does not know.
        return OutboundOutcome(False, None, text, "not_found")
    return OutboundOutcome(False, None, text, "bad_action")


def _event_id(value: object) -> str | None:
    return value if isinstance(value, str) and value.startswith("$") else None

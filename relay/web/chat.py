"""The web chat: a platform driver whose users are people in a browser.

:class:`WebChatPlatform` is a connector platform driver like
:class:`~relay.connector.platform.LoopbackPlatform` (it is one, with its transcript, message ids
and edits), and a :class:`~relay.web.server.WebApp` serving the chat page at ``/chat/``.  A
person opens the page, picks a name and writes in one or more chats; the bot's replies, edits
and typing show up live.  Everything else -- the tenant guard, buffering while the bot sleeps,
replay -- works through it unchanged: to the connector it is just a platform.

The browser speaks JSON over ``/chat/ws``, one object per message:

* browser -> server: ``{"type": "hello", "key": K, "name": N}`` first (``K``: a random secret
  the page keeps in the browser's storage; it is the user's identity), then
  ``{"type": "open", "chat": SLUG}`` (open or create a chat) and
  ``{"type": "send", "chat": SLUG, "text": T}``;
* server -> browser: ``welcome`` (the user's id, name, chats and the longest text allowed),
  ``history`` (one chat's messages), ``message`` (a new one, the user's own included, with
  ``redelivery`` true when the bot labelled it as a possible repeat), ``edit``, ``typing``,
  ``refused`` (a message not sent: too long, empty; shown in the page) and ``error`` (input the
  page never sends).

**Who sees what.**  A user's id is derived from their key (``u-`` + 16 hex digits of its
SHA-256): a chat id is ``<user id>.<slug>``, and a browser is shown only the chats of the key it
presented -- knowing a user's id (which the bot sees) does not let anyone read their chats.
The chat is a DM: its tenant is the user.  Text is text: the page renders every message with
``textContent``, and the server's pages forbid inline script.

**Memory is bounded**: ``max_history`` messages per chat, ``max_chats_per_user`` chats per
user and ``max_chats`` in all (then new chats are refused).  The transcript lives in this
process: reopening the page shows the conversation; restarting the connector forgets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Mapping
from typing import Any

import attrs
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from relay.connector.platform import ChatMessage, LoopbackPlatform, target_chat
from relay.web.server import static_files
from relay.wire.descriptor import LEGACY_OPS
from relay.wire.frames import OutboundOutcome
from statecore import RECONNECTED_MARKER, RECOVERED_MARKER

__all__ = ["WebChatPlatform"]

log = logging.getLogger("relay.web")

_SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_KEY = re.compile(r"[A-Za-z0-9_-]{16,128}")
_BANNERS = (RECOVERED_MARKER, RECONNECTED_MARKER)
_NAME_MAX = 40


@attrs.define(eq=False)
class _User:
    """One person (a key), their chats and the browser tabs they have open."""

    user_id: str
    name: str
    chats: list[str] = attrs.Factory(list)
    """Slugs, in the order they were opened."""
    sockets: set[ServerConnection] = attrs.Factory(set)


class WebChatPlatform(LoopbackPlatform):
    """The web chat (see the module docs): a platform driver and the app at ``/chat/``.

    ``WebChatPlatform(platform="webchat", *, label="Web chat", bot_name="bot",
    max_message_length=4000, max_history=500, max_chats_per_user=20, max_chats=10_000)``.
    Give it to a connector as a driver (``drivers={"webchat": chat}``) and to a
    :class:`~relay.web.server.WebServer` as an app.
    """

    prefix = "/chat"
    title = "Web chat"

    def __init__(
        self,
        platform: str = "webchat",
        *,
        label: str = "Web chat",
        bot_name: str = "bot",
        max_message_length: int = 4000,
        max_history: int = 500,
        max_chats_per_user: int = 20,
        max_chats: int = 10_000,
    ) -> None:
        for name, value in (
            ("max_message_length", max_message_length),
            ("max_history", max_history),
            ("max_chats_per_user", max_chats_per_user),
            ("max_chats", max_chats),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        super().__init__(
            platform,
            label=label,
            max_message_length=max_message_length,
            supported_ops=LEGACY_OPS,
        )
        self.bot_name = bot_name
        self.max_history = max_history
        self.max_chats_per_user = max_chats_per_user
        self.max_chats = max_chats
        self.files = static_files("chat")
        """The page's files (``relay/web/static/chat/``)."""
        self._users: dict[str, _User] = {}

    # -- the driver side (the connector calls these) ----------------------------------------

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        """Perform like the loopback platform, then show the result to the chat's user live:
        a new message, an edit, or the typing status."""
        outcome = await super().perform(action)
        chat_id = target_chat(action)
        if not outcome.success or chat_id is None:
            return outcome
        op = action.get("op")
        if op == "typing":
            # The contract: no content shows plain typing, "" clears it, a text is a status.
            content = action.get("content")
            status = (content or None) if isinstance(content, str) else "typing"
            self._push(chat_id, {"type": "typing", "status": status})
        elif op == "edit":
            message = self._find(chat_id, outcome.message_id)
            if message is not None:
                self._push(chat_id, {"type": "edit", **self._shown(message)})
        return outcome

    def _log(self, message: ChatMessage) -> None:
        """Every message of a chat (user's or bot's) lands here: kept (bounded) and shown."""
        super()._log(message)
        kept = self.transcript[message.chat_id]
        if len(kept) > self.max_history:
            del kept[: len(kept) - self.max_history]
        self._push(message.chat_id, {"type": "message", **self._shown(message)})

    # -- the browser side ---------------------------------------------------------------------

    async def session(self, ws: ServerConnection) -> None:
        """Serve one browser tab until it closes (see the module docs for the messages)."""
        user: _User | None = None
        try:
            async for raw in ws:
                request = _parse(raw)
                if request is None:
                    await _send(ws, {"type": "error", "reason": "expected a JSON object"})
                    continue
                kind = request.get("type")
                if kind == "hello" and user is None:
                    user = await self._hello(ws, request)
                elif user is None:
                    await _send(ws, {"type": "error", "reason": "say hello first"})
                elif kind == "open":
                    await self._open(ws, user, request.get("chat"))
                elif kind == "send":
                    await self._send_text(ws, user, request.get("chat"), request.get("text"))
                else:
                    await _send(ws, {"type": "error", "reason": "unknown message type"})
        except ConnectionClosed:
            pass
        finally:
            if user is not None:
                user.sockets.discard(ws)

    async def _hello(self, ws: ServerConnection, request: Mapping[str, Any]) -> _User | None:
        key, name = request.get("key"), request.get("name")
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            await _send(ws, {"type": "error", "reason": "hello needs a key of 16-128 letters"})
            return None
        if not isinstance(name, str) or not name.strip():
            await _send(ws, {"type": "error", "reason": "hello needs a name"})
            return None
        user_id = "u-" + hashlib.sha256(key.encode("ascii")).hexdigest()[:16]
        user = self._users.get(user_id)
        if user is None:
            user = self._users[user_id] = _User(user_id, name.strip()[:_NAME_MAX])
        else:
            user.name = name.strip()[:_NAME_MAX]
        user.sockets.add(ws)
        welcome = {
            "type": "welcome",
            "user": user.user_id,
            "name": user.name,
            "chats": list(user.chats),
            "max_text": self._descriptor.max_message_length,
        }
        await _send(ws, welcome)
        for slug in user.chats:
            await self._history(ws, user, slug)
        return user

    async def _open(self, ws: ServerConnection, user: _User, slug: object) -> None:
        if not isinstance(slug, str) or not _SLUG.fullmatch(slug):
            await _send(
                ws,
                {"type": "refused", "reason": "a chat name is 1-32 of a-z, 0-9 and -"},
            )
            return
        if slug not in user.chats:
            chats = sum(len(u.chats) for u in self._users.values())
            if len(user.chats) >= self.max_chats_per_user or chats >= self.max_chats:
                await _send(ws, {"type": "refused", "reason": "no more chats can be opened"})
                return
            user.chats.append(slug)
        await self._history(ws, user, slug)

    async def _history(self, ws: ServerConnection, user: _User, slug: str) -> None:
        chat_id = f"{user.user_id}.{slug}"
        messages = [self._shown(m) for m in self.transcript.get(chat_id, [])]
        await _send(ws, {"type": "history", "chat": slug, "messages": messages})

    async def _send_text(
        self, ws: ServerConnection, user: _User, slug: object, text: object
    ) -> None:
        if not isinstance(slug, str) or slug not in user.chats:
            await _send(ws, {"type": "refused", "reason": "open the chat first"})
            return
        if not isinstance(text, str) or not text.strip():
            await _send(ws, {"type": "refused", "chat": slug, "reason": "an empty message"})
            return
        limit = self._descriptor.max_message_length
        if len(text) > limit:
            reason = f"message too long: {len(text)} characters, at most {limit}"
            await _send(ws, {"type": "refused", "chat": slug, "reason": reason})
            return
        try:
            await self.inject(
                f"{user.user_id}.{slug}",
                text,
                user_id=user.user_id,
                user_name=user.name,
                chat_type="dm",
            )
        except Exception:  # the connector could not take it (its store failed): say so
            log.warning("web chat: a message could not be handed to the connector", exc_info=True)
            await _send(
                ws, {"type": "refused", "chat": slug, "reason": "not sent: try again later"}
            )

    # -- showing ----------------------------------------------------------------------------

    def _shown(self, message: ChatMessage) -> dict[str, Any]:
        """A message as the page shows it (the chat as its slug, never another user's id)."""
        bot = message.sender == "bot"
        return {
            "chat": message.chat_id.partition(".")[2],
            "id": message.message_id,
            "sender": self.bot_name if bot else "you",
            "bot": bot,
            "text": message.text,
            "edited": message.edited,
            "redelivery": bot and message.text.startswith(_BANNERS),
        }

    def _find(self, chat_id: str, message_id: str | None) -> ChatMessage | None:
        return next(
            (m for m in self.transcript.get(chat_id, []) if m.message_id == message_id), None
        )

    def _push(self, chat_id: str, payload: Mapping[str, Any]) -> None:
        """Send ``payload`` to every open tab of the chat's user (none: nobody is looking)."""
        user = self._users.get(chat_id.partition(".")[0])
        if user is None:
            return
        text = json.dumps({**payload, "chat": chat_id.partition(".")[2]})
        for ws in list(user.sockets):
            task = asyncio.ensure_future(_send_text(ws, text))
            task.add_done_callback(_ignore)


def _parse(raw: str | bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


async def _send(ws: ServerConnection, payload: Mapping[str, Any]) -> None:
    await _send_text(ws, json.dumps(payload))


async def _send_text(ws: ServerConnection, text: str) -> None:
    with contextlib.suppress(ConnectionClosed):  # a closed tab gets the history when it opens
        await ws.send(text)


def _ignore(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("web chat: a push failed", exc_info=task.exception())

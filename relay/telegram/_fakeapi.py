"""The Bot API methods of the fake server (``relay.telegram.testing``), on its chats and its
update queue: each answers a method's parameters with its ``result`` or raises
:class:`~relay.telegram._fakechat.ApiRefusal` as the real Bot API refuses it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Final

from relay.telegram._fakechat import CHAT_ACTIONS, ApiRefusal, Chat, ChatAction, TelegramUser
from relay.telegram._fakeupdates import UpdateQueue, Webhook

__all__ = ["BotApiMethods"]


class BotApiMethods:
    """``getMe``, ``getUpdates``, ``sendMessage``, ``editMessageText``, ``sendChatAction``,
    ``setWebhook``, ``deleteWebhook`` and ``getWebhookInfo`` of one fake bot."""

    def __init__(self, bot: TelegramUser, chats: dict[int, Chat], updates: UpdateQueue) -> None:
        self.bot = bot
        self.chats = chats
        self.updates = updates

    def knows(self, method: str) -> bool:
        """Whether ``method`` is one of these (names are case-insensitive in the Bot API)."""
        return method.lower() in _METHODS

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        """The ``result`` of ``method``; raises :class:`ApiRefusal` as the Bot API does."""
        return await _METHODS[method.lower()](self, params)

    async def _get_me(self, params: dict[str, Any]) -> Any:
        return {**self.bot.to_api(), "can_join_groups": True, "supports_inline_queries": False}

    async def _get_updates(self, params: dict[str, Any]) -> Any:
        offset = _int(params, "offset")
        limit = _int(params, "limit")
        timeout = _int(params, "timeout") or 0
        allowed = _obj(params, "allowed_updates")
        if allowed is not None and not (
            isinstance(allowed, list) and all(isinstance(a, str) for a in allowed)
        ):
            raise ApiRefusal(400, "Bad Request: can't parse allowed updates")
        limit = 100 if limit is None or limit <= 0 else min(limit, 100)
        return await self.updates.get_updates(offset, limit, min(max(timeout, 0), 50), allowed)

    async def _send_message(self, params: dict[str, Any]) -> Any:
        chat = self._target(params)
        thread_id = _int(params, "message_thread_id")
        text = chat.check_send(params.get("text"), thread_id)
        _check_parse_mode(params)
        reply_to = _int(params, "reply_to_message_id")
        without_ok = _bool(params, "allow_sending_without_reply")
        reply = _obj(params, "reply_parameters")
        if reply is not None:
            if not isinstance(reply, dict) or not isinstance(reply.get("message_id"), int):
                raise ApiRefusal(400, "Bad Request: invalid reply parameters specified")
            reply_to = reply["message_id"]
            without_ok = reply.get("allow_sending_without_reply") is True
        target = chat.reply_target(reply_to, without_reply_ok=without_ok)
        message = chat.add("bot", self.bot.id, text, thread_id=thread_id, reply_to=target)
        return chat.message_api(message, self.bot)

    async def _edit_message_text(self, params: dict[str, Any]) -> Any:
        if "inline_message_id" in params:
            raise ApiRefusal(400, "Bad Request: MESSAGE_ID_INVALID")
        chat = self._target(params)
        message_id = _int(params, "message_id")
        if message_id is None:
            raise ApiRefusal(400, "Bad Request: message identifier is not specified")
        _check_parse_mode(params)
        message, text = chat.check_edit(message_id, params.get("text"))
        return chat.message_api(chat.replace(message, text), self.bot)

    async def _send_chat_action(self, params: dict[str, Any]) -> Any:
        chat = self._target(params)
        action = params.get("action")
        if action not in CHAT_ACTIONS:
            raise ApiRefusal(400, "Bad Request: wrong parameter action in request")
        if chat.blocked:
            raise ApiRefusal(403, "Forbidden: bot was blocked by the user")
        thread_id = _int(params, "message_thread_id")
        chat.actions.append(ChatAction(str(action), thread_id, asyncio.get_running_loop().time()))
        return True

    async def _set_webhook(self, params: dict[str, Any]) -> Any:
        url = params.get("url")
        if not isinstance(url, str):
            raise ApiRefusal(400, "Bad Request: bad webhook: URL must be a string")
        secret = params.get("secret_token")
        if secret is not None and not (
            isinstance(secret, str)
            and 1 <= len(secret) <= 256
            and all(c.isascii() and (c.isalnum() or c in "_-") for c in secret)
        ):
            raise ApiRefusal(400, "Bad Request: secret token contains unallowed characters")
        allowed = _obj(params, "allowed_updates")
        if isinstance(allowed, list):
            self.updates.allowed = frozenset(a for a in allowed if isinstance(a, str))
        drop = _bool(params, "drop_pending_updates")
        if not url:
            self.updates.set_webhook(None, drop_pending=drop)
            return True
        if not url.startswith(("http://", "https://")):
            raise ApiRefusal(400, "Bad Request: bad webhook: An HTTPS URL must be provided")
        connections = _int(params, "max_connections") or 40
        self.updates.set_webhook(Webhook(url, secret, connections), drop_pending=drop)
        return True

    async def _delete_webhook(self, params: dict[str, Any]) -> Any:
        self.updates.set_webhook(None, drop_pending=_bool(params, "drop_pending_updates"))
        return True

    async def _get_webhook_info(self, params: dict[str, Any]) -> Any:
        return self.updates.info()

    def chat_for(self, chat_id: int, kind: str, *, title: str | None, forum: bool) -> Chat:
        chat = self.chats.get(chat_id)
        if chat is None:
            if kind == "private" and chat_id <= 0:
                raise ValueError("a private chat's id is its person's id (positive)")
            chat = Chat(chat_id, kind, title=title, is_forum=forum)
            self.chats[chat_id] = chat
        return chat

    def person(self, chat: Chat, user: TelegramUser | int | None) -> TelegramUser:
        if isinstance(user, TelegramUser):
            person = user
        elif isinstance(user, int):
            person = TelegramUser(user, f"person{user}", f"person{user}")
        elif chat.kind == "private":
            person = TelegramUser(chat.id, f"person{chat.id}", f"person{chat.id}")
        else:
            raise ValueError("say which user writes in a group")
        if chat.kind == "private":
            chat.first_name = person.first_name
        return person

    def _target(self, params: dict[str, Any]) -> Chat:
        raw = params.get("chat_id")
        if raw is None or raw == "":
            raise ApiRefusal(400, "Bad Request: chat_id is empty")
        chat_id = _as_int(raw)
        chat = self.chats.get(chat_id) if chat_id is not None else None
        if chat is None:
            raise ApiRefusal(400, "Bad Request: chat not found")
        return chat


_METHODS: Final[dict[str, Callable[[BotApiMethods, dict[str, Any]], Coroutine[Any, Any, Any]]]] = {
    "getme": BotApiMethods._get_me,
    "getupdates": BotApiMethods._get_updates,
    "sendmessage": BotApiMethods._send_message,
    "editmessagetext": BotApiMethods._edit_message_text,
    "sendchataction": BotApiMethods._send_chat_action,
    "setwebhook": BotApiMethods._set_webhook,
    "deletewebhook": BotApiMethods._delete_webhook,
    "getwebhookinfo": BotApiMethods._get_webhook_info,
}
"""Method names are case-insensitive in the Bot API."""


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return int(value)
    return None


def _int(params: Mapping[str, Any], key: str) -> int | None:
    value = params.get(key)
    if value is None:
        return None
    number = _as_int(value)
    if number is None:
        raise ApiRefusal(400, f"Bad Request: invalid {key} specified")
    return number


def _bool(params: Mapping[str, Any], key: str) -> bool:
    value = params.get(key)
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _obj(params: Mapping[str, Any], key: str) -> Any:
    """A parameter that is an object or a list: as JSON, or JSON text in a form."""
    value = params.get(key)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            raise ApiRefusal(400, f"Bad Request: can't parse {key} JSON object") from None
    return value


def _check_parse_mode(params: Mapping[str, Any]) -> None:
    mode = params.get("parse_mode")
    if mode not in (None, "", "HTML", "Markdown", "MarkdownV2"):
        raise ApiRefusal(400, f"Bad Request: unsupported parse_mode {str(mode)[:40]}")

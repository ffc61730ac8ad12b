"""A fake Telegram Bot API server on loopback, for testing bots (and this package's driver).

:class:`FakeTelegram` is an ``aiohttp.web`` server on ``127.0.0.1`` that answers
``/bot<token>/<method>`` as the published Bot API does, for the methods a chat bot uses:
``getMe``, ``getUpdates`` (long poll, offset confirmation, ``limit``, ``allowed_updates``:
:mod:`relay.telegram._fakeupdates`), ``sendMessage`` (message ids per chat, replies by
``reply_parameters`` or ``reply_to_message_id``, forum topics by ``message_thread_id``, the
4,096 UTF-16 unit limit; entities and ``parse_mode`` markup are stored as the raw text),
``editMessageText``, ``sendChatAction``, ``setWebhook`` / ``deleteWebhook`` /
``getWebhookInfo`` (with a webhook set, the server POSTs every update to it with the
``X-Telegram-Bot-Api-Secret-Token`` header and retries until a 2xx).  Parameters are read from
the query string, a JSON body, a form or a multipart body, as the Bot API reads them.

A test plays the people (:meth:`FakeTelegram.user_writes`, :meth:`~FakeTelegram.user_edits`,
:meth:`~FakeTelegram.push_update` for any raw update) and reads what a person would see
(:meth:`FakeTelegram.chat`: every message with its sender, text, topic, reply and whether it
was edited).  It makes the server misbehave the way the real one does: :meth:`fail_next` (a 429
with ``retry_after``, a 5xx, any refusal) before the method acts; :meth:`act_then_timeout`
performs the method and never answers (the caller cannot know it acted);
:meth:`duplicate_next_update` delivers an update twice; :meth:`malformed_next_answer` answers
200 with a body of the test's choosing; :meth:`revoke_token` makes every request a
``401 Unauthorized``.

Usage::

    async with FakeTelegram() as fake:
        driver = TelegramDriver(fake.token, api_url=fake.api_url)
        fake.user_writes(42, "hello")
        ...
        assert [m.text for m in fake.chat(42) if m.from_bot] == ["echo: hello"]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from typing import Any, Final

import aiohttp
import attrs
from aiohttp import web

from relay.telegram._fakechat import (
    CHAT_ACTIONS,
    ApiRefusal,
    Chat,
    ChatAction,
    ChatMessage,
    TelegramUser,
)
from relay.telegram._fakeupdates import SECRET_HEADER, Delivery, UpdateQueue, Webhook

__all__ = [
    "DEFAULT_TOKEN",
    "SECRET_HEADER",
    "ApiCall",
    "ChatAction",
    "ChatMessage",
    "Delivery",
    "FakeTelegram",
    "TelegramUser",
]

DEFAULT_TOKEN: Final = "110201543:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
"""A token of the Bot API's shape (``<bot id>:<secret>``), for this fake server only."""
_STATUS_TEXT: Final = {500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}


@attrs.frozen
class ApiCall:
    """One request the bot made: the method, its parameters, the status answered (None: not
    answered yet, or never: an :meth:`FakeTelegram.act_then_timeout`)."""

    method: str
    params: Mapping[str, Any]
    status: int | None


@attrs.define
class _Fault:
    kind: str  # "fail", "hang", "body"
    status: int = 500
    description: str | None = None
    retry_after: int | None = None
    body: bytes = b""


class FakeTelegram:
    """The fake server (see the module docs); start it with ``async with`` or :meth:`start`.

    ``FakeTelegram(token=DEFAULT_TOKEN, *, username="statecore_test_bot", first_update_id=
    700000001, webhook_retry_s=0.2)``.  Call its methods on the event loop it serves on.
    """

    def __init__(
        self,
        token: str = DEFAULT_TOKEN,
        *,
        username: str = "statecore_test_bot",
        first_update_id: int = 700_000_001,
        webhook_retry_s: float = 0.2,
    ) -> None:
        bot_id, _, secret = token.partition(":")
        if not bot_id.isdigit() or not secret:
            raise ValueError("a bot token looks like '<bot id>:<secret>'")
        self.token = token
        self.bot = TelegramUser(int(bot_id), "Statecore test bot", username, is_bot=True)
        self.updates = UpdateQueue(first_update_id, webhook_retry_s=webhook_retry_s)
        self.chats: dict[int, Chat] = {}
        self.calls: list[ApiCall] = []
        self.revoked = False
        self._faults: dict[str, list[_Fault]] = {}
        self._hanging: set[asyncio.Event] = set()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._pusher: asyncio.Task[None] | None = None
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, port: int = 0) -> FakeTelegram:
        """Listen on ``127.0.0.1:port`` (0: any free port); returns self."""
        app = web.Application(client_max_size=50 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        self._session = aiohttp.ClientSession(trust_env=False)
        self._pusher = asyncio.create_task(self.updates.push_loop(self._session))
        return self

    async def stop(self) -> None:
        """Stop serving (hanging answers end with the connection); idempotent."""
        for event in list(self._hanging):
            event.set()
        self.updates.close()
        pusher, self._pusher = self._pusher, None
        if pusher is not None:
            pusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pusher
        if self._session is not None:
            await self._session.close()
            self._session = None
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> FakeTelegram:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        """The base every method URL starts with: ``<url>/bot`` (then ``<token>/<method>``)."""
        return f"{self.url}/bot"

    # -- the people -----------------------------------------------------------------------------

    def user_writes(
        self,
        chat_id: int,
        text: str,
        *,
        user: TelegramUser | int | None = None,
        chat_type: str = "private",
        thread_id: int | None = None,
        reply_to: int | None = None,
        title: str | None = None,
        forum: bool = False,
    ) -> dict[str, Any]:
        """A person writes ``text`` in ``chat_id`` (the chat is made on first use, of
        ``chat_type``: ``private``, ``group``, ``supergroup`` -- a forum with ``forum`` --
        or ``channel``, whose posts are ``channel_post`` updates); in the forum topic
        ``thread_id`` (made if new), as a reply to ``reply_to``.  Returns the update queued
        (its ``update_id``, its ``message``); an update ``allowed_updates`` excludes is not
        created (the returned one is not queued)."""
        chat = self._chat(chat_id, chat_type, title=title, forum=forum)
        person = self._person(chat, user)
        if thread_id is not None:
            if not chat.is_forum:
                raise ValueError("topics exist in forum supergroups only")
            chat.topics.add(thread_id)
        if reply_to is not None and chat.find(reply_to) is None:
            raise ValueError(f"chat {chat_id} has no message {reply_to}")
        message = chat.add(
            person.first_name, person.id, text, thread_id=thread_id, reply_to=reply_to
        )
        kind = "channel_post" if chat.kind == "channel" else "message"
        update = {kind: chat.message_api(message, person)}
        return self.updates.add(update, kind=kind) or update

    def user_edits(self, chat_id: int, message_id: int, text: str) -> dict[str, Any]:
        """The author of ``message_id`` edits it to ``text``: an ``edited_message`` update."""
        chat = self.chats[chat_id]
        message = chat.find(message_id)
        if message is None or message.from_bot:
            raise ValueError(f"no person's message {message_id} in chat {chat_id}")
        edited = chat.replace(message, text)
        person = TelegramUser(edited.sender_id, edited.sender)
        kind = "edited_channel_post" if chat.kind == "channel" else "edited_message"
        update = {kind: chat.message_api(edited, person)}
        return self.updates.add(update, kind=kind) or update

    def push_update(self, update: object) -> object:
        """Queue any update as it is (a hostile one: a kind nobody knows, a message without a
        chat, a JSON value that is not an object ...); a dict without ``update_id`` gets the
        next one.  Returns what was queued."""
        return self.updates.add(update, kind=None)

    def chat(self, chat_id: int) -> list[ChatMessage]:
        """What the chat shows, oldest first (edits applied)."""
        chat = self.chats.get(chat_id)
        return list(chat.messages) if chat is not None else []

    def bot_texts(self, chat_id: int) -> list[str]:
        """The texts of the bot's messages in ``chat_id``, in order."""
        return [m.text for m in self.chat(chat_id) if m.from_bot]

    def actions(self, chat_id: int) -> list[ChatAction]:
        """The chat actions (``typing`` ...) the bot sent to ``chat_id``."""
        chat = self.chats.get(chat_id)
        return list(chat.actions) if chat is not None else []

    def block(self, chat_id: int) -> None:
        """The person of the private chat ``chat_id`` blocks the bot."""
        self.chats[chat_id].blocked = True

    def calls_of(self, method: str) -> list[ApiCall]:
        """The requests of ``method`` the bot made, in order."""
        return [call for call in self.calls if call.method == method]

    # -- misbehaving ----------------------------------------------------------------------------

    def fail_next(
        self,
        method: str,
        status: int = 429,
        *,
        retry_after: int | None = None,
        description: str | None = None,
        times: int = 1,
    ) -> None:
        """The next ``times`` calls of ``method`` fail with ``status`` before acting (a 429
        says ``Too Many Requests: retry after N`` with ``parameters.retry_after``)."""
        if status == 429 and retry_after is None:
            retry_after = 1
        if description is None:
            description = (
                f"Too Many Requests: retry after {retry_after}"
                if status == 429
                else _STATUS_TEXT.get(status, f"Error {status}")
            )
        fault = _Fault("fail", status, description, retry_after)
        self._faults.setdefault(method, []).extend([fault] * times)

    def act_then_timeout(self, method: str, *, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` act (a send is in the chat) and are never
        answered: the caller times out not knowing."""
        self._faults.setdefault(method, []).extend([_Fault("hang")] * times)

    def malformed_next_answer(self, method: str, body: bytes = b"<html>oops</html>") -> None:
        """The next call of ``method`` is answered 200 with ``body`` and does not act."""
        self._faults.setdefault(method, []).append(_Fault("body", 200, body=body))

    def duplicate_next_update(self, times: int = 1) -> None:
        """The next ``times`` deliveries carry their first update twice (the same id)."""
        self.updates.duplicate_next += times

    def revoke_token(self) -> None:
        """The bot's token is revoked: every request answers ``401 Unauthorized``."""
        self.revoked = True

    # -- the HTTP side ----------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        try:
            params = await _params(request)
        except ApiRefusal as bad:
            return web.json_response(bad.body(), status=bad.status)
        # Recorded as it comes in (status None until answered): a long poll shows at once.
        index = len(self.calls)
        self.calls.append(ApiCall(method, params, None))

        def answered(status: int | None) -> None:
            self.calls[index] = ApiCall(method, params, status)

        if request.match_info["token"] != self.token or self.revoked:
            answered(401)
            return web.json_response(ApiRefusal(401, "Unauthorized").body(), status=401)
        handler = _METHODS.get(method.lower())
        if handler is None:
            answered(404)
            return web.json_response(ApiRefusal(404, "Not Found").body(), status=404)
        faults = self._faults.get(method)
        fault = faults.pop(0) if faults else None
        if fault is not None and fault.kind == "body":
            answered(200)
            return web.Response(body=fault.body, content_type="application/json")
        if fault is not None and fault.kind == "fail":
            refusal = ApiRefusal(
                fault.status, fault.description or "", retry_after=fault.retry_after
            )
            answered(fault.status)
            return web.json_response(refusal.body(), status=fault.status)
        try:
            result = await handler(self, params)
        except ApiRefusal as refused:
            answered(refused.status)
            return web.json_response(refused.body(), status=refused.status)
        if fault is not None and fault.kind == "hang":
            hang = asyncio.Event()
            self._hanging.add(hang)
            try:
                await hang.wait()
            finally:
                self._hanging.discard(hang)
            raise ConnectionResetError("the fake server never answers this call")
        answered(200)
        return web.json_response({"ok": True, "result": result})

    # -- the methods ------------------------------------------------------------------------

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

    # -- helpers ------------------------------------------------------------------------------

    def _chat(self, chat_id: int, kind: str, *, title: str | None, forum: bool) -> Chat:
        chat = self.chats.get(chat_id)
        if chat is None:
            if kind == "private" and chat_id <= 0:
                raise ValueError("a private chat's id is its person's id (positive)")
            chat = Chat(chat_id, kind, title=title, is_forum=forum)
            self.chats[chat_id] = chat
        return chat

    def _person(self, chat: Chat, user: TelegramUser | int | None) -> TelegramUser:
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


_METHODS: Final = {
    "getme": FakeTelegram._get_me,
    "getupdates": FakeTelegram._get_updates,
    "sendmessage": FakeTelegram._send_message,
    "editmessagetext": FakeTelegram._edit_message_text,
    "sendchataction": FakeTelegram._send_chat_action,
    "setwebhook": FakeTelegram._set_webhook,
    "deletewebhook": FakeTelegram._delete_webhook,
    "getwebhookinfo": FakeTelegram._get_webhook_info,
}
"""Method names are case-insensitive in the Bot API."""


async def _params(request: web.Request) -> dict[str, Any]:
    """The call's parameters: query string, then a JSON, form or multipart body."""
    params: dict[str, Any] = dict(request.query)
    if not request.can_read_body:
        return params
    kind = request.content_type
    if kind == "application/json":
        try:
            body = json.loads(await request.read())
        except ValueError:
            raise ApiRefusal(400, "Bad Request: can't parse JSON") from None
        if not isinstance(body, dict):
            raise ApiRefusal(400, "Bad Request: JSON object expected")
        params.update(body)
    elif kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.post()
        params.update({k: v for k, v in form.items() if isinstance(v, str)})
    return params


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

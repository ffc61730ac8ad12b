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

from relay.telegram._fakeapi import BotApiMethods
from relay.telegram._fakechat import ApiRefusal, Chat, ChatAction, ChatMessage, TelegramUser
from relay.telegram._fakeupdates import SECRET_HEADER, Delivery, UpdateQueue

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

DEFAULT_TOKEN: Final = "123456789:fake-token-of-the-fake-bot-api-server"
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
        self.methods = BotApiMethods(self.bot, self.chats, self.updates)
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
        chat = self.methods.chat_for(chat_id, chat_type, title=title, forum=forum)
        person = self.methods.person(chat, user)
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
        if not self.methods.knows(method):
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
            result = await self.methods.call(method, params)
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

"""A fake Discord for tests and examples: the REST API (v10) and the gateway on loopback, written
from Discord's published documentation, with its record of what every channel shows.

``async with FakeDiscord() as fake:`` serves on ``127.0.0.1`` (a free port); point a bot at
``fake.api_base`` (the REST base, ``.../api/v10``) with ``fake.token``.  People are played by the
test: :meth:`FakeDiscord.user_writes` writes a message (a guild channel with ``guild_id``, a DM
without; ``thread=True`` makes the channel a public thread of ``parent_id``) and the gateway
dispatches MESSAGE_CREATE to every session of the bot; :meth:`FakeDiscord.channel` is what the
channel shows (the people's and the bot's messages, edits applied).

What the fake keeps, as Discord documents it:

* ``POST /channels/{id}/messages`` with ``nonce`` and ``enforce_nonce: true``: the same nonce from
  the same author within ``nonce_window_s`` returns the message it made the first time, and
  makes no other; ``content`` of at most 2,000 characters; ``message_reference`` to a message of
  the channel (unless ``fail_if_not_exists`` is false);
* ``PATCH /channels/{id}/messages/{id}`` for the bot's own messages, ``POST .../typing``,
  ``GET /channels/{id}``, ``GET /users/@me``, ``GET /gateway/bot``;
* every request needs ``Authorization: Bot <token>`` (401 otherwise);
* rate limits: each route's bucket per channel allows ``route_limit`` requests per window and
  says so in ``X-RateLimit-Bucket`` / ``-Limit`` / ``-Remaining`` / ``-Reset`` / ``-Reset-After``;
  past it a 429 with ``retry_after`` (and ``Retry-After``), not acted on; more than
  ``global_limit`` requests in one second are a global 429 (``global: true``);
* the gateway (:mod:`relay.discord._fake_gateway`): HELLO, IDENTIFY / RESUME, READY, a backlog
  per session replayed after a RESUME, INVALID_SESSION, RECONNECT, heartbeats checked.

Faults a test asks for: :meth:`~FakeDiscord.rate_limit_next` (429s, per route or global),
:meth:`~FakeDiscord.fail_next` (5xx), :meth:`~FakeDiscord.act_then_drop` (the message is made,
the answer never comes), :meth:`~FakeDiscord.revoke_token`, and on the gateway
:meth:`~FakeDiscord.drop_gateway`, :meth:`~FakeDiscord.send_reconnect`,
:meth:`~FakeDiscord.invalidate_session`, :meth:`~FakeDiscord.expire_sessions`,
:meth:`~FakeDiscord.duplicate_next`, :meth:`~FakeDiscord.send_malformed` and
``fake.gateway.ack_heartbeats = False`` (a zombie connection).  ``fake.requests`` records every
REST request.  Call every method on the event loop the fake serves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final

from aiohttp import web

from relay.discord._fake_gateway import GatewayState, Intents
from relay.discord._fake_records import (
    DM,
    EDIT_ROUTE,
    GUILD_TEXT,
    PUBLIC_THREAD,
    SEND_ROUTE,
    TYPING_ROUTE,
    Channel,
    FakeMessage,
    RecordedRequest,
    now_iso,
)
from relay.discord._fake_rest import FakeRestApi

__all__ = [
    "EDIT_ROUTE",
    "SEND_ROUTE",
    "TYPING_ROUTE",
    "FakeDiscord",
    "FakeMessage",
    "GatewayState",
    "Intents",
    "RecordedRequest",
]

_EPOCH_MS: Final = 1_420_070_400_000


class FakeDiscord(FakeRestApi):
    """A fake Discord for one bot (see the module docs).

    ``FakeDiscord(*, token="fake-bot-token", bot_name="statecore-bot",
    heartbeat_interval_ms=41250, nonce_window_s=300.0, session_timeout_s=120.0,
    backlog_max=1000, route_limit=(5, 1.0), global_limit=50, allowed_intents=MESSAGE_CONTENT)``.
    """

    def __init__(
        self,
        *,
        token: str = "fake-bot-token",
        bot_name: str = "statecore-bot",
        heartbeat_interval_ms: int = 41_250,
        nonce_window_s: float = 300.0,
        session_timeout_s: float = 120.0,
        backlog_max: int = 1000,
        route_limit: tuple[int, float] = (5, 1.0),
        global_limit: int = 50,
        allowed_intents: int = Intents.MESSAGE_CONTENT,
    ) -> None:
        super().__init__(
            nonce_window_s=nonce_window_s, route_limit=route_limit, global_limit=global_limit
        )
        self.token = token
        self._ids = itertools.count(1)
        self.bot_id = self.new_id()
        self.bot_name = bot_name
        self._users: dict[str, str] = {}
        self._channels: dict[str, Channel] = {}
        self._guilds: dict[str, set[str]] = {}
        self.changed = asyncio.Event()
        """Set whenever a message is made or edited (clear it, then wait for the next)."""
        self.gateway = GatewayState(
            token=lambda: self.token,
            ready_user=self._bot_user,
            guilds=self._guild_objects,
            resume_url=lambda: self.ws_base + "/gateway/resume",
            heartbeat_interval_ms=heartbeat_interval_ms,
            session_timeout_s=session_timeout_s,
            backlog_max=backlog_max,
            allowed_intents=allowed_intents,
        )
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- serving --------------------------------------------------------------------------------

    async def start(self) -> FakeDiscord:
        """Serve on ``127.0.0.1`` (a free port); returns self."""
        app = web.Application()
        app.router.add_get("/gateway", self.gateway.handle)
        app.router.add_get("/gateway/resume", self.gateway.handle)
        app.router.add_route("*", "/api/v10/{tail:.*}", self._rest)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        """Close every connection and stop serving; idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            self.gateway.drop()
            await runner.cleanup()

    async def __aenter__(self) -> FakeDiscord:
        return await self.start()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_base(self) -> str:
        """The REST base a bot uses (``.../api/v10``)."""
        return self.url + "/api/v10"

    @property
    def ws_base(self) -> str:
        """``ws://127.0.0.1:<port>``."""
        return f"ws://127.0.0.1:{self.port}"

    # -- people ---------------------------------------------------------------------------------

    def new_id(self) -> str:
        """A fresh snowflake (increasing)."""
        return str(((int(time.time() * 1000) - _EPOCH_MS) << 22) + next(self._ids))

    def user_id(self, name: str) -> str:
        """The id of the person called ``name`` (made on first use)."""
        if name not in self._users:
            self._users[name] = self.new_id()
        return self._users[name]

    def user_writes(
        self,
        channel_id: str,
        content: str,
        *,
        author: str = "user",
        guild_id: str | None = None,
        thread: bool = False,
        parent_id: str | None = None,
        reply_to: str | None = None,
    ) -> FakeMessage:
        """``author`` writes ``content`` in ``channel_id`` (made on first use: a DM without
        ``guild_id``, a text channel of the guild with one, a public thread of ``parent_id``
        with ``thread``); every session of the bot gets MESSAGE_CREATE.  Returns the message."""
        channel = self._channel_for(channel_id, guild_id, thread, parent_id)
        message = FakeMessage(
            self.new_id(),
            channel.id,
            self.user_id(author),
            author,
            content,
            False,
            guild_id=channel.guild_id,
            reply_to=reply_to,
        )
        self._post(channel, message)
        return message

    def user_edits(self, channel_id: str, message_id: str, content: str) -> FakeMessage:
        """A person edits their message: MESSAGE_UPDATE.  Raises ``KeyError`` if unknown."""
        message = self._message(channel_id, message_id)
        message.content = content
        message.edited_timestamp = now_iso()
        self._dispatch_message("MESSAGE_UPDATE", self._channels[channel_id], message)
        self.changed.set()
        return message

    def channel(self, channel_id: str) -> list[FakeMessage]:
        """What ``channel_id`` shows, oldest first (empty for a channel never used)."""
        found = self._channels.get(channel_id)
        return list(found.messages) if found is not None else []

    def bot_messages(self, channel_id: str) -> list[FakeMessage]:
        """The bot's messages in ``channel_id``, oldest first."""
        return [m for m in self.channel(channel_id) if m.author_id == self.bot_id]

    def forbid(self, channel_id: str) -> None:
        """The bot loses access to ``channel_id`` (403 Missing Access from now on)."""
        self._channels[channel_id].forbidden = True

    async def wait_until(self, check: Callable[[], bool], timeout_s: float = 20.0) -> None:
        """Until ``check()`` holds (rechecked after each change); TimeoutError after the bound."""
        async with asyncio.timeout(timeout_s):
            while not check():
                self.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), 0.1)

    # -- faults ---------------------------------------------------------------------------------

    def revoke_token(self) -> None:
        """The bot's token is no longer valid (REST 401, gateway 4004)."""
        self.token = "revoked:" + self.token

    def drop_gateway(self) -> None:
        """Cut every gateway connection mid-stream (the sessions stay resumable)."""
        self.gateway.drop()

    def send_reconnect(self) -> None:
        """Ask every connection to reconnect and resume (op 7)."""
        self.gateway.reconnect()

    def invalidate_session(self, *, resumable: bool = False) -> None:
        """Send INVALID_SESSION (op 9) with ``d=resumable`` to every connection."""
        self.gateway.invalidate(resumable=resumable)

    def expire_sessions(self) -> None:
        """Every session is gone: a RESUME gets INVALID_SESSION ``d=false``."""
        self.gateway.expire()

    def duplicate_next(self, count: int = 1) -> None:
        """The next ``count`` message dispatches (MESSAGE_CREATE / _UPDATE) are sent twice on
        their connection, with the same ``s``."""
        self.gateway.duplicate += count

    def send_malformed(self, kind: str = "not_json") -> None:
        """A malformed gateway payload on every live connection: ``not_json`` (a text frame
        that is not JSON), ``bad_message`` (a MESSAGE_CREATE dispatch with the next ``s`` whose
        message has no id nor author) or ``no_op`` (an object without ``op``)."""
        if kind == "not_json":
            self.gateway.send_raw("{this is not json")
        elif kind == "no_op":
            self.gateway.send_raw(json.dumps({"t": "MESSAGE_CREATE", "d": {}}))
        elif kind == "bad_message":
            self.gateway.dispatch("MESSAGE_CREATE", {"content": 5, "channel_id": None})
        else:
            raise ValueError(f"unknown malformed kind {kind!r}")

    # -- the state behind the API ---------------------------------------------------------------

    def _bot_user(self) -> dict[str, Any]:
        return {
            "id": self.bot_id,
            "username": self.bot_name,
            "global_name": None,
            "discriminator": "0",
            "bot": True,
        }

    def _guild_objects(self) -> list[dict[str, Any]]:
        return [self._guild_object(guild_id) for guild_id in self._guilds]

    def _guild_object(self, guild_id: str) -> dict[str, Any]:
        channels = [self._channels[c] for c in sorted(self._guilds[guild_id])]
        return {
            "id": guild_id,
            "name": f"guild-{guild_id}",
            "unavailable": False,
            "channels": [c.to_json() for c in channels if c.type != PUBLIC_THREAD],
            "threads": [c.to_json() for c in channels if c.type == PUBLIC_THREAD],
            "member_count": 2,
        }

    def _channel_for(
        self, channel_id: str, guild_id: str | None, thread: bool, parent_id: str | None
    ) -> Channel:
        found = self._channels.get(channel_id)
        if found is not None:
            return found
        if guild_id is None:
            channel = Channel(channel_id, DM, None, None)
            self._channels[channel_id] = channel
            return channel
        new_guild = guild_id not in self._guilds
        self._guilds.setdefault(guild_id, set())
        if thread:
            parent = parent_id or self.new_id()
            if parent not in self._channels:
                self._channels[parent] = Channel(parent, GUILD_TEXT, guild_id, None)
                self._guilds[guild_id].add(parent)
            channel = Channel(channel_id, PUBLIC_THREAD, guild_id, parent)
        else:
            channel = Channel(channel_id, GUILD_TEXT, guild_id, None)
        self._channels[channel_id] = channel
        self._guilds[guild_id].add(channel_id)
        wants = Intents.GUILDS
        if new_guild:
            self.gateway.dispatch("GUILD_CREATE", self._guild_object(guild_id), wants=wants)
        elif thread:
            data = {**channel.to_json(), "newly_created": True}
            self.gateway.dispatch("THREAD_CREATE", data, wants=wants)
        else:
            self.gateway.dispatch("CHANNEL_CREATE", channel.to_json(), wants=wants)
        return channel

    def _message(self, channel_id: str, message_id: str) -> FakeMessage:
        for message in self._channels[channel_id].messages:
            if message.id == message_id:
                return message
        raise KeyError(message_id)

    def _post(self, channel: Channel, message: FakeMessage) -> None:
        channel.messages.append(message)
        self._dispatch_message("MESSAGE_CREATE", channel, message)
        self.changed.set()

    def _dispatch_message(self, event: str, channel: Channel, message: FakeMessage) -> None:
        data = message.to_json()
        wants = Intents.DIRECT_MESSAGES
        if channel.guild_id is not None:
            data["guild_id"] = channel.guild_id
            data["member"] = {"roles": [], "joined_at": message.timestamp}
            wants = Intents.GUILD_MESSAGES
        for session in list(self.gateway.sessions.values()):
            if not session.valid or (session.intents & wants) != wants:
                continue
            seen = data
            if channel.guild_id is not None and not session.intents & Intents.MESSAGE_CONTENT:
                seen = {**data, "content": "", "embeds": [], "attachments": []}
            self.gateway.dispatch_to(session, event, seen)

    def _edited(self, channel: Channel, message: FakeMessage) -> None:
        self._dispatch_message("MESSAGE_UPDATE", channel, message)
        self.changed.set()

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
import math
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final

from aiohttp import web

from relay.discord._fake_gateway import GatewayState, Intents
from relay.discord._fake_records import (
    DM,
    EDIT_ROUTE,
    GUILD_TEXT,
    MAX_CONTENT,
    PUBLIC_THREAD,
    SEND_ROUTE,
    TYPING_ROUTE,
    Bucket,
    Channel,
    FakeMessage,
    Fault,
    RecordedRequest,
    Req,
    form_error,
    now_iso,
    route_of,
)

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


class FakeDiscord:
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
        self.token = token
        self._ids = itertools.count(1)
        self.bot_id = self.new_id()
        self.bot_name = bot_name
        self.nonce_window_s = nonce_window_s
        self.route_limit = route_limit
        self.global_limit = global_limit
        self._users: dict[str, str] = {}
        self._channels: dict[str, Channel] = {}
        self._guilds: dict[str, set[str]] = {}
        self._nonces: dict[tuple[str, str], tuple[float, FakeMessage]] = {}
        self._faults: list[Fault] = []
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self._global: deque[float] = deque()
        self.requests: list[RecordedRequest] = []
        self.limit_hits = 0
        """429s the fake's own limits served (not the injected ones)."""
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

    def rate_limit_next(
        self,
        count: int = 1,
        *,
        retry_after: float = 0.5,
        is_global: bool = False,
        route: str | None = None,
    ) -> None:
        """The next ``count`` requests (of ``route``, a template like :data:`SEND_ROUTE`; any
        route when None) get a 429 with ``retry_after`` seconds, not acted on."""
        self._faults.append(Fault("429", route, count, retry_after, is_global))

    def fail_next(self, count: int = 1, *, status: int = 500, route: str | None = None) -> None:
        """The next ``count`` requests (of ``route``) fail with ``status``, not acted on."""
        self._faults.append(Fault("fail", route, count, status=status))

    def act_then_drop(self, count: int = 1, *, route: str | None = SEND_ROUTE) -> None:
        """The next ``count`` requests of ``route`` are acted on, then the connection is cut
        before any answer (the bot cannot tell whether it happened)."""
        self._faults.append(Fault("drop", route, count))

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

    # -- REST -----------------------------------------------------------------------------------

    async def _rest(self, request: web.Request) -> web.StreamResponse:
        tail = "/" + request.match_info["tail"]
        parts = tail.strip("/").split("/")
        route, params = route_of(request.method, parts)
        call = Req(request, route, tail, None)
        if request.can_read_body:
            try:
                call.body = await request.json()
            except ValueError:
                return self._answer(call, 400, {"message": "bad json"})
        if request.headers.get("Authorization") != f"Bot {self.token}":
            return self._answer(call, 401, {"message": "401: Unauthorized", "code": 0})
        fault = self._fault(route)
        if fault is not None and fault.kind == "429":
            return self._too_many(call, fault.retry_after, fault.is_global)
        if fault is not None and fault.kind == "fail":
            answer = {"message": "Internal Server Error", "code": 0}
            return self._answer(call, fault.status, answer)
        limited = self._limits(route, params.get("channel_id", ""))
        if isinstance(limited, float):
            self.limit_hits += 1
            return self._too_many(call, limited, False)
        if limited == "global":
            self.limit_hits += 1
            return self._too_many(call, 1.0, True)
        status, answer = self._act(route, params, call.body)
        if fault is not None and fault.kind == "drop":
            self.requests.append(RecordedRequest(request.method, route, tail, call.body, 0))
            if isinstance(request.transport, asyncio.WriteTransport):
                request.transport.abort()
            raise asyncio.CancelledError
        headers = self._bucket_headers(route, params.get("channel_id", ""))
        return self._answer(call, status, answer, headers)

    def _answer(
        self, call: Req, status: int, answer: Any, headers: dict[str, str] | None = None
    ) -> web.Response:
        method = call.request.method
        self.requests.append(RecordedRequest(method, call.route, call.path, call.body, status))
        if status == 204:
            return web.Response(status=204, headers=headers)
        return web.json_response(answer, status=status, headers=headers)

    def _too_many(self, call: Req, retry_after: float, is_global: bool) -> web.Response:
        answer = {
            "message": "You are being rate limited.",
            "retry_after": round(retry_after, 3),
            "global": is_global,
        }
        headers = {
            "Retry-After": str(max(1, math.ceil(retry_after))),
            "X-RateLimit-Scope": "global" if is_global else "user",
        }
        if is_global:
            headers["X-RateLimit-Global"] = "true"
        return self._answer(call, 429, answer, headers)

    def _fault(self, route: str) -> Fault | None:
        for fault in self._faults:
            if fault.route is None or fault.route == route:
                fault.count -= 1
                if fault.count <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    def _limits(self, route: str, major: str) -> float | str | None:
        """None: allowed (and counted); a float: the bucket's retry_after; "global"."""
        now = time.monotonic()
        while self._global and now - self._global[0] > 1.0:
            self._global.popleft()
        if len(self._global) >= self.global_limit:
            return "global"
        self._global.append(now)
        if not major:
            return None
        limit, window = self.route_limit
        bucket = self._buckets.get((route, major))
        if bucket is None or now >= bucket.reset_at:
            bucket = Bucket(limit, now + window)
            self._buckets[(route, major)] = bucket
        if bucket.remaining <= 0:
            return max(bucket.reset_at - now, 0.001)
        bucket.remaining -= 1
        return None

    def _bucket_headers(self, route: str, major: str) -> dict[str, str]:
        bucket = self._buckets.get((route, major))
        if bucket is None:
            return {}
        after = max(bucket.reset_at - time.monotonic(), 0.0)
        return {
            "X-RateLimit-Bucket": f"b{abs(hash(route)) % 10**10:010d}",
            "X-RateLimit-Limit": str(self.route_limit[0]),
            "X-RateLimit-Remaining": str(bucket.remaining),
            "X-RateLimit-Reset": f"{time.time() + after:.3f}",
            "X-RateLimit-Reset-After": f"{after:.3f}",
        }

    def _act(self, route: str, params: dict[str, str], body: Any) -> tuple[int, Any]:
        if route == "GET /gateway/bot":
            limit = {"total": 1000, "remaining": 999, "reset_after": 86_400_000}
            session_limit = {**limit, "max_concurrency": 1}
            return 200, {
                "url": self.ws_base + "/gateway",
                "shards": 1,
                "session_start_limit": session_limit,
            }
        if route == "GET /users/@me":
            return 200, self._bot_user()
        channel = self._channels.get(params.get("channel_id", ""))
        if channel is None:
            return 404, {"message": "Unknown Channel", "code": 10003}
        if channel.forbidden:
            return 403, {"message": "Missing Access", "code": 50001}
        if route == "GET /channels/{channel_id}":
            return 200, channel.to_json()
        if route == TYPING_ROUTE:
            return 204, None
        if route == SEND_ROUTE:
            return self._create(channel, body)
        if route == EDIT_ROUTE:
            return self._edit(channel, params["message_id"], body)
        return 404, {"message": "404: Not Found", "code": 0}

    def _create(self, channel: Channel, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict):
            return 400, form_error("content", "BASE_TYPE_REQUIRED", "This field is required")
        content, nonce = body.get("content"), body.get("nonce")
        if not isinstance(content, str) or not content:
            return 400, {"message": "Cannot send an empty message", "code": 50006}
        if len(content) > MAX_CONTENT:
            return 400, form_error(
                "content", "BASE_TYPE_MAX_LENGTH", "Must be 2000 or fewer in length."
            )
        if nonce is not None and not (
            (isinstance(nonce, str) and len(nonce) <= 25)
            or (isinstance(nonce, int) and not isinstance(nonce, bool))
        ):
            return 400, form_error("nonce", "BASE_TYPE_BAD_LENGTH", "Must be 25 or fewer.")
        now = time.monotonic()
        key = (self.bot_id, str(nonce))
        if nonce is not None and body.get("enforce_nonce") is True and key in self._nonces:
            made_at, earlier = self._nonces[key]
            if now - made_at <= self.nonce_window_s:
                return 200, earlier.to_json()
        reply_to = None
        reference = body.get("message_reference")
        if isinstance(reference, dict) and reference.get("message_id") is not None:
            target = str(reference["message_id"])
            if any(m.id == target for m in channel.messages):
                reply_to = target
            elif reference.get("fail_if_not_exists", True) is not False:
                return 400, form_error(
                    "message_reference", "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "Unknown message"
                )
        message = FakeMessage(
            self.new_id(),
            channel.id,
            self.bot_id,
            self.bot_name,
            content,
            True,
            guild_id=channel.guild_id,
            reply_to=reply_to,
            nonce=nonce if isinstance(nonce, str | int) else None,
        )
        if nonce is not None:
            self._nonces[key] = (now, message)
        self._post(channel, message)
        return 200, message.to_json()

    def _edit(self, channel: Channel, message_id: str, body: Any) -> tuple[int, Any]:
        try:
            message = self._message(channel.id, message_id)
        except KeyError:
            return 404, {"message": "Unknown Message", "code": 10008}
        if message.author_id != self.bot_id:
            return 403, {"message": "Cannot edit a message authored by another user", "code": 50005}
        content = body.get("content") if isinstance(body, dict) else None
        if not isinstance(content, str) or not content or len(content) > MAX_CONTENT:
            return 400, form_error("content", "BASE_TYPE_MAX_LENGTH", "Must be 1 to 2000 long.")
        message.content = content
        message.edited_timestamp = now_iso()
        self._dispatch_message("MESSAGE_UPDATE", channel, message)
        self.changed.set()
        return 200, message.to_json()

"""The REST half of :mod:`relay.discord.testing`: the routes, the nonce's dedupe, the rate
limits with their headers, and the faults a test injects (see that module's docs)."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from typing import Any

from aiohttp import web

from relay.discord._fake_records import (
    EDIT_ROUTE,
    MAX_CONTENT,
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

__all__ = ["FakeRestApi"]


class FakeRestApi:
    """The REST API of the fake (its subclass :class:`relay.discord.testing.FakeDiscord` keeps
    the channels, people and the gateway)."""

    token: str
    bot_id: str
    bot_name: str
    _channels: dict[str, Channel]

    def __init__(
        self, *, nonce_window_s: float, route_limit: tuple[int, float], global_limit: int
    ) -> None:
        self.nonce_window_s = nonce_window_s
        self.route_limit = route_limit
        self.global_limit = global_limit
        self._nonces: dict[tuple[str, str], tuple[float, FakeMessage]] = {}
        self._faults: list[Fault] = []
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self._global: deque[float] = deque()
        self.requests: list[RecordedRequest] = []
        """Every REST request, in order (status 0: the answer was never sent)."""
        self.limit_hits = 0
        """429s the fake's own limits served (not the injected ones)."""

    # What the subclass provides.

    @property
    def ws_base(self) -> str:
        """``ws://127.0.0.1:<port>``."""
        raise NotImplementedError

    def new_id(self) -> str:
        """A fresh snowflake."""
        raise NotImplementedError

    def _bot_user(self) -> dict[str, Any]:
        raise NotImplementedError

    def _message(self, channel_id: str, message_id: str) -> FakeMessage:
        raise NotImplementedError

    def _post(self, channel: Channel, message: FakeMessage) -> None:
        raise NotImplementedError

    def _edited(self, channel: Channel, message: FakeMessage) -> None:
        raise NotImplementedError

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
        self._edited(channel, message)
        return 200, message.to_json()

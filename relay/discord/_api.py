"""Discord's REST API as the driver uses it: one request at a time per bucket, rate limits
honoured before they are hit, typed errors.

Discord announces each route's limit in the answer's headers: ``X-RateLimit-Bucket`` (routes
sharing a bucket share it), ``X-RateLimit-Remaining`` and ``X-RateLimit-Reset-After``.  The
driver keeps that state per bucket and major parameter (the channel), and a request to a
bucket with nothing remaining waits for its reset instead of being sent into a 429.  A 429 is
still read: ``retry_after`` from the body (or ``Retry-After``) pauses that bucket, and with
``global: true`` (or ``X-RateLimit-Global``) every request of the bot.  Requests of one bucket
go one at a time, so the state each one reads is the last answer's.

A request that got no usable answer (refused, reset, timed out, not JSON) is a
:class:`DiscordUnreachable`: for a create, Discord may or may not have acted.  The token is
sent in the ``Authorization`` header only, never in a URL, and never appears in an error's text.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any, Final

import aiohttp
import attrs

from relay.connector.driver_http import HttpSession, why
from statecore.clock import Clock
from statecore.errors import StatecoreError

__all__ = ["DiscordApi", "DiscordAuthError", "DiscordError", "DiscordUnreachable"]

MAX_BODY_BYTES: Final = 8 * 1024 * 1024


class DiscordError(StatecoreError):
    """Discord answered with an error (``status``, its JSON ``code`` and ``message``)."""

    def __init__(
        self,
        status: int,
        code: int | None,
        message: str | None,
        *,
        retry_after_s: float | None = None,
        is_global: bool = False,
        errors: Mapping[str, Any] | None = None,
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s
        self.is_global = is_global
        self.errors: Mapping[str, Any] = errors or {}
        shown = f" (code {code})" if code else ""
        text = f": {message[:200]}" if message else ""
        super().__init__(f"Discord answered {status}{shown}{text}")

    @property
    def rate_limited(self) -> bool:
        """True for a 429: wait ``retry_after_s`` and ask again."""
        return self.status == 429

    @property
    def transient(self) -> bool:
        """True for an answer worth asking again (5xx, 429)."""
        return self.status >= 500 or self.rate_limited


class DiscordUnreachable(StatecoreError):
    """No usable answer from Discord (refused, reset, timed out, not JSON)."""


class DiscordAuthError(StatecoreError):
    """Discord refuses the bot's token (401, gateway close 4004) or its configuration (intents
    it may not use, 4013/4014): the operator must fix it."""


@attrs.define
class _Bucket:
    remaining: int | None = None
    reset_at: float = 0.0


class DiscordApi:
    """One bot token against one REST base (``https://discord.com/api/v10``).

    Open with :meth:`open` (inside a running event loop), close with :meth:`close`.
    """

    def __init__(
        self, base: str, token: str, *, clock: Clock, request_timeout_s: float = 15.0
    ) -> None:
        self.base = base.rstrip("/")
        self.token = token
        self.clock = clock
        self.request_timeout_s = request_timeout_s
        self._http = HttpSession()
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._route_bucket: dict[str, str] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._global_until = 0.0
        self.waited = 0
        """Requests held back until their bucket's reset (a 429 avoided)."""
        self.limited = 0
        """429 answers received."""

    @property
    def session(self) -> aiohttp.ClientSession:
        """The HTTP session (opened on first use)."""
        return self._http.session

    def open(self) -> None:
        """Create the HTTP session (idempotent); call it on the event loop that will use it."""
        self._http.open()

    async def close(self) -> None:
        """Close the HTTP session; never raises."""
        await self._http.close()

    def _key(self, route: str, major: str) -> tuple[str, str]:
        return (self._route_bucket.get(route, route), major)

    async def request(
        self, method: str, path: str, *, route: str, major: str = "", body: Any = None
    ) -> Any:
        """One request of ``route`` (its template, e.g. ``POST /channels/{id}/messages``) for
        the major parameter ``major``; returns the answer's JSON (None for a 204).

        Waits first while the bucket has nothing remaining or a global limit holds.  Raises
        :class:`DiscordError` for an error answer (a 429 included: the caller decides whether
        to ask again after ``retry_after_s``) and :class:`DiscordUnreachable` without one.
        """
        lock = self._locks.setdefault((route, major), asyncio.Lock())
        async with lock:
            await self._wait(route, major)
            return await self._send(method, path, route, major, body)

    async def _wait(self, route: str, major: str) -> None:
        clock = self.clock
        while True:
            bucket = self._buckets.get(self._key(route, major))
            now = clock.monotonic()
            until = self._global_until
            if bucket is not None and bucket.remaining == 0 and bucket.reset_at > now:
                until = max(until, bucket.reset_at)
            if until <= now:
                return
            self.waited += 1
            await clock.sleep(until - now)
            if bucket is not None and clock.monotonic() >= bucket.reset_at:
                bucket.remaining = None

    async def _send(self, method: str, path: str, route: str, major: str, body: Any) -> Any:
        headers = {"Authorization": f"Bot {self.token}", "User-Agent": "DiscordBot (statecore)"}
        got = await self._http.request(
            method,
            self.base + path,
            json=body,
            headers=headers,
            timeout_s=self.request_timeout_s,
            max_bytes=MAX_BODY_BYTES,
            unreachable=lambda exc, _sent: DiscordUnreachable(f"{method} {route}: {why(exc)}"),
            keep_cause=True,
        )
        status, raw, answer_headers = got.status, got.body, got.headers
        self._note_limits(route, major, answer_headers)
        if status == 204:
            return None
        answer = _json(raw)
        if 200 <= status < 300:
            if answer is None:
                raise DiscordUnreachable(f"{method} {route}: a {status} answer that is not JSON")
            return answer
        obj = answer if isinstance(answer, dict) else {}
        error = _error(status, obj, answer_headers)
        if error.rate_limited:
            self.limited += 1
            pause = error.retry_after_s if error.retry_after_s is not None else 1.0
            until = self.clock.monotonic() + pause
            if error.is_global:
                self._global_until = max(self._global_until, until)
            else:
                bucket = self._buckets.setdefault(self._key(route, major), _Bucket())
                bucket.remaining, bucket.reset_at = 0, until
        raise error

    def _note_limits(self, route: str, major: str, headers: Mapping[str, str]) -> None:
        name = headers.get("X-RateLimit-Bucket")
        if name:
            self._route_bucket[route] = name[:100]
        remaining = _number(headers.get("X-RateLimit-Remaining"))
        after = _number(headers.get("X-RateLimit-Reset-After"))
        if remaining is None or after is None:
            return
        bucket = self._buckets.setdefault(self._key(route, major), _Bucket())
        bucket.remaining = int(remaining)
        bucket.reset_at = self.clock.monotonic() + after


def _error(status: int, obj: Mapping[str, Any], headers: Mapping[str, str]) -> DiscordError:
    code, message = obj.get("code"), obj.get("message")
    retry = _number(obj.get("retry_after"))
    if retry is None:
        retry = _number(headers.get("Retry-After"))
    is_global = obj.get("global") is True or headers.get("X-RateLimit-Global") == "true"
    errors = obj.get("errors")
    return DiscordError(
        status,
        code if isinstance(code, int) and not isinstance(code, bool) else None,
        message if isinstance(message, str) else None,
        retry_after_s=retry,
        is_global=is_global,
        errors=errors if isinstance(errors, dict) else None,
    )


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
    else:
        return None
    return number if 0 <= number < 86_400 else None


def _json(raw: bytes) -> Any:
    if len(raw) > MAX_BODY_BYTES:
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None

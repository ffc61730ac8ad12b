"""How the fake Slack (:mod:`relay.slack.testing`) delivers events, as Slack's documentation says
Slack does: one attempt at a time per event, each either acknowledged within the ack window or
failed, failed attempts retried after the configured delays (Slack: at once, after a minute and
after five), then given up.

* Socket Mode: an ``events_api`` envelope on one of the app's open connections (round robin,
  never one that was told to disconnect), with ``retry_attempt`` / ``retry_reason``; the
  attempt succeeds only when ``{"envelope_id": ...}`` comes back on the same connection within
  ``ack_timeout_s``.  An ack after that counts as late (:attr:`Deliverer.late_acks`) and the
  event is retried all the same.  No open connection: the attempt fails at once.
* Events API: a signed ``POST`` of the event callback to ``request_url``; a 2xx within
  ``ack_timeout_s`` succeeds; retries carry ``X-Slack-Retry-Num`` and ``X-Slack-Retry-Reason``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import aiohttp
import attrs
from aiohttp import web

__all__ = ["Deliverer", "Delivery", "Socket", "sign"]


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Slack-Signature`` of ``body`` sent at ``timestamp`` (``v0=`` + hex HMAC-SHA256)."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


@attrs.define(eq=False)
class Socket:
    """One Socket Mode connection of the app to the fake."""

    number: int
    ws: web.WebSocketResponse
    request: web.Request
    draining: bool = False
    """Told to disconnect: no new envelope goes to it."""
    received: list[str] = attrs.field(factory=list)
    """Every frame the app sent on it, as text."""


@attrs.frozen
class Delivery:
    """One attempt to deliver one event."""

    event_id: str
    attempt: int
    """0 for the first, then Slack's ``retry_attempt``."""
    via: str
    """``socket:<n>``, ``http`` or ``none`` (no connection open)."""
    envelope_id: str | None
    outcome: str
    """``acked``, ``no_ack``, ``no_connection``, ``http_timeout``, ``http_error`` (non-2xx)
    or ``connection_failed``."""


class Deliverer:
    """Delivers and retries events (see the module docs); owned by a ``FakeSlack``."""

    def __init__(
        self, *, signing_secret: str, ack_timeout_s: float, retry_delays_s: Sequence[float]
    ) -> None:
        self.signing_secret = signing_secret
        self.ack_timeout_s = ack_timeout_s
        self.retry_delays_s = tuple(retry_delays_s)
        self.request_url: str | None = None
        self.sockets: list[Socket] = []
        self.deliveries: list[Delivery] = []
        self.acked: Counter[str] = Counter()
        """Event id -> attempts acknowledged (more than one: a duplicate delivery acked twice)."""
        self.given_up: list[str] = []
        self.late_acks = 0
        self.strange_frames: list[str] = []
        """Frames the app sent that are not an ack of an envelope it was sent."""
        self._waiting: dict[str, tuple[Socket, asyncio.Future[None]]] = {}
        self._expired: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._send_lock = asyncio.Lock()
        self._turn = 0
        self._http: aiohttp.ClientSession | None = None
        self.changed = asyncio.Event()
        self.closing: set[asyncio.Task[None]] = set()
        """Closes of connections told to disconnect, under way."""

    @property
    def in_flight(self) -> int:
        """Deliveries (copies) neither acknowledged nor given up yet."""
        return len(self._tasks)

    @property
    def awaiting_ack(self) -> int:
        """Envelopes sent whose ack window is still open."""
        return len(self._waiting)

    def open_sockets(self) -> list[Socket]:
        """The connections new envelopes may go to."""
        return [s for s in self.sockets if not s.draining and not s.ws.closed]

    def deliver(self, event_id: str, payload: dict[str, Any], *, copies: int = 1) -> None:
        """Start delivering ``payload`` (``copies`` independent deliveries of it)."""
        for _ in range(copies):
            task = asyncio.get_running_loop().create_task(self._run(event_id, payload))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self.changed.set()

    async def _run(self, event_id: str, payload: dict[str, Any]) -> None:
        attempt, reason = 0, ""
        while True:
            outcome = await self._attempt(event_id, payload, attempt, reason)
            if outcome == "acked":
                self.acked[event_id] += 1
                return
            if attempt >= len(self.retry_delays_s):
                self.given_up.append(event_id)
                return
            await asyncio.sleep(self.retry_delays_s[attempt])
            attempt += 1
            reason = "timeout" if outcome in ("no_ack", "no_connection") else outcome

    def _record(self, event_id: str, attempt: int, via: str, env: str | None, out: str) -> str:
        self.deliveries.append(Delivery(event_id, attempt, via, env, out))
        self.changed.set()
        return out

    async def _attempt(
        self, event_id: str, payload: dict[str, Any], attempt: int, reason: str
    ) -> str:
        if self.request_url is not None:
            return await self._post(event_id, payload, attempt, reason)
        async with self._send_lock:
            choices = self.open_sockets()
            if not choices:
                return self._record(event_id, attempt, "none", None, "no_connection")
            socket = choices[self._turn % len(choices)]
            self._turn += 1
            envelope_id = str(uuid.uuid4())
            envelope = {
                "envelope_id": envelope_id,
                "payload": payload,
                "type": "events_api",
                "accepts_response_payload": False,
                "retry_attempt": attempt,
                "retry_reason": reason,
            }
            acked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting[envelope_id] = (socket, acked)
            # A connection that is going: the attempt times out like any other.
            with contextlib.suppress(ConnectionError, RuntimeError):
                await socket.ws.send_str(json.dumps(envelope))
        via = f"socket:{socket.number}"
        try:
            await asyncio.wait_for(asyncio.shield(acked), self.ack_timeout_s)
        except TimeoutError:
            self._expired.add(envelope_id)
            return self._record(event_id, attempt, via, envelope_id, "no_ack")
        finally:
            self._waiting.pop(envelope_id, None)
        return self._record(event_id, attempt, via, envelope_id, "acked")

    def on_frame(self, socket: Socket, text: str) -> None:
        """A frame the app sent on ``socket``: an ack settles its envelope's attempt."""
        socket.received.append(text)
        try:
            frame = json.loads(text)
        except ValueError:
            self.strange_frames.append(text)
            return
        envelope_id = frame.get("envelope_id") if isinstance(frame, dict) else None
        waiting = self._waiting.get(envelope_id) if isinstance(envelope_id, str) else None
        if waiting is not None and waiting[0] is socket and not waiting[1].done():
            waiting[1].set_result(None)
        elif isinstance(envelope_id, str) and envelope_id in self._expired:
            self.late_acks += 1
        else:
            self.strange_frames.append(text)

    async def _post(self, event_id: str, payload: dict[str, Any], attempt: int, reason: str) -> str:
        assert self.request_url is not None
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(trust_env=False)
        body = json.dumps(payload).encode()
        stamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": sign(self.signing_secret, stamp, body),
        }
        if attempt:
            headers["X-Slack-Retry-Num"] = str(attempt)
            headers["X-Slack-Retry-Reason"] = reason
        try:
            async with self._http.post(
                self.request_url,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.ack_timeout_s),
            ) as response:
                await response.read()
                ok = 200 <= response.status < 300
        except TimeoutError:
            return self._record(event_id, attempt, "http", None, "http_timeout")
        except (aiohttp.ClientError, OSError):
            return self._record(event_id, attempt, "http", None, "connection_failed")
        return self._record(event_id, attempt, "http", None, "acked" if ok else "http_error")

    async def post_signed(self, url: str, payload: dict[str, Any]) -> tuple[int, str]:
        """POST ``payload`` to ``url`` signed, once; (status, body text)."""
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(trust_env=False)
        body = json.dumps(payload).encode()
        stamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": sign(self.signing_secret, stamp, body),
        }
        async with self._http.post(
            url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=10)
        ) as response:
            return response.status, await response.text()

    async def close(self) -> None:
        """Cancel every delivery and close the HTTP session."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self._http is not None:
            await self._http.close()

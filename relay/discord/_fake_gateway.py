"""The gateway half of :mod:`relay.discord.testing`: sessions, their backlogs, and the
WebSocket a bot connects to (JSON encoding, API v10), as Discord's gateway documentation says.

A connection gets HELLO and must IDENTIFY (a new session: READY with ``session_id`` and
``resume_gateway_url``, then one GUILD_CREATE per guild) or RESUME (the session's dispatches
after the given ``seq`` are replayed from its backlog, then RESUMED).  Every dispatch of a
session carries the next ``s``; a session keeps every dispatch in a bounded backlog while it is
resumable, with or without a connection.  A RESUME of a session that is unknown, expired
(``session_timeout_s`` after its connection went away) or whose backlog no longer reaches back
to the given ``seq`` gets INVALID_SESSION ``d=false``.  The server checks heartbeats (none
within 1.5 intervals: close 4009, the session is gone), answers each with HEARTBEAT_ACK
(unless told not to), and closes with 4004 for a token it does not know, 4002 for a payload
that is not JSON, 4001 for an unknown opcode, 4003 for a payload before identifying, 4005 for
a second IDENTIFY, 4007 for a RESUME past the session's last ``seq``, 4008 past 120 payloads
a minute, 4012 for an API version other than 10 and 4014 for intents the bot may not use.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import attrs
from aiohttp import WSMsgType, web

__all__ = ["GatewayConnection", "GatewaySession", "GatewayState", "Intents"]

DISPATCH, HEARTBEAT, IDENTIFY, RESUME, RECONNECT, INVALID_SESSION, HELLO, HEARTBEAT_ACK = (
    0,
    1,
    2,
    6,
    7,
    9,
    10,
    11,
)
_SEND_LIMIT: Final = 120
"""Payloads a client may send per minute (the documented gateway limit)."""


class Intents:
    """The intent bits the fake reads."""

    GUILDS: Final = 1 << 0
    GUILD_MESSAGES: Final = 1 << 9
    DIRECT_MESSAGES: Final = 1 << 12
    MESSAGE_CONTENT: Final = 1 << 15
    PRIVILEGED: Final = (1 << 1) | (1 << 8) | (1 << 15)


@attrs.define(eq=False)
class GatewaySession:
    """One gateway session: its id, intents, the seq it is at and the dispatches it keeps."""

    session_id: str
    intents: int
    backlog: deque[dict[str, Any]]
    seq: int = 0
    connection: GatewayConnection | None = None
    detached_at: float | None = None
    valid: bool = True
    first_kept: int = 1
    """The lowest seq the backlog still holds (a RESUME from before it cannot be served)."""

    def resumable_from(self, seq: int, now: float, timeout_s: float) -> bool:
        """Whether a RESUME at ``seq`` can be served now."""
        if not self.valid:
            return False
        if self.detached_at is not None and now - self.detached_at > timeout_s:
            return False
        return seq + 1 >= self.first_kept


class GatewayState:
    """Every session of the one bot, and what the fake's gateway was asked (the record)."""

    def __init__(
        self,
        *,
        token: Callable[[], str],
        ready_user: Callable[[], dict[str, Any]],
        guilds: Callable[[], list[dict[str, Any]]],
        resume_url: Callable[[], str],
        heartbeat_interval_ms: int,
        session_timeout_s: float,
        backlog_max: int,
        allowed_intents: int,
    ) -> None:
        self._token = token
        self._ready_user = ready_user
        self._guilds = guilds
        self._resume_url = resume_url
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.session_timeout_s = session_timeout_s
        self.backlog_max = backlog_max
        self.allowed_intents = allowed_intents
        self.sessions: dict[str, GatewaySession] = {}
        self.connections: list[GatewayConnection] = []
        self.identifies = 0
        self.resumes: list[tuple[str, int, str]] = []
        """Every RESUME served: (session_id, seq asked, the path it came on)."""
        self.invalid_sessions = 0
        self.heartbeats: list[int | None] = []
        """The ``d`` of every heartbeat received (the client's last seq)."""
        self.ack_heartbeats = True
        self.duplicate = 0
        self.closes: list[int] = []
        """Close codes the fake sent."""

    def sessions_seq(self) -> int:
        """The highest seq any valid session is at (what a caught-up client has taken)."""
        return max((s.seq for s in self.sessions.values() if s.valid), default=0)

    # -- dispatching ---------------------------------------------------------------------------

    def dispatch(self, event: str, data: dict[str, Any], *, wants: int = 0) -> None:
        """Give ``event`` the next seq of every valid session whose intents hold ``wants``."""
        for session in list(self.sessions.values()):
            if session.valid and (session.intents & wants) == wants:
                self.dispatch_to(session, event, data)

    def dispatch_to(self, session: GatewaySession, event: str, data: dict[str, Any]) -> None:
        """Append ``event`` to ``session``'s backlog and send it on its connection."""
        session.seq += 1
        payload = {"op": DISPATCH, "t": event, "s": session.seq, "d": data}
        session.backlog.append(payload)
        if len(session.backlog) > self.backlog_max:
            session.backlog.popleft()
            session.first_kept = session.backlog[0]["s"]
        if session.connection is not None:
            session.connection.send(payload)
            if self.duplicate and event.startswith("MESSAGE_"):
                self.duplicate -= 1
                session.connection.send(payload)

    def send_raw(self, text: str) -> None:
        """Send ``text`` as it is on every live connection (a malformed frame)."""
        for connection in self.connections:
            connection.send_text(text)

    # -- faults --------------------------------------------------------------------------------

    def drop(self) -> None:
        """Cut every live connection without a close frame (sessions stay resumable)."""
        for connection in list(self.connections):
            connection.abort()

    def reconnect(self) -> None:
        """Send RECONNECT (op 7) on every live connection."""
        for connection in self.connections:
            connection.send({"op": RECONNECT, "d": None})

    def invalidate(self, *, resumable: bool) -> None:
        """Send INVALID_SESSION on every live connection; ``resumable=False`` ends the sessions."""
        for connection in list(self.connections):
            if connection.session is not None and not resumable:
                connection.session.valid = False
            self.invalid_sessions += 1
            connection.send({"op": INVALID_SESSION, "d": resumable})

    def expire(self) -> None:
        """Every session is gone: a later RESUME gets INVALID_SESSION ``d=false``."""
        for session in self.sessions.values():
            session.valid = False

    def request_heartbeat(self) -> None:
        """Ask every connection for a heartbeat at once (op 1 from the server)."""
        for connection in self.connections:
            connection.send({"op": HEARTBEAT, "d": None})

    # -- connections ---------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The gateway WebSocket endpoint (aiohttp handler)."""
        ws = web.WebSocketResponse(autoping=True, max_msg_size=4096 * 1024)
        await ws.prepare(request)
        connection = GatewayConnection(self, ws, request.path, request.transport)
        if request.query.get("v") != "10":
            await connection.close(4012)
            return ws
        if request.query.get("encoding", "json") != "json":
            await connection.close(4002)
            return ws
        self.connections.append(connection)
        try:
            await connection.serve()
        finally:
            self.connections.remove(connection)
            connection.detach()
        return ws

    def identify(self, connection: GatewayConnection, data: object) -> int | None:
        """An IDENTIFY: a close code, or None once READY went out."""
        if not isinstance(data, dict) or data.get("token") != self._token():
            return 4004
        intents = data.get("intents")
        if not isinstance(intents, int) or isinstance(intents, bool) or intents < 0:
            return 4013
        if intents & Intents.PRIVILEGED & ~self.allowed_intents:
            return 4014
        self.identifies += 1
        session = GatewaySession("fs" + secrets.token_hex(8), intents, deque())
        self.sessions[session.session_id] = session
        connection.attach(session)
        ready = {
            "v": 10,
            "user": self._ready_user(),
            "guilds": [{"id": g["id"], "unavailable": True} for g in self._guilds()],
            "session_id": session.session_id,
            "resume_gateway_url": self._resume_url(),
            "application": {"id": self._ready_user()["id"], "flags": 0},
        }
        self.dispatch_to(session, "READY", ready)
        for guild in self._guilds():
            self.dispatch_to(session, "GUILD_CREATE", guild)
        return None

    def resume(self, connection: GatewayConnection, data: object) -> int | None:
        """A RESUME: a close code, or None (replayed, or INVALID_SESSION sent)."""
        if not isinstance(data, dict) or data.get("token") != self._token():
            return 4004
        session_id, seq = data.get("session_id"), data.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool):
            seq = 0
        session = self.sessions.get(session_id) if isinstance(session_id, str) else None
        if session is not None and seq > session.seq:
            return 4007
        if session is None or not session.resumable_from(
            seq, time.monotonic(), self.session_timeout_s
        ):
            self.invalid_sessions += 1
            connection.send({"op": INVALID_SESSION, "d": False})
            return None
        old = session.connection
        if old is not None and old is not connection:
            old.abort()
        self.resumes.append((session.session_id, seq, connection.path))
        connection.attach(session)
        for payload in list(session.backlog):
            if payload["s"] > seq:
                connection.send(payload)
        self.dispatch_to(session, "RESUMED", {})
        return None


class GatewayConnection:
    """One client's WebSocket: an ordered writer, the reader, and the heartbeat watchdog."""

    def __init__(
        self,
        state: GatewayState,
        ws: web.WebSocketResponse,
        path: str,
        transport: asyncio.BaseTransport | None,
    ) -> None:
        self.state = state
        self._transport = transport
        self.ws = ws
        self.path = path
        self.session: GatewaySession | None = None
        self._out: asyncio.Queue[str | None] = asyncio.Queue()
        self._last_heartbeat = time.monotonic()
        self._sent_times: deque[float] = deque()
        self._closing = False

    def send(self, payload: dict[str, Any]) -> None:
        """Queue ``payload`` (sent in order)."""
        self._out.put_nowait(json.dumps(payload))

    def send_text(self, text: str) -> None:
        """Queue a raw text frame."""
        self._out.put_nowait(text)

    def attach(self, session: GatewaySession) -> None:
        """This connection now carries ``session``'s dispatches."""
        self.session = session
        session.connection = self
        session.detached_at = None

    def detach(self) -> None:
        """The connection is gone; its session waits (resumable) for a RESUME."""
        if self.session is not None and self.session.connection is self:
            self.session.connection = None
            self.session.detached_at = time.monotonic()

    def abort(self) -> None:
        """Cut the connection without a close frame."""
        self._closing = True
        self._out.put_nowait(None)
        if isinstance(self._transport, asyncio.WriteTransport):
            self._transport.abort()

    async def close(self, code: int) -> None:
        """Close with ``code`` (recorded)."""
        self._closing = True
        self.state.closes.append(code)
        with contextlib.suppress(Exception):
            await self.ws.close(code=code)

    async def serve(self) -> None:
        """HELLO, then read until the connection ends."""
        interval = self.state.heartbeat_interval_ms
        self.send({"op": HELLO, "d": {"heartbeat_interval": interval}})
        writer = asyncio.create_task(self._write())
        watchdog = asyncio.create_task(self._watch(interval / 1000))
        try:
            await self._read()
        finally:
            for task in (writer, watchdog):
                task.cancel()
            for task in (writer, watchdog):
                with contextlib.suppress(BaseException):
                    await task

    async def _write(self) -> None:
        while True:
            text = await self._out.get()
            if text is None:
                return
            try:
                await self.ws.send_str(text)
            except (ConnectionError, RuntimeError):
                return

    async def _watch(self, interval_s: float) -> None:
        while not self._closing:
            await asyncio.sleep(interval_s / 4)
            if time.monotonic() - self._last_heartbeat > interval_s * 1.5:
                if self.session is not None:
                    self.session.valid = False
                await self.close(4009)
                return

    async def _read(self) -> None:
        async for message in self.ws:
            if message.type != WSMsgType.TEXT:
                if message.type == WSMsgType.BINARY:
                    await self.close(4002)
                break
            code = self._received(message.data)
            if code is not None:
                await self.close(code)
                break

    def _received(self, text: str) -> int | None:
        now = time.monotonic()
        self._sent_times.append(now)
        while self._sent_times and now - self._sent_times[0] > 60:
            self._sent_times.popleft()
        if len(self._sent_times) > _SEND_LIMIT:
            return 4008
        try:
            payload = json.loads(text)
        except ValueError:
            return 4002
        if not isinstance(payload, dict):
            return 4002
        op, data = payload.get("op"), payload.get("d")
        if op == HEARTBEAT:
            self._last_heartbeat = now
            self.state.heartbeats.append(data if isinstance(data, int) else None)
            if self.state.ack_heartbeats:
                self.send({"op": HEARTBEAT_ACK})
            return None
        if op == IDENTIFY:
            if self.session is not None:
                return 4005
            return self.state.identify(self, data)
        if op == RESUME:
            if self.session is not None:
                return 4005
            return self.state.resume(self, data)
        if op in (3, 4, 8, 31):  # presence, voice state, request members, soundboard
            return None if self.session is not None else 4003
        return 4001

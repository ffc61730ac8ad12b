"""Test doubles for the relay transport tests: a real WebSocket connector and a fault proxy.

* :class:`StubConnector` is an in-process connector served by ``websockets`` on ``127.0.0.1`` (port
  0, path ``/relay``).  It answers ``hello`` with a descriptor, ``outbound`` with a configurable
  ``outbound_result``, ``going_idle`` with ``going_idle_ack`` (or never), records every frame,
  every ``inbound_ack`` and each connection's ``Authorization`` header, keeps a durable-buffer
  backlog that it replays (with ``bufferId``) on every handshake until acked, can push frames
  and close a connection on demand, can verify bearer tokens, and can be stopped and restarted
  on the same port.
* :class:`FaultProxy` is a TCP proxy (asyncio streams) between a transport and a connector that
  passes bytes through, stalls (accepts, then forwards nothing), or cuts the next
  connector-to-gateway message in half and drops the connection.
* :class:`TransportFactory` builds transports aimed at the connector with short timings and
  tears them all down; :func:`eventually` and :func:`next_sleep` are bounded waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from http import HTTPStatus
from typing import Any, Literal

import attrs
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from relay.client.lifecycle import TransportState
from relay.client.transport import WebSocketRelayTransport
from relay.wire.auth import token_from_header, verify_token
from relay.wire.errors import AuthError
from statecore.clock import FakeClock
from tests.waiting import eventually

__all__ = [
    "BOT_ID",
    "DESCRIPTOR",
    "FAST",
    "PLATFORM",
    "Conn",
    "FaultProxy",
    "MemoryDedupe",
    "Reply",
    "StubConnector",
    "TransportFactory",
    "eventually",
    "inbound_event",
    "next_sleep",
    "state_of",
]

PLATFORM = "discord"
BOT_ID = "app-1"

DESCRIPTOR: dict[str, Any] = {
    "contract_version": 1,
    "platform": PLATFORM,
    "label": "Discord",
    "max_message_length": 2000,
    "supports_draft_streaming": False,
    "supports_edit": True,
    "supports_threads": True,
    "markdown_dialect": "discord",
    "len_unit": "chars",
}

Frame = dict[str, Any]


def inbound_event(
    text: str,
    *,
    chat_id: str = "c1",
    chat_type: str = "dm",
    scope_id: str | None = None,
    user_id: str | None = None,
    platform: str = PLATFORM,
) -> Frame:
    """An ``event`` object as the connector sends it inside an ``inbound`` frame."""
    source: Frame = {"platform": platform, "chat_id": chat_id, "chat_type": chat_type}
    if scope_id is not None:
        source["scope_id"] = scope_id
    if user_id is not None:
        source["user_id"] = user_id
    return {"text": text, "message_type": "text", "source": source}


@attrs.define
class Reply:
    """How the connector answers one ``outbound`` frame."""

    success: bool = True
    message_id: str | None = None
    """None: an automatic ``m-<n>``."""
    error: str | None = None
    code: str | None = None
    delay_s: float = 0.0
    answer: bool = True
    """False: never answer (the request stays pending until :meth:`StubConnector.answer`)."""

    @classmethod
    def ok(cls, message_id: str | None = None, *, delay_s: float = 0.0) -> Reply:
        """Acknowledge success."""
        return cls(True, message_id, delay_s=delay_s)

    @classmethod
    def failed(cls, error: str, code: str | None = None) -> Reply:
        """Acknowledge a failure."""
        return cls(False, None, error, code)

    @classmethod
    def declined(cls) -> Reply:
        """Refuse definitely, as the tenant guard does."""
        return cls(False, None, "not permitted", "egress_declined")

    @classmethod
    def never(cls) -> Reply:
        """Never answer."""
        return cls(answer=False)


@attrs.define(eq=False)
class Conn:
    """One WebSocket connection the connector accepted."""

    number: int
    ws: ServerConnection
    authorization: str | None
    features: str | None = None
    """The ``X-Relay-Features`` header of the upgrade (None: the gateway announced nothing)."""
    frames: list[Frame] = attrs.Factory(list)
    hellos: int = 0
    handshaken: bool = False
    close_code: int | None = None
    close_reason: str | None = None
    closed: asyncio.Event = attrs.Factory(asyncio.Event)

    @property
    def is_open(self) -> bool:
        """True until the connection's handler returned."""
        return not self.closed.is_set()

    def frames_of(self, frame_type: str) -> list[Frame]:
        """The frames of ``frame_type`` received on this connection."""
        return [f for f in self.frames if f.get("type") == frame_type]


class StubConnector:
    """An in-process relay connector for tests (see the module docs)."""

    def __init__(
        self,
        *,
        descriptor: Mapping[str, Any] | None = None,
        secrets: Mapping[str, Sequence[str | bytes]] | None = None,
        now: Callable[[], float] | None = None,
    ) -> None:
        self.descriptor: Frame = dict(descriptor or DESCRIPTOR)
        self.extra_descriptors: list[Frame] = []
        """Further descriptors sent right after the first one of a connection."""
        self.secrets = secrets
        """When set, every upgrade must carry a bearer token valid for one of these."""
        self.now: Callable[[], float] = now or time.time
        """The connector's idea of the wall clock when verifying tokens."""
        self.answer_hello = True
        self.ack_going_idle = True
        self.reply: Reply | Callable[[Frame], Reply] = Reply.ok()
        self.push_on_handshake: list[Frame | str] = []
        """Frames pushed after the first descriptor of every connection (after the backlog)."""
        self.close_on_connect: dict[int, tuple[int, str]] = {}
        """Connection number (1-based) -> close code and reason sent before any descriptor."""
        self.close_after_handshake: dict[int, tuple[int, str]] = {}
        """Connection number -> close code and reason sent right after its first descriptor."""
        self.on_connect: Callable[[int], None] | None = None
        """Called with the connection number before the token is checked."""
        self.reject_status: int | None = None
        """When set, refuse the HTTP upgrade with this status."""
        self.upgrades = 0
        """HTTP upgrade requests seen (refused ones included)."""

        self.backlog: list[tuple[str, Frame]] = []
        """The durable buffer: (bufferId, event), replayed on every handshake until acked."""
        self.buffering = False
        """True after a going_idle was acked: :meth:`deliver` buffers instead of pushing."""
        self.received: list[Frame] = []
        self.inbound_acks: list[str] = []
        self.going_idle_count = 0
        self.error_frames: list[Frame] = []
        self.unanswered: list[str] = []
        self.conns: list[Conn] = []
        self.live = 0
        self.max_live = 0

        self._server: Server | None = None
        self._port = 0
        self._buffer_ids = itertools.count(1)
        self._message_ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the connector listens on (kept across restarts)."""
        return self._port

    @property
    def url(self) -> str:
        """The base URL to give a transport (it appends ``/relay``)."""
        return f"ws://127.0.0.1:{self._port}"

    @property
    def running(self) -> bool:
        """True while the server accepts connections."""
        return self._server is not None

    async def start(self) -> None:
        """Listen (on a fresh port the first time, on the same port after a stop)."""
        assert self._server is None, "already running"
        self._server = await serve(
            self._handle,
            "127.0.0.1",
            self._port,
            process_request=self._process_request,
            compression=None,
            close_timeout=1.0,
        )
        sock = next(iter(self._server.sockets))
        self._port = sock.getsockname()[1]

    async def stop(self) -> None:
        """Close every connection (1001) and stop listening; bounded."""
        server, self._server = self._server, None
        for task in list(self._tasks):
            task.cancel()
        if server is None:
            return
        server.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 5.0)

    async def restart(self) -> None:
        """Stop and start again on the same port (a connector restart)."""
        await self.stop()
        await self.start()

    # -- observation ---------------------------------------------------------------------------

    @property
    def connections(self) -> int:
        """How many WebSocket connections were accepted so far."""
        return len(self.conns)

    @property
    def authorizations(self) -> list[str | None]:
        """The Authorization header of each connection, in order."""
        return [c.authorization for c in self.conns]

    @property
    def current(self) -> Conn:
        """The newest connection that is still open."""
        for conn in reversed(self.conns):
            if conn.is_open:
                return conn
        raise AssertionError("the connector has no open connection")

    def frames_of(self, frame_type: str) -> list[Frame]:
        """Every received frame of ``frame_type``, over all connections."""
        return [f for f in self.received if f.get("type") == frame_type]

    # -- acting --------------------------------------------------------------------------------

    async def push(self, frame: Frame | str, conn: Conn | None = None) -> None:
        """Send a frame (a dict, or raw text sent as is) on ``conn`` (default: the current)."""
        target = conn or self.current
        text = frame if isinstance(frame, str) else json.dumps(frame) + "\n"
        await target.ws.send(text)

    async def push_inbound(
        self, event: Frame, buffer_id: str | None = None, conn: Conn | None = None
    ) -> None:
        """Push one ``inbound`` frame (buffered when ``buffer_id`` is given)."""
        frame: Frame = {"type": "inbound", "event": event}
        if buffer_id is not None:
            frame["bufferId"] = buffer_id
        await self.push(frame, conn)

    async def deliver(self, event: Frame) -> str | None:
        """Deliver a platform event as a real connector would.

        Buffered (returns its bufferId) after a going_idle or with no open connection; pushed
        live otherwise (returns None).
        """
        live = [c for c in self.conns if c.is_open and c.handshaken]
        if self.buffering or not live:
            buffer_id = f"buf-{next(self._buffer_ids)}"
            self.backlog.append((buffer_id, event))
            return buffer_id
        await self.push_inbound(event, None, live[-1])
        return None

    async def answer(
        self, request_id: str, *, success: bool = True, conn: Conn | None = None, **result: Any
    ) -> None:
        """Send the ``outbound_result`` of ``request_id`` now."""
        payload: Frame = {"success": success, **result}
        await self.push(
            {"type": "outbound_result", "requestId": request_id, "result": payload}, conn
        )

    async def close_current(self, code: int, reason: str = "") -> None:
        """Close the current connection with ``code`` and ``reason`` (bounded)."""
        conn = self.current
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(conn.ws.close(code, reason), 3.0)

    def abort_current(self) -> None:
        """Cut the current connection's TCP stream without a close frame."""
        self.current.ws.transport.abort()

    # -- serving -------------------------------------------------------------------------------

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        self.upgrades += 1
        if request.path != "/relay":
            return connection.respond(HTTPStatus.NOT_FOUND, "only /relay\n")
        if self.reject_status is not None:
            return connection.respond(HTTPStatus(self.reject_status), "refused\n")
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        request = ws.request
        authorization = request.headers.get("Authorization") if request is not None else None
        features = request.headers.get("X-Relay-Features") if request is not None else None
        conn = Conn(len(self.conns) + 1, ws, authorization, features)
        self.conns.append(conn)
        self.live += 1
        self.max_live = max(self.max_live, self.live)
        try:
            if self.on_connect is not None:
                self.on_connect(conn.number)
            refusal = self._refusal(authorization) or self.close_on_connect.get(conn.number)
            if refusal is not None:
                await ws.close(*refusal)
                return
            async for raw in ws:
                text = raw if isinstance(raw, str) else raw.decode("utf-8")
                for line in text.split("\n"):
                    if not line.strip():
                        continue
                    frame = json.loads(line)
                    conn.frames.append(frame)
                    self.received.append(frame)
                    await self._on_frame(conn, frame)
        except ConnectionClosed:
            pass
        finally:
            self.live -= 1
            conn.close_code = ws.close_code
            conn.close_reason = ws.close_reason
            conn.closed.set()

    def _refusal(self, authorization: str | None) -> tuple[int, str] | None:
        if self.secrets is None:
            return None
        try:
            verify_token(token_from_header(authorization), self.secrets, now=self.now())
        except AuthError as exc:
            if exc.reason == "expired":
                return (4419, "expired")
            return (4401, exc.reason)
        return None

    async def _on_frame(self, conn: Conn, frame: Frame) -> None:
        kind = frame.get("type")
        if kind == "hello":
            await self._on_hello(conn, frame)
        elif kind == "outbound":
            await self._on_outbound(conn, frame)
        elif kind == "going_idle":
            self.going_idle_count += 1
            if self.ack_going_idle:
                self.buffering = True
                ack: Frame = {"type": "going_idle_ack"}
                if frame.get("requestId") is not None:
                    ack["requestId"] = frame["requestId"]
                await self.push(ack, conn)
        elif kind == "inbound_ack":
            buffer_id = frame.get("bufferId")
            self.inbound_acks.append(str(buffer_id))
            self.backlog = [(b, e) for b, e in self.backlog if b != buffer_id]
        elif kind == "error":
            self.error_frames.append(frame)

    async def _on_hello(self, conn: Conn, frame: Frame) -> None:
        conn.hellos += 1
        if not self.answer_hello:
            return
        descriptor = copy.deepcopy(self.descriptor)
        if frame.get("platform") != descriptor["platform"]:
            descriptor["platform"] = frame.get("platform")
            descriptor["label"] = str(frame.get("platform")).title()
        await self.push({"type": "descriptor", "descriptor": descriptor}, conn)
        if conn.hellos > 1:
            return
        for extra in self.extra_descriptors:
            await self.push({"type": "descriptor", "descriptor": extra}, conn)
        conn.handshaken = True
        self.buffering = False
        for buffer_id, event in list(self.backlog):
            await self.push_inbound(event, buffer_id, conn)
        for pushed in self.push_on_handshake:
            await self.push(pushed, conn)
        plan = self.close_after_handshake.get(conn.number)
        if plan is not None:
            await conn.ws.close(*plan)

    async def _on_outbound(self, conn: Conn, frame: Frame) -> None:
        reply = self.reply(frame) if callable(self.reply) else self.reply
        request_id = str(frame.get("requestId"))
        if not reply.answer:
            self.unanswered.append(request_id)
            return
        result: Frame = {"success": reply.success}
        message_id = reply.message_id
        if reply.success and message_id is None:
            message_id = f"m-{next(self._message_ids)}"
        for key, value in (
            ("message_id", message_id),
            ("error", reply.error),
            ("code", reply.code),
        ):
            if value is not None:
                result[key] = value
        out: Frame = {"type": "outbound_result", "requestId": request_id, "result": result}
        if reply.delay_s <= 0:
            await self.push(out, conn)
            return

        async def later() -> None:
            await asyncio.sleep(reply.delay_s)
            with contextlib.suppress(ConnectionClosed):
                await self.push(out, conn)

        self._spawn(later())

    def _spawn(self, coro: Awaitable[None]) -> None:
        async def run() -> None:
            await coro

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


# -- the fault-injecting proxy -------------------------------------------------------------------

ProxyMode = Literal["pass", "stall", "stall_after_upgrade"]


@attrs.define(eq=False)
class _Link:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    stalled: bool = False
    watch_upgrade: bool = False
    seen: bytes = b""
    tasks: list[asyncio.Task[None]] = attrs.Factory(list)

    def close(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None and not writer.is_closing():
                writer.close()

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.transport.abort()


class FaultProxy:
    """A TCP proxy in front of ``target_port`` on 127.0.0.1 that can inject faults.

    ``mode`` applies to new connections: ``"pass"`` forwards both ways; ``"stall"`` accepts and
    never forwards (the WebSocket upgrade never completes); ``"stall_after_upgrade"`` forwards
    the upgrade, then nothing more (the connector looks connected but silent).  :meth:`stall`
    freezes the live connections; :meth:`drop_next_server_message` forwards half of the next
    connector-to-gateway chunk and then cuts the connection.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.mode: ProxyMode = "pass"
        self.accepted = 0
        self.links: list[_Link] = []
        self.dropped = 0
        self._drop_armed = False
        self._server: asyncio.Server | None = None
        self._port = 0

    @property
    def url(self) -> str:
        """The base URL to give a transport instead of the connector's."""
        return f"ws://127.0.0.1:{self._port}"

    async def start(self) -> None:
        """Listen on a fresh port."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self._port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and cut every link; bounded."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks: list[asyncio.Task[None]] = []
        for link in self.links:
            link.abort()
            tasks.extend(link.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 2.0)

    def stall(self) -> None:
        """Stop forwarding anything on every live link (both directions)."""
        for link in self.links:
            link.stalled = True

    def drop_next_server_message(self) -> None:
        """Forward half of the next connector-to-gateway chunk, then cut that connection."""
        self._drop_armed = True

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        link = _Link(writer)
        self.links.append(link)
        if self.mode == "stall":
            link.stalled = True
            link.tasks.append(asyncio.current_task())  # type: ignore[arg-type]
            await self._pump(link, reader, None, upstream=False)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        link.upstream = up_writer
        link.watch_upgrade = self.mode == "stall_after_upgrade"
        link.tasks.append(asyncio.ensure_future(self._pump(link, reader, up_writer, upstream=True)))
        link.tasks.append(
            asyncio.ensure_future(self._pump(link, up_reader, writer, upstream=False))
        )

    async def _pump(
        self,
        link: _Link,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter | None,
        *,
        upstream: bool,
    ) -> None:
        try:
            while True:
                data = await src.read(65536)
                if not data:
                    break
                if link.stalled or dst is None:
                    continue
                if not upstream and link.watch_upgrade:
                    link.seen += data
                    end = link.seen.find(b"\r\n\r\n")
                    if end >= 0:
                        # Forward the upgrade response only; from here on, silence.
                        cut = len(data) - (len(link.seen) - (end + 4))
                        dst.write(data[:cut])
                        await dst.drain()
                        link.stalled = True
                        continue
                if not upstream and self._drop_armed:
                    self._drop_armed = False
                    self.dropped += 1
                    dst.write(data[: max(1, len(data) // 2)])
                    await dst.drain()
                    link.abort()
                    return
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            link.close()


# -- transports under test -----------------------------------------------------------------------

FAST: dict[str, Any] = {
    "reconnect_backoff_s": 0.05,
    "reconnect_max_s": 0.2,
    "dormant_redial_s": 0.05,
    "request_timeout_s": 2.0,
    "handshake_timeout_s": 2.0,
    "open_timeout_s": 2.0,
}
"""Short real-time settings for transports on the system clock."""


class TransportFactory:
    """Builds transports aimed at the test connector and disconnects them all afterwards."""

    def __init__(self, connector: StubConnector) -> None:
        self.connector = connector
        self.created: list[WebSocketRelayTransport] = []

    def __call__(self, url: str | None = None, **overrides: Any) -> WebSocketRelayTransport:
        """A transport to ``url`` (default: the connector) with :data:`FAST` settings."""
        settings: dict[str, Any] = {**FAST, "rng": random.Random(0), **overrides}
        transport = WebSocketRelayTransport(
            url or self.connector.url, settings.pop("platform", PLATFORM), BOT_ID, **settings
        )
        self.created.append(transport)
        return transport

    async def connected(self, url: str | None = None, **overrides: Any) -> WebSocketRelayTransport:
        """A transport that completed connect() and handshake()."""
        transport = self(url, **overrides)
        await asyncio.wait_for(transport.connect(), 3.0)
        await asyncio.wait_for(transport.handshake(), 3.0)
        return transport

    async def close_all(self) -> None:
        """Disconnect every transport built here (each bounded)."""
        for transport in self.created:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(transport.disconnect(budget_s=0.5), 5.0)


async def next_sleep(clock: FakeClock, *, after: float | None = None) -> float:
    """Wait (bounded) until something sleeps on ``clock``; return how long it sleeps from now.

    ``after``: only a sleeper whose deadline lies beyond this monotonic time counts.
    """

    def armed() -> bool:
        deadline = clock.next_deadline
        return deadline is not None and (after is None or deadline > after)

    await eventually(armed, what="a sleeper on the fake clock")
    deadline = clock.next_deadline
    assert deadline is not None
    return deadline - clock.monotonic()


def state_of(transport: WebSocketRelayTransport) -> TransportState:
    """The transport's current state, read through a call so type narrowing never goes stale
    across awaits (the state changes behind the test's back)."""
    return transport.state


class MemoryDedupe:
    """A BufferDedupe that remembers in memory and checks the connector at remember time."""

    def __init__(self, connector: StubConnector, seen: tuple[str, ...] = ()) -> None:
        self.connector = connector
        self.handled = set(seen)
        self.remembered: list[str] = []
        self.acked_before_remembered: dict[str, bool] = {}
        self.undeliverable: list[tuple[str, str, str, str]] = []
        self.fail_records = False

    async def seen(self, buffer_id: str) -> bool:
        return buffer_id in self.handled

    async def remember(self, buffer_id: str) -> None:
        # Give a premature ack every chance to arrive before looking.
        await asyncio.sleep(0.05)
        self.acked_before_remembered[buffer_id] = buffer_id in self.connector.inbound_acks
        self.handled.add(buffer_id)
        self.remembered.append(buffer_id)

    async def record_undeliverable(
        self, buffer_id: str, *, frame_type: str, reason: str, raw_line: str
    ) -> None:
        if self.fail_records:
            raise OSError("disk full")
        await asyncio.sleep(0.05)  # a premature ack would arrive meanwhile
        self.acked_before_remembered[buffer_id] = buffer_id in self.connector.inbound_acks
        self.handled.add(buffer_id)
        self.undeliverable.append((buffer_id, frame_type, reason, raw_line))

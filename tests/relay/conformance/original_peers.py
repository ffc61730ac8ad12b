"""Peers that follow the ORIGINAL relay contract, written from its specification alone.

Nothing here imports the project's own relay code: these doubles are the yardstick the
project's gateway and connector are measured against.

* :func:`mint` / :func:`verify`: the original bearer token, ``base64url(no padding)`` of
  ``"{gatewayId}:{exp}:{sig}"`` where ``sig`` is the lowercase hex HMAC-SHA256 of
  ``"{gatewayId}:{exp}"`` with the shared secret.
* :class:`OriginalConnector`: a WebSocket server (``127.0.0.1``, port 0, path ``/relay``) that
  authenticates at upgrade (refusals close with 4401 and the reason), refuses a second
  simultaneous connection of a gateway (1008 "already connected"), answers ``hello`` with an
  original descriptor, performs ``outbound`` actions, acks ``going_idle`` and replays a durable
  buffer one entry at a time, waiting for each ``inbound_ack``.
* :class:`OriginalGateway`: a client that dials with a fresh token every time, says ``hello``,
  acks buffered ``inbound`` frames, performs requests and redials the original way (at once
  after a drop or an expired token, a few slow retries after a start-up 4401, gives up after a
  4401 once connected).

Wire format, both ways: one compact JSON object followed by ``"\\n"`` per text message; a reader
accepts several lines in one message and ignores blank and unparsable lines.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import itertools
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, NamedTuple

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.http11 import Request, Response

from tests.waiting import eventually

__all__ = [
    "BOT_ID",
    "GATEWAY_ID",
    "PLATFORM",
    "RELAY_PATH",
    "SECRET",
    "BufferEntry",
    "OriginalConnector",
    "OriginalGateway",
    "PeerConnection",
    "Received",
    "Refused",
    "decode_message",
    "encode_frame",
    "eventually",
    "mint",
    "peek_gateway_id",
    "verify",
]

_log = logging.getLogger(__name__)

Frame = dict[str, Any]

RELAY_PATH = "/relay"
GATEWAY_ID = "gw-1"
SECRET = "original-secret"
PLATFORM = "discord"
BOT_ID = "app-1"

CONTENT_OPS = frozenset({"send", "edit", "follow_up"})
"""Ops whose ``content`` must be a non-empty string."""
OUTBOUND_OPS = CONTENT_OPS | {"typing"}
BUFFERED_FRAME_TYPES = frozenset({"inbound", "passthrough_forward", "interrupt_inbound"})
"""Frame types a connector may replay from its buffer with a ``bufferId`` (the gateway acks)."""

_B64URL = re.compile(r"[A-Za-z0-9_-]+")
_DIGITS = re.compile(r"[0-9]+")
_HEX_SHA256 = re.compile(r"[0-9a-f]{64}")


# --------------------------------------------------------------------------- tokens


class Refused(Exception):
    """A bearer token was refused; ``reason`` is expired, unknown, forged or malformed."""

    def __init__(self, reason: str, gateway_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.gateway_id = gateway_id


def _sign(gateway_id: str, exp: int, secret: str) -> str:
    payload = f"{gateway_id}:{exp}".encode()
    return hmac.new(secret.encode("utf-8"), payload, hashlib.sha256).hexdigest()


def mint(gateway_id: str, secret: str, ttl_s: float = 300, now: float | None = None) -> str:
    """An original bearer token for ``gateway_id`` expiring ``ttl_s`` seconds after ``now``."""
    issued = time.time() if now is None else now
    exp = int(issued + ttl_s)
    raw = f"{gateway_id}:{exp}:{_sign(gateway_id, exp, secret)}"
    return base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii").rstrip("=")


def _split(token: str) -> tuple[str, int, str]:
    """Decode a token into (gateway id, exp, sig); :class:`Refused` ("malformed") otherwise."""
    if not _B64URL.fullmatch(token) or len(token) % 4 == 1:
        raise Refused("malformed")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("utf-8")
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused("malformed") from exc
    parts = raw.rsplit(":", 2)
    if len(parts) != 3:
        raise Refused("malformed")
    gateway_id, exp_text, sig = parts
    if not gateway_id or not _DIGITS.fullmatch(exp_text) or not _HEX_SHA256.fullmatch(sig):
        raise Refused("malformed", gateway_id or None)
    return gateway_id, int(exp_text), sig


def peek_gateway_id(token: str) -> str | None:
    """The gateway id a token claims, without checking it (None if it cannot be decoded)."""
    try:
        return _split(token)[0]
    except Refused as refusal:
        return refusal.gateway_id


def verify(
    token: str,
    secrets: Mapping[str, Sequence[str]],
    now: float | None = None,
    skew_s: float = 30,
) -> tuple[str, str]:
    """Check an original token against ``secrets`` (gateway id -> accepted secrets).

    Returns ``(gateway_id, "")``; raises :class:`Refused` with reason "malformed" (not a token),
    "unknown" (no secret for that gateway), "forged" (no secret matches the signature) or
    "expired" (``exp + skew_s`` is in the past), checked in that order.
    """
    gateway_id, exp, sig = _split(token)
    accepted = secrets.get(gateway_id) or ()
    if not accepted:
        raise Refused("unknown", gateway_id)
    if not any(hmac.compare_digest(_sign(gateway_id, exp, secret), sig) for secret in accepted):
        raise Refused("forged", gateway_id)
    current = time.time() if now is None else now
    if current > exp + skew_s:
        raise Refused("expired", gateway_id)
    return gateway_id, ""


def _bearer(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header; "malformed" otherwise."""
    if header is None:
        raise Refused("malformed")
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Refused("malformed")
    return token.strip()


# --------------------------------------------------------------------------- wire helpers


def encode_frame(frame: Mapping[str, Any]) -> str:
    """One frame as the original peers put it in a text message: compact JSON plus newline."""
    return json.dumps(frame, separators=(",", ":")) + "\n"


def decode_message(message: str | bytes) -> tuple[str, list[Frame], list[str]]:
    """Split one WebSocket message into (text, frames, unparsable lines); blank lines skipped."""
    text = message if isinstance(message, str) else message.decode("utf-8", "replace")
    frames: list[Frame] = []
    bad: list[str] = []
    for line in text.split("\n"):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            bad.append(line)
            continue
        if isinstance(obj, dict):
            frames.append(obj)
        else:
            bad.append(line)
    return text, frames, bad


def _close_info(ws: ServerConnection | ClientConnection) -> tuple[int, str]:
    """The close code and reason of a finished connection (1006 when no close frame came)."""
    code = ws.close_code
    return (1006 if code is None else code), (ws.close_reason or "")


# --------------------------------------------------------------------------- connector


@dataclass
class BufferEntry:
    """One durable-buffer entry: the frame to replay (``bufferId`` added on the wire)."""

    buffer_id: str
    frame: Frame

    def wire(self) -> Frame:
        """The frame as replayed: the stored frame plus its ``bufferId``."""
        return {**self.frame, "bufferId": self.buffer_id}


@dataclass(eq=False)
class PeerConnection:
    """One WebSocket connection the :class:`OriginalConnector` accepted (refused ones too)."""

    number: int
    ws: ServerConnection
    authorization: str | None = None
    gateway_id: str | None = None
    """The authenticated gateway id (the claimed one for a refused upgrade, when readable)."""
    refused: str | None = None
    """Why the connection was closed right after upgrade (a token reason or "already
    connected"), None if it was accepted."""
    received: list[Frame] = field(default_factory=list)
    sent: list[Frame] = field(default_factory=list)
    platforms: list[str] = field(default_factory=list)
    """Platforms a descriptor was sent for, in hello order."""
    handshaken: bool = False
    buffered_only: bool = False
    """Set by ``going_idle``: live events go to the buffer."""
    replaying: bool = False
    replay_stalled: bool = False
    """True when a replayed entry was not acked within ``ack_timeout_s``: the replay stopped
    and the rest waits for the next handshake."""
    unacked: set[str] = field(default_factory=set)
    """Replayed bufferIds sent on this connection and not acked yet."""
    close_code: int | None = None
    close_reason: str | None = None
    closed: bool = False
    _awaiting: tuple[str, asyncio.Future[None]] | None = None


class OriginalConnector:
    """An original-contract relay connector served on ``127.0.0.1`` (see the module docs)."""

    def __init__(
        self,
        *,
        secrets: Mapping[str, Sequence[str]] | None = None,
        platforms: Iterable[str] = (PLATFORM,),
        labels: Mapping[str, str] | None = None,
        refuse_next: int = 0,
        clock: Callable[[], float] | None = None,
        skew_s: float = 30,
        ack_timeout_s: float = 10.0,
        send_timeout_s: float = 5.0,
    ) -> None:
        self.secrets: dict[str, list[str]] = {
            gid: list(keys) for gid, keys in (secrets or {GATEWAY_ID: [SECRET]}).items()
        }
        self.platforms: set[str] = set(platforms)
        self.labels: dict[str, str] = dict(labels or {})
        self.refuse_next = refuse_next
        """Refuse this many next upgrades with 4401 "unknown", whatever their token."""
        self.clock: Callable[[], float] = clock or time.time
        self.skew_s = skew_s
        self.ack_timeout_s = ack_timeout_s
        self.send_timeout_s = send_timeout_s

        self.upgrades = 0
        """WebSocket upgrade attempts on ``/relay`` (refused ones included)."""
        self.dials_by_gateway: dict[str, int] = {}
        """Upgrade attempts per gateway id claimed by the bearer token (refused included)."""
        self.connections: list[PeerConnection] = []
        self.received: list[Frame] = []
        self.raw_messages: list[str] = []
        self.unparsable: list[str] = []
        self.error_frames_received = 0
        self.performed: list[Frame] = []
        """Outbound actions performed successfully, in order."""
        self.acked: list[str] = []
        """BufferIds removed from the buffer by an ``inbound_ack``, in ack order."""
        self.stray_acks: list[Any] = []
        """``inbound_ack`` bufferIds that matched no buffered entry (duplicates included)."""
        self.replayed: list[str] = []
        """BufferIds sent with a replay, in send order (a re-replay appears again)."""
        self.live_delivered: list[Any] = []
        """Events delivered live (without bufferId)."""
        self.timeline: list[tuple[str, str]] = []
        """("replay", bufferId) when an entry is sent, ("ack", bufferId) when one is acked."""
        self.max_unacked_in_flight = 0
        """Most replayed entries ever outstanding (sent, not acked) on one connection."""

        self._buffers: dict[str, list[BufferEntry]] = {}
        self._live: dict[str, PeerConnection] = {}
        self._buffer_ids = itertools.count(1)
        self._message_ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: Server | None = None
        self.port = 0

    # ---- lifecycle

    @property
    def url(self) -> str:
        """The base URL, ``ws://127.0.0.1:PORT`` (gateways dial ``url + "/relay"``)."""
        return f"ws://127.0.0.1:{self.port}"

    async def start(self, port: int | None = None) -> None:
        """Listen on ``port`` (default: the previous port, or a free one the first time)."""
        self._server = await serve(
            self._handle,
            "127.0.0.1",
            self.port if port is None else port,
            process_request=self._process_request,
            close_timeout=2,
        )
        sockets = list(self._server.sockets)
        self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close every connection (1001) and the server; cancel the replay tasks."""
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            server, self._server = self._server, None
            server.close()
            await asyncio.wait_for(server.wait_closed(), 10)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 3.0) -> None:
        """Wait (bounded) until ``predicate()`` is true."""
        await eventually(predicate, "connector condition", timeout)

    # ---- inspection

    def live(self, gateway_id: str) -> PeerConnection | None:
        """The gateway's accepted, still open connection, if any."""
        return self._live.get(gateway_id)

    def pending(self, gateway_id: str) -> list[str]:
        """BufferIds of the gateway's buffered entries not acked yet, in replay order."""
        return [entry.buffer_id for entry in self._buffers.get(gateway_id, [])]

    def received_of(self, frame_type: str) -> list[Frame]:
        """Every received frame of ``frame_type``."""
        return [frame for frame in self.received if frame.get("type") == frame_type]

    def descriptor_for(self, platform: str) -> Frame:
        """The original descriptor for ``platform`` (no supported_ops/features/max_frame_bytes)."""
        return {
            "contract_version": 1,
            "platform": platform,
            "label": self.labels.get(platform, platform.title()),
            "max_message_length": 4096,
            "supports_draft_streaming": False,
            "supports_edit": True,
            "supports_threads": False,
            "markdown_dialect": "plain",
            "len_unit": "chars",
        }

    # ---- durable buffer and delivery

    def buffer(self, gateway_id: str, event: Any) -> str:
        """Queue ``event`` as an ``inbound`` frame's event; returns its bufferId.

        The buffer is replayed on the gateway's next handshake (or picked up by a replay in
        progress).
        """
        return self.buffer_frame(gateway_id, {"type": "inbound", "event": event})

    def buffer_frame(self, gateway_id: str, frame: Mapping[str, Any]) -> str:
        """Queue a whole frame (e.g. ``passthrough_forward``); returns its bufferId."""
        entry = BufferEntry(f"b-{next(self._buffer_ids)}", dict(frame))
        self._buffers.setdefault(gateway_id, []).append(entry)
        return entry.buffer_id

    async def deliver(self, gateway_id: str, event: Any) -> str | None:
        """Deliver ``event`` live, or buffer it behind a replay / while idle / while away.

        Returns the bufferId when it was buffered, None when it was sent live.
        """
        conn = self._live.get(gateway_id)
        if (
            conn is None
            or not conn.handshaken
            or conn.replaying
            or conn.buffered_only
            or self._buffers.get(gateway_id)
        ):
            return self.buffer(gateway_id, event)
        try:
            await self._send(conn, {"type": "inbound", "event": event})
        except (ConnectionClosed, TimeoutError):
            return self.buffer(gateway_id, event)
        self.live_delivered.append(event)
        return None

    async def push_raw(self, gateway_id: str, text: str) -> None:
        """Send ``text`` as is (one text message) on the gateway's live connection."""
        conn = self._live.get(gateway_id)
        if conn is None:
            raise LookupError(f"no live connection for {gateway_id!r}")
        await asyncio.wait_for(conn.ws.send(text), self.send_timeout_s)

    async def push(self, gateway_id: str, frame: Mapping[str, Any]) -> None:
        """Send one frame on the gateway's live connection."""
        await self.push_raw(gateway_id, encode_frame(frame))

    async def kick(self, gateway_id: str, code: int = 1011, reason: str = "") -> None:
        """Close the gateway's live connection with ``code`` and ``reason``."""
        conn = self._live.get(gateway_id)
        if conn is None:
            raise LookupError(f"no live connection for {gateway_id!r}")
        await self._close(conn, code, reason)

    # ---- server internals

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.path.split("?", 1)[0] != RELAY_PATH:
            return connection.respond(HTTPStatus.NOT_FOUND, "not found\n")
        self.upgrades += 1
        try:
            claimed = peek_gateway_id(_bearer(request.headers.get("Authorization")))
        except Refused:
            claimed = None
        if claimed is not None:
            self.dials_by_gateway[claimed] = self.dials_by_gateway.get(claimed, 0) + 1
        return None

    def _authorize(self, conn: PeerConnection) -> str:
        with contextlib.suppress(Refused):
            conn.gateway_id = peek_gateway_id(_bearer(conn.authorization))
        if self.refuse_next > 0:
            self.refuse_next -= 1
            raise Refused("unknown", conn.gateway_id)
        token = _bearer(conn.authorization)
        gateway_id, _ = verify(token, self.secrets, now=self.clock(), skew_s=self.skew_s)
        return gateway_id

    async def _close(self, conn: PeerConnection, code: int, reason: str) -> None:
        if conn.close_code is None:
            conn.close_code, conn.close_reason = code, reason
        await conn.ws.close(code, reason)

    async def _handle(self, ws: ServerConnection) -> None:
        request = ws.request
        conn = PeerConnection(
            number=len(self.connections) + 1,
            ws=ws,
            authorization=None if request is None else request.headers.get("Authorization"),
        )
        self.connections.append(conn)
        try:
            try:
                gateway_id = self._authorize(conn)
            except Refused as refusal:
                conn.refused = refusal.reason
                await self._close(conn, 4401, refusal.reason)
                return
            conn.gateway_id = gateway_id
            if gateway_id in self._live:
                conn.refused = "already connected"
                await self._close(conn, 1008, "already connected")
                return
            self._live[gateway_id] = conn
            try:
                async for message in ws:
                    await self._on_message(conn, message)
            except ConnectionClosed:
                pass
            finally:
                if self._live.get(gateway_id) is conn:
                    del self._live[gateway_id]
        finally:
            self._finish(conn)

    def _finish(self, conn: PeerConnection) -> None:
        conn.closed = True
        if conn._awaiting is not None and not conn._awaiting[1].done():
            conn._awaiting[1].cancel()
        conn.unacked.clear()
        if conn.close_code is None:
            conn.close_code, conn.close_reason = _close_info(conn.ws)

    async def _send(self, conn: PeerConnection, frame: Frame) -> None:
        await asyncio.wait_for(conn.ws.send(encode_frame(frame)), self.send_timeout_s)
        conn.sent.append(frame)

    async def _on_message(self, conn: PeerConnection, message: str | bytes) -> None:
        text, frames, bad = decode_message(message)
        self.raw_messages.append(text)
        for line in bad:
            _log.warning("original connector: ignoring unparsable line %r", line)
            self.unparsable.append(line)
        for frame in frames:
            self.received.append(frame)
            conn.received.append(frame)
            await self._dispatch(conn, frame)

    async def _dispatch(self, conn: PeerConnection, frame: Frame) -> None:
        kind = frame.get("type")
        if kind == "hello":
            await self._on_hello(conn, frame)
        elif kind == "outbound":
            await self._on_outbound(conn, frame)
        elif kind == "going_idle":
            conn.buffered_only = True
            ack: Frame = {"type": "going_idle_ack"}
            if "requestId" in frame:
                ack["requestId"] = frame["requestId"]
            await self._send(conn, ack)
        elif kind == "inbound_ack":
            self._on_ack(conn, frame.get("bufferId"))
        elif kind == "error":
            self.error_frames_received += 1
        else:
            _log.info("original connector: ignoring frame type %r", kind)

    async def _on_hello(self, conn: PeerConnection, frame: Frame) -> None:
        platform = frame.get("platform")
        if not isinstance(platform, str) or platform not in self.platforms:
            _log.info("original connector: ignoring hello for platform %r", platform)
            return
        await self._send(conn, {"type": "descriptor", "descriptor": self.descriptor_for(platform)})
        conn.platforms.append(platform)
        if not conn.handshaken:
            conn.handshaken = True
            conn.replaying = True
            task = asyncio.get_running_loop().create_task(self._replay(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _on_outbound(self, conn: PeerConnection, frame: Frame) -> None:
        action = frame.get("action")
        op = action.get("op") if isinstance(action, dict) else None
        result: Frame
        if not isinstance(action, dict) or op not in OUTBOUND_OPS:
            result = {"success": False, "error": "unsupported op"}
        elif op in CONTENT_OPS and not (
            isinstance(action.get("content"), str) and action.get("content")
        ):
            result = {"success": False, "error": "empty content"}
        else:
            self.performed.append(dict(action))
            result = {"success": True, "message_id": f"om-{next(self._message_ids)}"}
        reply: Frame = {"type": "outbound_result"}
        if "requestId" in frame:
            reply["requestId"] = frame["requestId"]
        reply["result"] = result
        await self._send(conn, reply)

    def _on_ack(self, conn: PeerConnection, buffer_id: Any) -> None:
        entries = self._buffers.get(conn.gateway_id or "", [])
        for index, entry in enumerate(entries):
            if entry.buffer_id == buffer_id:
                del entries[index]
                self.acked.append(entry.buffer_id)
                self.timeline.append(("ack", entry.buffer_id))
                break
        else:
            self.stray_acks.append(buffer_id)
        if isinstance(buffer_id, str):
            conn.unacked.discard(buffer_id)
        awaiting = conn._awaiting
        if awaiting is not None and awaiting[0] == buffer_id and not awaiting[1].done():
            awaiting[1].set_result(None)

    async def _replay(self, conn: PeerConnection) -> None:
        """Send the buffer one entry at a time, each only after the previous one was acked."""
        entries = self._buffers.setdefault(conn.gateway_id or "", [])
        loop = asyncio.get_running_loop()
        while entries:
            entry = entries[0]
            acked: asyncio.Future[None] = loop.create_future()
            conn._awaiting = (entry.buffer_id, acked)
            conn.unacked.add(entry.buffer_id)
            self.max_unacked_in_flight = max(self.max_unacked_in_flight, len(conn.unacked))
            self.replayed.append(entry.buffer_id)
            self.timeline.append(("replay", entry.buffer_id))
            try:
                await self._send(conn, entry.wire())
                await asyncio.wait_for(acked, self.ack_timeout_s)
            except TimeoutError:
                _log.warning("original connector: %s not acked, replay stalled", entry.buffer_id)
                conn.replay_stalled = True
                return
            except ConnectionClosed:
                return
            finally:
                conn._awaiting = None
        conn.replaying = False


# --------------------------------------------------------------------------- gateway


class Received(NamedTuple):
    """One ``inbound`` frame as the gateway received it."""

    event: Any
    buffer_id: str | None


@dataclass(eq=False)
class _Session:
    ws: ClientConnection
    handshake: asyncio.Future[None]
    handshaken: bool = False
    requests: dict[str, asyncio.Future[Frame]] = field(default_factory=dict)
    idle_waiters: list[tuple[str | None, asyncio.Future[None]]] = field(default_factory=list)

    def fail_pending(self, error: BaseException) -> None:
        """Fail every request and going_idle still waiting on this connection."""
        waiting: list[asyncio.Future[Any]] = [*self.requests.values()]
        waiting += [waiter for _, waiter in self.idle_waiters]
        for future in waiting:
            if not future.done():
                future.set_exception(error)
                future.add_done_callback(_retrieve)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a failed future's exception as seen (its awaiting caller may have gone)."""
    if not future.cancelled():
        future.exception()


class OriginalGateway:
    """An original-contract gateway client with the original redial policy."""

    def __init__(
        self,
        base_url: str,
        *,
        gateway_id: str = GATEWAY_ID,
        secret: str = SECRET,
        platform: str = PLATFORM,
        bot_id: str = BOT_ID,
        hellos: Sequence[tuple[str, str]] | None = None,
        token_factory: Callable[[], str] | None = None,
        ttl_s: float = 300,
        handshake_timeout_s: float = 30.0,
        startup_retry_s: float = 1.0,
        startup_retries: int = 5,
        connect_retry_s: float = 0.05,
        max_dials: int = 1000,
        request_timeout_s: float = 5.0,
        open_timeout_s: float = 5.0,
        auto_ack: bool = True,
    ) -> None:
        self.url = base_url.rstrip("/") + RELAY_PATH
        self.gateway_id = gateway_id
        self.secret = secret
        self.hellos: list[tuple[str, str]] = list(hellos or [(platform, bot_id)])
        """(platform, botId) pairs, one ``hello`` each after connecting."""
        self.token_factory: Callable[[], str] = token_factory or (
            lambda: mint(self.gateway_id, self.secret, ttl_s)
        )
        self.handshake_timeout_s = handshake_timeout_s
        self.startup_retry_s = startup_retry_s
        self.startup_retries = startup_retries
        self.connect_retry_s = connect_retry_s
        """Pause after a dial that failed before the upgrade (refused TCP, HTTP error)."""
        self.max_dials = max_dials
        self.request_timeout_s = request_timeout_s
        self.open_timeout_s = open_timeout_s
        self.auto_ack = auto_ack
        """False: buffered frames are not acked until :meth:`ack` is called."""

        self.dials = 0
        self.handshakes = 0
        self.closes: list[tuple[int, str]] = []
        """(code, reason) of every upgraded connection that ended, in order."""
        self.connect_failures = 0
        self.handshake_timeouts = 0
        self.startup_races = 0
        """Start-up 4401s retried after ``startup_retry_s``."""
        self.tokens: list[str] = []
        self.descriptors: list[Frame] = []
        self.received_frames: list[Frame] = []
        self.received_events: list[Received] = []
        self.raw_messages: list[str] = []
        self.unparsable: list[str] = []
        self.error_frames_received = 0
        self.unacked: list[str] = []
        """BufferIds received while ``auto_ack`` is off and not acked yet."""
        self.stopped_reason: str | None = None
        """Why the dial loop ended: "revoked", "refused", "max_dials", "stopped" or "error"."""
        self.error: BaseException | None = None

        self._session: _Session | None = None
        self._task: asyncio.Task[None] | None = None
        self._request_ids = itertools.count(1)
        self._race_retries_used = 0

    # ---- lifecycle

    async def start(self) -> None:
        """Start the dial loop as a task."""
        if self._task is None or self._task.done():
            self.stopped_reason = None
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the dial loop and close the connection (bounded)."""
        task, self._task = self._task, None
        if task is not None:
            if not task.done():
                task.cancel()
            await asyncio.wait({task}, timeout=10)
        if self.stopped_reason is None:
            self.stopped_reason = "stopped"

    @property
    def running(self) -> bool:
        """True while the dial loop runs."""
        return self._task is not None and not self._task.done()

    @property
    def connected(self) -> bool:
        """True while a connection is open and handshaken."""
        return self._session is not None and self._session.handshaken

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 3.0) -> None:
        """Wait (bounded) until ``predicate()`` is true."""
        await eventually(predicate, "gateway condition", timeout)

    async def wait_connected(self, timeout: float = 3.0) -> None:
        """Wait (bounded) until the gateway is connected and handshaken."""
        await eventually(lambda: self.connected, "gateway handshake", timeout)

    # ---- requests

    async def send(self, chat_id: str, content: str | None, **fields: Any) -> Frame:
        """Perform ``op: send`` (``content`` omitted when None); returns the ``result`` dict."""
        action: Frame = {"op": "send", "chat_id": chat_id}
        if content is not None:
            action["content"] = content
        action.update(fields)
        return await self.request(action)

    async def request(self, action: Mapping[str, Any]) -> Frame:
        """Send an ``outbound`` frame with ``action``; returns its ``result`` (TimeoutError)."""
        async with asyncio.timeout(self.request_timeout_s):
            session = await self._ready()
            request_id = f"r-{next(self._request_ids)}"
            future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
            session.requests[request_id] = future
            try:
                frame = {"type": "outbound", "requestId": request_id, "action": dict(action)}
                await session.ws.send(encode_frame(frame))
                return await future
            finally:
                session.requests.pop(request_id, None)

    async def going_idle(self, *, with_request_id: bool = True) -> bool:
        """Send ``going_idle``; True once ``going_idle_ack`` came, False on timeout or drop."""
        try:
            async with asyncio.timeout(self.request_timeout_s):
                session = await self._ready()
                request_id = f"r-{next(self._request_ids)}" if with_request_id else None
                waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                session.idle_waiters.append((request_id, waiter))
                frame: Frame = {"type": "going_idle"}
                if request_id is not None:
                    frame["requestId"] = request_id
                await session.ws.send(encode_frame(frame))
                await waiter
        except (TimeoutError, ConnectionError, ConnectionClosed):
            return False
        return True

    async def send_raw(self, text: str) -> None:
        """Send ``text`` as is (one text message) on the current connection."""
        session = self._session
        if session is None:
            raise ConnectionError("not connected")
        await asyncio.wait_for(session.ws.send(text), self.request_timeout_s)

    async def send_frame(self, frame: Mapping[str, Any]) -> None:
        """Send one frame on the current connection."""
        await self.send_raw(encode_frame(frame))

    async def ack(self, buffer_id: str) -> None:
        """Ack a buffered frame by hand (with ``auto_ack`` off)."""
        await self.send_frame({"type": "inbound_ack", "bufferId": buffer_id})
        with contextlib.suppress(ValueError):
            self.unacked.remove(buffer_id)

    async def _ready(self) -> _Session:
        while not self.connected:
            await asyncio.sleep(0.005)
        assert self._session is not None
        return self._session

    # ---- dial loop

    async def _run(self) -> None:
        try:
            while True:
                if self.dials >= self.max_dials:
                    self.stopped_reason = "max_dials"
                    return
                self.dials += 1
                token = self.token_factory()
                self.tokens.append(token)
                try:
                    ws = await connect(
                        self.url,
                        additional_headers={"Authorization": f"Bearer {token}"},
                        open_timeout=self.open_timeout_s,
                        close_timeout=2,
                    )
                except (OSError, TimeoutError, InvalidHandshake) as exc:
                    _log.info("original gateway: dial failed: %r", exc)
                    self.connect_failures += 1
                    await asyncio.sleep(self.connect_retry_s)
                    continue
                code, reason, handshaken = await self._serve(ws)
                self.closes.append((code, reason))
                if code != 4401 or reason == "expired":
                    continue
                if handshaken:
                    self.stopped_reason = "revoked"
                    return
                if self._race_retries_used >= self.startup_retries:
                    self.stopped_reason = "refused"
                    return
                self._race_retries_used += 1
                self.startup_races += 1
                await asyncio.sleep(self.startup_retry_s)
        except asyncio.CancelledError:
            self.stopped_reason = self.stopped_reason or "stopped"
            raise
        except Exception as exc:
            _log.exception("original gateway: dial loop failed")
            self.stopped_reason = "error"
            self.error = exc

    async def _serve(self, ws: ClientConnection) -> tuple[int, str, bool]:
        """Run one connection to its end; returns (close code, reason, handshaken)."""
        session = _Session(ws, asyncio.get_running_loop().create_future())
        self._session = session
        reader = asyncio.get_running_loop().create_task(self._read(session))
        try:
            with contextlib.suppress(ConnectionClosed):
                for platform, bot_id in self.hellos:
                    hello = {"type": "hello", "platform": platform, "botId": bot_id}
                    await ws.send(encode_frame(hello))
            await asyncio.wait(
                {reader, session.handshake},
                timeout=self.handshake_timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not session.handshaken and not reader.done():
                self.handshake_timeouts += 1
                await ws.close(1000, "handshake timeout")
            await reader
            code, reason = _close_info(ws)
            return code, reason, session.handshaken
        finally:
            self._session = None
            if not session.handshake.done():
                session.handshake.cancel()
            session.fail_pending(ConnectionError("connection closed"))
            await ws.close()
            if not reader.done():
                reader.cancel()
                await asyncio.wait({reader}, timeout=5)

    async def _read(self, session: _Session) -> None:
        try:
            async for message in session.ws:
                text, frames, bad = decode_message(message)
                self.raw_messages.append(text)
                for line in bad:
                    _log.warning("original gateway: ignoring unparsable line %r", line)
                    self.unparsable.append(line)
                for frame in frames:
                    self.received_frames.append(frame)
                    await self._on_frame(session, frame)
        except ConnectionClosed:
            pass

    async def _on_frame(self, session: _Session, frame: Frame) -> None:
        kind = frame.get("type")
        if kind == "descriptor":
            descriptor = frame.get("descriptor")
            self.descriptors.append(descriptor if isinstance(descriptor, dict) else {})
            if not session.handshaken:
                session.handshaken = True
                self.handshakes += 1
                self._race_retries_used = 0
                if not session.handshake.done():
                    session.handshake.set_result(None)
        elif kind in BUFFERED_FRAME_TYPES:
            buffer_id = frame.get("bufferId")
            if kind == "inbound":
                self.received_events.append(
                    Received(frame.get("event"), buffer_id if isinstance(buffer_id, str) else None)
                )
            if isinstance(buffer_id, str):
                if self.auto_ack:
                    ack = {"type": "inbound_ack", "bufferId": buffer_id}
                    with contextlib.suppress(ConnectionClosed):
                        await session.ws.send(encode_frame(ack))
                else:
                    self.unacked.append(buffer_id)
        elif kind == "outbound_result":
            future = session.requests.get(str(frame.get("requestId")))
            result = frame.get("result")
            if future is not None and not future.done():
                if isinstance(result, dict):
                    future.set_result(result)
                else:
                    future.set_exception(ValueError(f"malformed outbound_result: {frame!r}"))
        elif kind == "going_idle_ack":
            request_id = frame.get("requestId")
            for index, (expected, waiter) in enumerate(session.idle_waiters):
                if request_id is None or expected == request_id:
                    del session.idle_waiters[index]
                    if not waiter.done():
                        waiter.set_result(None)
                    break
        elif kind == "error":
            self.error_frames_received += 1
        else:
            _log.info("original gateway: ignoring frame type %r", kind)

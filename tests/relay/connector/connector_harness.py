"""The connector harness shared by the connector tests: a real connector per test, our transports
and raw WebSocket clients aimed at it, and small bounded helpers.  Everything a test opens is
closed by :meth:`Harness.close`."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from relay.client.transport import WebSocketRelayTransport
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from relay.wire.auth import mint_token
from relay.wire.compat import ACKED_LIVE, OUR_FEATURES, features_header
from relay.wire.frames import EventSource, InboundEvent
from statecore.store import Store
from tests.waiting import BOUND, eventually

SECRETS: dict[str, list[str | bytes]] = {
    "gw-a": ["secret-a"],
    "gw-b": ["secret-b"],
    "gw-rot": ["new-secret", "old-secret"],
}

Handler = Callable[[InboundEvent], Awaitable[None]]


def is_live(connector: Connector, gateway_id: str) -> bool:
    """True once the connector delivers ``gateway_id``'s inbound live (its replay finished).

    Reads the connector's private instance table (falling back to ``connected``).  An event
    injected while the post-handshake replay runs is buffered and replayed rather than sent
    live; tests that assert live delivery (no bufferId, nothing buffered) wait for this first.
    The race itself is pinned by ``test_event_arriving_as_replay_finishes_is_delivered``.
    """
    instances = getattr(connector, "_instances", None)
    if not isinstance(instances, dict):
        return connector.connected(gateway_id)
    instance = instances.get(gateway_id)
    return instance is not None and bool(getattr(instance, "live", True))


class Recorder:
    """An inbound handler that records every event it handled."""

    def __init__(self) -> None:
        self.events: list[InboundEvent] = []

    async def __call__(self, event: InboundEvent) -> None:
        self.events.append(event)

    @property
    def texts(self) -> list[str]:
        return [e.text for e in self.events]


class Harness:
    """Starts connectors, transports and raw clients, and tears every one of them down."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.platform = LoopbackPlatform()
        self.connectors: list[Connector] = []
        self.transports: list[WebSocketRelayTransport] = []
        self.sockets: list[ClientConnection] = []

    async def start(
        self,
        *,
        drivers: Mapping[str, Any] | None = None,
        secrets: Mapping[str, Sequence[str | bytes]] = SECRETS,
        **options: Any,
    ) -> Connector:
        # Most tests here exercise something other than the egress guard, so they open egress
        # explicitly; the provenance default is pinned by tests that pass open_egress=False.
        if "tenants" not in options:
            options.setdefault("open_egress", True)
        connector = Connector(
            self.store,
            secrets=secrets,
            drivers=drivers if drivers is not None else {"loopback": self.platform},
            **options,
        )
        self.connectors.append(connector)
        await connector.start()
        return connector

    def transport(
        self, connector: Connector, gateway_id: str, platform: str = "loopback", **options: Any
    ) -> WebSocketRelayTransport:
        options.setdefault("reconnect", False)
        options.setdefault("secret", SECRETS[gateway_id][0])
        transport = WebSocketRelayTransport(
            connector.url, platform, f"bot-{gateway_id}", gateway_id=gateway_id, **options
        )
        self.transports.append(transport)
        return transport

    async def gateway(
        self,
        connector: Connector,
        gateway_id: str,
        handler: Handler | None = None,
        **options: Any,
    ) -> WebSocketRelayTransport:
        """A transport connected, handshaken and receiving live."""
        transport = self.transport(connector, gateway_id, **options)
        if handler is not None:
            transport.set_inbound_handler(handler)
        await asyncio.wait_for(transport.connect(), BOUND)
        await transport.handshake(BOUND)
        await eventually(lambda: is_live(connector, gateway_id), f"{gateway_id} live")
        return transport

    async def raw(
        self,
        connector: Connector,
        gateway_id: str | None = "gw-a",
        *,
        token: str | None = None,
        header: str | None = None,
        path: str = "/relay",
        announce: bool = True,
    ) -> ClientConnection:
        """A raw WebSocket client, authenticated as ``gateway_id`` unless told otherwise, that
        announces our features on the upgrade (``announce=False``: an original gateway)."""
        if header is None and token is None and gateway_id is not None:
            token = mint_token(gateway_id, SECRETS[gateway_id][0])
        if header is None and token is not None:
            header = f"Bearer {token}"
        headers = [] if header is None else [("Authorization", header)]
        if announce:
            # Our additions, except acked live delivery: these raw clients do not ack live
            # events (the tests of that feature announce it themselves).
            headers.append(features_header(f for f in OUR_FEATURES if f != ACKED_LIVE))
        ws = await connect(
            connector.url + path,
            additional_headers=headers,
            compression=None,
            proxy=None,
            open_timeout=BOUND,
            close_timeout=1,
        )
        self.sockets.append(ws)
        return ws

    async def close(self) -> None:
        for transport in self.transports:
            await transport.disconnect(budget_s=2)
        for ws in self.sockets:
            await asyncio.wait_for(ws.close(), BOUND)
        for connector in self.connectors:
            await asyncio.wait_for(connector.stop(), BOUND)


async def send_line(ws: ClientConnection, obj: Mapping[str, Any] | str) -> None:
    await ws.send((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")


_UNREAD: weakref.WeakKeyDictionary[ClientConnection, list[str]] = weakref.WeakKeyDictionary()
"""Lines of a message already received on a socket and not handed out yet: the connector may
put several lines in one message (a replay does), as the framing allows."""


async def recv_frame(ws: ClientConnection, timeout: float = BOUND) -> dict[str, Any]:
    """The next frame the connector sent (the next line: a message may carry several)."""
    unread = _UNREAD.setdefault(ws, [])
    while not unread:
        message = await asyncio.wait_for(ws.recv(), timeout)
        unread.extend(line for line in str(message).splitlines() if line.strip())
    frame = json.loads(unread.pop(0))
    assert isinstance(frame, dict)
    return frame


async def nothing_arrives(ws: ClientConnection, within: float = 0.2) -> bool:
    """True when no frame arrives on ``ws`` within ``within`` seconds (none left unread)."""
    if _UNREAD.get(ws):
        return False
    try:
        await asyncio.wait_for(ws.recv(), within)
    except TimeoutError:
        return True
    return False


async def close_code(ws: ClientConnection, timeout: float = BOUND) -> int | None:
    """Read until the connector closes ``ws``; return the close code it sent."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            await asyncio.wait_for(ws.recv(), max(0.0, deadline - time.monotonic()))
    except ConnectionClosed as exc:
        return None if exc.rcvd is None else exc.rcvd.code


async def raw_hello(ws: ClientConnection, platform: str = "loopback") -> dict[str, Any]:
    await send_line(ws, {"type": "hello", "platform": platform, "botId": "bot"})
    return await recv_frame(ws)


async def raw_request(
    ws: ClientConnection, request_id: str, action: Mapping[str, Any], **extra: Any
) -> dict[str, Any]:
    """Send one outbound frame and return its result object."""
    await send_line(ws, {"type": "outbound", "requestId": request_id, "action": action, **extra})
    frame = await recv_frame(ws)
    assert (frame["type"], frame["requestId"]) == ("outbound_result", request_id), frame
    result = frame["result"]
    assert isinstance(result, dict)
    return result


def send_action(chat_id: str, text: str, **metadata: object) -> dict[str, Any]:
    action: dict[str, Any] = {"op": "send", "chat_id": chat_id, "content": text}
    if metadata:
        action["metadata"] = metadata
    return action


def no_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Log records above WARNING (there must be none for bad input)."""
    return [r.getMessage() for r in caplog.records if r.levelno > logging.WARNING]


def make_event(n: int, chat_id: str = "c1") -> InboundEvent:
    return InboundEvent(
        text=f"e{n}",
        message_id=f"x{n}",
        source=EventSource(platform="loopback", chat_id=chat_id, chat_type="dm", user_id="u"),
    )


# -- authentication at the upgrade -----------------------------------------------------------------

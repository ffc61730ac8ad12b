"""A hostile-input run against the connector's socket, all at once: random bytes, invalid
UTF-8, wrong types for every field of every frame a gateway may send, huge and deeply nested
frames, thousands of lines in one message, slow and half-open sockets, forged, expired, replayed
and other gateways' tokens.  Afterwards a legitimate gateway still connects and round-trips a
send, nothing was performed for anyone else, and the connector's memory stayed bounded.  Real
sockets on 127.0.0.1; the seed is fixed, so a failure replays."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import tracemalloc
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from relay.wire.auth import mint_token
from tests.relay.connector.connector_harness import (
    BOUND,
    SECRETS,
    Harness,
    eventually,
    is_live,
    raw_hello,
    raw_request,
    recv_frame,
    send_action,
)

SEED = 20_261_201
MEMORY_BOUND = 64 * 1024 * 1024
"""Peak bytes the whole test process may allocate on top of its start during the attack."""

# Every field of every frame a gateway sends, with values of every wrong JSON type.
WRONG = [None, True, -1, 1.5, "x", [], {}, [1, [2]], {"a": {"b": None}}]
FRAMES: dict[str, dict[str, Any]] = {
    "hello": {"type": "hello", "platform": "loopback", "botId": "bot"},
    "outbound": {
        "type": "outbound",
        "requestId": "r",
        "action": {"op": "send", "chat_id": "c1", "content": "x"},
        "idempotencyKey": "k",
    },
    "inbound_ack": {"type": "inbound_ack", "bufferId": "b"},
    "going_idle": {"type": "going_idle"},
    "interrupt": {"type": "interrupt", "requestId": "r"},
}


def wrong_type_lines(rng: random.Random) -> list[str]:
    """Each frame with each field (and the action's fields) set to each wrong type."""
    lines = []
    for frame in FRAMES.values():
        for field in frame:
            for value in WRONG:
                lines.append(json.dumps({**frame, field: value}))
        if "action" in frame:
            for field in frame["action"]:
                for value in WRONG:
                    lines.append(json.dumps({**frame, "action": {**frame["action"], field: value}}))
    rng.shuffle(lines)
    return lines


async def hostile_socket(harness: Harness, url: str, rng: random.Random, kind: str) -> None:
    """One attacker; every way it ends is fine, as long as the connector stays up."""
    with contextlib.suppress(ConnectionClosed, InvalidStatus, OSError, TimeoutError):
        if kind == "half-open":  # a TCP connection that never speaks
            host, port = url.removeprefix("ws://").split(":")
            with socket.create_connection((host, int(port)), timeout=BOUND) as sock:
                sock.sendall(b"GET /relay HTTP/1.1\r\nHost: x\r\n")  # and never finishes
                await asyncio.sleep(1.0)
            return
        token = {
            "forged": mint_token("gw-a", "not-the-secret"),
            "expired": mint_token("gw-a", SECRETS["gw-a"][0], now=1_000_000.0),
            "other": mint_token("gw-b", SECRETS["gw-b"][0]),
            "replayed": harness_token,
        }.get(kind, mint_token("gw-b", SECRETS["gw-b"][0]))
        async with connect(
            url + "/relay",
            additional_headers=[("Authorization", f"Bearer {token}")],
            open_timeout=BOUND,
            close_timeout=1,
            max_size=None,
        ) as ws:
            await attack(ws, rng, kind)


harness_token = ""


async def attack(ws: ClientConnection, rng: random.Random, kind: str) -> None:
    if kind in ("forged", "expired"):
        await ws.recv()  # the connector closes: the recv raises ConnectionClosed
        return
    if kind == "replayed":  # a genuine token used a second time: it is gw-a, nothing more
        await ws.send(json.dumps(FRAMES["hello"]) + "\n")
        return
    if kind == "bytes":
        for _ in range(50):
            await ws.send(rng.randbytes(rng.randint(1, 4096)))
    elif kind == "utf8":
        await ws.send(b'{"type": "hello", "platform": "\xff\xfe\xfd"}\n')
    elif kind == "types":
        await ws.send(json.dumps(FRAMES["hello"]) + "\n")
        for line in wrong_type_lines(rng):
            await ws.send(line + "\n")
    elif kind == "huge":
        await ws.send("[" * 200_000 + "]" * 200_000)  # deeply nested and over the frame cap
    elif kind == "nested":
        await ws.send(
            json.dumps(FRAMES["hello"])[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}\n"
        )
    elif kind == "lines":
        await ws.send("".join(json.dumps(FRAMES["inbound_ack"]) + "\n" for _ in range(20_000)))
    elif kind == "slow":
        for char in json.dumps(FRAMES["hello"]):  # a frame dribbled one character at a time
            await ws.send(char)
            await asyncio.sleep(0.01)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ws.recv(), 0.5)


@pytest.mark.asyncio
async def test_after_a_hostile_run_a_gateway_still_connects_and_round_trips(
    mh: Harness,
) -> None:
    global harness_token  # noqa: PLW0603 -- the one genuine token the attackers replay
    rng = random.Random(SEED)
    connector = await mh.start(open_egress=False, max_frame_bytes=65_536)
    harness_token = mint_token("gw-a", SECRETS["gw-a"][0])
    kinds = [
        "half-open",
        "forged",
        "expired",
        "other",
        "replayed",
        "bytes",
        "utf8",
        "types",
        "huge",
        "nested",
        "lines",
        "slow",
    ]
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        attackers = [
            hostile_socket(mh, connector.url, random.Random(rng.random()), k) for k in kinds * 3
        ]
        await asyncio.wait_for(asyncio.gather(*attackers), 60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"hostile run: peak {peak - base} bytes allocated over the start")
    assert peak - base < MEMORY_BOUND, f"peak {peak - base} bytes over the start"

    # A legitimate gateway: connects, receives, and its reply to that chat is performed.
    ws = await mh.raw(connector, "gw-a")
    await raw_hello(ws)
    await eventually(lambda: is_live(connector, "gw-a"), "gw-a live")
    await mh.platform.inject("c1", "still here")
    frame = await recv_frame(ws)
    assert frame["event"]["text"] == "still here", frame
    result = await raw_request(ws, "ok", send_action("c1", "a reply"))
    assert result["success"] is True, result
    # Nothing any attacker asked for was performed: only the legitimate reply went out.
    assert [a.content for a in mh.platform.sent] == ["a reply"]

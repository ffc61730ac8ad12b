"""The relay transport against raw ``websockets`` on loopback, measured in the same run.

Run: ``.venv/bin/python benchmarks/bench_relay.py`` (``--check`` exits 1 if a target is missed,
``--quick`` for a smoke run).

* ``rtt``: sequential request/response round trips through ``WebSocketRelayTransport.request``
  against a connector that answers each outbound with its result, vs a raw ``websockets``
  client and server exchanging the same JSON lines (json encode, send, recv, json decode).
  Target >= 0.85x the raw rate.
* ``inbound``: a connector pushes buffered inbound events; the transport decodes them, runs the
  handler outside the reader and acks each one after it, vs raw one-way ``websockets``
  throughput of the same frames (received and json-decoded).  Target >= 0.85x.  The stand-in
  connector shares the event loop, so its own work is timed too: it checks the acks against
  the exact acks owed, in order (one string comparison per ack message, falling back to parsing
  each line), and the round fails unless every event was handled once and acked once.
* ``memory``: tracemalloc of one idle connected transport (reported, no target).

Both sides run in one process and one event loop, compression off. Each round measures ours
and the raw baseline back to back; the rates printed are medians over rounds, and the ratio
checked is the median of the rounds' own ratios (a load change between rounds moves both sides
of a round together).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

from relay.client.transport import WebSocketRelayTransport

RESULTS: list[tuple[str, float, str, bool]] = []

DESCRIPTOR = {
    "contract_version": 1,
    "platform": "bench",
    "label": "Bench",
    "max_message_length": 4096,
    "supports_draft_streaming": False,
    "supports_edit": True,
    "supports_threads": True,
    "markdown_dialect": "plain",
    "len_unit": "chars",
}
TEXT = "x" * 120  # with the envelope, ~200-byte frames


def _inbound_line(n: int) -> str:
    event = {
        "content": TEXT,
        "message_type": "text",
        "message_id": str(n),
        "source": {"platform": "bench", "chat_id": "c1", "chat_type": "dm", "user_id": "u1"},
    }
    return json.dumps({"type": "inbound", "event": event, "bufferId": f"b{n}"}) + "\n"


class Connector:
    """A minimal connector: descriptor on hello, a result per outbound, pushes on demand."""

    def __init__(self, push: int = 0) -> None:
        self.push = push
        # Built before the clock starts, as in the raw baseline.
        self.lines = [_inbound_line(n) for n in range(push)]
        # Every ack the gateway owes, in handling order, in the protocol's compact encoding.
        self.expected_acks = "".join(
            f'{{"type":"inbound_ack","bufferId":"b{n}"}}\n' for n in range(push)
        )
        self.verified = 0  # how far into expected_acks the gateway's acks matched exactly
        self.acks = 0
        self.done = asyncio.Event()

    async def handle(self, ws: ServerConnection) -> None:
        async for raw in ws:
            text = str(raw)
            if text and self.expected_acks.startswith(text, self.verified):
                # Exactly the next acks owed, in order: verified by one comparison, so that this
                # stand-in connector's own parsing stays out of the gateway's measurement.
                self.verified += len(text)
                self._acked(text.count("\n"))
                continue
            for line in text.splitlines():
                if not line:
                    continue
                frame = json.loads(line)
                kind = frame["type"]
                if kind == "outbound":
                    result = {"success": True, "message_id": frame["requestId"]}
                    await ws.send(
                        json.dumps(
                            {
                                "type": "outbound_result",
                                "requestId": frame["requestId"],
                                "result": result,
                            }
                        )
                        + "\n"
                    )
                elif kind == "hello":
                    await ws.send(
                        json.dumps({"type": "descriptor", "descriptor": DESCRIPTOR}) + "\n"
                    )
                    for pushed in self.lines:
                        await ws.send(pushed)
                elif kind == "inbound_ack":
                    self._acked(1)

    def _acked(self, count: int) -> None:
        self.acks += count
        if self.acks >= self.push:
            self.done.set()


async def _server(handler: Callable[[ServerConnection], Awaitable[None]]) -> tuple[Any, str]:
    server = await serve(handler, "127.0.0.1", 0, compression=None)
    port = next(iter(server.sockets)).getsockname()[1]
    return server, f"ws://127.0.0.1:{port}"


async def rtt_round(n: int) -> tuple[float, float]:
    """(transport requests/s, raw round trips/s) for n sequential round trips each."""
    connector = Connector()
    server, url = await _server(connector.handle)
    try:
        transport = WebSocketRelayTransport(url, "bench", "bot", reconnect=False)
        await transport.connect()
        await transport.handshake()
        action = {"op": "send", "chat_id": "c1", "content": TEXT}
        for _ in range(50):  # warm up
            await transport.request(action)
        start = time.perf_counter()
        for _ in range(n):
            result = await transport.request(action)
            assert result.success
        ours = n / (time.perf_counter() - start)
        await transport.disconnect(budget_s=2)

        async with connect(url + "/relay", compression=None, proxy=None) as ws:
            payload = {"action": action, "idempotencyKey": "k"}
            for _ in range(50):
                await _raw_round_trip(ws, payload, 0)
            start = time.perf_counter()
            for i in range(n):
                await _raw_round_trip(ws, payload, i)
            raw = n / (time.perf_counter() - start)
        return ours, raw
    finally:
        server.close()
        await server.wait_closed()


async def _raw_round_trip(ws: Any, payload: dict[str, Any], i: int) -> None:
    frame = {"type": "outbound", "requestId": f"r{i}", **payload}
    await ws.send(json.dumps(frame) + "\n")
    reply = json.loads(await ws.recv())
    assert reply["result"]["success"]


async def inbound_round(n: int) -> tuple[float, float]:
    """(transport inbound events/s handled and acked, raw one-way frames/s)."""
    connector = Connector(push=n)
    server, url = await _server(connector.handle)
    try:
        handled = 0

        async def handler(_: object) -> None:
            nonlocal handled
            handled += 1

        transport = WebSocketRelayTransport(url, "bench", "bot", reconnect=False)
        transport.set_inbound_handler(handler)
        start = time.perf_counter()
        await transport.connect()
        await transport.handshake()
        await asyncio.wait_for(connector.done.wait(), timeout=60)
        ours = n / (time.perf_counter() - start)
        assert handled == n
        assert connector.acks == n, (connector.acks, n)
        await transport.disconnect(budget_s=2)
    finally:
        server.close()
        await server.wait_closed()

    lines = [_inbound_line(i) for i in range(n)]

    async def push(ws: ServerConnection) -> None:
        await ws.recv()
        for line in lines:
            await ws.send(line)

    server, url = await _server(push)
    try:
        async with connect(url, compression=None, proxy=None) as ws:
            start = time.perf_counter()
            await ws.send("go")
            for _ in range(n):
                json.loads(await ws.recv())
            raw = n / (time.perf_counter() - start)
    finally:
        server.close()
        await server.wait_closed()
    return ours, raw


async def idle_memory() -> float:
    """Bytes of Python heap held by one idle connected transport."""
    connector = Connector()
    server, url = await _server(connector.handle)
    try:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        transport = WebSocketRelayTransport(url, "bench", "bot", reconnect=False)
        await transport.connect()
        await transport.handshake()
        await asyncio.sleep(0.05)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        await transport.disconnect(budget_s=2)
        return float(after - before)
    finally:
        server.close()
        await server.wait_closed()


def report(name: str, value: float, target: str, ok: bool) -> None:
    """Record and print one ratio against its target."""
    RESULTS.append((name, value, target, ok))
    print(f"  {name:<40} {value:8.2f}   target {target:<7} {'ok' if ok else 'MISSED'}")


def _paired_ratio(pairs: list[tuple[float, float]]) -> float:
    """The median over rounds of (ours / raw) measured back to back in the same round: a load
    change on the machine between rounds moves both sides of a round together."""
    return statistics.median(ours / raw for ours, raw in pairs)


async def run(args: argparse.Namespace) -> None:
    """Run the selected parts."""
    rounds = 3 if args.quick else 7
    n_rtt = 500 if args.quick else 3000
    n_in = 2000 if args.quick else 20000
    if args.only in (None, "rtt"):
        print(f"request/response round trips ({n_rtt} sequential, {rounds} rounds)")
        pairs = [await rtt_round(n_rtt) for _ in range(rounds)]
        ours = statistics.median(p[0] for p in pairs)
        raw = statistics.median(p[1] for p in pairs)
        print(f"  raw websockets round trips      {raw:10.0f} /s  ({1e6 / raw:.0f} us)  (baseline)")
        print(f"  transport.request               {ours:10.0f} /s  ({1e6 / ours:.0f} us)")
        ratio = _paired_ratio(pairs)
        report("rtt: transport / raw", ratio, ">= 0.85", ratio >= 0.85)
    if args.only in (None, "inbound"):
        print(f"\ninbound throughput ({n_in} buffered events, handler + ack each, {rounds} rounds)")
        pairs = [await inbound_round(n_in) for _ in range(rounds)]
        ours = statistics.median(p[0] for p in pairs)
        raw = statistics.median(p[1] for p in pairs)
        print(f"  raw websockets one-way          {raw:10.0f} frames/s (baseline)")
        print(f"  transport inbound + acks        {ours:10.0f} events/s")
        ratio = _paired_ratio(pairs)
        report("inbound: transport / raw", ratio, ">= 0.85", ratio >= 0.85)
    if args.only in (None, "memory"):
        size = statistics.median([await idle_memory() for _ in range(3)])
        print(f"\nidle connected transport: {size / 1024:.1f} KiB of Python heap (tracemalloc)")


def main(argv: list[str] | None = None) -> int:
    """Print the measurements; with ``--check`` return 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("rtt", "inbound", "memory"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    asyncio.run(run(args))
    missed = [r for r in RESULTS if not r[3]]
    print(f"\n{len(RESULTS) - len(missed)} of {len(RESULTS)} targets met")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())

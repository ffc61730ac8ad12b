"""The reference connector against raw ``websockets`` on loopback, measured in the same run.

Run: ``.venv/bin/python benchmarks/bench_connector.py`` (``--check`` exits 1 if a target is
missed, ``--quick`` for a smoke run, ``--only replay|idle`` for one part).

* ``replay``: a gateway (``WebSocketRelayTransport`` with an inbound handler) connects to a
  ``relay.Connector`` holding a 10,000-event backlog for it; the connector replays it in order
  with bufferIds, the transport handles and acks every event, the connector retires each ack in
  its store.  Timed from the dial until the last ack is retired, with the buffer on SQLite (the
  target) and on the in-memory store (reported).  Baseline: raw one-way ``websockets``
  throughput of the very same frames (received and json-decoded).  Target >= 0.5x.  Every
  event's handler calls are counted: a lost or duplicated event fails the check.
* ``idle``: 200 gateways (each its own id and secret) hold idle connections to one connector.
  The gateways run in a child process so that the connector's process measures only the
  connector: Python heap per connection (tracemalloc) and RSS per connection (psutil), and the
  handshake latency (dial to descriptor) p50/p99, dialed one at a time and as a burst of 200.
  Reported; the one check is that a broadcast event still reaches every idle gateway.  Run in a
  fresh process of its own, so that the replay part has not warmed the allocator.

Both sides of ``replay`` run in one process and one event loop, compression off; replay and
baseline rounds are interleaved and the median round is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

from relay.client.transport import WebSocketRelayTransport
from relay.connector.buffer import InboundBuffer
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from relay.wire.codec import encode
from relay.wire.frames import EventSource, Inbound, InboundEvent
from statecore.store import Store
from stores import InMemoryStore, SQLiteStore

RESULTS: list[tuple[str, float, str, bool]] = []
PLATFORM = "bench"
TEXT = "x" * 120  # with the envelope and bufferId, ~250-byte frames
GUARD_S = 60.0
"""Real seconds any one phase may take before the benchmark gives up (counted as a miss)."""


def report(name: str, value: float, target: str, ok: bool) -> None:
    """Record and print one ratio against its target."""
    RESULTS.append((name, value, target, ok))
    print(f"  {name:<46} {value:8.2f}   target {target:<7} {'ok' if ok else 'MISSED'}")


def make_event(n: int) -> InboundEvent:
    return InboundEvent(
        text=TEXT,
        message_id=f"m{n}",
        source=EventSource(platform=PLATFORM, chat_id="c1", chat_type="dm", user_id="u1"),
    )


class CountingBuffer(InboundBuffer):
    """The connector's buffer, counting retired acks and signalling when all are in."""

    def __init__(self, store: Store, expected: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(store)
        self.expected = expected
        self.retired = 0
        self.all_acked = asyncio.Event()
        self._loop = loop

    def ack(self, gateway_id: str, buffer_ids: Iterable[str]) -> int:
        retired = super().ack(gateway_id, buffer_ids)
        self.retired += retired  # the connector's one store thread: no race
        if self.retired >= self.expected:
            self._loop.call_soon_threadsafe(self.all_acked.set)
        return retired


# -- replay -------------------------------------------------------------------------------------


async def replay_round(kind: str, n: int, workdir: Path, round_no: int) -> dict[str, Any]:
    """One replay of an n-event backlog; returns the rate, the counts and the frames sent."""
    store: Store = (
        InMemoryStore() if kind == "memory" else SQLiteStore(workdir / f"{kind}-{round_no}.db")
    )
    connector = Connector(
        store, secrets={"gw": ["bench-secret"]}, drivers={PLATFORM: LoopbackPlatform(PLATFORM)}
    )
    buffer = CountingBuffer(store, n, asyncio.get_running_loop())
    connector.buffer = buffer
    with store.atomic():  # the backlog is built before the clock starts
        for i in range(n):
            buffer.append("gw", PLATFORM, make_event(i))
    lines = [encode(Inbound(e.event, e.buffer_id)) for e in buffer.backlog("gw")]
    counts: collections.Counter[str] = collections.Counter()

    async def handler(event: InboundEvent) -> None:
        counts[event.message_id or ""] += 1

    await connector.start()
    transport = WebSocketRelayTransport(
        connector.url, PLATFORM, "bot", gateway_id="gw", secret="bench-secret", reconnect=False
    )
    transport.set_inbound_handler(handler)
    try:
        start = time.perf_counter()
        await transport.connect()
        await transport.handshake()
        await asyncio.wait_for(buffer.all_acked.wait(), GUARD_S)
        elapsed = time.perf_counter() - start
        # Anything still in flight would show up as a duplicate here.
        await asyncio.sleep(0.05)
        left = connector.buffered("gw")
    finally:
        await transport.disconnect(budget_s=2)
        await connector.stop()
        store.close()
    return {
        "rate": n / elapsed,
        "handled": sum(counts.values()),
        "distinct": len(counts),
        "duplicated": sum(1 for c in counts.values() if c > 1),
        "acked": buffer.retired,
        "left": left,
        "lines": lines,
    }


async def raw_round(lines: list[str]) -> float:
    """Raw one-way websockets: the same frames pushed, received and json-decoded; frames/s."""

    async def push(ws: ServerConnection) -> None:
        await ws.recv()
        for line in lines:
            await ws.send(line)

    server = await serve(push, "127.0.0.1", 0, compression=None)
    port = next(iter(server.sockets)).getsockname()[1]
    try:
        async with connect(f"ws://127.0.0.1:{port}", compression=None, proxy=None) as ws:
            start = time.perf_counter()
            await ws.send("go")
            for _ in range(len(lines)):
                json.loads(await ws.recv())
            return len(lines) / (time.perf_counter() - start)
    finally:
        server.close()
        await server.wait_closed()


async def run_replay(n: int, rounds: int) -> None:
    print(f"replay of a {n}-event backlog with acks ({rounds} rounds, medians)")
    with tempfile.TemporaryDirectory(prefix="bench-connector-") as tmp:
        workdir = Path(tmp)
        raw_rates: list[float] = []
        ours: dict[str, list[dict[str, Any]]] = {"sqlite": [], "memory": []}
        for r in range(rounds):
            for kind in ("sqlite", "memory"):
                result = await replay_round(kind, n, workdir, r)
                ours[kind].append(result)
                raw_rates.append(await raw_round(result.pop("lines")))
    raw = statistics.median(raw_rates)
    print(f"  raw websockets one-way, same frames    {raw:10.0f} frames/s (baseline)")
    for kind in ("sqlite", "memory"):
        rate = statistics.median(r["rate"] for r in ours[kind])
        print(f"  connector replay + acks, {kind:<7}       {rate:10.0f} events/s")
    for kind in ("sqlite", "memory"):
        results = ours[kind]
        print(
            f"  counts ({kind}): expected {n} per round; "
            + "; ".join(
                f"handled {r['handled']} distinct {r['distinct']} duplicated {r['duplicated']} "
                f"acked {r['acked']} left {r['left']}"
                for r in results
            )
        )
    for kind in ("sqlite", "memory"):
        results = ours[kind]
        exact = all(
            r["handled"] == r["distinct"] == r["acked"] == n and r["left"] == 0 for r in results
        )
        report(f"replay ({kind}): lost or duplicated events", 0.0 if exact else 1.0, "= 0", exact)
    sqlite_ratio = statistics.median(r["rate"] for r in ours["sqlite"]) / raw
    memory_ratio = statistics.median(r["rate"] for r in ours["memory"]) / raw
    report("replay (sqlite): connector / raw", sqlite_ratio, ">= 0.5", sqlite_ratio >= 0.5)
    print(f"  {'replay (memory): connector / raw':<46} {memory_ratio:8.2f}   (reported)")


# -- idle connections ---------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def child_main(url: str, n: int) -> None:
    """The gateways' process: dial n gateways one at a time, report, then on command drop
    them and dial all n at once, report, and exit on the next command."""
    received = 0

    async def handler(_: InboundEvent) -> None:
        nonlocal received
        received += 1

    def dial(i: int) -> WebSocketRelayTransport:
        transport = WebSocketRelayTransport(
            url, PLATFORM, f"bot-{i}", gateway_id=f"gw-{i}", secret=f"secret-{i}", reconnect=False
        )
        transport.set_inbound_handler(handler)
        return transport

    async def handshake(transport: WebSocketRelayTransport) -> float:
        start = time.perf_counter()
        await transport.connect()
        await transport.handshake()
        return time.perf_counter() - start

    loop = asyncio.get_running_loop()

    async def command() -> str:
        line: str = await loop.run_in_executor(None, sys.stdin.readline)
        return line.strip()

    transports = [dial(i) for i in range(n)]
    sequential = [await handshake(t) for t in transports]
    print(json.dumps({"sequential": sequential}), flush=True)
    await command()  # the parent has measured; it injected one event for everyone
    await asyncio.sleep(0.2)
    seen = received
    await asyncio.gather(*(t.disconnect(budget_s=2) for t in transports))
    transports = [dial(i) for i in range(n)]
    burst = await asyncio.gather(*(handshake(t) for t in transports))
    print(json.dumps({"burst": list(burst), "received": seen}), flush=True)
    await command()
    await asyncio.gather(*(t.disconnect(budget_s=2) for t in transports))


async def idle_pass(n: int, *, trace: bool) -> dict[str, Any]:
    """One connector with n idle gateways in a child process; memory and latencies."""
    platform = LoopbackPlatform(PLATFORM)
    store = InMemoryStore()
    connector = Connector(
        store,
        secrets={f"gw-{i}": [f"secret-{i}"] for i in range(n)},
        drivers={PLATFORM: platform},
    )
    await connector.start()
    process = psutil.Process()
    child: asyncio.subprocess.Process | None = None
    try:
        gc.collect()
        if trace:
            tracemalloc.start()
        heap_before = tracemalloc.get_traced_memory()[0] if trace else 0
        rss_before = process.memory_info().rss
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--child",
            connector.url,
            str(n),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert child.stdout is not None
        assert child.stdin is not None
        first = json.loads(await asyncio.wait_for(child.stdout.readline(), GUARD_S))
        deadline = time.monotonic() + GUARD_S
        while not all(connector.connected(f"gw-{i}") for i in range(n)):
            if time.monotonic() > deadline:
                raise TimeoutError("the gateways did not all connect")
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # replays finished, sockets idle
        gc.collect()
        heap_after = tracemalloc.get_traced_memory()[0] if trace else 0
        rss_after = process.memory_info().rss
        if trace:
            tracemalloc.stop()
        await platform.inject("c1", "hello, everyone")  # the idle connections still serve
        child.stdin.write(b"burst\n")
        await child.stdin.drain()
        second = json.loads(await asyncio.wait_for(child.stdout.readline(), GUARD_S))
        child.stdin.write(b"quit\n")
        await child.stdin.drain()
        await asyncio.wait_for(child.wait(), GUARD_S)
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
        if child is not None and child.returncode is None:
            child.kill()
            await child.wait()
        await connector.stop()
        store.close()
    return {
        "heap_per_conn": (heap_after - heap_before) / n,
        "rss_per_conn": (rss_after - rss_before) / n,
        "sequential": first["sequential"],
        "burst": second["burst"],
        "received": second["received"],
    }


async def run_idle(n: int) -> None:
    print(f"\n{n} concurrent idle gateway connections on one connector (gateways in a child)")
    timing = await idle_pass(n, trace=False)
    heap = await idle_pass(n, trace=True)
    print(f"  connector Python heap per connection   {heap['heap_per_conn'] / 1024:8.1f} KiB")
    print(f"  connector RSS growth per connection    {timing['rss_per_conn'] / 1024:8.1f} KiB")
    for name, values in (
        ("one at a time", timing["sequential"]),
        ("burst of all", timing["burst"]),
    ):
        ms = [v * 1000 for v in values]
        print(
            f"  handshake {name:<13} p50 {percentile(ms, 0.5):7.2f} ms   "
            f"p99 {percentile(ms, 0.99):7.2f} ms   max {max(ms):7.2f} ms"
        )
    reached = timing["received"]
    report(f"idle: one broadcast reached all {n} gateways", reached / n, "= 1.00", reached == n)


async def run(args: argparse.Namespace) -> None:
    """Run the selected parts (the idle part only when asked for alone: see ``main``)."""
    if args.only in (None, "replay"):
        await run_replay(1000 if args.quick else 10_000, 1 if args.quick else 3)
    if args.only == "idle":
        await run_idle(50 if args.quick else 200)


def main(argv: list[str] | None = None) -> int:
    """Print the measurements; with ``--check`` return 1 when a target is missed."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        asyncio.run(child_main(argv[1], int(argv[2])))
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--only", choices=("replay", "idle"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    asyncio.run(run(args))
    if args.only is None:
        # The idle part measures the connector's RSS: run it in a fresh process, where the
        # allocator has not been warmed up by the replay part.
        sys.stdout.flush()
        command = [sys.executable, __file__, "--only", "idle", "--check"]
        if args.quick:
            command.append("--quick")
        if subprocess.run(command, check=False).returncode:
            report("idle part (child process)", 0.0, "ok", False)
    missed = [r for r in RESULTS if not r[3]]
    if RESULTS:
        print(f"\n{len(RESULTS) - len(missed)} of {len(RESULTS)} targets met")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Connector replay with the gateway in another process, against raw ``websockets`` across two
processes, measured in the same run.

Run: ``.venv/bin/python benchmarks/bench_replay.py`` (``--check`` exits 1 if a target is
missed, ``--quick`` for a smoke run: one round of 2,000 events).

The one part, ``replay``: this process fills a SQLite store (WAL, in a temporary directory) with
a 10,000-event backlog for gateway ``gw`` before the clock starts, then starts a
``relay.Connector`` on it on 127.0.0.1.  A child process (this script with ``--child``) connects
as that gateway and receives the replay.  Three sides, each round interleaved, each timed by the
child from the start of its dial to the last event (frame) it received:

* ``baseline``: raw one-way ``websockets`` across two processes -- this process runs a bare
  ``websockets`` server that, on the child's first message, sends the very frames the replay
  sends (the backlog's own lines from ``InboundBuffer.replay_lines``, ~310 bytes each); the
  child receives and json-decodes each one.
* ``transport`` (the target): the child runs the real ``WebSocketRelayTransport`` (what users
  run) with an inbound handler that counts events by message id.  It announces ``OUR_FEATURES``
  (so ``acked_live``) with ``window`` 64 (``DEFAULT_MAX_IN_FLIGHT``), so the connector paces the
  replay by that window, and its dispatcher acks each event after its handler returned, the
  acks that became due together in one message of at most 64.
* ``raw gateway`` (reported): the child is a raw ``websockets`` client announcing the same
  (features header, hello with ``protocol``, ``OUR_FEATURES`` and ``window`` 64).  It decodes
  every line and acks at once: each time its reader would wait, everything received since the
  last ack goes out in one message (at most 64) -- with one line per message from the
  connector, that is one ack message per event, the connector's costliest peer.  It counts
  distinct bufferIds and duplicates.

Targets: transport / baseline >= 0.5 (the median of the rounds' own ratios); for both gateway
sides, every round, 0 lost (every event received once, and the store holds 0 unacked entries
once the acks are in) and 0 duplicated.  Compression is off on every socket, as the connector
and the transport have it.  Every wait is bounded; children are killed and reaped on the way
out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench_connector import PLATFORM, make_event
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from relay.client.dispatch import DEFAULT_MAX_IN_FLIGHT
from relay.client.transport import WebSocketRelayTransport
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from relay.wire.auth import bearer_header, mint_token
from relay.wire.codec import ack_lines, encode
from relay.wire.compat import OUR_FEATURES, features_header
from relay.wire.frames import Hello, InboundEvent
from relay.wire.urls import relay_url
from stores import SQLiteStore

GATEWAY = "gw"
SECRET = "bench-replay-secret"
SECRET_ENV = "BENCH_REPLAY_SECRET"
"""The child reads the gateway's secret here, never from its command line."""
GUARD_S = 60.0
"""Real seconds any one wait may take before the round gives up (counted as a miss)."""
SETTLE_S = 10.0
"""How long the store may take to retire the last acks after the child saw the last event."""
ACK_BATCH = 64
"""Acks per message at most: the transport's dispatcher (relay/client/dispatch.py) batches so."""
SIDES = ("baseline", "transport", "raw gateway")
TARGET_SIDE = "transport"
"""The side whose ratio is the target: the gateway users run."""

RESULTS: list[tuple[str, list[float], str, bool | None]] = []
"""(name, one value per round, target, met); met None: reported, no target."""


# -- the child ----------------------------------------------------------------------------------


def _result(received: int, ids: dict[str, int], elapsed: float) -> dict[str, Any]:
    return {
        "received": received,
        "distinct": len(ids),
        "duplicated": sum(1 for c in ids.values() if c > 1),
        "elapsed": elapsed,
    }


async def child_baseline(url: str, n: int) -> None:
    """Receive n frames from a bare websockets server; time from the dial to the last one."""
    start = time.perf_counter()
    async with connect(url, compression=None, proxy=None, open_timeout=GUARD_S) as ws:
        await ws.send("go")
        for _ in range(n):
            json.loads(await asyncio.wait_for(ws.recv(), GUARD_S))
        elapsed = time.perf_counter() - start
        print(json.dumps({"received": n, "elapsed": elapsed}), flush=True)
        await _wait_quit()


async def child_raw_gateway(url: str, n: int, secret: str) -> None:
    """Be gateway ``gw`` on a raw socket, announcing what WebSocketRelayTransport announces;
    receive the replay, ack every bufferId (batched as the transport's dispatcher does)."""
    headers = [features_header(OUR_FEATURES), bearer_header(mint_token(GATEWAY, secret))]
    hello = encode(Hello(PLATFORM, "bot", features=OUR_FEATURES, window=DEFAULT_MAX_IN_FLIGHT))
    ids: dict[str, int] = {}
    received = 0
    pending: list[str] = []
    acker: asyncio.Task[None] | None = None
    sends = [0]
    start = time.perf_counter()
    async with connect(
        relay_url(url), additional_headers=headers, compression=None, proxy=None,
        open_timeout=GUARD_S, close_timeout=2,
    ) as ws:  # fmt: skip

        async def flush() -> None:
            nonlocal pending
            while pending:
                batch, pending = pending[:ACK_BATCH], pending[ACK_BATCH:]
                sends[0] += 1
                await ws.send(ack_lines(batch))

        await ws.send(hello)
        while len(ids) < n:
            message = await asyncio.wait_for(ws.recv(), GUARD_S)
            assert isinstance(message, str)
            for line in message.splitlines():
                frame = json.loads(line)
                if frame.get("type") != "inbound":
                    continue  # the descriptor answering the hello
                buffer_id = frame["bufferId"]
                received += 1
                ids[buffer_id] = ids.get(buffer_id, 0) + 1
                pending.append(buffer_id)
            if pending and (acker is None or acker.done()):
                acker = asyncio.create_task(flush())
        elapsed = time.perf_counter() - start
        if acker is not None:
            await asyncio.wait_for(acker, GUARD_S)
        await flush()
        # Anything sent after the last distinct event would be a duplicate: read a moment more.
        try:
            while True:
                message = await asyncio.wait_for(ws.recv(), 0.2)
                for line in str(message).splitlines():
                    frame = json.loads(line)
                    if frame.get("type") == "inbound":
                        received += 1
                        ids[frame["bufferId"]] = ids.get(frame["bufferId"], 0) + 1
        except TimeoutError:
            pass
        print(json.dumps({**_result(received, ids, elapsed), "acks": sends[0]}), flush=True)
        await _wait_quit()


async def child_transport(url: str, n: int, secret: str) -> None:
    """Be gateway ``gw`` through the real WebSocketRelayTransport, counting handled events."""
    ids: dict[str, int] = {}
    received = 0
    done = asyncio.Event()
    last = 0.0

    async def handler(event: InboundEvent) -> None:
        nonlocal received, last
        received += 1
        key = event.message_id or ""
        ids[key] = ids.get(key, 0) + 1
        if len(ids) >= n and not done.is_set():
            last = time.perf_counter()
            done.set()

    transport = WebSocketRelayTransport(
        url, PLATFORM, "bot", gateway_id=GATEWAY, secret=secret, reconnect=False
    )
    transport.set_inbound_handler(handler)
    try:
        start = time.perf_counter()
        await asyncio.wait_for(transport.connect(), GUARD_S)
        await transport.handshake(GUARD_S)
        await asyncio.wait_for(done.wait(), GUARD_S)
        await asyncio.sleep(0.2)  # a duplicate sent after the last event would show up here
        print(json.dumps(_result(received, ids, last - start)), flush=True)
        await _wait_quit()
    finally:
        await transport.disconnect(budget_s=2)


async def _wait_quit() -> None:
    """Hold the connection until the parent says so (it checks the store first)."""
    loop = asyncio.get_running_loop()
    await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.readline), GUARD_S)


def child_main(mode: str, url: str, n: int) -> int:
    secret = os.environ.get(SECRET_ENV, "")
    runs: dict[str, Callable[[], Awaitable[None]]] = {
        "baseline": lambda: child_baseline(url, n),
        "raw-gateway": lambda: child_raw_gateway(url, n, secret),
        "transport": lambda: child_transport(url, n, secret),
    }

    async def go() -> None:
        await runs[mode]()

    asyncio.run(go())
    return 0


# -- the parent ---------------------------------------------------------------------------------


class RoundFailed(RuntimeError):
    """A side of a round could not be measured; the message says why."""


class Child:
    """This script as a child process; its one JSON report read with a bound."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def spawn(cls, mode: str, url: str, n: int, secret: str) -> Child:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            mode,
            url,
            str(n),
            env={**os.environ, SECRET_ENV: secret},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(proc)

    async def report(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), GUARD_S)
        except TimeoutError:
            raise RoundFailed(f"child {self.proc.pid}: no report within {GUARD_S:g} s") from None
        if not line:
            await asyncio.wait_for(self.proc.wait(), 10)
            raise RoundFailed(f"child {self.proc.pid} exited ({self.proc.returncode}) unreported")
        result: dict[str, Any] = json.loads(line)
        return result

    async def finish(self) -> None:
        """Tell it to close and wait for it (bounded); kill and reap it if it lingers."""
        try:
            if self.proc.returncode is None and self.proc.stdin is not None:
                self.proc.stdin.write(b"quit\n")
                await self.proc.stdin.drain()
                await asyncio.wait_for(self.proc.wait(), 10)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            if self.proc.returncode is None:
                self.proc.kill()
                await asyncio.wait_for(self.proc.wait(), 10)


def fill(path: Path, n: int) -> tuple[SQLiteStore, Connector, list[str]]:
    """A connector over a fresh SQLite store holding an n-event backlog for ``gw``; the
    backlog's lines as the replay will send them."""
    store = SQLiteStore(path)
    connector = Connector(
        store,
        secrets={GATEWAY: [SECRET]},
        drivers={PLATFORM: LoopbackPlatform(PLATFORM)},
        open_egress=True,
    )
    batch = 1000
    for first in range(0, n, batch):
        connector.buffer.append_many(
            [(GATEWAY, PLATFORM, make_event(i)) for i in range(first, min(n, first + batch))]
        )
    lines = [line for _, _, line in connector.buffer.replay_lines(GATEWAY, limit=n)]
    if len(lines) != n:
        raise RoundFailed(f"the backlog holds {len(lines)} entries, not {n}")
    return store, connector, lines


async def gateway_side(mode: str, path: Path, n: int) -> dict[str, Any]:
    """One replay of an n-event backlog to a gateway in a child process."""
    store, connector, _ = fill(path, n)
    child: Child | None = None
    try:
        await connector.start()
        child = await Child.spawn(mode, connector.url, n, SECRET)
        cpu = time.process_time()
        result = await child.report()
        result["connector_cpu"] = time.process_time() - cpu
        deadline = time.monotonic() + SETTLE_S
        left = connector.buffered(GATEWAY)
        while left and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            left = connector.buffered(GATEWAY)
        result["left"] = left
        result["rate"] = n / result["elapsed"]
        return result
    finally:
        if child is not None:
            await child.finish()
        await asyncio.wait_for(connector.stop(), GUARD_S)
        store.close()


async def baseline_side(path: Path, n: int) -> dict[str, Any]:
    """Raw one-way websockets: the backlog's own lines pushed to a child that receives them."""
    store, connector, lines = fill(path, n)  # the same frames the replay sends
    store.close()
    del connector

    async def push(ws: ServerConnection) -> None:
        try:
            await ws.recv()
            for line in lines:
                await ws.send(line)
            await ws.wait_closed()
        except ConnectionClosed:
            pass

    server = await serve(push, "127.0.0.1", 0, compression=None)
    port = next(iter(server.sockets)).getsockname()[1]
    child: Child | None = None
    try:
        child = await Child.spawn("baseline", f"ws://127.0.0.1:{port}", n, "")
        result = await child.report()
        result["rate"] = n / result["elapsed"]
        return result
    finally:
        if child is not None:
            await child.finish()
        server.close()
        await asyncio.wait_for(server.wait_closed(), GUARD_S)


async def run_rounds(n: int, rounds: int) -> dict[str, list[dict[str, Any] | None]]:
    """Interleaved rounds (the order of the sides rotates); None where a side failed."""
    got: dict[str, list[dict[str, Any] | None]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        for r in range(rounds):
            order = SIDES[r % len(SIDES) :] + SIDES[: r % len(SIDES)]
            for side in order:
                path = Path(tmp) / f"{side.replace(' ', '-')}-{r}.db"
                try:
                    if side == "baseline":
                        result = await baseline_side(path, n)
                    else:
                        mode = "raw-gateway" if side == "raw gateway" else "transport"
                        result = await gateway_side(mode, path, n)
                except (RoundFailed, TimeoutError, OSError) as exc:
                    print(f"  round {r + 1} {side}: FAILED: {exc!r}", flush=True)
                    got[side].append(None)
                    continue
                got[side].append(result)
                extra = (
                    ""
                    if side == "baseline"
                    else f"  distinct {result['distinct']} duplicated {result['duplicated']} "
                    f"unacked {result['left']}, connector CPU {result['connector_cpu']:.2f} s"
                    + (f", {result['acks']} ack messages" if "acks" in result else "")
                )
                print(
                    f"  round {r + 1} {side:<12} {result['rate']:9.0f} /s "
                    f"({result['elapsed']:.3f} s){extra}",
                    flush=True,
                )
    return got


def report(name: str, values: list[float], target: str, ok: bool | None) -> None:
    RESULTS.append((name, values, target, ok))


def evaluate(n: int, got: dict[str, list[dict[str, Any] | None]]) -> None:
    """Turn the rounds into the table's rows (a side that failed in any round misses)."""
    base = got["baseline"]
    report("baseline: raw websockets frames/s", [r["rate"] for r in base if r], "-", None)
    for side in ("transport", "raw gateway"):
        ours = got[side]
        measured = all(r is not None for r in ours)
        report(f"{side}: replay events/s", [r["rate"] for r in ours if r], "-", None)
        ratios = [o["rate"] / b["rate"] for o, b in zip(ours, base, strict=True) if o and b]
        if side == TARGET_SIDE:
            ok = len(ratios) == len(ours) and statistics.median(ratios) >= 0.5
            report(f"{side} / baseline", ratios, ">= 0.5", ok)
        else:
            report(f"{side} / baseline", ratios, "-", None)
        lost = [float(n - r["distinct"] + r["left"]) for r in ours if r]
        dup = [float(r["duplicated"]) for r in ours if r]
        report(f"{side}: lost (unreceived + unacked)", lost, "= 0", measured and not any(lost))
        report(f"{side}: duplicated", dup, "= 0", measured and not any(dup))


def _shown(values: list[float], how: str) -> str:
    if not values:
        return "n/a"
    value = statistics.median(values) if how == "median" else min(values)
    value = max(values) if how == "max" else value
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.2f}" if value != int(value) else f"{value:.0f}"


def table() -> None:
    head = f"  {'measured over the rounds':<42} {'median':>8} {'min':>8} {'max':>8}"
    print(f"{head}   {'target':<7} result")
    for name, values, target, ok in RESULTS:
        result = "info" if ok is None else "ok" if ok else "MISSED"
        print(
            f"  {name:<42} {_shown(values, 'median'):>8} {_shown(values, 'min'):>8} "
            f"{_shown(values, 'max'):>8}   {target:<7} {result}"
        )


def main(argv: list[str] | None = None) -> int:
    """Print the measurements; with ``--check`` return 1 when a target is missed."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(argv[1], argv[2], int(argv[3]))
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round of 2,000 events")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    n, rounds = (2000, 1) if args.quick else (10_000, 3)
    print(f"replay of a {n}-event backlog with acks, gateway in a child process ({rounds} rounds)")
    got = asyncio.run(run_rounds(n, rounds))
    evaluate(n, got)
    print()
    table()
    checked = [r for r in RESULTS if r[3] is not None]
    missed = [r for r in checked if not r[3]]
    print(f"\n{len(checked) - len(missed)} of {len(checked)} targets met")
    print(f"(took {time.perf_counter() - began:.1f} s)")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())

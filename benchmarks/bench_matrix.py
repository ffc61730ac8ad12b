"""An echo bot on Matrix: statecore against a plain matrix-nio bot, through the same Synapse.

Run: ``.venv/bin/python benchmarks/bench_matrix.py`` (``--check`` exits 1 if the target is
missed, ``--quick`` for a smoke run).

* ``ours``: Synapse -> the connector with the Matrix driver (``relay.matrix.MatrixDriver``: the
  sync token moved only after the intake took every event) -> the gateway (an echo bot whose
  replies are ledgered obligations) -> Synapse (each reply a ``PUT`` under a transaction id
  derived from its obligation).  Connector and gateway run in one process, their stores two
  connections to one SQLite file, like ``examples/matrix_bot.py``.
* ``nio``: what a user would write instead, without any durability: a matrix-nio
  ``AsyncClient`` whose message callback sends the echo with ``room_send``, run by
  ``sync_forever`` with the driver's timeline limit (200 events a room per sync; with the
  server's default of 10 and no gap filling, such a bot passes over messages under this load).

Both bots answer every message with ``echo: <text>`` as a reply to it, each in a process of
its own, on the bench's own throwaway homeserver (``relay.matrix.testing``, rate limits
relaxed).  ``ROOMS`` people (matrix-nio clients in this process) each write ``N`` messages into
their room with the bot, keeping ``WINDOW`` unanswered at most.  A client of the bot's account
on a device of its own follows the replies by ``/sync``.  Answered per second runs from the
first message written to the last reply seen.  Each round measures both bots back to back (the
order alternating); the rates printed are medians over rounds and the ratio checked is the
median of the rounds' own ratios.  Target: ours >= 0.8x the plain bot.

Under this load the homeserver (one Python process) can be the bottleneck rather than either
bot, so the CPU time each bot's process spent per answered message is printed too (no target):
it shows what the durable path costs where the rate alone would not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from nio import (  # type: ignore[import-untyped]
    AsyncClient,
    InviteMemberEvent,
    MatrixRoom,
    RoomMessageText,
    RoomSendResponse,
)

from relay.client.adapter import RelayAdapter
from relay.client.dedupe import StoreBufferDedupe
from relay.client.transport import WebSocketRelayTransport
from relay.connector.server import Connector
from relay.matrix import MatrixDriver
from relay.matrix.testing import Homeserver, MatrixAccount, start_homeserver
from statecore.gateway import Gateway, Turn
from stores import SQLiteStore

RESULTS: list[tuple[str, float, str, bool]] = []
ROOMS = 6
WINDOW = 8
"""Messages a person keeps unanswered at most."""
TARGET = 0.8
READY_S = 60.0
ROUND_S = 120.0
"""The bound on one side of one round."""
FILTER = {
    "presence": {"types": []},
    "account_data": {"types": []},
    "room": {
        "timeline": {"limit": 1000, "types": ["m.room.message"]},
        "state": {"lazy_load_members": True},
        "ephemeral": {"types": []},
        "account_data": {"types": []},
    },
}


# -- the two bots, each run as a child process of this script --------------------------------------


async def until_parent_goes(parent: int) -> None:
    """Return when stdin closes (the bench ended) or the parent is gone."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    reading = asyncio.ensure_future(reader.read())
    while not reading.done() and os.getppid() == parent:
        await asyncio.wait([reading], timeout=0.5)
    reading.cancel()


async def ours_bot(args: argparse.Namespace) -> None:
    """The connector with the Matrix driver and a gateway with the ledgered echo bot."""
    parent = os.getppid()
    secret = secrets.token_urlsafe(16)
    connector_store, gateway_store = SQLiteStore(args.db), SQLiteStore(args.db)
    driver = MatrixDriver(args.homeserver, args.user, password=args.password)
    connector = Connector(connector_store, secrets={"bench": [secret]}, drivers={"matrix": driver})
    await connector.start()
    transport = WebSocketRelayTransport(
        connector.url,
        "matrix",
        "bot",
        gateway_id="bench",
        secret=secret,
        dedupe=StoreBufferDedupe(gateway_store),
    )
    gateway = Gateway(gateway_store)
    gateway.add_adapter("matrix", RelayAdapter(transport))

    async def echo(turn: Turn) -> None:
        await turn.reply(f"echo: {turn.message.text}")

    gateway.on_message(echo)
    await gateway.start()
    print("READY", flush=True)
    try:
        await until_parent_goes(parent)
    finally:
        await gateway.stop()
        await connector.stop()
        gateway_store.close()
        connector_store.close()


async def nio_bot(args: argparse.Namespace) -> None:
    """The plain bot: matrix-nio, a message callback that sends the echo, no durability."""
    parent = os.getppid()
    client = AsyncClient(args.homeserver, args.user)
    await client.login(args.password)

    async def on_message(room: MatrixRoom, event: RoomMessageText) -> None:
        if event.sender == client.user_id:
            return
        content = {
            "msgtype": "m.text",
            "body": f"echo: {event.body}",
            "m.relates_to": {"m.in_reply_to": {"event_id": event.event_id}},
        }
        await client.room_send(room.room_id, "m.room.message", content)

    async def on_invite(room: MatrixRoom, event: InviteMemberEvent) -> None:
        if event.state_key == client.user_id:
            await client.join(room.room_id)

    await client.sync(timeout=0)  # the current position: history is not answered
    client.add_event_callback(on_message, RoomMessageText)
    client.add_event_callback(on_invite, InviteMemberEvent)
    # The timeline limit of the driver's own filter: with Synapse's default (10 events a room
    # per sync) and no gap filling, this bot passed over messages under the bench's load.
    timeline = {"room": {"timeline": {"limit": 200}}}
    syncing = asyncio.create_task(client.sync_forever(timeout=30_000, sync_filter=timeline))
    print("READY", flush=True)
    try:
        await until_parent_goes(parent)
    finally:
        syncing.cancel()
        with contextlib.suppress(BaseException):
            await syncing
        await client.close()


# -- the bench's side -----------------------------------------------------------------------------


class Side:
    """One bot under measurement: its account, its process, its rooms and people, and a client
    of its account following the replies."""

    def __init__(self, name: str, homeserver: Homeserver, workdir: Path) -> None:
        self.name = name
        self.homeserver = homeserver
        self.bot = homeserver.register(f"{name}-bot-{secrets.token_hex(4)}")
        self.db = workdir / f"{name}.db"
        self.proc: asyncio.subprocess.Process | None = None
        self.people: list[tuple[AsyncClient, str]] = []
        self.observer = client_of(homeserver, self.bot)
        self.waiting: dict[str, asyncio.Semaphore] = {}  # message event id -> its writer's window
        self.early: set[str] = set()  # answered before the writer knew the event id
        self.answered = 0
        self.last_reply = 0.0
        self.total = 0
        self.done = asyncio.Event()
        self.cpu_ms = 0.0
        """CPU milliseconds of the bot's process per answered message, in the last round."""
        self._observing: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the bot's process (READY, bounded), make the rooms, wait for every join."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--bot",
            self.name,
            *("--homeserver", self.homeserver.url, "--user", self.bot.user_id),
            *("--password", self.bot.password, "--db", str(self.db)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), READY_S)
        if not line.startswith(b"READY"):
            raise RuntimeError(f"the {self.name} bot did not start: {line!r}")
        for n in range(ROOMS):
            person = self.homeserver.register(f"{self.name}-p{n}-{secrets.token_hex(4)}")
            room = self.homeserver.create_room(person, invite=[self.bot.user_id])
            self.people.append((client_of(self.homeserver, person), room))
        rooms = {room for _, room in self.people}
        deadline = time.monotonic() + READY_S
        while True:
            path = "/_matrix/client/v3/joined_rooms"
            joined = self.homeserver.request("GET", path, account=self.bot)["joined_rooms"]
            if rooms <= set(joined):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {self.name} bot did not join its rooms")
            await asyncio.sleep(0.1)
        self._observing = asyncio.create_task(self.observe())
        await self.measure(1, "warm")  # both bots and the observer warmed up

    async def observe(self) -> None:
        since: str | None = None
        while True:
            answer = await self.observer.sync(timeout=10_000, sync_filter=FILTER, since=since)
            next_batch = getattr(answer, "next_batch", None)
            if not isinstance(next_batch, str):
                await asyncio.sleep(0.2)
                continue
            since = next_batch
            for info in answer.rooms.join.values():
                for event in info.timeline.events:
                    self.note(event.source)

    def note(self, source: dict[str, Any]) -> None:
        """A reply of the bot: open its writer's window."""
        if source.get("sender") != self.bot.user_id:
            return
        relates = source.get("content", {}).get("m.relates_to", {})
        target = relates.get("m.in_reply_to", {}).get("event_id")
        window = self.waiting.pop(target, None)
        if window is None:
            self.early.add(target)
            return
        self.replied(window)

    def replied(self, window: asyncio.Semaphore) -> None:
        window.release()
        self.answered += 1
        self.last_reply = time.monotonic()
        if self.answered >= self.total:
            self.done.set()

    async def write(self, client: AsyncClient, room: str, count: int, tag: str) -> None:
        """Write ``count`` messages, at most ``WINDOW`` of them unanswered at a time."""
        window = asyncio.Semaphore(WINDOW)
        for n in range(count):
            await window.acquire()
            content = {"msgtype": "m.text", "body": f"{tag}-{room[1:9]}-{n}"}
            answer = await client.room_send(room, "m.room.message", content)
            if not isinstance(answer, RoomSendResponse):
                raise RuntimeError(f"a person could not write: {answer}")
            if answer.event_id in self.early:
                self.early.discard(answer.event_id)
                self.replied(window)
            else:
                self.waiting[answer.event_id] = window

    async def measure(self, per_room: int, tag: str) -> float:
        """Answered messages per second: ``per_room`` in every room, first write to last reply."""
        self.answered, self.total = 0, per_room * len(self.people)
        self.done.clear()
        began, cpu = time.monotonic(), self.cpu_s()
        try:
            async with asyncio.timeout(ROUND_S):
                writing = (self.write(c, room, per_room, tag) for c, room in self.people)
                await asyncio.gather(*writing)
                await self.done.wait()
        except TimeoutError:
            unanswered = sorted(self.waiting)[:5]
            raise RuntimeError(
                f"the {self.name} bot answered {self.answered} of {self.total} messages within "
                f"{ROUND_S:g} s (unanswered: {', '.join(unanswered)})"
            ) from None
        self.cpu_ms = (self.cpu_s() - cpu) * 1000 / self.total
        return self.total / (self.last_reply - began)

    def cpu_s(self) -> float:
        """CPU seconds the bot's process has used so far."""
        assert self.proc is not None
        times = psutil.Process(self.proc.pid).cpu_times()
        return float(times.user + times.system)

    async def stop(self) -> None:
        if self._observing is not None:
            self._observing.cancel()
            with contextlib.suppress(BaseException):
                await self._observing
        for client, _ in self.people:
            await client.close()
        await self.observer.close()
        proc = self.proc
        if proc is not None and proc.returncode is None:
            assert proc.stdin is not None
            proc.stdin.close()  # the bot stops on its own
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def client_of(homeserver: Homeserver, account: MatrixAccount) -> AsyncClient:
    """A matrix-nio client on ``account``'s device, logged in already."""
    client = AsyncClient(homeserver.url, account.user_id, device_id=account.device_id)
    client.access_token = account.access_token
    client.user_id = account.user_id
    return client


def report(name: str, value: float, target: str, ok: bool) -> None:
    """Record and print one ratio against its target."""
    RESULTS.append((name, value, target, ok))
    print(f"  {name:<40} {value:8.2f}   target {target:<7} {'ok' if ok else 'MISSED'}")


async def run(args: argparse.Namespace) -> None:
    rounds = 1 if args.quick else args.rounds
    per_room = 10 if args.quick else args.messages
    print("starting a throwaway homeserver (Synapse)...", flush=True)
    homeserver = start_homeserver()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-matrix-") as workdir:
            sides = [Side(name, homeserver, Path(workdir)) for name in ("ours", "nio")]
            try:
                for side in sides:
                    await side.start()
                print(
                    f"echo bots on Synapse: {ROOMS} rooms x {per_room} messages, window "
                    f"{WINDOW} per room, {rounds} rounds (answered/s, first write to last reply)"
                )
                pairs: list[tuple[float, float]] = []
                cpu: dict[str, list[float]] = {"ours": [], "nio": []}
                for n in range(rounds):
                    order = sides if n % 2 == 0 else sides[::-1]
                    rates = {s.name: await s.measure(per_room, f"r{n}") for s in order}
                    pairs.append((rates["ours"], rates["nio"]))
                    for side in sides:
                        cpu[side.name].append(side.cpu_ms)
                    print(
                        f"  round {n + 1}: statecore {rates['ours']:6.1f}/s "
                        f"({sides[0].cpu_ms:4.1f} ms CPU each)   plain nio {rates['nio']:6.1f}/s "
                        f"({sides[1].cpu_ms:4.1f} ms CPU each)   ratio "
                        f"{rates['ours'] / rates['nio']:.2f}",
                        flush=True,
                    )
            finally:
                for side in sides:
                    await side.stop()
    finally:
        homeserver.stop()
    ours = statistics.median(p[0] for p in pairs)
    raw = statistics.median(p[1] for p in pairs)
    ours_cpu, raw_cpu = statistics.median(cpu["ours"]), statistics.median(cpu["nio"])
    for name, rate, each in (
        ("plain matrix-nio echo bot (baseline)", raw, raw_cpu),
        ("statecore: Matrix driver + gateway", ours, ours_cpu),
    ):
        print(f"  {name:<38} {rate:8.1f} answered/s  {each:5.1f} ms CPU each")
    ratio = statistics.median(o / r for o, r in pairs)
    report("matrix echo: statecore / plain nio", ratio, f">= {TARGET}", ratio >= TARGET)


def main(argv: list[str] | None = None) -> int:
    """Print the measurements; with ``--check`` return 1 when the target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=50, help="messages per room per round")
    parser.add_argument("--bot", choices=("ours", "nio"), help=argparse.SUPPRESS)
    parser.add_argument("--homeserver", help=argparse.SUPPRESS)
    parser.add_argument("--user", help=argparse.SUPPRESS)
    parser.add_argument("--password", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bot is not None:
        asyncio.run(ours_bot(args) if args.bot == "ours" else nio_bot(args))
        return 0
    asyncio.run(run(args))
    missed = [r for r in RESULTS if not r[3]]
    print(f"\n{len(RESULTS) - len(missed)} of {len(RESULTS)} targets met")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())

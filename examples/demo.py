"""The main job (``make demo``): a bot that loses no reply through a SIGKILL and a nap.

The parent process runs the reference connector with the loopback chat platform and plays the
users.  The bot's gateway runs in a child process on SQLite (a local file), so it can really be
killed.  The script: a greeting; a question whose reply is cut off by SIGKILL mid-send; a
message while the bot is dead; a restart that recovers the reply (labelled, since it may repeat
what the user saw) and answers the buffered message; the bot going dormant; a message while it
sleeps; the wake.  Every chat message and every obligation, transport and buffer transition is
printed as it happens; the summary counts what was sent, redelivered and lost (must be 0).

At the end, run in a terminal, it serves the dashboard of the bot's ledger (each reply's
history) until Ctrl-C; run otherwise (a pipe, CI), it says how to open it later and exits.

Run: ``python examples/demo.py`` (``make demo``) (``--data DIR`` to keep the databases elsewhere;
``--no-dashboard`` never waits).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from relay.client.adapter import RelayAdapter
from relay.client.dedupe import StoreBufferDedupe
from relay.client.transport import WebSocketRelayTransport
from relay.connector.buffer import BUFFER_KIND
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from relay.web.dashboard import Dashboard
from relay.web.server import WebServer
from statecore.cli import main as statecore_cli
from statecore.entity import EntityKind
from statecore.gateway import Gateway, Turn
from statecore.gateway.adapter import SendResult
from statecore.obligation import OBLIGATION_KIND, RECOVERED_MARKER
from statecore.store import Audit, Row, Store, TransitionRecord
from stores import SQLiteStore

__all__ = ["main"]

PLATFORM = "loopback"
GATEWAY_ID = "demo-bot"
SECRET = "demo-secret"  # a local demo credential, not a real one
SLOW_WORDS = "carefully"  # the reply the first gateway is killed in the middle of sending
WAIT_S = 20.0

# One time line for both processes: the parent passes its start to the gateway it spawns.
_T0 = float(os.environ.get("STATECORE_DEMO_T0") or time.time())


def _say(kind: str, text: str) -> None:
    print(f"[{time.time() - _T0:6.2f}s] {kind:<9} {text}", flush=True)


def _short(entity_id: str) -> str:
    return entity_id if len(entity_id) <= 12 else f"{entity_id[:4]}..{entity_id[-6:]}"


# -- a store that narrates its transitions ---------------------------------------------------


class NarratedStore:
    """A Store that prints every transition of the kinds it watches, then delegates."""

    def __init__(self, inner: Store, kinds: Iterable[EntityKind[Any]], label: str) -> None:
        self.inner = inner
        self.kinds = {kind.name for kind in kinds}
        self.label = label

    def _tell(self, kind: EntityKind[Any], rows: Sequence[Row[Any]], event: str) -> None:
        if kind.name not in self.kinds:
            return
        for row in rows:
            _say(self.label, f"{kind.name} {_short(row.id)}: {event} -> {row.state.value}")

    def register(self, kind: EntityKind[Any]) -> None:
        self.inner.register(kind)

    def insert(
        self,
        kind: EntityKind[Any],
        entity_id: str,
        values: Mapping[str, object],
        *,
        event: str,
        audit: Audit,
    ) -> tuple[Row[Any], bool]:
        row, created = self.inner.insert(kind, entity_id, values, event=event, audit=audit)
        if created:
            self._tell(kind, [row], event)
        return row, created

    def transition(self, kind: EntityKind[Any], entity_id: str, event: str, **kw: Any) -> Row[Any]:
        row = self.inner.transition(kind, entity_id, event, **kw)
        self._tell(kind, [row], event)
        return row

    def transition_many(
        self, kind: EntityKind[Any], entity_ids: Sequence[str], event: str, **kw: Any
    ) -> list[Row[Any]]:
        rows = self.inner.transition_many(kind, entity_ids, event, **kw)
        self._tell(kind, rows, event)
        return rows

    def get(self, kind: EntityKind[Any], entity_id: str) -> Row[Any] | None:
        return self.inner.get(kind, entity_id)

    def select(self, kind: EntityKind[Any], **kw: Any) -> list[Row[Any]]:
        return self.inner.select(kind, **kw)

    def count(self, kind: EntityKind[Any], **kw: Any) -> int:
        return self.inner.count(kind, **kw)

    def prune(self, kind: EntityKind[Any], event: str, **kw: Any) -> int:
        return self.inner.prune(kind, event, **kw)

    def history(self, kind: EntityKind[Any], entity_id: str) -> list[TransitionRecord]:
        return self.inner.history(kind, entity_id)

    def atomic(self) -> AbstractContextManager[None]:
        return self.inner.atomic()

    def close(self) -> None:
        self.inner.close()


# -- the bot (child process) -----------------------------------------------------------------


class DemoAdapter(RelayAdapter):
    """A relay adapter whose first send of the slow answer hangs (the platform call never
    returns): the moment the demo kills the gateway."""

    hang_slow_answer = True

    async def send(
        self, chat_id: str, content: str, metadata: Mapping[str, Any] | None = None
    ) -> SendResult:
        if self.hang_slow_answer and SLOW_WORDS in content and RECOVERED_MARKER not in content:
            _say("gateway", "sending the long answer... (the platform call hangs)")
            await asyncio.Event().wait()
        return await super().send(chat_id, content, metadata)


async def run_gateway(url: str, db: Path, *, restarted: bool) -> None:
    """The bot: a gateway on SQLite behind one relay connection; commands on stdin."""
    sqlite = SQLiteStore(db)
    store = NarratedStore(sqlite, [OBLIGATION_KIND], "ledger")
    transport = WebSocketRelayTransport(
        url,
        PLATFORM,
        "bot",
        gateway_id=GATEWAY_ID,
        secret=SECRET,
        dormant_redial_s=3.0,
        reconnect_backoff_s=0.2,
        dedupe=StoreBufferDedupe(sqlite),
    )
    transport.listeners.append(
        lambda before, after, event: _say("relay", f"transport: {before.value} -> {after.value}")
    )
    adapter = DemoAdapter(transport)
    adapter.hang_slow_answer = not restarted
    gateway = Gateway(store, retry_interval_s=2.0)
    gateway.add_adapter(PLATFORM, adapter)

    async def bot(turn: Turn) -> None:
        m = turn.message
        if "think" in m.text:
            answer = f"After thinking {SLOW_WORDS}: the answer is 42."
        else:
            answer = f"Hi {m.user_name or m.user_id}! You said: {m.text!r}"
        await turn.reply(answer)

    gateway.on_message(bot)
    claimed = await gateway.start()
    if restarted:
        _say("gateway", f"restarted; claimed {claimed} reply(ies) a dead process still owed")
    print("READY", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        if line == "dormant":
            slept = await adapter.go_dormant()
            _say("gateway", "idle: went dormant" if slept else "could not go dormant")
            print("DORMANT", flush=True)
        elif line == "stop":
            break
    await asyncio.sleep(0.3)  # let the last acks and settles finish
    _say("gateway", f"stopping (delivered {gateway.delivered}, redelivered {gateway.redelivered})")
    print(f"STATS {gateway.delivered} {gateway.redelivered} {gateway.labelled}", flush=True)
    await gateway.stop(budget_s=3)
    sqlite.close()


# -- the users and the connector (parent process) --------------------------------------------


class Child:
    """The gateway process: its output is relayed into the live view."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.changed = asyncio.Event()
        self.pump = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        assert self.proc.stdout is not None
        while raw := await self.proc.stdout.readline():
            line = raw.decode().rstrip()
            if line.startswith(("READY", "DORMANT", "STATS")):
                self.lines.append(line)
            else:
                print(line, flush=True)
                self.lines.append(line)
            self.changed.set()

    async def wait_for(self, needle: str, timeout: float = WAIT_S) -> str:
        deadline = time.monotonic() + timeout
        while True:
            for line in self.lines:
                if needle in line:
                    return line
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"the gateway never printed {needle!r}")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)

    async def command(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{text}\n".encode())
        await self.proc.stdin.drain()


async def _spawn(url: str, db: Path, *, restarted: bool) -> Child:
    args = [sys.executable, str(Path(__file__).resolve()), "--gateway", url, "--db", str(db)]
    if restarted:
        args.append("--restarted")
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "STATECORE_DEMO_T0": repr(_T0)},
    )
    child = Child(proc)
    await child.wait_for("READY")
    return child


async def _until(check: Any, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


class Demo:
    """The scripted conversation against one connector (see the module docs)."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.platform = LoopbackPlatform(PLATFORM)
        self.store = NarratedStore(SQLiteStore(data / "connector.db"), [BUFFER_KIND], "buffer")
        self.connector = Connector(
            self.store, secrets={GATEWAY_ID: [SECRET]}, drivers={PLATFORM: self.platform}
        )
        self.asked: list[tuple[str, str]] = []
        self.children: list[Child] = []
        self._shown = 0

    async def user(self, name: str, text: str) -> None:
        """``name`` writes ``text`` in their own DM with the bot."""
        _say("chat", f"{name} -> bot: {text}")
        self.asked.append((name, text))
        await self.platform.inject(name, text, user_id=name, user_name=name)

    def replies(self, chat: str) -> list[str]:
        """The bot's replies in ``chat`` so far (new ones are printed first)."""
        for action in self.platform.sent[self._shown :]:
            if action.op == "send":
                _say("chat", f"bot -> {action.chat_id}: {action.content!r}")
        self._shown = len(self.platform.sent)
        return self.platform.texts(chat)

    def buffered(self) -> int:
        return self.connector.buffered(GATEWAY_ID)

    async def spawn(self, *, restarted: bool) -> Child:
        child = await _spawn(self.connector.url, self.data / "gateway.db", restarted=restarted)
        self.children.append(child)
        return child

    async def crash_mid_reply(self) -> None:
        """A greeting, then a question whose reply is cut off by SIGKILL mid-send."""
        _say("demo", "starting the bot's gateway (a child process on SQLite)")
        first = await self.spawn(restarted=False)
        await self.user("alice", "hello")
        await _until(lambda: len(self.replies("alice")) == 1, "the greeting")
        await self.user("alice", "please think about life")
        await first.wait_for("attempting")  # recorded, and the send has begun...
        await asyncio.sleep(0.2)
        first.proc.send_signal(signal.SIGKILL)
        await first.proc.wait()
        _say("demo", f"SIGKILLed the gateway mid-reply (exit status {first.proc.returncode})")

    async def restart(self) -> Child:
        """A message while the bot is dead; the restart recovers both."""
        await self.user("bob", "are you there?")
        # Alice's question is still owed too: it reached the bot, but the bot died before it
        # acked it (a message is retired only once its handler returned).
        await _until(lambda: self.buffered() == 2, "bob's message buffered")
        _say(
            "connector",
            f"the bot is down: {self.buffered()} message(s) owed (alice's, never acked, and bob's)",
        )
        _say("demo", "restarting the gateway")
        second = await self.spawn(restarted=True)
        await _until(
            lambda: len(self.replies("alice")) == 2 and len(self.replies("bob")) == 1, "recovery"
        )
        return second

    async def nap(self, bot: Child) -> None:
        """The bot goes dormant; a message while it sleeps; the wake."""
        await bot.command("dormant")
        await bot.wait_for("DORMANT")
        await self.user("carol", "good morning")
        await _until(lambda: self.buffered() >= 1 or bool(self.replies("carol")), "carol buffered")
        _say("connector", f"{self.buffered()} message(s) buffered while the bot sleeps")
        await _until(lambda: len(self.replies("carol")) == 1, "the wake and the answer", 30)

    async def run(self) -> int:
        """Play the script; returns the exit status (0: nothing lost)."""
        await self.connector.start()
        _say("connector", f"listening on {self.connector.url} (loopback chat platform)")
        try:
            await self.crash_mid_reply()
            bot = await self.restart()
            await self.nap(bot)
            await bot.command("stop")
            stats = await bot.wait_for("STATS")
            await asyncio.wait_for(bot.proc.wait(), 10)
            self.replies("")
            return _summary(self.platform, self.asked, stats)
        finally:
            for child in self.children:
                if child.proc.returncode is None:
                    child.proc.kill()
                    await child.proc.wait()
            await self.connector.stop()
            self.store.close()


async def serve_dashboard(db: Path, stop: asyncio.Event) -> None:
    """Serve the dashboard of the ledger in ``db`` (read-only, replies shown: a local demo) until
    ``stop`` is set, saying where."""
    ledger = SQLiteStore(db)
    dashboard = Dashboard(ledger, show_content=True)
    web = WebServer([dashboard])
    await web.start()
    try:
        print(f"\nthe bot's ledger, each reply's history on click: {web.url}/dashboard/")
        print("Ctrl-C stops it.", flush=True)
        await stop.wait()
    finally:
        await web.stop()
        await dashboard.close()
        ledger.close()


def statecore_command() -> str:
    """How to run the ``statecore`` command from here: its name when the shell finds this
    environment's one on PATH, else its path (``.venv/bin/statecore`` after ``make demo``)."""
    here = Path(sys.executable).parent / "statecore"
    found = shutil.which("statecore")
    if found is not None and Path(found).resolve() == here.resolve():
        return "statecore"
    with contextlib.suppress(ValueError):
        return str(here.relative_to(Path.cwd()))
    return str(here)


async def run_demo(data: Path) -> int:
    """Run the demo in ``data`` (emptied first); returns the exit status (0: nothing lost)."""
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    return await Demo(data).run()


def _summary(platform: LoopbackPlatform, asked: list[tuple[str, str]], stats: str) -> int:
    per_chat = {chat: platform.texts(chat) for chat, _ in asked}
    expected = len(asked)
    got = sum(len(texts) for texts in per_chat.values())
    labelled = sum(1 for chat in per_chat for t in per_chat[chat] if t.startswith(RECOVERED_MARKER))
    lost = max(0, expected - got)
    print()
    print("transcript:")
    for chat, texts in per_chat.items():
        for text in texts:
            print(f"  {chat:<6} {text!r}")
    redelivered = stats.split()[2]
    print()
    print(
        f"summary: {expected} messages, {got} replies sent, redelivered {redelivered} "
        f"(labelled {labelled}), lost {lost}"
    )
    return 0 if lost == 0 and got == expected else 1


def main(argv: list[str] | None = None) -> int:
    """Run the demo (or, with ``--gateway URL``, the bot's gateway process)."""
    parser = argparse.ArgumentParser(description="statecore demo: no reply lost")
    parser.add_argument("--data", default="demo-data", help="directory for the databases")
    parser.add_argument(
        "--no-dashboard",
        action="store_true",
        help="exit after the summary, even in a terminal (default: serve the dashboard there)",
    )
    parser.add_argument("--gateway", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--restarted", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.gateway:
        asyncio.run(run_gateway(args.gateway, Path(args.db), restarted=args.restarted))
        return 0
    status = asyncio.run(run_demo(Path(args.data)))
    # What an operator would run next: the gateway's ledger, counted by state.
    db = Path(args.data).resolve() / "gateway.db"
    store_url = f"sqlite:///{db}"
    command = statecore_command()
    print(f"\n$ {command} ledger stats --store {store_url}")
    statecore_cli(["ledger", "stats", "--store", store_url])
    if command != "statecore":
        print(f"\n(`statecore` is {command}; or first: source {Path(command).parent}/activate)")
    print("\nto talk to a bot yourself, in a browser: make chat")
    if args.no_dashboard or not (sys.stdin.isatty() and sys.stdout.isatty()):
        print(f"to browse this run's ledger: {command} dashboard --store {store_url}")
        return status

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve_dashboard(db, stop)

    asyncio.run(serve())
    return status


if __name__ == "__main__":
    sys.exit(main())

"""A gateway bot SIGKILLed again and again under steady load, with real processes.

The test process runs the connector (``relay.Connector`` on SQLite) in front of a loopback chat.
The bot runs in a child process (``tests/relay/crash_child.py``): a ``Gateway`` whose ledger is
a SQLite file, on a ``WebSocketRelayTransport`` with a ``StoreBufferDedupe``.  Six users write
round-robin at a steady rate while the bot is SIGKILLed after a random 0.5-2.5 s of life and
restarted at once on the same database.  The load starts once the first life has connected
(until a gateway said hello, the connector does not know it listens, and buffers nothing for
it).  When the load ends, the last bot lives on until everything settles (bounded).  Then every
message must have been answered in its own chat, every repeated answer must carry a redelivery
banner, nothing may be owed in the bot's ledger and nothing may be left unacked in the
connector's buffer.

The summary line counts kills, lives (and how many got as far as ``READY``), messages,
replies, messages without a reply (and how many of those the connector never buffered, i.e.
delivered only live), unlabelled duplicates, labelled answers, wrong chat, stray replies, what
the bot's ledger still owes or abandoned, the connector's unacked entries, events nobody
listened to, and the reply latency (injection to the first answer on the platform) p50/p99.

The load lasts ``STATECORE_CRASH_SECONDS`` (default 20); ``STATECORE_CRASH_SEED`` picks the
kill schedule.  A long run, with the one-line summary printed::

    STATECORE_CRASH_SECONDS=400 .venv/bin/pytest -q -s tests/relay/test_crash_under_load.py

Every wait is bounded, and every child is killed and reaped in a ``finally``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import attrs
import pytest

from relay import Connector, LoopbackPlatform
from relay.connector.buffer import BUFFER_KIND, BufferState
from relay.connector.platform import ChatMessage
from statecore import RECONNECTED_MARKER, RECOVERED_MARKER, Ledger
from stores import SQLiteStore
from tests.crash_analysis import (
    Analysis,
    Injected,
    TimedPlatform,
    analyse,
    percentile,
)
from tests.process_lives import Lives, Quiet

pytestmark = pytest.mark.skipif(os.name != "posix", reason="kills real processes with SIGKILL")

REPO_ROOT = Path(__file__).resolve().parents[2]
CHILD_MODULE = "tests.relay.crash_child"
SECONDS_ENV = "STATECORE_CRASH_SECONDS"
SEED_ENV = "STATECORE_CRASH_SEED"
DEFAULT_SECONDS = 20.0
DEFAULT_SEED = 20_240_917
GATEWAY_ID = "gw"
SECRET = "crash-under-load-secret"
CHATS = 6
RATE_PER_S = 8.0
"""Messages injected per second, over all chats together."""
LIFE_S = (0.5, 2.5)
"""A bot process lives uniformly this long before its SIGKILL (from its spawn; the first life
from the start of the load)."""
HANDLER_SLEEP_S = 0.05
"""The bot's work per message before it replies."""
QUIET_MAX_S = 30.0
"""The longest the quiet period may last before the checks run anyway."""
STABLE_S = 3.0
"""Settled: nothing owed, nothing buffered, and no new reply for this long (or all answered)."""
FIRST_HELLO_S = 20.0
"""The bound on the first life's first connection (before the load starts)."""
"""The bound on reaping one killed child."""


def load_seconds() -> float:
    """How long the load runs: ``STATECORE_CRASH_SECONDS``, default 20."""
    raw = os.environ.get(SECONDS_ENV, "").strip()
    return float(raw) if raw else DEFAULT_SECONDS


def seed() -> int:
    """The kill schedule's seed: ``STATECORE_CRASH_SEED``, default fixed."""
    raw = os.environ.get(SEED_ENV, "").strip()
    return int(raw) if raw else DEFAULT_SEED


def chat_of(n: int) -> str:
    """The chat id of chat number ``n``."""
    return f"chat-{n}"


def user_of(n: int) -> str:
    """The user who writes in chat number ``n``."""
    return f"user-{n}"


# -- the bot's lives ------------------------------------------------------------------------------


class Bots(Lives):
    """The bot's successive lives: child processes on one database, killed with SIGKILL."""

    def __init__(self, url: str, db: Path, log: IO[bytes]) -> None:
        super().__init__()
        self.url = url
        self.db = db
        self.log = log

    @property
    def current(self) -> asyncio.subprocess.Process | None:
        """The newest life, if it has not been reaped."""
        if self.lives and self.lives[-1].returncode is None:
            return self.lives[-1]
        return None

    async def spawn(self) -> asyncio.subprocess.Process:
        """Start a new life of the bot."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            CHILD_MODULE,
            "--url",
            self.url,
            "--db",
            str(self.db),
            "--secret",
            SECRET,
            "--handler-sleep",
            str(HANDLER_SLEEP_S),
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
        )
        self.lives.append(proc)
        return proc

    async def kill(self, proc: asyncio.subprocess.Process, *, crash: bool = True) -> None:
        """SIGKILL the bot's life ``proc`` and reap it (see :meth:`Lives.kill_one`)."""
        await self.kill_one(proc, crash=crash)


async def crash_loop(
    bots: Bots, proc: asyncio.subprocess.Process, rng: random.Random, until: float
) -> None:
    """Let ``proc`` live 0.5-2.5 s, SIGKILL it, restart at once, and so on; the life that would
    outlast the load is left running (it is the one the quiet period watches)."""
    while True:
        life = rng.uniform(*LIFE_S)
        if time.monotonic() + life >= until:
            return
        await asyncio.sleep(life)
        await bots.kill(proc)
        proc = await bots.spawn()


async def first_hello(connector: Connector, proc: asyncio.subprocess.Process) -> None:
    """Wait (bounded) until the first life is connected: from then on the connector knows the
    gateway listens to the platform, and buffers for it whenever it is gone."""
    deadline = time.monotonic() + FIRST_HELLO_S
    while not connector.connected(GATEWAY_ID):
        if proc.returncode is not None or time.monotonic() > deadline:
            raise AssertionError(
                f"the first life of the bot did not connect within {FIRST_HELLO_S:g} s "
                f"(exit status {proc.returncode})"
            )
        await asyncio.sleep(0.02)


async def load(platform: LoopbackPlatform, until: float, injected: list[Injected]) -> None:
    """Inject unique messages round-robin over the chats at ``RATE_PER_S`` until ``until``."""
    interval = 1.0 / RATE_PER_S
    next_at = time.monotonic()
    n = 0
    while next_at < until:
        delay = next_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        chat = n % CHATS
        text = f"c{chat}-m{n // CHATS}"
        at = time.monotonic()
        message_id = await platform.inject(chat_of(chat), text, user_id=user_of(chat))
        injected.append(Injected(text, chat_of(chat), message_id, at))
        n += 1
        next_at += interval


def ever_buffered(store: SQLiteStore) -> set[str]:
    """Message ids of every event the connector ever buffered for the gateway (acked or not)."""
    rows = store.select(BUFFER_KIND, states=tuple(BufferState), where={"gateway_id": GATEWAY_ID})
    ids = set()
    for row in rows:
        message_id = json.loads(row["event_json"]).get("message_id")
        if isinstance(message_id, str):
            ids.add(message_id)
    return ids


async def quiet_period(
    connector: Connector,
    platform: TimedPlatform,
    db: Path,
    all_answered: Callable[[], bool],
) -> Quiet:
    """Wait (at most ``QUIET_MAX_S``) until the bot is connected, nothing is owed in its ledger,
    nothing is buffered for it, and either every message is answered or no reply came for
    ``STABLE_S``."""
    start = time.monotonic()
    quiet = Quiet()
    last_count, last_change = -1, start
    store: SQLiteStore | None = None
    ledger: Ledger | None = None
    try:
        while time.monotonic() - start < QUIET_MAX_S:
            now = time.monotonic()
            if platform.performed != last_count:
                last_count, last_change = platform.performed, now
            if ledger is None and db.exists():
                store = SQLiteStore(db)  # a second connection next to the running bot's
                ledger = Ledger(store)
            if ledger is not None:
                quiet.owed = len(ledger.owed())
            quiet.buffered = connector.buffered(GATEWAY_ID)
            if (
                connector.connected(GATEWAY_ID)
                and quiet.owed == 0
                and quiet.buffered == 0
                and (all_answered() or now - last_change >= STABLE_S)
            ):
                quiet.settled = True
                break
            await asyncio.sleep(0.1)
    finally:
        quiet.seconds = time.monotonic() - start
        if store is not None:
            store.close()
    return quiet


# -- the tests ------------------------------------------------------------------------------------


def test_analysis_strips_banners_and_counts_missing_duplicates_and_wrong_chats() -> None:
    """The harness's reading of the chats: banners are stripped, only unlabelled repeats count
    as duplicates, and answers in another chat or to nothing are counted apart."""
    platform = LoopbackPlatform()
    msgs = [Injected(f"c{n}-m0", chat_of(n), f"m{n}", 0.0) for n in range(4)]

    def bot(chat: str, text: str) -> None:
        line = ChatMessage(f"b{len(platform.sent)}", chat, "bot", text)
        platform.transcript.setdefault(chat, []).append(line)

    bot(chat_of(0), "echo: c0-m0")
    bot(chat_of(0), f"{RECOVERED_MARKER}\n\necho: c0-m0")  # a labelled repeat: fine
    bot(chat_of(1), f"{RECONNECTED_MARKER}\n\necho: c1-m0")  # labelled first copy: answered
    bot(chat_of(1), "echo: c1-m0")  # an unlabelled repeat
    bot(chat_of(2), "echo: c3-m0")  # c3's answer in c2's chat
    bot(chat_of(2), "echo: nobody asked")
    bot(chat_of(2), f"{RECOVERED_MARKER}\necho: c2-m0")  # no blank line: not a banner
    result = analyse(msgs, platform, {(chat_of(0), "echo: c0-m0"): 0.25})
    assert result.messages == 4
    assert result.replies == 7
    assert result.without_reply == ("c2-m0", "c3-m0")
    assert result.unlabelled_duplicates == 1
    assert result.labelled == 2
    assert result.wrong_chat == 1
    assert result.stray == 2
    assert result.latencies == (0.25,)


@attrs.frozen
class Run:
    """Everything one crash-under-load run measured."""

    seed: int
    load_s: float
    kills: int
    lives: int
    ready: int
    """Lives that got as far as printing READY (``gateway.start()`` returned)."""
    other_exits: tuple[int, ...]
    final_alive: bool
    quiet: Quiet
    result: Analysis
    lost_unbuffered: int
    """Of the messages without a reply, those the connector never buffered (delivered live)."""
    owed: int
    abandoned: int
    buffered: int
    undeliverable: int
    """Events the connector had no listening gateway for."""

    def summary(self) -> str:
        """The one-line report."""
        r = self.result
        ms = [x * 1000 for x in r.latencies]
        return (
            f"crash under load: {self.load_s:.0f} s, seed {self.seed}, kills {self.kills}, "
            f"lives {self.lives} ({self.ready} ready), messages {r.messages} "
            f"({r.messages / self.load_s:.1f}/s), replies {r.replies}, "
            f"messages without a reply {len(r.without_reply)} "
            f"({self.lost_unbuffered} never buffered), "
            f"unlabelled duplicates {r.unlabelled_duplicates}, labelled {r.labelled}, "
            f"wrong chat {r.wrong_chat}, stray {r.stray}, owed {self.owed}, "
            f"abandoned {self.abandoned}, unacked buffered {self.buffered}, "
            f"undeliverable {self.undeliverable}, "
            f"latency p50 {percentile(ms, 0.5):.0f} ms p99 {percentile(ms, 0.99):.0f} ms, "
            f"quiet {self.quiet.seconds:.1f} s "
            f"({'settled' if self.quiet.settled else 'NOT settled'})"
        )

    def problems(self) -> list[str]:
        """Every check that failed, the harness's own first."""
        found = []
        # The harness: a crash test that did not crash, load or restart proves nothing.
        if self.kills < 1 or self.ready < 1:
            found.append(f"the harness did not run: {self.kills} kills, {self.ready} lives ready")
        r = self.result
        if r.messages < 4 * self.load_s * 0.9:
            found.append(f"the load fell below 4 messages/s ({r.messages} in {self.load_s:.1f} s)")
        if self.undeliverable:
            found.append(f"events no gateway listened to: {self.undeliverable}")
        if self.other_exits:
            found.append(f"bot lives that ended other than by SIGKILL: {list(self.other_exits)}")
        if not self.final_alive:
            found.append("the last life of the bot died during the quiet period")
        # The framework.
        if r.without_reply:
            shown = ", ".join(r.without_reply[:10]) + ("..." if len(r.without_reply) > 10 else "")
            found.append(f"messages without a reply: {len(r.without_reply)} ({shown})")
        if r.unlabelled_duplicates:
            found.append(f"unlabelled duplicates: {r.unlabelled_duplicates}")
        if r.wrong_chat or r.stray:
            found.append(f"wrong chat: {r.wrong_chat}, stray replies: {r.stray}")
        if self.owed or self.abandoned:
            found.append(f"the bot's ledger still owes {self.owed}, abandoned {self.abandoned}")
        if self.buffered:
            found.append(f"the connector holds {self.buffered} unacked entries for {GATEWAY_ID}")
        if not self.quiet.settled:
            found.append(
                f"not settled within {QUIET_MAX_S:g} s (owed {self.quiet.owed}, "
                f"buffered {self.quiet.buffered} at its end)"
            )
        return found


async def crash_under_load(workdir: Path, seconds: float, run_seed: int) -> Run:
    """Run the connector here and the bot in ever-killed children under load; then settle,
    stop everything and read the chats, the bot's ledger and the connector's buffer."""
    rng = random.Random(run_seed)
    platform = TimedPlatform()
    connector_store = SQLiteStore(workdir / "connector.db")
    connector = Connector(
        connector_store, secrets={GATEWAY_ID: [SECRET]}, drivers={"loopback": platform}
    )
    db = workdir / "bot.db"
    log_path = workdir / "bots.log"
    injected: list[Injected] = []

    def answered() -> bool:
        return not analyse(injected, platform, platform.first_seen).without_reply

    try:
        await connector.start()
        with log_path.open("ab") as log:
            bots = Bots(connector.url, db, log)
            try:
                first = await bots.spawn()
                await first_hello(connector, first)
                start = time.monotonic()
                until = start + seconds
                async with asyncio.timeout(seconds + 60):
                    await asyncio.gather(
                        crash_loop(bots, first, rng, until), load(platform, until, injected)
                    )
                load_s = time.monotonic() - start
                final = bots.current
                assert final is not None, "the last life of the bot is not running"
                quiet = await quiet_period(connector, platform, db, answered)
                final_alive = final.returncode is None
                await bots.kill(final, crash=False)
            finally:
                await bots.kill_all()
                await connector.stop()
        bot_store = SQLiteStore(db)  # every life is gone: this is what the bot left behind
        try:
            ledger = Ledger(bot_store)
            owed, abandoned = len(ledger.owed()), len(ledger.abandoned())
        finally:
            bot_store.close()
        buffered = connector.buffered(GATEWAY_ID)
        buffered_ids = ever_buffered(connector_store)
    finally:
        connector_store.close()
    result = analyse(injected, platform, platform.first_seen)
    ids = {m.text: m.message_id for m in injected}
    return Run(
        seed=run_seed,
        load_s=load_s,
        kills=bots.kills,
        lives=len(bots.lives),
        ready=log_path.read_text(errors="replace").count("READY pid="),
        other_exits=tuple(bots.other_exits),
        final_alive=final_alive,
        quiet=quiet,
        result=result,
        lost_unbuffered=sum(ids[text] not in buffered_ids for text in result.without_reply),
        owed=owed,
        abandoned=abandoned,
        buffered=buffered,
        undeliverable=connector.undeliverable,
    )


@pytest.mark.asyncio
async def test_every_message_is_answered_once_or_labelled_across_sigkills_under_load(
    tmp_path: Path,
) -> None:
    """Under steady load, with the bot SIGKILLed every 0.5-2.5 s, every message is answered in
    its own chat, repeats are labelled, and nothing stays owed or unacked."""
    run = await crash_under_load(tmp_path, load_seconds(), seed())
    summary = run.summary()
    print(f"\n{summary}")
    problems = run.problems()
    assert not problems, summary + "\n" + "\n".join(problems)

"""The Telegram driver's guarantee under SIGKILL, against the fake Bot API server.

Three parts: the fake Bot API server (``relay.telegram.testing``) in this test process, on a
fixed loopback port for the whole run; the connector with the Telegram driver on a SQLite file,
in a child process (``tests/relay/telegram/connector_child.py``, on a fixed port so that the
gateway redials the same URL after a restart); and the gateway, an echo bot whose ledger is a
SQLite file, in a child process (``tests/relay/crash_child.py --platform telegram``),
answering every message ``text`` with ``echo: <text>`` in the message's topic and as a reply to
it.

Six chats (three private, two groups, one forum topic); people write ``RATE_PER_S`` unique
messages a second (``m-<chat>-<n>``) round-robin for the whole run, after one answered warm-up
message in every chat.  Meanwhile faults drawn from a seed SIGKILL the connector and the
gateway, shuffled, each restarted at once on its database, ``LIFE_S`` after the previous restart
was READY; every second kill of each kind waits (at most ``MOMENT_WAIT_S``) for its moment: a
connector whose output says it took an update whose offset is not saved yet (a batch half
taken), a gateway with messages unanswered (replies in flight).  The fake server misbehaves as
well, every ``PLATFORM_FAULT_S``: a ``sendMessage`` that acts and never answers (an ambiguous
attempt), a 429 with ``retry_after``, a 502 on a send or on ``getUpdates``, an update delivered
twice.  After the last kill the load goes on for ``TAIL_S``, then the run waits (bounded) until
every message is answered, the gateway's ledger owes nothing and the connector's buffer is empty.

Then every chat, as the fake server shows it, is checked: every person message has a bot reply
(``reply_to`` the message, the body ``echo: <text>`` after any "possible repeat" banner) in the
same chat and topic; **at most one copy of each reply without the banner** (Telegram has no
idempotent send: an ambiguous attempt's resend is a second message, and it must be labelled);
no reply in the wrong chat or topic, no stray bot message.  Copies and labels are counted.

``STATECORE_TELEGRAM_CRASH_KILLS`` sets the kills of each kind (default 3, the normal suite);
``STATECORE_TELEGRAM_CRASH_SEED`` the seed (default fixed; printed with the results).  The long
run: ``STATECORE_TELEGRAM_CRASH_KILLS=20 pytest -s tests/relay/telegram/test_crash.py``.

Every wait is bounded, and every child is killed and reaped in a ``finally``; the children exit
on their own when orphaned.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import aiohttp
import attrs
import pytest

from relay.telegram.testing import ChatMessage, FakeTelegram, TelegramUser
from statecore import RECONNECTED_MARKER, RECOVERED_MARKER, Ledger
from statecore.lifecycles import ObligationState
from statecore.obligation import OBLIGATION_KIND
from stores import SQLiteStore
from tests.process_lives import Lives, Quiet

pytestmark = pytest.mark.skipif(os.name != "posix", reason="kills real processes with SIGKILL")

REPO_ROOT = Path(__file__).resolve().parents[3]
CONNECTOR_MODULE = "tests.relay.telegram.connector_child"
GATEWAY_MODULE = "tests.relay.crash_child"
GATEWAY_LEDGER = (
    *("--max-attempts", "10"),
    *("--retry-backoff", "0.5,1,1,1,1"),
    *("--retry-interval", "0.5"),
)
"""The gateway's ledger retries a failed send after 0.5 s and 1 s (and its sweep runs every
0.5 s), up to 10 attempts: the run's platform faults (a send that reached Telegram without an
answer) are resent within the run, labelled."""
KILLS_ENV = "STATECORE_TELEGRAM_CRASH_KILLS"
SEED_ENV = "STATECORE_TELEGRAM_CRASH_SEED"
DEFAULT_KILLS = 3
DEFAULT_SEED = 20_261_204
SECRET = "telegram-crash-secret"
RATE_PER_S = 5.0
"""Messages written per second, over all chats together."""
LIFE_S = (0.3, 2.0)
"""A fault comes uniformly this long after the previous restart was READY."""
MOMENT_WAIT_S = 3.0
HANDLER_SLEEP_S = 0.2
REQUEST_TIMEOUT_S = 1.0
"""The connector's bound on one Bot API call (an ambiguous send fails after it)."""
SAVE_DELAY_S = 0.05
"""The connector child waits this long before each save of its offset (a slow store)."""
PLATFORM_FAULT_S = (1.0, 3.0)
"""The fake server misbehaves once every so long (uniformly drawn)."""
TAIL_S = 3.0
READY_S = 40.0
SETUP_S = 30.0
QUIET_MAX_S = 90.0
STABLE_S = 2.0
BANNERS = (f"{RECOVERED_MARKER}\n\n", f"{RECONNECTED_MARKER}\n\n")
ANN = TelegramUser(501, "Ann", "ann")
BOB = TelegramUser(502, "Bob", "bob")


@attrs.frozen
class ChatPlan:
    """One chat of the run: where people write, and how."""

    index: int
    chat_id: int
    kind: str
    user: TelegramUser | None
    thread_id: int | None = None


CHATS = (
    ChatPlan(0, 1001, "private", None),
    ChatPlan(1, 1002, "private", None),
    ChatPlan(2, 1003, "private", None),
    ChatPlan(3, -2001, "group", ANN),
    ChatPlan(4, -2002, "supergroup", BOB),
    ChatPlan(5, -3001, "supergroup", ANN, thread_id=5),
)


def kills_of_each_kind() -> int:
    raw = os.environ.get(KILLS_ENV, "").strip()
    return int(raw) if raw else DEFAULT_KILLS


def run_seed() -> int:
    raw = os.environ.get(SEED_ENV, "").strip()
    return int(raw) if raw else DEFAULT_SEED


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the analysis of the chats --------------------------------------------------------------------


def split_banner(body: str) -> tuple[bool, str]:
    """(labelled, the rest): whether ``body`` starts with a "possible repeat" banner."""
    for banner in BANNERS:
        if body.startswith(banner):
            return True, body[len(banner) :]
    return False, body


@attrs.frozen
class Analysis:
    """Every chat checked (see the module docs)."""

    messages: int
    replies: int
    without_reply: tuple[str, ...]
    copies: int
    """Bot messages answering a message already answered (labelled or not)."""
    unlabelled_copies: int
    """Copies beyond the first without a banner: silent repeats (must be 0)."""
    labelled: int
    wrong_place: int
    """Bot messages in another chat or topic than the message they answer."""
    stray: int
    first_answer_at: Mapping[tuple[int, int], float]
    written_at: Mapping[tuple[int, int], float]


def analyse(chats: Mapping[int, Sequence[ChatMessage]]) -> Analysis:
    """Check what every chat shows (chat id -> messages, oldest first)."""
    people = {
        (chat_id, m.message_id): m
        for chat_id, messages in chats.items()
        for m in messages
        if not m.from_bot
    }
    by_text = {m.text: key for key, m in people.items()}
    copies: Counter[tuple[int, int]] = Counter()
    plain: Counter[tuple[int, int]] = Counter()
    first: dict[tuple[int, int], float] = {}
    labelled = wrong_place = stray = replies = 0
    for chat_id, messages in chats.items():
        for bot in (m for m in messages if m.from_bot):
            replies += 1
            flagged, rest = split_banner(bot.text)
            labelled += flagged
            echoed = by_text.get(rest[len("echo: ") :]) if rest.startswith("echo: ") else None
            target = (chat_id, bot.reply_to) if bot.reply_to is not None else None
            if echoed is None:
                stray += 1
            elif echoed[0] != chat_id or people[echoed].thread_id != bot.thread_id:
                wrong_place += 1
            elif target != echoed:
                stray += 1  # the relation and the body disagree
            else:
                copies[echoed] += 1
                plain[echoed] += not flagged
                first[echoed] = min(first.get(echoed, bot.at), bot.at)
    return Analysis(
        messages=len(people),
        replies=replies,
        without_reply=tuple(m.text for key, m in people.items() if not copies[key]),
        copies=sum(n - 1 for n in copies.values() if n > 1),
        unlabelled_copies=sum(n - 1 for n in plain.values() if n > 1),
        labelled=labelled,
        wrong_place=wrong_place,
        stray=stray,
        first_answer_at=first,
        written_at={key: m.at for key, m in people.items()},
    )


def test_the_analysis_counts_missing_copies_silent_repeats_and_wrong_places() -> None:
    """The harness's reading of the chats: a repeat without its banner is a silent repeat,
    a labelled one is a counted copy; a reply elsewhere or to another message is no answer."""

    def msg(n: int, sender: str, text: str, reply_to: int | None = None, thread: int | None = None):
        return ChatMessage(n, 0, sender, 1, text, thread, reply_to, at=float(n))

    a = [msg(1, "Ann", "m-0-0"), msg(2, "Ann", "m-0-1"), msg(3, "Ann", "m-0-2")]
    a += [
        msg(4, "bot", "echo: m-0-0", 1),
        msg(5, "bot", f"{RECOVERED_MARKER}\n\necho: m-0-0", 1),  # a labelled copy
        msg(6, "bot", "echo: m-0-1", 2),
        msg(7, "bot", "echo: m-0-1", 2),  # a silent repeat
        msg(8, "bot", "echo: m-0-2", 1),  # the relation names another message
        msg(9, "bot", "echo: m-1-0", 1),  # another chat's answer here
    ]
    b = [msg(1, "Bob", "m-1-0", thread=5), msg(2, "bot", "echo: m-1-0", 1, thread=None)]
    result = analyse({10: a, 20: b})
    assert result.messages == 4
    assert result.replies == 7
    assert result.without_reply == ("m-0-2", "m-1-0")
    assert result.copies == 2
    assert result.unlabelled_copies == 1
    assert result.labelled == 1
    assert result.wrong_place == 2  # in another chat; in the chat but outside the topic
    assert result.stray == 1


# -- the processes --------------------------------------------------------------------------------


@attrs.define(eq=False)
class Life:
    """One child process and what its output said."""

    proc: asyncio.subprocess.Process
    ready: asyncio.Event = attrs.field(factory=asyncio.Event)
    taken: list[str] = attrs.field(factory=list)
    unsaved: int = 0
    saving: bool = False
    took: asyncio.Event = attrs.field(factory=asyncio.Event)
    reader: asyncio.Task[None] | None = None

    @property
    def half_taken(self) -> bool:
        """Updates taken, and the save of the offset that covers them not begun."""
        return self.unsaved > 0 and not self.saving


async def read_output(life: Life, log: IO[bytes]) -> None:
    """Copy a child's output to ``log`` and follow its READY, ``T``, ``s`` and ``S`` lines."""
    stream = life.proc.stdout
    assert stream is not None
    async for raw in stream:
        log.write(raw)
        line = raw.decode(errors="replace").rstrip("\n")
        if line.startswith("READY "):
            life.ready.set()
        elif line.startswith("T "):
            life.taken.append(line[2:])
            life.unsaved += 1
            life.took.set()
        elif line == "s":
            life.saving = True
            life.took.clear()
        elif line == "S":
            life.unsaved, life.saving = 0, False


class Processes(Lives):
    """The successive lives of one kind of child, each spawned with ``argv``."""

    def __init__(self, name: str, argv: list[str], log: IO[bytes]) -> None:
        super().__init__()
        self.name = name
        self.argv = argv
        self.log = log
        self.by_proc: dict[int, Life] = {}
        self.ready_times: list[float] = []

    @property
    def current(self) -> Life | None:
        if self.lives and self.lives[-1].returncode is None:
            return self.by_proc[id(self.lives[-1])]
        return None

    def all_lives(self) -> list[Life]:
        return [self.by_proc[id(proc)] for proc in self.lives]

    async def spawn(self) -> Life:
        """Start a new life and wait (bounded) for its READY."""
        began = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            *self.argv,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        self.lives.append(proc)
        life = Life(proc)
        self.by_proc[id(proc)] = life
        life.reader = asyncio.create_task(read_output(life, self.log))
        waits = [asyncio.create_task(life.ready.wait()), asyncio.create_task(proc.wait())]
        await asyncio.wait(waits, timeout=READY_S, return_when=asyncio.FIRST_COMPLETED)
        for task in waits:
            task.cancel()
        if not life.ready.is_set():
            raise AssertionError(
                f"a {self.name} life was not READY within {READY_S:g} s "
                f"(exit status {proc.returncode}); see its log"
            )
        self.ready_times.append(time.monotonic() - began)
        return life

    async def kill(self, life: Life, *, crash: bool = True) -> None:
        """SIGKILL ``life``, reap it and read the rest of its output (bounded)."""
        await self.kill_one(life.proc, crash=crash)
        if life.reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(life.reader, 5.0)

    async def stop_all(self) -> None:
        await self.kill_all()
        for life in self.all_lives():
            if life.reader is not None and not life.reader.done():
                life.reader.cancel()
                with contextlib.suppress(BaseException):
                    await life.reader


# -- one run --------------------------------------------------------------------------------------


@attrs.frozen
class Kill:
    kind: str
    at: float
    """``time.monotonic()`` of the kill (the fake server's clock for messages)."""
    targeted: bool
    in_flight: int


@attrs.frozen
class Run:
    """Everything one Telegram crash run measured."""

    seed: int
    kills: tuple[Kill, ...]
    connector_kills: int
    gateway_kills: int
    half_taken: int
    while_saving: int
    redelivered: int
    platform_faults: Mapping[str, int]
    other_exits: tuple[int, ...]
    load_s: float
    written: int
    quiet: Quiet
    owed: int
    abandoned: int
    resent: int
    result: Analysis

    @property
    def loaded(self) -> int:
        return self.written - len(CHATS)

    def recoveries(self, kind: str) -> list[float]:
        """For every kill of ``kind``: seconds to the first answer to a message written after."""
        r = self.result
        found = []
        for kill in self.kills:
            if kill.kind != kind:
                continue
            answers = [
                t for key, t in r.first_answer_at.items() if r.written_at.get(key, 0) > kill.at
            ]
            if answers:
                found.append(min(answers) - kill.at)
        return found

    def latencies(self) -> list[float]:
        r = self.result
        return [t - r.written_at[key] for key, t in r.first_answer_at.items()]

    def summary(self) -> str:
        r = self.result

        def spread(values: Sequence[float]) -> str:
            if not values:
                return "-"
            ordered = sorted(values)
            p50 = statistics.median(ordered)
            p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
            return f"p50 {p50:.2f} s, p99 {p99:.2f} s, max {ordered[-1]:.2f} s"

        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.platform_faults.items()))
        in_flight = [k.in_flight for k in self.kills if k.kind == "gateway"]
        rows = [
            ("seed", str(self.seed)),
            ("chats", "6 (3 private, 2 groups, 1 forum topic)"),
            ("load", f"{self.load_s:.1f} s, {self.loaded / self.load_s:.2f} messages/s"),
            ("messages written", str(self.written)),
            ("person messages in the chats", str(r.messages)),
            ("bot replies in the chats", str(r.replies)),
            ("connector kills (SIGKILL)", str(self.connector_kills)),
            ("  with a batch half taken", str(self.half_taken)),
            ("  while saving the offset", str(self.while_saving)),
            ("  updates redelivered and recognised", str(self.redelivered)),
            ("gateway kills (SIGKILL)", str(self.gateway_kills)),
            (
                "  messages in flight at a kill",
                f"mean {statistics.mean(in_flight or [0]):.1f}, "
                f"{sum(n > 0 for n in in_flight)} of {len(in_flight)} kills with some",
            ),
            ("  replies sent more than once (ledger)", str(self.resent)),
            ("platform faults", faults or "-"),
            ("lives ended otherwise", str(list(self.other_exits))),
            ("MISSING (no reply)", str(len(r.without_reply))),
            ("SILENT REPEATS (unlabelled copies)", str(r.unlabelled_copies)),
            ("copies (labelled)", str(r.copies - r.unlabelled_copies)),
            ("WRONG CHAT OR TOPIC", str(r.wrong_place)),
            ("stray bot messages", str(r.stray)),
            ("labelled (possible repeat banner)", str(r.labelled)),
            ("recovery after a connector kill", spread(self.recoveries("connector"))),
            ("recovery after a gateway kill", spread(self.recoveries("gateway"))),
            ("reply latency", spread(self.latencies())),
            (
                "quiet period",
                f"{self.quiet.seconds:.1f} s "
                f"({'settled' if self.quiet.settled else 'NOT settled'}); "
                f"owed {self.owed}, abandoned {self.abandoned}, "
                f"unacked buffered {self.quiet.buffered}",
            ),
        ]
        width = max(len(name) for name, _ in rows)
        lines = ["telegram crash run (recovery: kill -> first answer to a message written after)"]
        lines += [f"  {name:<{width}}  {value}" for name, value in rows]
        return "\n".join(lines)

    def problems(self, wanted: int) -> list[str]:
        found = []
        r = self.result
        if self.connector_kills < wanted or self.gateway_kills < wanted:
            found.append(
                f"the harness did not kill enough: {self.connector_kills} connector and "
                f"{self.gateway_kills} gateway kills, {wanted} of each wanted"
            )
        if self.loaded < 4 * self.load_s:
            found.append(f"the load fell below 4 messages/s ({self.loaded} in {self.load_s:.1f} s)")
        if self.other_exits:
            found.append(f"lives that ended other than by SIGKILL: {list(self.other_exits)}")
        if r.messages != self.written:
            found.append(f"{self.written} messages written, {r.messages} in the chats")
        if r.without_reply:
            shown = ", ".join(r.without_reply[:10])
            found.append(f"messages without a reply: {len(r.without_reply)} ({shown})")
        if r.unlabelled_copies:
            found.append(f"silent repeats (copies without the banner): {r.unlabelled_copies}")
        if r.wrong_place or r.stray:
            found.append(f"replies in the wrong chat or topic: {r.wrong_place}, stray: {r.stray}")
        if self.owed or self.abandoned:
            found.append(f"the bot's ledger still owes {self.owed}, abandoned {self.abandoned}")
        if self.quiet.buffered:
            found.append(f"the connector holds {self.quiet.buffered} unacked entries")
        if not self.quiet.settled:
            found.append(f"not settled within {QUIET_MAX_S:g} s")
        return found


async def healthz(session: aiohttp.ClientSession, port: int) -> dict[str, Any] | None:
    try:
        async with session.get(
            f"http://127.0.0.1:{port}/healthz", timeout=aiohttp.ClientTimeout(total=2)
        ) as response:
            body = await response.json()
            return body if isinstance(body, dict) else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def bounded(predicate: Callable[[], Any], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(0.1)


def ledger_counts(db: Path) -> tuple[int, int, int]:
    """(owed, abandoned, sent more than once) in the bot's ledger (a connection of its own)."""
    if not db.exists():
        return -1, -1, -1
    store = SQLiteStore(db)
    try:
        ledger = Ledger(store)
        rows = store.select(OBLIGATION_KIND, states=tuple(ObligationState))
        resent = sum(int(row["attempts"]) > 1 for row in rows)
        return len(ledger.owed()), len(ledger.abandoned()), resent
    finally:
        store.close()


class CrashRun:
    """One run: the chats, the processes, the load, the faults, the quiet period."""

    def __init__(self, fake: FakeTelegram, workdir: Path, wanted: int, seed: int) -> None:
        self.fake = fake
        self.wanted = wanted
        self.seed = seed
        self.rng = random.Random(seed)
        self.port = free_port()
        self.workdir = workdir
        self.gateway_db = workdir / "gateway.db"
        self.written: dict[tuple[int, int], str] = {}
        self.counts = [0] * len(CHATS)
        self.kills: list[Kill] = []
        self.faults: Counter[str] = Counter()
        self.stop_load = asyncio.Event()
        self.last_bot_count = 0
        self.last_bot_at = time.monotonic()

    def argv(self, kind: str) -> list[str]:
        if kind == "connector":
            return [
                *(CONNECTOR_MODULE, "--api-url", self.fake.api_url, "--token", self.fake.token),
                *("--db", str(self.workdir / "connector.db"), "--secret", SECRET),
                *("--port", str(self.port), "--save-delay", str(SAVE_DELAY_S)),
                *("--request-timeout", str(REQUEST_TIMEOUT_S)),
            ]
        return [
            *(GATEWAY_MODULE, "--url", f"ws://127.0.0.1:{self.port}"),
            *("--db", str(self.gateway_db), "--secret", SECRET, "--platform", "telegram"),
            *("--handler-sleep", str(HANDLER_SLEEP_S)),
            *GATEWAY_LEDGER,
        ]

    def write(self, plan: ChatPlan, text: str) -> None:
        update = self.fake.user_writes(
            plan.chat_id,
            text,
            user=plan.user,
            chat_type=plan.kind,
            thread_id=plan.thread_id,
            forum=plan.thread_id is not None,
        )
        kind = "message"
        self.written[(plan.chat_id, update[kind]["message_id"])] = text

    def answered(self) -> set[tuple[int, int]]:
        found = set()
        bots = 0
        for plan in CHATS:
            for message in self.fake.chat(plan.chat_id):
                if message.from_bot:
                    bots += 1
                    if message.reply_to is not None:
                        found.add((plan.chat_id, message.reply_to))
        if bots != self.last_bot_count:
            self.last_bot_count, self.last_bot_at = bots, time.monotonic()
        return found

    def in_flight(self) -> int:
        return len(set(self.written) - self.answered())

    async def load(self) -> None:
        interval = 1.0 / RATE_PER_S
        next_at = time.monotonic()
        n = 0
        while not self.stop_load.is_set():
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            plan = CHATS[n % len(CHATS)]
            self.write(plan, f"m-{plan.index}-{self.counts[plan.index]}")
            self.counts[plan.index] += 1
            n += 1
            next_at += interval

    async def misbehave(self) -> None:
        """The fake server's own faults, one every ``PLATFORM_FAULT_S``, until cancelled."""
        kinds = ["ambiguous send", "429 send", "502 send", "502 getUpdates", "duplicate update"]
        cycle: list[str] = []
        while True:
            await asyncio.sleep(self.rng.uniform(*PLATFORM_FAULT_S))
            if not cycle:
                cycle = ["ambiguous send", *kinds]  # each kind in turn, ambiguity twice
                self.rng.shuffle(cycle)
            kind = cycle.pop()
            self.faults[kind] += 1
            if kind == "ambiguous send":
                self.fake.act_then_timeout("sendMessage")
            elif kind == "429 send":
                self.fake.fail_next("sendMessage", 429, retry_after=1)
            elif kind == "502 send":
                self.fake.fail_next("sendMessage", 502)
            elif kind == "502 getUpdates":
                self.fake.fail_next("getUpdates", 502)
            else:
                self.fake.duplicate_next_update()

    async def kill_faults(self, connectors: Processes, gateways: Processes) -> None:
        kinds = ["connector"] * self.wanted + ["gateway"] * self.wanted
        self.rng.shuffle(kinds)
        for kind in kinds:
            await asyncio.sleep(self.rng.uniform(*LIFE_S))
            lives = connectors if kind == "connector" else gateways
            life = lives.current
            assert life is not None, f"no {kind} life is running"
            aim = lives.kills % 2 == 1
            with contextlib.suppress(AssertionError, TimeoutError):
                if aim and kind == "connector":
                    await asyncio.wait_for(life.took.wait(), MOMENT_WAIT_S)
                elif aim:
                    await bounded(self.in_flight, "replies in flight", MOMENT_WAIT_S)
            self.kills.append(Kill(kind, time.monotonic(), aim, self.in_flight()))
            await lives.kill(life)
            await lives.spawn()

    async def quiet(self, http: aiohttp.ClientSession) -> Quiet:
        quiet = Quiet()
        began = time.monotonic()
        while time.monotonic() - began < QUIET_MAX_S:
            quiet.owed = ledger_counts(self.gateway_db)[0]
            health = await healthz(http, self.port)
            quiet.buffered = None if health is None else health.get("buffered")
            missing = self.in_flight()
            calm = time.monotonic() - self.last_bot_at >= STABLE_S
            if not missing and quiet.owed == 0 and quiet.buffered == 0 and calm:
                quiet.settled = True
                break
            await asyncio.sleep(0.25)
        quiet.seconds = time.monotonic() - began
        return quiet

    async def serve(
        self, connectors: Processes, gateways: Processes, http: aiohttp.ClientSession
    ) -> tuple[float, Quiet]:
        await connectors.spawn()
        await gateways.spawn()

        async def connected() -> bool:
            health = await healthz(http, self.port)
            return health is not None and health.get("gateways") == 1

        await bounded(connected, "the gateway's first connection", SETUP_S)
        for plan in CHATS:
            self.write(plan, f"m-{plan.index}-warm")
        await bounded(lambda: not self.in_flight(), "the warm-up answers", SETUP_S)
        began = time.monotonic()
        load = asyncio.create_task(self.load())
        misbehaving = asyncio.create_task(self.misbehave())
        try:
            async with asyncio.timeout(self.wanted * 2 * (READY_S + 10) + 60):
                await self.kill_faults(connectors, gateways)
                await asyncio.sleep(TAIL_S)
        finally:
            self.stop_load.set()
            misbehaving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await misbehaving
            await asyncio.wait_for(load, 5)
        load_s = time.monotonic() - began
        return load_s, await self.quiet(http)

    async def run(self) -> Run:
        with (
            (self.workdir / "connector.log").open("ab") as connector_log,
            (self.workdir / "gateway.log").open("ab") as gateway_log,
        ):
            connectors = Processes("connector", self.argv("connector"), connector_log)
            gateways = Processes("gateway", self.argv("gateway"), gateway_log)
            http = aiohttp.ClientSession()
            try:
                load_s, quiet = await self.serve(connectors, gateways, http)
                for lives in (connectors, gateways):
                    final = lives.current
                    if final is not None:
                        await lives.kill(final, crash=False)
            finally:
                await connectors.stop_all()
                await gateways.stop_all()
                await http.close()
        result = analyse({plan.chat_id: self.fake.chat(plan.chat_id) for plan in CHATS})
        lives = connectors.all_lives()
        taken = Counter(e for life in lives for e in set(life.taken))
        owed, abandoned, resent = ledger_counts(self.gateway_db)
        return Run(
            seed=self.seed,
            kills=tuple(self.kills),
            connector_kills=connectors.kills,
            gateway_kills=gateways.kills,
            half_taken=sum(life.half_taken for life in lives[:-1]),
            while_saving=sum(life.saving for life in lives[:-1]),
            redelivered=sum(n > 1 for n in taken.values()),
            platform_faults=dict(self.faults),
            other_exits=tuple(connectors.other_exits + gateways.other_exits),
            load_s=load_s,
            written=len(self.written),
            quiet=quiet,
            owed=owed,
            abandoned=abandoned,
            resent=resent,
            result=result,
        )


@pytest.mark.asyncio
async def test_every_message_is_answered_and_every_repeat_is_labelled_across_sigkills(
    tmp_path: Path,
) -> None:
    """Under steady load in six chats, with the connector and the gateway SIGKILLed again and
    again and the Bot API misbehaving, every message has a reply in its own chat and topic, and
    no copy of a reply is shown without its "possible repeat" label."""
    wanted, seed = kills_of_each_kind(), run_seed()
    print(f"\ntelegram crash run: seed {seed}, {wanted} kills of each kind", flush=True)
    async with FakeTelegram() as fake:
        run = await CrashRun(fake, tmp_path, wanted, seed).run()
    summary = run.summary()
    print(summary)
    problems = run.problems(wanted)
    assert not problems, summary + "\n" + "\n".join(problems)

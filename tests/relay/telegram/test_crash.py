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
import os
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import aiohttp
import attrs
import pytest

from relay.telegram.testing import ChatMessage, FakeTelegram, TelegramUser
from statecore import RECOVERED_MARKER
from tests.crash_analysis import split_banner
from tests.process_lives import Quiet
from tests.relay.platform_crash import (
    Children,
    Kill,
    bounded,
    children,
    free_port,
    gateway_connected,
    harness_problems,
    in_flight_at_kills,
    kill_and_restart,
    ledger_counts,
    quiet_period,
    quiet_row,
    setting,
    spread,
    table,
    taken_in_more_than_one_life,
    took,
    under_load,
)

pytestmark = pytest.mark.skipif(os.name != "posix", reason="kills real processes with SIGKILL")

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
HANDLER_SLEEP_S = 0.2
REQUEST_TIMEOUT_S = 1.0
"""The connector's bound on one Bot API call (an ambiguous send fails after it)."""
SAVE_DELAY_S = 0.05
"""The connector child waits this long before each save of its offset (a slow store)."""
PLATFORM_FAULT_S = (1.0, 3.0)
"""The fake server misbehaves once every so long (uniformly drawn)."""
TAIL_S = 3.0
SETUP_S = 30.0
QUIET_MAX_S = 90.0
STABLE_S = 2.0
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


# -- the analysis of the chats --------------------------------------------------------------------


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

    def msg(
        n: int, sender: str, text: str, reply_to: int | None = None, thread: int | None = None
    ) -> ChatMessage:
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


# -- one run --------------------------------------------------------------------------------------


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
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.platform_faults.items()))
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
            ("  messages in flight at a kill", in_flight_at_kills(self.kills)),
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
            ("quiet period", quiet_row(self.quiet, self.owed, self.abandoned)),
        ]
        title = "telegram crash run (recovery: kill -> first answer to a message written after)"
        return table(title, rows)

    def problems(self, wanted: int) -> list[str]:
        found = harness_problems(
            self.connector_kills,
            self.gateway_kills,
            wanted,
            loaded=self.loaded,
            load_s=self.load_s,
            other_exits=self.other_exits,
        )
        r = self.result
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

    def record(self, kind: str, aim: bool) -> None:
        self.kills.append(Kill(kind, time.monotonic(), aim, self.in_flight()))

    async def quiet(self, http: aiohttp.ClientSession) -> Quiet:
        def settled() -> bool:
            missing = self.in_flight()
            calm = time.monotonic() - self.last_bot_at >= STABLE_S
            return not missing and calm

        return await quiet_period(http, self.port, self.gateway_db, settled, QUIET_MAX_S)

    async def serve(self, lives: Children) -> tuple[float, Quiet]:
        await lives.connectors.spawn()
        await lives.gateways.spawn()
        await bounded(
            lambda: gateway_connected(lives.http, self.port),
            "the gateway's first connection",
            SETUP_S,
        )
        for plan in CHATS:
            self.write(plan, f"m-{plan.index}-warm")
        await bounded(lambda: not self.in_flight(), "the warm-up answers", SETUP_S)
        faults = kill_and_restart(
            self.rng,
            self.wanted,
            LIFE_S,
            lives,
            connector_moment=took,
            in_flight=self.in_flight,
            record=self.record,
        )
        began = await under_load(
            self.load(),
            self.stop_load,
            faults,
            wanted=self.wanted,
            tail_s=TAIL_S,
            beside=[self.misbehave()],
        )
        load_s = time.monotonic() - began
        return load_s, await self.quiet(lives.http)

    async def run(self) -> Run:
        async with children(self.workdir, self.argv("connector"), self.argv("gateway")) as lives:
            load_s, quiet = await self.serve(lives)
            await lives.stop_finals()
        connectors, gateways = lives.connectors, lives.gateways
        result = analyse({plan.chat_id: self.fake.chat(plan.chat_id) for plan in CHATS})
        connector_lives = connectors.all_lives()
        owed, abandoned, resent = ledger_counts(self.gateway_db)
        return Run(
            seed=self.seed,
            kills=tuple(self.kills),
            connector_kills=connectors.kills,
            gateway_kills=gateways.kills,
            half_taken=sum(life.half_taken for life in connector_lives[:-1]),
            while_saving=sum(life.saving for life in connector_lives[:-1]),
            redelivered=taken_in_more_than_one_life(connector_lives),
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
    wanted, seed = setting(KILLS_ENV, DEFAULT_KILLS), setting(SEED_ENV, DEFAULT_SEED)
    print(f"\ntelegram crash run: seed {seed}, {wanted} kills of each kind", flush=True)
    async with FakeTelegram() as fake:
        run = await CrashRun(fake, tmp_path, wanted, seed).run()
    summary = run.summary()
    print(summary)
    problems = run.problems(wanted)
    assert not problems, summary + "\n" + "\n".join(problems)

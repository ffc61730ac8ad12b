"""The Slack driver's guarantee under SIGKILL, against the fake Slack.

The fake Slack (``relay.slack.testing``) lives in this test process for the whole run, with
Slack's 3 s ack window and ``RETRY_DELAYS_S`` between its (at most three) retries.  Two kinds of
child process: the connector with the Slack driver in Socket Mode (two connections) on a SQLite
file (``tests/relay/slack/connector_child.py``, on a fixed loopback port so that the gateway
redials the same URL after a restart), and the gateway, an echo bot whose ledger is a SQLite
file (``tests/relay/crash_child.py --platform slack``), answering every message ``text`` with
``echo: <text>``.

Six people write in six chats (three direct, three channels) ``RATE_PER_S`` unique messages a
second (``m-<chat>-<n>``) for the whole run, after one answered warm-up message in every chat.
Meanwhile faults drawn from a seed SIGKILL the connector and the gateway, shuffled, each
restarted at once on its database, ``LIFE_S`` after the previous restart was READY; every
second kill of each kind waits (at most ``MOMENT_WAIT_S``) for its moment: a connector whose
intake took an event the fake has not seen acked yet (updates half taken), a gateway with
messages unanswered (replies in flight).  After the last kill the load goes on for ``TAIL_S``,
then the run waits (bounded) until every message is answered, no delivery is in flight, the
gateway's ledger owes nothing and the connector's buffer is empty.

Then every chat is read back from the fake as people see it and checked: every person message
has a bot answer (``echo: <text>`` after any "possible repeat" banner) in its own chat; a second
answer to the same message must carry the banner (Slack does not deduplicate sends); no answer
in the wrong chat, no stray bot message; Slack gave up on no event.

``STATECORE_SLACK_CRASH_KILLS`` sets the kills of each kind (default 3, the normal suite);
``STATECORE_SLACK_CRASH_SEED`` the seed (printed with the results).  Every wait is bounded, and
every child is killed and reaped in a ``finally``; the children exit on their own when orphaned.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest

from relay.slack.testing import FakeSlack
from statecore import RECOVERED_MARKER
from tests.crash_analysis import split_banner
from tests.process_lives import Quiet
from tests.relay.platform_crash import (
    MOMENT_WAIT_S,
    Calm,
    Kill,
    Life,
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
    under_load,
)

pytestmark = pytest.mark.skipif(os.name != "posix", reason="kills real processes with SIGKILL")

KILLS_ENV = "STATECORE_SLACK_CRASH_KILLS"
SEED_ENV = "STATECORE_SLACK_CRASH_SEED"
DEFAULT_KILLS = 3
DEFAULT_SEED = 20_261_204
SECRET = "slack-crash-secret"
CHATS = ("D00", "C01", "D02", "C03", "D04", "C05")
RATE_PER_S = 5.0
LIFE_S = (0.3, 2.5)
HANDLER_SLEEP_S = 0.2
TAIL_S = 3.0
SETUP_S = 30.0
QUIET_MAX_S = 90.0
STABLE_S = 2.0
RETRY_DELAYS_S = (1.0, 5.0, 15.0)
"""The fake's delays before each of its three retries (Slack: at once, 1 min, 5 min)."""


@attrs.frozen
class Analysis:
    messages: int
    replies: int
    without_reply: tuple[str, ...]
    unlabelled_duplicates: int
    labelled: int
    wrong_chat: int
    stray: int


def analyse(chats: dict[str, list[tuple[bool, str]]]) -> Analysis:
    """Check every chat's messages (chat -> [(from the bot, text)], in order)."""
    home = {text: chat for chat, items in chats.items() for bot, text in items if not bot}
    answers: dict[str, list[bool]] = {text: [] for text in home}
    labelled = wrong = stray = replies = 0
    for chat, items in chats.items():
        for bot, text in items:
            if not bot:
                continue
            replies += 1
            flagged, rest = split_banner(text)
            labelled += flagged
            asked = rest[len("echo: ") :] if rest.startswith("echo: ") else None
            if asked is None or asked not in home:
                stray += 1
            elif home[asked] != chat:
                wrong += 1
            else:
                answers[asked].append(flagged)
    unlabelled = sum(max(0, len(flags) - 1 - sum(flags)) for flags in answers.values())
    return Analysis(
        messages=len(home),
        replies=replies,
        without_reply=tuple(t for t, flags in answers.items() if not flags),
        unlabelled_duplicates=unlabelled,
        labelled=labelled,
        wrong_chat=wrong,
        stray=stray,
    )


def test_the_analysis_counts_missing_unlabelled_repeats_wrong_chats_and_strays() -> None:
    label = f"{RECOVERED_MARKER}\n\n"
    result = analyse(
        {
            "D1": [
                (False, "a"),
                (True, "echo: a"),
                (True, label + "echo: a"),  # a labelled repeat: fine
                (False, "b"),
                (True, "echo: b"),
                (True, "echo: b"),  # an unlabelled repeat
                (False, "c"),
                (True, "echo: d"),  # d's answer in the wrong chat
            ],
            "C2": [(False, "d"), (True, "echo: nobody"), (False, "e")],
        }
    )
    assert (result.messages, result.replies, result.labelled) == (5, 6, 1)
    assert result.without_reply == ("c", "d", "e")
    assert (result.unlabelled_duplicates, result.wrong_chat, result.stray) == (1, 1, 1)


class CrashRun:
    """One run: the fake, the processes, the load, the faults, the quiet period."""

    def __init__(self, fake: FakeSlack, workdir: Path, wanted: int, seed: int) -> None:
        self.fake = fake
        self.wanted = wanted
        self.seed = seed
        self.rng = random.Random(seed)
        self.port = free_port()
        self.workdir = workdir
        self.gateway_db = workdir / "gateway.db"
        self.sent: dict[str, str] = {}
        """Text -> chat of every person message."""
        self.written = Counter[str]()
        self.kills: list[Kill] = []
        """Every kill; ``in_flight`` is, for a connector, the envelopes awaiting their ack."""
        self.stop_load = asyncio.Event()

    def argv(self, kind: str) -> list[str]:
        fake = self.fake
        if kind == "connector":
            return [
                *("tests.relay.slack.connector_child", "--api-url", fake.api_url),
                *("--bot-token", fake.bot_token, "--app-token", fake.app_token),
                *("--db", str(self.workdir / "connector.db"), "--secret", SECRET),
                *("--port", str(self.port)),
            ]
        return [
            *("tests.relay.crash_child", "--url", f"ws://127.0.0.1:{self.port}"),
            *("--db", str(self.gateway_db), "--secret", SECRET, "--platform", "slack"),
            *("--handler-sleep", str(HANDLER_SLEEP_S)),
        ]

    def answered(self) -> set[str]:
        done = set()
        for chat in CHATS:
            if chat in self.fake.channels():
                for text in self.fake.channel(chat).bot_texts():
                    rest = split_banner(text)[1]
                    if rest.startswith("echo: "):
                        done.add(rest[len("echo: ") :])
        return done

    def in_flight(self) -> int:
        return len(set(self.sent) - self.answered())

    def write(self, chat: str, text: str) -> None:
        kind = "im" if chat.startswith("D") else "channel"
        self.fake.user_writes(chat, text, user=f"U{chat}", channel_type=kind)
        self.sent[text] = chat

    async def load(self) -> None:
        interval, next_at, n = 1.0 / RATE_PER_S, time.monotonic(), 0
        while not self.stop_load.is_set():
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            chat = CHATS[n % len(CHATS)]
            self.write(chat, f"m-{chat}-{self.written[chat]}")
            self.written[chat] += 1
            n += 1
            next_at += interval

    async def half_taken(self, life: Life) -> None:
        """Until an envelope is out whose ack has not come (the event in the connector's
        intake, or taken and not yet acked), polled closely; bounded by ``MOMENT_WAIT_S``."""
        deadline = time.monotonic() + MOMENT_WAIT_S
        while not self.fake.delivery.awaiting_ack and time.monotonic() < deadline:
            await asyncio.sleep(0.002)

    def record(self, kind: str, aim: bool) -> None:
        """A kill: for a connector the envelopes awaiting their ack, for a gateway the
        messages in flight."""
        awaiting = self.fake.delivery.awaiting_ack
        counted = awaiting if kind == "connector" else self.in_flight()
        self.kills.append(Kill(kind, time.monotonic(), aim, counted))

    async def quiet(self, http: aiohttp.ClientSession) -> Quiet:
        calm = Calm(STABLE_S)

        def settled() -> bool:
            count = sum(len(self.fake.channel(c).bot_texts()) for c in CHATS)
            still = calm.see(count)
            idle = self.fake.delivery.in_flight == 0
            return not self.in_flight() and still and idle

        return await quiet_period(http, self.port, self.gateway_db, settled, QUIET_MAX_S)

    async def run(self) -> dict[str, Any]:
        async with children(self.workdir, self.argv("connector"), self.argv("gateway")) as lives:
            connectors, gateways, http = lives.connectors, lives.gateways, lives.http
            await connectors.spawn()
            await gateways.spawn()
            await bounded(
                lambda: gateway_connected(http, self.port),
                "the gateway's first connection",
                SETUP_S,
            )
            await bounded(lambda: len(self.fake.delivery.open_sockets()) == 2, "sockets", SETUP_S)
            for chat in CHATS:
                self.write(chat, f"m-{chat}-warm")
            await bounded(lambda: not self.in_flight(), "the warm-up answers", SETUP_S)
            faults = kill_and_restart(
                self.rng,
                self.wanted,
                LIFE_S,
                lives,
                connector_moment=self.half_taken,
                in_flight=self.in_flight,
                record=self.record,
            )
            began = await under_load(
                self.load(), self.stop_load, faults, wanted=self.wanted, tail_s=TAIL_S
            )
            load_s = time.monotonic() - began
            quiet = await self.quiet(http)
            await lives.stop_finals()
        chats = {
            c: [(m.bot, m.text) for m in self.fake.channel(c).messages]
            for c in CHATS
            if c in self.fake.channels()
        }
        owed, abandoned, resent = ledger_counts(self.gateway_db)
        deliveries = self.fake.delivery.deliveries
        return {
            "analysis": analyse(chats),
            "connector_kills": connectors.kills,
            "gateway_kills": gateways.kills,
            "other_exits": connectors.other_exits + gateways.other_exits,
            "load_s": load_s,
            "loaded": len(self.sent) - len(CHATS),
            "quiet": quiet,
            "owed": owed,
            "abandoned": abandoned,
            "resent": resent,
            "redelivered": taken_in_more_than_one_life(connectors.all_lives()),
            "retries": sum(d.attempt > 0 for d in deliveries),
            "no_ack": sum(d.outcome == "no_ack" for d in deliveries),
            "no_connection": sum(d.outcome == "no_connection" for d in deliveries),
            "late_acks": self.fake.delivery.late_acks,
            "given_up": len(self.fake.delivery.given_up),
            "kills": self.kills,
            "ready_s": connectors.ready_times[1:] + gateways.ready_times[1:],
        }


def summary(run: dict[str, Any], seed: int) -> str:
    r: Analysis = run["analysis"]
    quiet: Quiet = run["quiet"]
    kills: list[Kill] = run["kills"]
    rows = [
        ("seed", str(seed)),
        ("chats", f"{len(CHATS)} (3 direct, 3 channels), 2 Socket Mode connections"),
        ("load", f"{run['load_s']:.1f} s, {run['loaded'] / run['load_s']:.2f} messages/s"),
        ("person messages", str(r.messages)),
        ("bot replies", str(r.replies)),
        ("connector kills (SIGKILL)", str(run["connector_kills"])),
        (
            "  with envelopes awaiting their ack",
            str(sum(k.in_flight > 0 for k in kills if k.kind == "connector")),
        ),
        ("  events taken in more than one life", str(run["redelivered"])),
        ("  attempts not acked / no connection", f"{run['no_ack']} / {run['no_connection']}"),
        ("  Slack retries (retry_attempt > 0)", str(run["retries"])),
        ("  late acks", str(run["late_acks"])),
        ("gateway kills (SIGKILL)", str(run["gateway_kills"])),
        ("  messages in flight at a kill", in_flight_at_kills(kills)),
        ("  replies attempted more than once", str(run["resent"])),
        ("lives ended otherwise", str(run["other_exits"])),
        ("MISSING (no reply)", str(len(r.without_reply))),
        ("UNLABELLED DUPLICATES", str(r.unlabelled_duplicates)),
        ("labelled (possible repeat banner)", str(r.labelled)),
        ("WRONG CHAT / stray", f"{r.wrong_chat} / {r.stray}"),
        ("events Slack gave up on", str(run["given_up"])),
        ("restart to READY", spread(run["ready_s"], p99=False)),
        ("quiet period", quiet_row(quiet, run["owed"], run["abandoned"], "buffered")),
    ]
    return table("slack crash run", rows)


def problems(run: dict[str, Any], wanted: int) -> list[str]:
    r: Analysis = run["analysis"]
    found = harness_problems(
        run["connector_kills"],
        run["gateway_kills"],
        wanted,
        loaded=run["loaded"],
        load_s=run["load_s"],
        other_exits=run["other_exits"],
    )
    if r.without_reply:
        found.append(f"messages without a reply: {len(r.without_reply)} {r.without_reply[:10]}")
    if r.unlabelled_duplicates:
        found.append(f"unlabelled duplicates: {r.unlabelled_duplicates}")
    if r.wrong_chat or r.stray:
        found.append(f"replies in the wrong chat: {r.wrong_chat}, stray: {r.stray}")
    if run["given_up"]:
        found.append(f"events Slack gave up on: {run['given_up']}")
    if run["owed"] or run["abandoned"]:
        found.append(f"the ledger still owes {run['owed']}, abandoned {run['abandoned']}")
    if not run["quiet"].settled:
        found.append("not settled")
    return found


@pytest.mark.asyncio
async def test_every_message_is_answered_and_repeats_are_labelled_across_sigkills(
    tmp_path: Path,
) -> None:
    """Under steady load in six chats, with the connector and the gateway SIGKILLed again and
    again, every message has an answer in its own chat and every repeat is labelled."""
    wanted, seed = setting(KILLS_ENV, DEFAULT_KILLS), setting(SEED_ENV, DEFAULT_SEED)
    print(f"\nslack crash run: seed {seed}, {wanted} kills of each kind", flush=True)
    fake = FakeSlack(ack_timeout_s=3.0, retry_delays_s=RETRY_DELAYS_S, refresh_grace_s=5.0)
    await fake.start()
    try:
        run = await CrashRun(fake, tmp_path, wanted, seed).run()
    finally:
        await fake.stop()
    text = summary(run, seed)
    print(text)
    found = problems(run, wanted)
    assert not found, text + "\n" + "\n".join(found)

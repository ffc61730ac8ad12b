"""The Discord driver's guarantee under SIGKILL, against the fake Discord.

The fake Discord (``relay.discord.testing``) lives in the test process; the connector with the
Discord driver on a SQLite file runs in a child process
(``tests/relay/discord/connector_child.py``, on a fixed loopback port so that the gateway
redials the same URL after a restart), and so does the gateway, an echo bot whose ledger is a
SQLite file (``tests/relay/crash_child.py --platform discord``), answering every message
``text`` with ``echo: <text>`` in its thread and as a reply to it.

Six channels (two DMs, two guild channels, two threads of a guild channel) get ``RATE_PER_S``
unique messages a second together (``m-<channel>-<n>``) for the whole run, after one answered
warm-up message in each.  Meanwhile faults drawn from a seed SIGKILL the connector and the
gateway, shuffled, each restarted at once on its database, ``LIFE_S`` after the previous
restart was READY; every second kill of each kind waits (at most ``MOMENT_WAIT_S``) for its
moment: a connector whose output says it took an event whose seq is not saved yet (half
taken), a gateway with messages unanswered (replies in flight).  After the last kill the load
goes on for ``TAIL_S``, then the run waits (bounded) until every message is answered, the
gateway's ledger owes nothing and the connector's buffer is empty.

Then what every channel shows (the fake's record) is checked: every person message has exactly
one bot message answering it (its ``message_reference`` is the message, its text ``echo:
<text>`` after any "possible repeat" banner) in the same channel; no message without a reply,
no second bot message for the same message (Discord deduplicates the sends by their nonce:
**no duplicates at all**, labelled or not), nothing in the wrong channel, no stray bot message.

``STATECORE_DISCORD_CRASH_KILLS`` sets the kills of each kind (default 3, the normal suite);
``STATECORE_DISCORD_CRASH_SEED`` the seed (printed with the results).  Every wait is bounded
and every child is killed and reaped in a ``finally``; the children exit on their own when
orphaned.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest

from relay.discord.testing import FakeDiscord, FakeMessage
from statecore import RECOVERED_MARKER
from tests.crash_analysis import split_banner
from tests.process_lives import Quiet
from tests.relay.platform_crash import (
    Calm,
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

KILLS_ENV = "STATECORE_DISCORD_CRASH_KILLS"
SEED_ENV = "STATECORE_DISCORD_CRASH_SEED"
DEFAULT_KILLS = 3
DEFAULT_SEED = 20_261_204
SECRET = "discord-crash-secret"
RATE_PER_S = 5.0
LIFE_S = (0.3, 2.5)
HANDLER_SLEEP_S = 0.2
TAIL_S = 3.0
SETUP_S = 40.0
QUIET_MAX_S = 120.0
STABLE_S = 2.0
CHANNELS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("1001", {}),
    ("1002", {}),
    ("2001", {"guild_id": "77"}),
    ("2002", {"guild_id": "77"}),
    ("3001", {"guild_id": "88", "thread": True, "parent_id": "3000"}),
    ("3002", {"guild_id": "88", "thread": True, "parent_id": "3000"}),
)


@attrs.frozen
class Analysis:
    messages: int
    replies: int
    without_reply: tuple[str, ...]
    duplicates: int
    labelled: int
    wrong_channel: int
    stray: int


def analyse(channels: Mapping[str, Sequence[FakeMessage]], bot_id: str) -> Analysis:
    """Check what every channel shows (see the module docs)."""
    people = {m.id: m for msgs in channels.values() for m in msgs if m.author_id != bot_id}
    by_text = {m.content: m for m in people.values()}
    copies: Counter[str] = Counter()
    replies = labelled = wrong = stray = 0
    for channel_id, messages in channels.items():
        for message in messages:
            if message.author_id != bot_id:
                continue
            replies += 1
            flagged, rest = split_banner(message.content)
            labelled += flagged
            echoed = by_text.get(rest[len("echo: ") :]) if rest.startswith("echo: ") else None
            target = people.get(message.reply_to or "")
            found = echoed or target
            if found is None:
                stray += 1
            elif found.channel_id != channel_id:
                wrong += 1
            elif echoed is not target:
                stray += 1
            else:
                copies[found.id] += 1
    return Analysis(
        messages=len(people),
        replies=replies,
        without_reply=tuple(m.content for m in people.values() if not copies[m.id]),
        duplicates=sum(n - 1 for n in copies.values() if n > 1),
        labelled=labelled,
        wrong_channel=wrong,
        stray=stray,
    )


def test_the_analysis_counts_missing_duplicates_wrong_channels_and_labels() -> None:
    """The harness's reading: a repeat is a duplicate labelled or not, a reply in another
    channel or to the wrong message is never an answer."""

    def msg(mid: str, ch: str, author: str, text: str, reply: str | None = None) -> FakeMessage:
        return FakeMessage(mid, ch, author, author, text, author == "bot", reply_to=reply)

    a = [msg("1", "a", "p", "m-a-0"), msg("2", "a", "p", "m-a-1"), msg("3", "a", "p", "m-a-2")]
    b = [msg("4", "b", "q", "m-b-0")]
    a += [
        msg("10", "a", "bot", "echo: m-a-0", "1"),
        msg("11", "a", "bot", f"{RECOVERED_MARKER}\n\necho: m-a-0", "1"),
        msg("12", "a", "bot", "echo: m-a-1", "3"),
        msg("13", "a", "bot", "echo: m-b-0", "4"),
    ]
    result = analyse({"a": a, "b": b}, "bot")
    assert (result.messages, result.replies) == (4, 4)
    assert result.without_reply == ("m-a-1", "m-a-2", "m-b-0")
    assert (result.duplicates, result.labelled, result.wrong_channel, result.stray) == (1, 1, 1, 1)


class CrashRun:
    """One run: the channels, the processes, the load, the faults, the quiet period."""

    def __init__(self, fake: FakeDiscord, workdir: Path, wanted: int, seed: int) -> None:
        self.fake = fake
        self.workdir = workdir
        self.wanted = wanted
        self.seed = seed
        self.rng = random.Random(seed)
        self.port = free_port()
        self.gateway_db = workdir / "gateway.db"
        self.written: dict[str, int] = {c: 0 for c, _ in CHANNELS}
        self.sent: list[FakeMessage] = []
        self.kills: list[Kill] = []
        self.stop_load = asyncio.Event()

    def argv(self, kind: str) -> list[str]:
        if kind == "connector":
            return [
                *("tests.relay.discord.connector_child", "--api-base", self.fake.api_base),
                *("--token", self.fake.token, "--db", str(self.workdir / "connector.db")),
                *("--secret", SECRET, "--port", str(self.port)),
            ]
        return [
            *("tests.relay.crash_child", "--url", f"ws://127.0.0.1:{self.port}"),
            *("--db", str(self.gateway_db), "--secret", SECRET, "--platform", "discord"),
            *("--handler-sleep", str(HANDLER_SLEEP_S)),
        ]

    def answered(self) -> set[str]:
        return {
            m.reply_to
            for c, _ in CHANNELS
            for m in self.fake.bot_messages(c)
            if m.reply_to is not None
        }

    def in_flight(self) -> int:
        return len({m.id for m in self.sent} - self.answered())

    def write(self, index: int, suffix: str | None = None) -> None:
        channel, options = CHANNELS[index]
        n = self.written[channel]
        self.written[channel] += 1
        text = f"m-{channel}-{suffix or n}"
        self.sent.append(self.fake.user_writes(channel, text, author=f"p{index}", **options))

    async def load(self) -> None:
        interval, next_at, n = 1.0 / RATE_PER_S, time.monotonic(), 0
        while not self.stop_load.is_set():
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self.write(n % len(CHANNELS))
            n += 1
            next_at += interval

    def record(self, kind: str, aim: bool) -> None:
        self.kills.append(Kill(kind, time.monotonic(), aim, self.in_flight()))

    async def quiet(self, http: aiohttp.ClientSession) -> Quiet:
        calm = Calm(STABLE_S)

        def settled() -> bool:
            still = calm.see(sum(len(self.fake.bot_messages(c)) for c, _ in CHANNELS))
            return not self.in_flight() and still

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
            for index in range(len(CHANNELS)):
                self.write(index, "warm")
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
                self.load(), self.stop_load, faults, wanted=self.wanted, tail_s=TAIL_S
            )
            load_s = time.monotonic() - began
            quiet = await self.quiet(http)
            await lives.stop_finals()
        channels = {c: self.fake.channel(c) for c, _ in CHANNELS}
        connector_lives = connectors.all_lives()
        owed, abandoned, resent = ledger_counts(self.gateway_db)
        return {
            "analysis": analyse(channels, self.fake.bot_id),
            "load_s": load_s,
            "sent": len(self.sent),
            "connector_kills": connectors.kills,
            "gateway_kills": gateways.kills,
            "half_taken": sum(life.half_taken for life in connector_lives[:-1]),
            "while_saving": sum(life.saving for life in connector_lives[:-1]),
            "redelivered": taken_in_more_than_one_life(connector_lives),
            "other_exits": connectors.other_exits + gateways.other_exits,
            "quiet": quiet,
            "owed": owed,
            "abandoned": abandoned,
            "resent": resent,
            "kills": self.kills,
            "resumes": len(self.fake.gateway.resumes),
            "identifies": self.fake.gateway.identifies,
            "nonce_repeats": sum(
                1 for r in self.fake.requests if r.route.endswith("/messages") and r.status == 200
            )
            - sum(len(self.fake.bot_messages(c)) for c, _ in CHANNELS),
            "ready_s": (connectors.ready_times[1:], gateways.ready_times[1:]),
        }


def summary(seed: int, r: Mapping[str, Any]) -> str:
    a: Analysis = r["analysis"]
    quiet: Quiet = r["quiet"]
    rows = [
        ("seed", str(seed)),
        ("channels", "6 (2 DMs, 2 guild channels, 2 threads)"),
        ("load", f"{r['load_s']:.1f} s, {(r['sent'] - 6) / r['load_s']:.2f} messages/s"),
        ("messages written", str(r["sent"])),
        ("bot replies in the channels", str(a.replies)),
        ("connector kills (SIGKILL)", str(r["connector_kills"])),
        ("  with a dispatch half taken", str(r["half_taken"])),
        ("  while saving the seq", str(r["while_saving"])),
        ("  events replayed and recognised", str(r["redelivered"])),
        ("gateway RESUMEs / IDENTIFYs", f"{r['resumes']} / {r['identifies']}"),
        ("gateway kills (SIGKILL)", str(r["gateway_kills"])),
        ("  messages in flight at a kill", in_flight_at_kills(r["kills"])),
        ("  replies sent more than once (ledger)", str(r["resent"])),
        ("  creates answered with an earlier message (nonce)", str(r["nonce_repeats"])),
        ("lives ended otherwise", str(r["other_exits"])),
        ("MISSING (no reply)", str(len(a.without_reply))),
        ("DUPLICATES (labelled or not)", str(a.duplicates)),
        ("WRONG CHANNEL", str(a.wrong_channel)),
        ("stray bot messages", str(a.stray)),
        ("labelled (possible repeat banner)", str(a.labelled)),
        ("connector restart to READY", spread(r["ready_s"][0], p99=False)),
        ("gateway restart to READY", spread(r["ready_s"][1], p99=False)),
        ("quiet period", quiet_row(quiet, r["owed"], r["abandoned"])),
    ]
    return table("discord crash run", rows)


@pytest.mark.asyncio
async def test_every_message_is_answered_exactly_once_across_sigkills_of_both_processes(
    tmp_path: Path,
) -> None:
    """Under steady load in six channels, with the connector and the gateway SIGKILLed again
    and again, every message has exactly one answer in its own channel: no duplicates at all."""
    wanted, seed = setting(KILLS_ENV, DEFAULT_KILLS), setting(SEED_ENV, DEFAULT_SEED)
    print(f"\ndiscord crash run: seed {seed}, {wanted} kills of each kind", flush=True)
    async with FakeDiscord(route_limit=(50, 1.0), session_timeout_s=300.0) as fake:
        result = await CrashRun(fake, tmp_path, wanted, seed).run()
    text = summary(seed, result)
    print(text)
    a: Analysis = result["analysis"]
    problems = harness_problems(
        result["connector_kills"],
        result["gateway_kills"],
        wanted,
        loaded=result["sent"] - 6,
        load_s=result["load_s"],
        other_exits=result["other_exits"],
    )
    if a.without_reply:
        problems.append(f"messages without a reply: {list(a.without_reply)[:10]}")
    if a.duplicates or a.wrong_channel or a.stray:
        problems.append(f"duplicates {a.duplicates}, wrong {a.wrong_channel}, stray {a.stray}")
    if result["owed"] or result["abandoned"] or not result["quiet"].settled:
        problems.append("not settled: the ledger owes or the buffer holds entries")
    assert not problems, text + "\n" + "\n".join(problems)

"""The Matrix driver's guarantee under SIGKILL, against a real homeserver.

Three kinds of process, all real: the session's Synapse (``relay.matrix.testing``); the
connector with the Matrix driver on a SQLite file, in a child process
(``tests/relay/matrix/connector_child.py``, on a fixed loopback port so that the gateway redials
the same URL after a restart); and the gateway, an echo bot whose ledger is a SQLite file, in a
child process (``tests/relay/crash_child.py --platform matrix``), answering every message
``text`` with ``echo: <text>`` in the message's thread and as a reply to it.

Six people each create a room and invite the bot (the driver joins on its own).  Half of them
write through ``matrix-nio``'s ``AsyncClient``, the other half through the plain HTTP client of
``relay.matrix.testing``; together they write ``RATE_PER_S`` unique messages a second
(``m-<room>-<n>``, in bursts of ``BURST`` at once from one person) for the whole run, after one
answered warm-up message in every room.
Meanwhile faults drawn from a seed SIGKILL the connector and the gateway, shuffled, each
restarted at once on its database, ``LIFE_S`` after the previous restart was READY (the
connector pauses ``INTAKE_DELAY_S`` after the intake took each event, as a slower store
would); every
second kill of each kind waits (at most ``MOMENT_WAIT_S``) for its moment: a connector whose
output says it took an event whose sync token is not saved yet (a sync batch half taken), a
gateway with messages unanswered (replies in flight).  The run counts how many connector lives
really died with a batch half taken (their output, read to its end after the kill) and how many
events the connector's intake took in more than one life (redelivered by the server, recognised
by the connector).  After the last kill the load goes on for ``TAIL_S``, then the run waits
(bounded) until every message is answered, the gateway's ledger owes nothing and the
connector's buffer is empty.

Then every room's timeline is read back from the server (``/rooms/{room}/messages``, every
page) and checked: every person message has exactly one bot event answering it (its
``m.relates_to.m.in_reply_to.event_id`` is the message's event id, its body ``echo: <text>``
after any "possible repeat" banner) in the same room; no message without a reply, no second bot
event answering the same message (labelled or not), no reply in the wrong room, no stray bot
event.  Bot events carrying the banner are counted and reported.

``STATECORE_MATRIX_CRASH_KILLS`` sets the kills of each kind (default 3, the run of
``make test``); ``STATECORE_MATRIX_CRASH_SEED`` the seed (default fixed; printed with the
results).  The
long run, with its summary table printed: ``make matrix-crash KILLS=50``.

Every wait is bounded, and every child is killed and reaped in a ``finally``; the children
exit on their own when orphaned.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest
from nio import AsyncClient, RoomSendResponse

from relay.matrix.testing import (
    Homeserver,
    HomeserverUnavailable,
    MatrixAccount,
    MatrixRequestError,
)
from statecore import RECONNECTED_MARKER, RECOVERED_MARKER
from tests.crash_analysis import split_banner
from tests.process_lives import Quiet
from tests.relay.platform_crash import (
    Children,
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
    ready_spreads,
    setting,
    spread,
    table,
    taken_in_more_than_one_life,
    took,
    under_load,
)

pytestmark = pytest.mark.skipif(os.name != "posix", reason="kills real processes with SIGKILL")

CONNECTOR_MODULE = "tests.relay.matrix.connector_child"
GATEWAY_MODULE = "tests.relay.crash_child"
KILLS_ENV = "STATECORE_MATRIX_CRASH_KILLS"
SEED_ENV = "STATECORE_MATRIX_CRASH_SEED"
DEFAULT_KILLS = 3
DEFAULT_SEED = 20_261_203
SECRET = "matrix-crash-secret"
ROOMS = 6
RATE_PER_S = 5.0
"""Messages written per second, over all rooms together."""
BURST = 3
"""Messages one person writes at once."""
LIFE_S = (0.3, 2.5)
"""A fault comes uniformly this long after the previous restart was READY."""
HANDLER_SLEEP_S = 0.2
"""The bot's work per message before it replies."""
INTAKE_DELAY_S = 0.02
"""The connector's pause after the intake took an event, before the driver goes on."""
TAIL_S = 3.0
"""The load goes on this long after the last restart was READY."""
SETUP_S = 60.0
"""The bound on joins, the first connection and the warm-up answers."""
QUIET_MAX_S = 120.0
"""The longest the wait for the last answers may last before the checks run anyway."""
STABLE_S = 2.0
"""Settled: every message answered, nothing owed or buffered, no new bot event this long."""
SEND_TRIES = 20
"""A person's send is asked again (the same transaction id) this many times at most."""
OBSERVER_FILTER = {
    "presence": {"types": []},
    "account_data": {"types": []},
    "room": {
        "timeline": {"limit": 1000, "types": ["m.room.message"]},
        "state": {"lazy_load_members": True},
        "ephemeral": {"types": []},
        "account_data": {"types": []},
    },
}


# -- the analysis of the timelines ----------------------------------------------------------------


def reply_target(event: Mapping[str, Any]) -> str | None:
    """The event id ``event`` replies to (``m.relates_to.m.in_reply_to.event_id``)."""
    content = event.get("content")
    relates = content.get("m.relates_to") if isinstance(content, dict) else None
    in_reply = relates.get("m.in_reply_to") if isinstance(relates, dict) else None
    target = in_reply.get("event_id") if isinstance(in_reply, dict) else None
    return target if isinstance(target, str) else None


def body_of(event: Mapping[str, Any]) -> str | None:
    content = event.get("content")
    body = content.get("body") if isinstance(content, dict) else None
    return body if isinstance(body, str) else None


@attrs.frozen
class Written:
    """A person message as the server's timeline holds it."""

    room_id: str
    event_id: str
    text: str
    ts_ms: int


@attrs.frozen
class Analysis:
    """Every room's timeline checked (see the module docs)."""

    messages: int
    replies: int
    """Bot message events, in every room."""
    without_reply: tuple[str, ...]
    duplicates: int
    """Bot events answering a message already answered (labelled or not)."""
    labelled: int
    """Bot events carrying a "possible repeat" banner."""
    wrong_room: int
    """Bot events answering (by relation or by body) a message of another room."""
    stray: int
    """Bot events answering nothing written, or whose relation and body disagree."""
    first_answer_ms: Mapping[str, int]
    """Message event id -> server time of its first answer."""
    written: tuple[Written, ...]


def analyse(
    timelines: Mapping[str, Sequence[Mapping[str, Any]]], people: Mapping[str, str], bot: str
) -> Analysis:
    """Check the ``m.room.message`` events of every room (room id -> events, oldest first)
    against the messages its person (``people``: room id -> user id) wrote there."""
    written: list[Written] = []
    bot_events: list[tuple[str, Mapping[str, Any]]] = []
    for room_id, events in timelines.items():
        for event in events:
            if event.get("type") != "m.room.message":
                continue
            body, sender = body_of(event), event.get("sender")
            if sender == people.get(room_id) and body is not None:
                ts = event.get("origin_server_ts")
                written.append(Written(room_id, str(event["event_id"]), body, int(ts) if ts else 0))
            elif sender == bot:
                bot_events.append((room_id, event))
    by_id = {w.event_id: w for w in written}
    by_text = {w.text: w for w in written}
    copies: Counter[str] = Counter()
    first: dict[str, int] = {}
    labelled = wrong_room = stray = 0
    for room_id, event in bot_events:
        flagged, rest = split_banner(body_of(event) or "")
        labelled += flagged
        echoed = by_text.get(rest[len("echo: ") :]) if rest.startswith("echo: ") else None
        target = by_id.get(reply_target(event) or "")
        message = echoed or target
        if message is None:
            stray += 1
        elif message.room_id != room_id or (target is not None and target.room_id != room_id):
            wrong_room += 1
        elif echoed is not target:
            stray += 1
        else:
            copies[message.event_id] += 1
            ts = int(event.get("origin_server_ts") or 0)
            first[message.event_id] = min(first.get(message.event_id, ts), ts)
    return Analysis(
        messages=len(written),
        replies=len(bot_events),
        without_reply=tuple(w.text for w in written if not copies[w.event_id]),
        duplicates=sum(n - 1 for n in copies.values() if n > 1),
        labelled=labelled,
        wrong_room=wrong_room,
        stray=stray,
        first_answer_ms=first,
        written=tuple(written),
    )


def test_the_analysis_counts_missing_duplicates_wrong_rooms_and_labels() -> None:
    """The harness's reading of the timelines: a repeat counts as a duplicate labelled or
    not, a reply in another room or to the wrong event is never an answer."""
    people = {"!a": "@p:x", "!b": "@q:x"}
    serial = iter(range(100))

    def msg(sender: str, body: str, reply_to: str | None = None) -> dict[str, Any]:
        content: dict[str, Any] = {"msgtype": "m.text", "body": body}
        if reply_to is not None:
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply_to}}
        return {
            "type": "m.room.message",
            "event_id": f"$e{next(serial)}",
            "sender": sender,
            "origin_server_ts": 1000,
            "content": content,
        }

    a = [msg("@p:x", f"m-0-{n}") for n in range(4)]
    b = [msg("@q:x", "m-1-0"), msg("@q:x", "m-1-1")]
    ids = [e["event_id"] for e in a + b]
    a += [
        msg("@bot:x", "echo: m-0-0", ids[0]),
        msg("@bot:x", f"{RECOVERED_MARKER}\n\necho: m-0-0", ids[0]),  # a labelled repeat
        msg("@bot:x", f"{RECONNECTED_MARKER}\n\necho: m-0-1", ids[1]),  # labelled, answered
        msg("@bot:x", "echo: m-0-2", ids[3]),  # the relation names another message
        msg("@bot:x", "echo: m-1-0", ids[4]),  # b's answer in a's room
        msg("@bot:x", "echo: nobody wrote this"),
    ]
    b += [msg("@bot:x", "echo: m-1-1", ids[5]), msg("@bot:x", "echo: m-1-1", ids[5])]
    result = analyse({"!a": a, "!b": b}, people, "@bot:x")
    assert result.messages == 6
    assert result.replies == 8
    assert result.without_reply == ("m-0-2", "m-0-3", "m-1-0")
    assert result.duplicates == 2
    assert result.labelled == 2
    assert result.wrong_room == 1
    assert result.stray == 2
    assert set(result.first_answer_ms) == {ids[0], ids[1], ids[5]}


# -- the processes --------------------------------------------------------------------------------


# -- the people and the observer ------------------------------------------------------------------


@attrs.define(eq=False)
class Person:
    """A person who made a room with the bot, and how they write into it."""

    index: int
    account: MatrixAccount
    room_id: str
    client: AsyncClient | None
    """A matrix-nio client, or None: the plain HTTP client of the homeserver module."""
    written: int = 0

    async def send(self, homeserver: Homeserver, text: str) -> str:
        """Write ``text``; the event id.  A failure is asked again under the same transaction
        id (one event at most), bounded."""
        txn = f"crash-{self.index}-{uuid.uuid4().hex}"
        content = {"msgtype": "m.text", "body": text}
        problem = ""
        for _ in range(SEND_TRIES):
            if self.client is not None:
                answer = await self.client.room_send(
                    self.room_id, "m.room.message", content, tx_id=txn
                )
                if isinstance(answer, RoomSendResponse):
                    return str(answer.event_id)
                problem = str(answer)
            else:
                try:
                    return await asyncio.to_thread(
                        homeserver.send_text, self.account, self.room_id, text, txn_id=txn
                    )
                except (MatrixRequestError, HomeserverUnavailable) as exc:
                    problem = str(exc)
            await asyncio.sleep(0.5)
        raise AssertionError(f"person {self.index} could not write {text!r}: {problem[:300]}")


class Observer:
    """A client of the bot's own account (a device of its own) following every room by
    ``/sync``: which written messages have an answer so far, and when the last bot event came."""

    def __init__(self, homeserver: Homeserver, bot: MatrixAccount) -> None:
        self.bot = bot.user_id
        self.client = AsyncClient(homeserver.url, bot.user_id, device_id=bot.device_id)
        self.client.access_token = bot.access_token
        self.client.user_id = bot.user_id
        self.answered: set[str] = set()
        self.last_bot_event = time.monotonic()
        self.gaps = 0

    async def run(self) -> None:
        since: str | None = None
        while True:
            try:
                answer = await self.client.sync(
                    timeout=3000, sync_filter=OBSERVER_FILTER, since=since
                )
            except (aiohttp.ClientError, TimeoutError):
                answer = None  # asked again below, from the same token
            next_batch = getattr(answer, "next_batch", None)
            if not isinstance(next_batch, str):
                await asyncio.sleep(0.5)
                continue
            since = next_batch
            for info in answer.rooms.join.values():
                self.gaps += bool(info.timeline.limited)
                for event in info.timeline.events:
                    source = getattr(event, "source", None)
                    if isinstance(source, dict) and source.get("sender") == self.bot:
                        self.last_bot_event = time.monotonic()
                        target = reply_target(source)
                        if target is not None:
                            self.answered.add(target)


# -- one run --------------------------------------------------------------------------------------


@attrs.frozen
class Run:
    """Everything one Matrix crash run measured."""

    seed: int
    kills: tuple[Kill, ...]
    connector_kills: int
    gateway_kills: int
    half_taken: int
    """Connector kills whose life had taken events and not begun to save the sync token that
    covers them."""
    while_saving: int
    """Connector kills whose life was saving its sync token (the save may or may not have
    committed)."""
    redelivered: int
    """Events the connector's intake took in more than one life (redelivered by the server
    after a kill, recognised by the connector)."""
    other_exits: tuple[int, ...]
    load_s: float
    sent: int
    sent_ids: frozenset[str]
    quiet: Quiet
    owed: int
    abandoned: int
    resent: tuple[int, int]
    """Sends a connector life began again under a transaction id of an earlier life, and of
    those the ones the server had accepted before: each must still be one event."""
    result: Analysis
    recovery_s: Mapping[str, tuple[float, ...]]
    ready_s: Mapping[str, tuple[float, ...]]
    observer_gaps: int

    @property
    def loaded(self) -> int:
        """Messages written by the load (the warm-up's left out)."""
        return self.sent - ROOMS

    def latencies_s(self) -> list[float]:
        ts = {w.event_id: w.ts_ms for w in self.result.written}
        return [(t - ts[m]) / 1000 for m, t in self.result.first_answer_ms.items() if m in ts]

    def summary(self) -> str:
        """The table of the run."""
        r = self.result

        rows = [
            ("seed", str(self.seed)),
            ("rooms", f"{ROOMS} (half nio clients, half plain HTTP)"),
            ("load", f"{self.load_s:.1f} s, {self.loaded / self.load_s:.2f} messages/s"),
            ("messages written", str(self.sent)),
            ("person messages in the timelines", str(r.messages)),
            ("bot replies in the timelines", str(r.replies)),
            ("connector kills (SIGKILL)", str(self.connector_kills)),
            ("  with a sync batch half taken", str(self.half_taken)),
            ("  while saving the sync token", str(self.while_saving)),
            ("  events redelivered and recognised", str(self.redelivered)),
            (
                "  sends asked again by a later life",
                f"{self.resent[0]} ({self.resent[1]} seen accepted before)",
            ),
            ("gateway kills (SIGKILL)", str(self.gateway_kills)),
            ("  messages in flight at a kill", in_flight_at_kills(self.kills)),
            ("lives ended otherwise", str(list(self.other_exits))),
            ("MISSING (no reply)", str(len(r.without_reply))),
            ("DUPLICATES (labelled or not)", str(r.duplicates)),
            ("WRONG ROOM", str(r.wrong_room)),
            ("stray bot events", str(r.stray)),
            ("labelled (possible repeat banner)", str(r.labelled)),
            ("recovery after a connector kill", spread(self.recovery_s["connector"])),
            ("recovery after a gateway kill", spread(self.recovery_s["gateway"])),
            ("connector restart to READY", spread(self.ready_s["connector"])),
            ("gateway restart to READY", spread(self.ready_s["gateway"])),
            ("reply latency", spread(self.latencies_s())),
            ("observer's sync gaps (limited timelines)", str(self.observer_gaps)),
            ("quiet period", quiet_row(self.quiet, self.owed, self.abandoned)),
        ]
        title = "matrix crash run (recovery: kill -> first answer to a message written after it)"
        return table(title, rows)

    def problems(self, wanted: int) -> list[str]:
        """Every check that failed, the harness's own first."""
        found = harness_problems(
            self.connector_kills,
            self.gateway_kills,
            wanted,
            loaded=self.loaded,
            load_s=self.load_s,
            other_exits=self.other_exits,
        )
        r = self.result
        in_timelines = {w.event_id for w in r.written}
        if not self.sent_ids <= in_timelines:
            found.append(
                f"written messages not in the timelines: {len(self.sent_ids - in_timelines)}"
            )
        if r.without_reply:
            shown = ", ".join(r.without_reply[:10]) + ("..." if len(r.without_reply) > 10 else "")
            found.append(f"messages without a reply: {len(r.without_reply)} ({shown})")
        if r.duplicates:
            found.append(f"duplicates in the timelines: {r.duplicates}")
        if r.wrong_room or r.stray:
            found.append(f"replies in the wrong room: {r.wrong_room}, stray: {r.stray}")
        if self.owed or self.abandoned:
            found.append(f"the bot's ledger still owes {self.owed}, abandoned {self.abandoned}")
        if self.quiet.buffered:
            found.append(f"the connector holds {self.quiet.buffered} unacked entries")
        if not self.quiet.settled:
            found.append(
                f"not settled within {QUIET_MAX_S:g} s (owed {self.quiet.owed}, "
                f"buffered {self.quiet.buffered} at its end)"
            )
        return found


def resent_sends(lives: Sequence[Life]) -> tuple[int, int]:
    """(sends a connector life began under a transaction id an earlier life had begun, of
    those the ones an earlier life had seen accepted); within one life the connector performs
    a key once."""
    begun: set[str] = set()
    accepted: set[str] = set()
    again = again_accepted = 0
    for life in lives:
        again += sum(txn in begun for txn in life.asked)
        again_accepted += sum(txn in accepted for txn in life.asked)
        begun.update(life.asked)
        accepted.update(life.done)
    return again, again_accepted


class CrashRun:
    """One run: the rooms, the processes, the load, the faults, the quiet period."""

    def __init__(self, homeserver: Homeserver, workdir: Path, wanted: int, seed: int) -> None:
        self.homeserver = homeserver
        self.wanted = wanted
        self.seed = seed
        self.rng = random.Random(seed)
        self.tag = uuid.uuid4().hex[:8]
        self.bot = homeserver.register(f"crashbot-{self.tag}")
        self.port = free_port()
        self.workdir = workdir
        self.gateway_db = workdir / "gateway.db"
        self.people: list[Person] = []
        self.observer = Observer(homeserver, self.bot)
        self.sent: dict[str, str] = {}
        """Event id -> text of every message written."""
        self.kills: list[Kill] = []
        self.writes: set[asyncio.Task[None]] = set()
        self.stop_load = asyncio.Event()
        self.observing: asyncio.Task[None] | None = None

    def argv(self, kind: str) -> list[str]:
        """The command line of a ``kind`` life (after ``python -m``)."""
        if kind == "connector":
            return [
                *(CONNECTOR_MODULE, "--homeserver", self.homeserver.url),
                *("--user", self.bot.user_id, "--password", self.bot.password),
                *("--db", str(self.workdir / "connector.db"), "--secret", SECRET),
                *("--port", str(self.port), "--intake-delay", str(INTAKE_DELAY_S)),
            ]
        return [
            *(GATEWAY_MODULE, "--url", f"ws://127.0.0.1:{self.port}"),
            *("--db", str(self.gateway_db), "--secret", SECRET, "--platform", "matrix"),
            *("--handler-sleep", str(HANDLER_SLEEP_S)),
        ]

    def in_flight(self) -> int:
        """Messages written and not yet answered, as the observer saw it."""
        return len(set(self.sent) - self.observer.answered)

    async def write(self, person: Person, text: str) -> None:
        self.sent[await person.send(self.homeserver, text)] = text

    async def rooms(self) -> None:
        """Six people, each with a room the bot was invited to; returns once it joined all."""
        homeserver = self.homeserver
        for n in range(ROOMS):
            account = homeserver.register(f"person{n}-{self.tag}")
            room = homeserver.create_room(account, invite=[self.bot.user_id], is_direct=n % 3 == 0)
            client = None
            if n % 2 == 0:
                client = AsyncClient(homeserver.url, account.user_id, device_id=account.device_id)
                client.access_token = account.access_token
                client.user_id = account.user_id
            self.people.append(Person(n, account, room, client))
        wanted = {p.room_id for p in self.people}

        def joined() -> bool:
            path = "/_matrix/client/v3/joined_rooms"
            answer = homeserver.request("GET", path, account=self.bot)
            return wanted <= set(answer.get("joined_rooms", []))

        await bounded(joined, "the bot to join every room", SETUP_S)

    async def load(self) -> None:
        """Unique messages round-robin over the rooms at ``RATE_PER_S`` until stopped, in
        bursts of ``BURST`` written at once by one person (so that a sync batch often holds
        several events of one room, taken one after the other)."""
        interval = BURST / RATE_PER_S
        next_at = time.monotonic()
        n = 0
        while not self.stop_load.is_set():
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            person = self.people[n % ROOMS]
            for _ in range(BURST):
                text = f"m-{person.index}-{person.written}"
                person.written += 1
                task = asyncio.create_task(self.write(person, text))
                self.writes.add(task)
                task.add_done_callback(self.writes.discard)
            n += 1
            next_at += interval

    def record(self, kind: str, aim: bool) -> None:
        """A kill, at the wall clock (the server's timestamps are compared with it)."""
        self.kills.append(Kill(kind, time.time(), aim, self.in_flight()))

    async def quiet(self, http: aiohttp.ClientSession) -> Quiet:
        """Wait (at most ``QUIET_MAX_S``) until every message is answered, the bot's ledger
        owes nothing, the connector buffers nothing and no bot event came for ``STABLE_S``."""

        def settled() -> bool:
            if self.observing is not None and self.observing.done():
                self.observing.result()  # the observer failed: its error, not a quiet period
            calm = time.monotonic() - self.observer.last_bot_event >= STABLE_S
            return not self.in_flight() and calm

        return await quiet_period(http, self.port, self.gateway_db, settled, QUIET_MAX_S)

    async def serve(self, lives: Children) -> tuple[float, Quiet]:
        """Start both processes, warm up, load under faults, then the quiet period; returns
        the load's duration and how the quiet period ended."""
        await lives.connectors.spawn()
        await self.rooms()
        await lives.gateways.spawn()
        await bounded(
            lambda: gateway_connected(lives.http, self.port),
            "the gateway's first connection",
            SETUP_S,
        )
        observing = self.observing = asyncio.create_task(self.observer.run())
        try:
            # Warm-up: one answered message in every room before any fault.
            await asyncio.gather(*(self.write(p, f"m-{p.index}-warm") for p in self.people))
            await bounded(lambda: not self.in_flight(), "the warm-up answers", SETUP_S)
            # Every second kill of each kind waits for its moment: a connector with a sync
            # batch half taken, a gateway with replies in flight.
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
            if self.writes:
                await asyncio.wait_for(asyncio.gather(*self.writes), 60)
            load_s = time.monotonic() - began
            quiet = await self.quiet(lives.http)
        finally:
            observing.cancel()
            with contextlib.suppress(BaseException):
                await observing
        return load_s, quiet

    async def run(self) -> Run:
        """The whole run; the children are killed and reaped, the clients closed, however it
        ends."""
        try:
            async with children(
                self.workdir, self.argv("connector"), self.argv("gateway")
            ) as lives:
                load_s, quiet = await self.serve(lives)
                await lives.stop_finals()
        finally:
            await self.observer.client.close()
            for person in self.people:
                if person.client is not None:
                    await person.client.close()
        return await self.results(lives, load_s, quiet)

    async def results(self, lives: Children, load_s: float, quiet: Quiet) -> Run:
        """Read every room's timeline back from the server and put the run together."""
        timelines = {
            p.room_id: await asyncio.to_thread(
                self.homeserver.messages, p.account, p.room_id, event_type="m.room.message"
            )
            for p in self.people
        }
        people = {p.room_id: p.account.user_id for p in self.people}
        result = analyse(timelines, people, self.bot.user_id)
        connectors, gateways = lives.connectors, lives.gateways
        connector_lives = connectors.all_lives()
        owed, abandoned, _ = ledger_counts(self.gateway_db)
        return Run(
            seed=self.seed,
            kills=tuple(self.kills),
            connector_kills=connectors.kills,
            gateway_kills=gateways.kills,
            # Every life but the last was killed under load.
            half_taken=sum(life.half_taken for life in connector_lives[:-1]),
            while_saving=sum(life.saving for life in connector_lives[:-1]),
            redelivered=taken_in_more_than_one_life(connector_lives),
            other_exits=tuple(connectors.other_exits + gateways.other_exits),
            load_s=load_s,
            sent=len(self.sent),
            sent_ids=frozenset(self.sent),
            quiet=quiet,
            owed=owed,
            abandoned=abandoned,
            resent=resent_sends(connector_lives),
            result=result,
            recovery_s={k: recoveries(result, self.kills, k) for k in ("connector", "gateway")},
            ready_s=ready_spreads(lives),
            observer_gaps=self.observer.gaps,
        )


def recoveries(result: Analysis, kills: Sequence[Kill], kind: str) -> tuple[float, ...]:
    """For every kill of ``kind``: seconds from the kill to the first answer (server time) to
    a message the server received after it."""
    found = []
    for kill in kills:
        if kill.kind != kind:
            continue
        at_ms = kill.at * 1000
        answers = [
            result.first_answer_ms[w.event_id]
            for w in result.written
            if w.ts_ms > at_ms and w.event_id in result.first_answer_ms
        ]
        if answers:
            found.append((min(answers) - at_ms) / 1000)
    return tuple(found)


@pytest.mark.asyncio
async def test_every_message_is_answered_exactly_once_across_sigkills_of_both_processes(
    homeserver: Homeserver, tmp_path: Path
) -> None:
    """Under steady load in six rooms, with the connector and the gateway SIGKILLed again and
    again, every message has exactly one answer in its own room on the server."""
    wanted, seed = setting(KILLS_ENV, DEFAULT_KILLS), setting(SEED_ENV, DEFAULT_SEED)
    print(f"\nmatrix crash run: seed {seed}, {wanted} kills of each kind", flush=True)
    run = await CrashRun(homeserver, tmp_path, wanted, seed).run()
    summary = run.summary()
    print(summary)
    problems = run.problems(wanted)
    assert not problems, summary + "\n" + "\n".join(problems)

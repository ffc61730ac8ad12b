"""A gateway fleet of real processes on one PostgreSQL ledger, SIGKILLed at random under load.

The test process runs the connector (``relay.Connector`` on SQLite, provenance egress) in front
of a loopback chat whose sends take ``SEND_S`` (so replies are in flight when a kill lands).
Three gateway processes (``tests/statecore/gateway/fleet_child.py``), each a ``Gateway`` with
its own ``RelayAdapter`` + ``WebSocketRelayTransport`` and its own identity at the connector
(``gw-0``..``gw-2``, each with its secret), share ONE ledger: a fresh schema in the session's
PostgreSQL database (``postgres_url``), with ``recover_interval_s`` = ``RECOVER_S`` on the real
clock.  The connector fans every message out to the three; each answers only its own chats
(chat n: gateway n % 3).

Users write round-robin in six chats for ``STATECORE_FLEET_SECONDS`` (default 15) while the
test, every little while, picks a random gateway, waits (bounded) until that process owes a
reply in the ledger, SIGKILLs it and leaves it dead for ``DEAD_S`` -- longer than the recover
tick, so a LIVE peer must claim its owed rows through the shared ledger (same host: the process
probe says at once that the owner is dead) -- and only then restarts it.  After a bounded quiet
period: every message answered in its own chat, every repeat labelled, nothing owed or abandoned
in the ledger, nothing unacked at the connector; and the obligations' audit shows at least one
reply recorded by one gateway's process and delivered by ANOTHER gateway's process before
the killed one was even restarted.

Every wait is bounded, and every child is killed and reaped in a ``finally``.  A longer run::

    STATECORE_FLEET_SECONDS=120 .venv/bin/pytest -q -s \
        tests/statecore/gateway/test_fleet_processes.py
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import attrs
import pytest

from relay import Connector
from relay.wire.frames import OutboundOutcome
from statecore.lifecycles import ObligationState
from statecore.obligation import OBLIGATION_KIND
from stores import PostgresStore, SQLiteStore
from tests.crash_analysis import (
    Analysis,
    Injected,
    TimedPlatform,
    analyse,
    percentile,
)
from tests.process_lives import Lives, Quiet
from tests.statecore.gateway.fleet_child import PG_URL_ENV, chat_of, gateway_id

pytestmark = pytest.mark.skipif(os.name != "posix", reason="kills real processes with SIGKILL")

REPO_ROOT = Path(__file__).resolve().parents[3]
CHILD_MODULE = "tests.statecore.gateway.fleet_child"
SECONDS_ENV = "STATECORE_FLEET_SECONDS"
SEED_ENV = "STATECORE_FLEET_SEED"
DEFAULT_SECONDS = 15.0
DEFAULT_SEED = 20_261_201
GATEWAYS = 3
CHATS = 6
RATE_PER_S = 8.0
"""Messages injected per second, over all chats together."""
HANDLER_SLEEP_S = 0.05
"""A gateway's work per message before it replies."""
SEND_S = 0.15
"""How long the platform takes to perform one send (a reply is in flight that long)."""
RECOVER_S = 1.0
"""Every gateway's ``recover_interval_s``."""
PAUSE_S = (0.3, 1.0)
"""The pause before each kill is chosen (after the previous victim is back)."""
OWING_S = 1.5
"""How long the chosen victim is watched for an owed row before it is killed anyway."""
DEAD_S = 2.5
"""How long a killed gateway stays dead: the live peers' recover ticks run meanwhile."""
READY_S = 20.0
"""The bound on a gateway process connecting (spawn to handshake)."""
QUIET_MAX_S = 15.0
"""The longest the quiet period may last before the checks run anyway."""
STABLE_S = 3.0
"""Settled without every answer: nothing owed, nothing buffered, no new reply for this long."""
"""The bound on reaping one killed child."""
_OWED = (ObligationState.PENDING, ObligationState.ATTEMPTING, ObligationState.FAILED)


def load_seconds() -> float:
    """How long the load runs: ``STATECORE_FLEET_SECONDS``, default 15."""
    raw = os.environ.get(SECONDS_ENV, "").strip()
    return float(raw) if raw else DEFAULT_SECONDS


def seed() -> int:
    """The kill schedule's seed: ``STATECORE_FLEET_SEED``, default fixed."""
    raw = os.environ.get(SEED_ENV, "").strip()
    return int(raw) if raw else DEFAULT_SEED


def secret_of(index: int) -> str:
    """Gateway ``index``'s own secret at the connector."""
    return f"fleet-secret-{index}"


def pid_of(label: str | None) -> int | None:
    """The pid in an audit owner label ``host:pid:token`` (None when there is none)."""
    if not label:
        return None
    parts = label.rsplit(":", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


class SlowPlatform(TimedPlatform):
    """The timed loopback chat, whose sends take ``SEND_S`` before they are performed."""

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        """Wait ``SEND_S`` for a send, then perform it like the timed loopback platform."""
        if action.get("op") == "send":
            await asyncio.sleep(SEND_S)
        return await super().perform(action)


# -- the fleet's processes ------------------------------------------------------------------------


class Fleet(Lives):
    """The gateway processes: one slot per gateway, each a succession of lives."""

    def __init__(self, url: str, schema: str, pg_url: str, log: IO[bytes]) -> None:
        super().__init__()
        self.url = url
        self.schema = schema
        self.env = {**os.environ, PG_URL_ENV: pg_url}  # never on a command line: a password
        self.log = log
        self.current: dict[int, asyncio.subprocess.Process] = {}
        self.index_of: dict[int, int] = {}
        """pid -> the gateway number that process served."""
        self.spawned_at: dict[int, float] = {}
        """pid -> wall-clock time of its spawn (the audit's clock)."""
        self.kills_owing = 0
        """Kills that landed while the victim owned an owed row in the ledger."""

    async def spawn(self, index: int) -> asyncio.subprocess.Process:
        """Start a new life of gateway ``index``."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            CHILD_MODULE,
            "--url",
            self.url,
            "--index",
            str(index),
            "--gateways",
            str(GATEWAYS),
            "--secret",
            secret_of(index),
            "--schema",
            self.schema,
            "--handler-sleep",
            str(HANDLER_SLEEP_S),
            "--recover-interval",
            str(RECOVER_S),
            cwd=REPO_ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
        )
        self.current[index] = proc
        self.lives.append(proc)
        self.index_of[proc.pid] = index
        self.spawned_at[proc.pid] = time.time()
        return proc

    def replaced_at(self, pid: int) -> float:
        """Wall-clock time the next life of ``pid``'s gateway was spawned (inf: none was)."""
        index, born = self.index_of[pid], self.spawned_at[pid]
        later = [at for p, at in self.spawned_at.items() if self.index_of[p] == index and at > born]
        return min(later, default=float("inf"))

    async def kill(self, index: int, *, crash: bool = True) -> None:
        """SIGKILL gateway ``index``'s current life and reap it, bounded (a reaped process is
        no longer alive to the peers' process probe)."""
        await self.kill_one(self.current.pop(index), crash=crash)


async def connected(connector: Connector, index: int, proc: asyncio.subprocess.Process) -> None:
    """Wait (bounded) until life ``proc`` of gateway ``index`` has a handshaken connection."""
    deadline = time.monotonic() + READY_S
    while not connector.connected(gateway_id(index)):
        if proc.returncode is not None or time.monotonic() > deadline:
            raise AssertionError(
                f"gateway {index} (pid {proc.pid}) did not connect within {READY_S:g} s "
                f"(exit status {proc.returncode})"
            )
        await asyncio.sleep(0.02)


async def owed_by(store: PostgresStore, pid: int | None = None) -> int:
    """Owed rows in the shared ledger (only those owned by process ``pid`` when given)."""
    where = None if pid is None else {"owner_pid": pid}
    return await asyncio.to_thread(store.count, OBLIGATION_KIND, states=_OWED, where=where)


async def kill_loop(
    fleet: Fleet,
    connector: Connector,
    store: PostgresStore,
    rng: random.Random,
    until: float,
) -> None:
    """Until the load ends: pause, pick a random gateway, kill it once it owes a reply (or after
    ``OWING_S``), leave it dead ``DEAD_S``, restart it and wait until it is connected."""
    while True:
        await asyncio.sleep(rng.uniform(*PAUSE_S))
        if time.monotonic() + OWING_S + DEAD_S >= until:
            return
        index = rng.randrange(GATEWAYS)
        victim = fleet.current[index]
        deadline = time.monotonic() + OWING_S
        owing = False
        while time.monotonic() < deadline:
            if await owed_by(store, victim.pid):
                owing = True
                break
            await asyncio.sleep(0.01)
        await fleet.kill(index)
        fleet.kills_owing += owing
        await asyncio.sleep(DEAD_S)
        await connected(connector, index, await fleet.spawn(index))


async def load(platform: TimedPlatform, until: float, injected: list[Injected]) -> None:
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
        message_id = await platform.inject(chat_of(chat), text, user_id=f"user-{chat}")
        injected.append(Injected(text, chat_of(chat), message_id, at))
        n += 1
        next_at += interval


async def quiet_period(
    connector: Connector,
    platform: TimedPlatform,
    store: PostgresStore,
    all_answered: Callable[[], bool],
) -> Quiet:
    """Wait (at most ``QUIET_MAX_S``) until every gateway is connected, nothing is owed in the
    ledger, nothing is buffered at the connector, and every message is answered (or no reply
    came for ``STABLE_S``)."""
    start = time.monotonic()
    quiet = Quiet()
    last_count, last_change = -1, start
    try:
        while time.monotonic() - start < QUIET_MAX_S:
            now = time.monotonic()
            if platform.performed != last_count:
                last_count, last_change = platform.performed, now
            quiet.owed = await owed_by(store)
            quiet.buffered = sum(connector.buffered(gateway_id(i)) for i in range(GATEWAYS))
            if (
                all(connector.connected(gateway_id(i)) for i in range(GATEWAYS))
                and quiet.owed == 0
                and quiet.buffered == 0
                and (all_answered() or now - last_change >= STABLE_S)
            ):
                quiet.settled = True
                break
            await asyncio.sleep(0.1)
    finally:
        quiet.seconds = time.monotonic() - start
    return quiet


@attrs.frozen
class Handovers:
    """Who delivered each delivered reply, from the obligations' audit (owner labels)."""

    delivered: int
    by_recorder: int
    """Delivered by the very process that recorded it."""
    by_restarted: int
    """Delivered by a later life of the recorder's gateway."""
    by_peer: int
    """Delivered by a process of ANOTHER gateway: the fleet took over."""
    by_peer_while_down: int
    """Of those, delivered before the recorder's gateway was even restarted."""
    unknown: int
    """Whose recorder or deliverer could not be told from the audit."""


def handovers(store: PostgresStore, fleet: Fleet) -> Handovers:
    """Read every delivered obligation's history: its creator's and its deliverer's owner label
    (``host:pid:token``), mapped to the fleet's gateway numbers by pid, and when it was
    delivered (the audit's wall clock)."""
    index_of = fleet.index_of
    rows = store.select(OBLIGATION_KIND, states=(ObligationState.DELIVERED,))
    same = restarted = peer = while_down = unknown = 0
    for row in rows:
        history = store.history(OBLIGATION_KIND, row.id)
        recorded = next((h.owner for h in history if h.from_state is None), None)
        delivery = next(
            (h for h in reversed(history) if h.to_state is ObligationState.DELIVERED), None
        )
        recorder = pid_of(recorded)
        deliverer = None if delivery is None else pid_of(delivery.owner)
        if recorder not in index_of or deliverer not in index_of:
            unknown += 1
        elif recorder == deliverer:
            same += 1
        elif index_of[recorder] == index_of[deliverer]:
            restarted += 1
        else:
            peer += 1
            assert delivery is not None
            while_down += delivery.at < fleet.replaced_at(recorder)
    return Handovers(len(rows), same, restarted, peer, while_down, unknown)


# -- the test -------------------------------------------------------------------------------------


def test_owner_label_pid_is_read_from_the_audit_label() -> None:
    """The audit names an owner ``host:pid:token``; the host part may itself hold colons."""
    assert pid_of("box/m-1/boot-2/pidns-3:4242:abcd") == 4242
    assert pid_of("a:b:17:tok") == 17
    assert pid_of("no-pid-here") is None
    assert pid_of(None) is None


@attrs.frozen
class Run:
    """Everything one fleet run measured."""

    seed: int
    load_s: float
    kills: int
    kills_owing: int
    lives: int
    ready: int
    other_exits: tuple[int, ...]
    quiet: Quiet
    result: Analysis
    owed: int
    abandoned: int
    buffered: int
    undeliverable: int
    handovers: Handovers

    def summary(self) -> str:
        """The one-line report."""
        r, h = self.result, self.handovers
        ms = [x * 1000 for x in r.latencies]
        return (
            f"gateway fleet: {GATEWAYS} processes, {self.load_s:.0f} s, seed {self.seed}, "
            f"kills {self.kills} ({self.kills_owing} owing), lives {self.lives} "
            f"({self.ready} ready), messages {r.messages}, replies {r.replies}, "
            f"without a reply {len(r.without_reply)}, unlabelled duplicates "
            f"{r.unlabelled_duplicates}, labelled {r.labelled}, wrong chat {r.wrong_chat}, "
            f"stray {r.stray}, owed {self.owed}, abandoned {self.abandoned}, unacked buffered "
            f"{self.buffered}, undeliverable {self.undeliverable}; delivered {h.delivered}: "
            f"by the recorder {h.by_recorder}, by its restarted gateway {h.by_restarted}, "
            f"by a PEER gateway {h.by_peer} ({h.by_peer_while_down} before the recorder's gateway "
            f"restarted), unknown {h.unknown}; latency p50 "
            f"{percentile(ms, 0.5):.0f} ms p99 {percentile(ms, 0.99):.0f} ms, quiet "
            f"{self.quiet.seconds:.1f} s ({'settled' if self.quiet.settled else 'NOT settled'})"
        )

    def problems(self) -> list[str]:
        """Every check that failed, the harness's own first."""
        found = []
        r, h = self.result, self.handovers
        if self.kills < 2 or self.ready < GATEWAYS + self.kills:
            found.append(f"the harness did not run: {self.kills} kills, {self.ready} lives ready")
        if r.messages < 0.9 * RATE_PER_S * self.load_s:
            found.append(f"the load fell short: {r.messages} messages in {self.load_s:.1f} s")
        if self.undeliverable:
            found.append(f"events no gateway listened to: {self.undeliverable}")
        if self.other_exits:
            found.append(f"lives that ended other than by SIGKILL: {list(self.other_exits)}")
        if r.without_reply:
            shown = ", ".join(r.without_reply[:10]) + ("..." if len(r.without_reply) > 10 else "")
            found.append(f"messages without a reply: {len(r.without_reply)} ({shown})")
        if r.unlabelled_duplicates:
            found.append(f"unlabelled duplicates: {r.unlabelled_duplicates}")
        if r.wrong_chat or r.stray:
            found.append(f"wrong chat: {r.wrong_chat}, stray replies: {r.stray}")
        if self.owed or self.abandoned:
            found.append(f"the ledger still owes {self.owed}, abandoned {self.abandoned}")
        if self.buffered:
            found.append(f"the connector holds {self.buffered} unacked entries")
        if not self.quiet.settled:
            found.append(
                f"not settled within {QUIET_MAX_S:g} s (owed {self.quiet.owed}, "
                f"buffered {self.quiet.buffered} at its end)"
            )
        if h.delivered != r.messages - len(r.without_reply):
            found.append(f"{h.delivered} delivered obligations for {r.messages} messages")
        if h.unknown:
            found.append(f"{h.unknown} delivered obligations name no fleet process")
        if h.by_peer_while_down < 1:
            found.append(
                "no reply owed by a killed process was delivered by a peer gateway before the "
                f"killed one restarted ({h.by_peer} peer deliveries in all)"
            )
        return found


async def fleet_under_kills(workdir: Path, pg_url: str, seconds: float, run_seed: int) -> Run:
    """Run the connector here and the fleet in children under load and kills; then settle, stop
    everything and read the chats, the shared ledger and the connector's buffer."""
    rng = random.Random(run_seed)
    platform = SlowPlatform()
    schema = f"fleet_{uuid.uuid4().hex[:12]}"
    ledger_store = PostgresStore(pg_url, schema=schema, pool_size=4)
    ledger_store.register(OBLIGATION_KIND)
    connector_store = SQLiteStore(workdir / "connector.db")
    connector = Connector(
        connector_store,
        secrets={gateway_id(i): [secret_of(i)] for i in range(GATEWAYS)},
        drivers={"loopback": platform},
    )
    log_path = workdir / "fleet.log"
    injected: list[Injected] = []

    def answered() -> bool:
        return not analyse(injected, platform, platform.first_seen).without_reply

    try:
        await connector.start()
        with log_path.open("ab") as log:
            fleet = Fleet(connector.url, schema, pg_url, log)
            try:
                firsts = [await fleet.spawn(i) for i in range(GATEWAYS)]
                for i, proc in enumerate(firsts):
                    await connected(connector, i, proc)
                start = time.monotonic()
                until = start + seconds
                async with asyncio.timeout(seconds + 60):
                    await asyncio.gather(
                        kill_loop(fleet, connector, ledger_store, rng, until),
                        load(platform, until, injected),
                    )
                load_s = time.monotonic() - start
                quiet = await quiet_period(connector, platform, ledger_store, answered)
                for i in range(GATEWAYS):
                    await fleet.kill(i, crash=False)
            finally:
                await fleet.kill_all()
                await connector.stop()
        # Every process is gone: this is what the fleet left behind.
        owed = await owed_by(ledger_store)
        abandoned = ledger_store.count(OBLIGATION_KIND, states=(ObligationState.ABANDONED,))
        took_over = await asyncio.to_thread(handovers, ledger_store, fleet)
        buffered = sum(connector.buffered(gateway_id(i)) for i in range(GATEWAYS))
    finally:
        connector_store.close()
        ledger_store.close()
    return Run(
        seed=run_seed,
        load_s=load_s,
        kills=fleet.kills,
        kills_owing=fleet.kills_owing,
        lives=len(fleet.lives),
        ready=log_path.read_text(errors="replace").count("READY index="),
        other_exits=tuple(fleet.other_exits),
        quiet=quiet,
        result=analyse(injected, platform, platform.first_seen),
        owed=owed,
        abandoned=abandoned,
        buffered=buffered,
        undeliverable=connector.undeliverable,
        handovers=took_over,
    )


@pytest.mark.asyncio
async def test_a_killed_gateways_owed_replies_are_delivered_by_a_live_peer(
    tmp_path: Path, postgres_url: str
) -> None:
    """Three gateway processes on one PostgreSQL ledger, one SIGKILLed at random again and
    again under load: every message is answered once in its own chat (repeats labelled),
    nothing stays owed, and a killed process's owed replies are delivered by a live peer."""
    run = await fleet_under_kills(tmp_path, postgres_url, load_seconds(), seed())
    summary = run.summary()
    print(f"\n{summary}")
    problems = run.problems()
    assert not problems, summary + "\n" + "\n".join(problems)

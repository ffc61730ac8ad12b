"""What the platforms' crash runs share (tests/relay/{matrix,slack,telegram,discord}/
test_crash.py; never collected): the children's lives and what their output says, the shuffled
kills of a seed with every second kill of each kind waiting for its moment, the load under
those kills, the bounded quiet period after it, the bot's ledger and the connector's health
read from outside, and the summary table's formatting.  What each platform shows (its chats,
rooms or channels read back) and checks stays in its own run.

A connector child prints ``READY pid=<pid> url=<url>`` and then, as it goes, ``T <id>`` (an
event taken), ``R <id>`` (a rejection recorded), ``s``/``S`` (the save of its cursor note begun
and done), ``P <txn>``/``D <txn>`` (a keyed send begun and accepted); the gateway child prints
its READY only (tests/relay/child_kit.py, tests/relay/crash_child.py).
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
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import aiohttp
import attrs

from statecore import Ledger
from statecore.lifecycles import ObligationState
from statecore.obligation import OBLIGATION_KIND
from stores import SQLiteStore
from tests.crash_analysis import percentile
from tests.process_lives import Lives, Quiet

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_S = 40.0
"""The bound on one life's READY."""
MOMENT_WAIT_S = 3.0
"""The bound on a targeted kill's wait for its moment."""
POLL_S = 0.1
"""How often :func:`bounded` looks."""
QUIET_POLL_S = 0.25
"""How often the quiet period looks."""
READER_S = 5.0
"""The bound on reading the rest of a killed life's output."""


def setting(name: str, default: int) -> int:
    """The environment's integer ``name``, else ``default``."""
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


def free_port() -> int:
    """A loopback port free now (the connector's lives all listen on it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the children -----------------------------------------------------------------------------


@attrs.define(eq=False)
class Life:
    """One child process and what its output said."""

    proc: asyncio.subprocess.Process
    ready: asyncio.Event = attrs.field(factory=asyncio.Event)
    taken: list[str] = attrs.field(factory=list)
    """Ids of the events the connector's intake returned for (connector lives)."""
    unsaved: int = 0
    """Events taken since the cursor note was last saved."""
    saving: bool = False
    """The save of the cursor note has begun and not yet returned."""
    took: asyncio.Event = attrs.field(factory=asyncio.Event)
    """Set while events are taken and the cursor's save has not begun."""
    asked: list[str] = attrs.field(factory=list)
    """Transaction ids of the sends under a key begun (connector lives)."""
    done: list[str] = attrs.field(factory=list)
    """Transaction ids of the sends under a key the platform accepted."""
    reader: asyncio.Task[None] | None = None

    @property
    def half_taken(self) -> bool:
        """Events taken, and the save of the cursor that covers them not begun."""
        return self.unsaved > 0 and not self.saving


async def read_output(life: Life, log: IO[bytes]) -> None:
    """Copy a child's output to ``log`` and follow its lines (see the module docs)."""
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
        elif line.startswith("P "):
            life.asked.append(line[2:])
        elif line.startswith("D "):
            life.done.append(line[2:])


class Processes(Lives):
    """The successive lives of one kind of child, each spawned with ``python -m *argv``."""

    def __init__(self, name: str, argv: list[str], log: IO[bytes]) -> None:
        super().__init__()
        self.name = name
        self.argv = argv
        self.log = log
        self.by_proc: dict[int, Life] = {}
        self.ready_times: list[float] = []
        """Seconds from spawn to READY of every life (the first one included)."""

    @property
    def current(self) -> Life | None:
        """The newest life, if it still runs."""
        if self.lives and self.lives[-1].returncode is None:
            return self.by_proc[id(self.lives[-1])]
        return None

    def all_lives(self) -> list[Life]:
        """Every life, in order."""
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
                f"a {self.name} life ({self.argv[0]}) was not READY within {READY_S:g} s "
                f"(exit status {proc.returncode}); see its log"
            )
        self.ready_times.append(time.monotonic() - began)
        return life

    async def kill(self, life: Life, *, crash: bool = True) -> None:
        """SIGKILL ``life``, reap it and read the rest of its output (bounded)."""
        await self.kill_one(life.proc, crash=crash)
        if life.reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(life.reader, READER_S)

    async def stop_all(self) -> None:
        """Kill and reap every life, and stop reading their output."""
        await self.kill_all()
        for life in self.all_lives():
            if life.reader is not None and not life.reader.done():
                life.reader.cancel()
                with contextlib.suppress(BaseException):
                    await life.reader


@attrs.frozen
class Children:
    """The connector's and the gateway's lives of one run, and a client for the connector."""

    connectors: Processes
    gateways: Processes
    http: aiohttp.ClientSession

    def of(self, kind: str) -> Processes:
        """The lives of ``kind`` ("connector" or "gateway")."""
        return self.connectors if kind == "connector" else self.gateways

    async def stop_finals(self) -> None:
        """Kill the last life of each kind after the quiet period (not a kill under load)."""
        for lives in (self.connectors, self.gateways):
            final = lives.current
            if final is not None:
                await lives.kill(final, crash=False)


@contextlib.asynccontextmanager
async def children(
    workdir: Path, connector_argv: list[str], gateway_argv: list[str]
) -> AsyncIterator[Children]:
    """The two kinds of child, logging to ``workdir``/{connector,gateway}.log; every life is
    killed and reaped, and the client closed, however the run ends."""
    with (
        (workdir / "connector.log").open("ab") as connector_log,
        (workdir / "gateway.log").open("ab") as gateway_log,
    ):
        connectors = Processes("connector", connector_argv, connector_log)
        gateways = Processes("gateway", gateway_argv, gateway_log)
        http = aiohttp.ClientSession()
        try:
            yield Children(connectors, gateways, http)
        finally:
            await connectors.stop_all()
            await gateways.stop_all()
            await http.close()


# -- waiting, bounded -------------------------------------------------------------------------


async def bounded(predicate: Callable[[], Any], what: str, timeout_s: float) -> None:
    """Poll (sync or async) ``predicate`` until true; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(POLL_S)


async def healthz(session: aiohttp.ClientSession, port: int) -> dict[str, Any] | None:
    """The connector's ``/healthz`` answer, None while it cannot be had."""
    try:
        async with session.get(
            f"http://127.0.0.1:{port}/healthz", timeout=aiohttp.ClientTimeout(total=2)
        ) as response:
            body = await response.json()
            return body if isinstance(body, dict) else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def gateway_connected(session: aiohttp.ClientSession, port: int) -> bool:
    """Whether the connector on ``port`` has its one gateway connected."""
    health = await healthz(session, port)
    return health is not None and health.get("gateways") == 1


def ledger_counts(db: Path) -> tuple[int, int, int]:
    """(owed, abandoned, attempted more than once) in the bot's ledger (a connection of its
    own); -1 each while the file does not exist."""
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


class Calm:
    """Whether a count (the bot's messages) stayed the same for ``stable_s``."""

    def __init__(self, stable_s: float) -> None:
        self.stable_s = stable_s
        self.last_count = -1
        self.last_change = time.monotonic()

    def see(self, count: int) -> bool:
        """Note ``count``; whether it has not changed for ``stable_s``."""
        if count != self.last_count:
            self.last_count, self.last_change = count, time.monotonic()
        return time.monotonic() - self.last_change >= self.stable_s


async def quiet_period(
    http: aiohttp.ClientSession,
    port: int,
    gateway_db: Path,
    settled: Callable[[], bool],
    max_s: float,
) -> Quiet:
    """Wait (at most ``max_s``) until the bot's ledger owes nothing, the connector buffers
    nothing and the platform's own ``settled`` holds (every message answered, nothing moving);
    ``settled`` is asked on every look, after the ledger and the connector."""
    quiet = Quiet()
    began = time.monotonic()
    while time.monotonic() - began < max_s:
        quiet.owed = ledger_counts(gateway_db)[0]
        health = await healthz(http, port)
        quiet.buffered = None if health is None else health.get("buffered")
        calm = settled()
        if calm and quiet.owed == 0 and quiet.buffered == 0:
            quiet.settled = True
            break
        await asyncio.sleep(QUIET_POLL_S)
    quiet.seconds = time.monotonic() - began
    return quiet


# -- the kills under load ---------------------------------------------------------------------


@attrs.frozen
class Kill:
    """One fault: which process, when, whether it waited for its moment, and the messages
    written and not yet answered at the kill."""

    kind: str
    at: float
    targeted: bool
    in_flight: int


def kill_schedule(rng: random.Random, wanted: int) -> list[str]:
    """``wanted`` kills of each kind, shuffled by ``rng``."""
    kinds = ["connector"] * wanted + ["gateway"] * wanted
    rng.shuffle(kinds)
    return kinds


async def took(life: Life) -> None:
    """Until the connector ``life`` took events whose cursor's save has not begun (bounded by
    ``MOMENT_WAIT_S``: TimeoutError)."""
    await asyncio.wait_for(life.took.wait(), MOMENT_WAIT_S)


async def kill_and_restart(
    rng: random.Random,
    wanted: int,
    life_s: tuple[float, float],
    lives: Children,
    *,
    connector_moment: Callable[[Life], Awaitable[object]],
    in_flight: Callable[[], int],
    record: Callable[[str, bool], None],
) -> None:
    """The seed's faults: ``wanted`` SIGKILLs of each kind, shuffled, each ``life_s`` (drawn)
    after the previous restart was READY, each restarted at once.  Every second kill of each
    kind waits (at most ``MOMENT_WAIT_S``) for its moment: ``connector_moment`` for a
    connector (a batch half taken), replies in flight for a gateway; ``record`` notes each kill
    (kind, targeted) just before it."""
    for kind in kill_schedule(rng, wanted):
        await asyncio.sleep(rng.uniform(*life_s))
        processes = lives.of(kind)
        life = processes.current
        assert life is not None, f"no {kind} life is running"
        aim = processes.kills % 2 == 1
        with contextlib.suppress(AssertionError, TimeoutError):
            if aim and kind == "connector":
                await connector_moment(life)
            elif aim:
                await bounded(in_flight, "replies in flight", MOMENT_WAIT_S)
        record(kind, aim)
        await processes.kill(life)
        await processes.spawn()


async def under_load(
    load: Coroutine[Any, Any, None],
    stop_load: asyncio.Event,
    faults: Coroutine[Any, Any, None],
    *,
    wanted: int,
    tail_s: float,
    beside: Sequence[Coroutine[Any, Any, None]] = (),
) -> float:
    """Run ``load`` (until ``stop_load``) and ``beside`` (until cancelled) while ``faults``
    runs, then ``tail_s`` more; bounded by the kills wanted.  Returns the monotonic time the
    load began."""
    began = time.monotonic()
    loading = asyncio.create_task(load)
    others = [asyncio.create_task(side) for side in beside]
    try:
        async with asyncio.timeout(wanted * 2 * (READY_S + 10) + 60):
            await faults
            await asyncio.sleep(tail_s)
    finally:
        stop_load.set()
        for other in others:
            other.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await other
        await asyncio.wait_for(loading, 5)
    return began


def taken_in_more_than_one_life(lives: Sequence[Life]) -> int:
    """Events the connector's intake took in more than one life (redelivered after a kill and
    recognised by the connector)."""
    seen: dict[str, int] = {}
    for life in lives:
        for event in set(life.taken):
            seen[event] = seen.get(event, 0) + 1
    return sum(n > 1 for n in seen.values())


# -- the summary ------------------------------------------------------------------------------


def spread(values: Sequence[float], *, p99: bool = True) -> str:
    """``p50 …, p99 …, max …`` seconds of ``values`` (the p99 left out when not ``p99``);
    ``-`` when there are none."""
    if not values:
        return "-"
    ordered = sorted(values)
    parts = [f"p50 {statistics.median(ordered):.2f} s"]
    if p99:
        parts.append(f"p99 {percentile(ordered, 0.99):.2f} s")
    parts.append(f"max {ordered[-1]:.2f} s")
    return ", ".join(parts)


def in_flight_at_kills(kills: Sequence[Kill], kind: str = "gateway") -> str:
    """The messages in flight at the kills of ``kind``: their mean, and how many had some."""
    counts = [k.in_flight for k in kills if k.kind == kind]
    if not counts:
        return "-"
    hit = sum(n > 0 for n in counts)
    return f"mean {statistics.mean(counts):.1f}, {hit} of {len(counts)} kills with some"


def quiet_row(quiet: Quiet, owed: int, abandoned: int, buffered: str = "unacked buffered") -> str:
    """The quiet period's row: how long, whether it settled, what was left."""
    state = "settled" if quiet.settled else "NOT settled"
    return (
        f"{quiet.seconds:.1f} s ({state}); "
        f"owed {owed}, abandoned {abandoned}, {buffered} {quiet.buffered}"
    )


def table(title: str, rows: Sequence[tuple[str, str]]) -> str:
    """``title`` and the rows, names padded to one width."""
    width = max(len(name) for name, _ in rows)
    return "\n".join([title] + [f"  {name:<{width}}  {value}" for name, value in rows])


MIN_RATE_PER_S = 4.0
"""The load a run must have kept up (messages a second) for its checks to count."""


def harness_problems(
    connector_kills: int,
    gateway_kills: int,
    wanted: int,
    *,
    loaded: int,
    load_s: float,
    other_exits: Sequence[int],
) -> list[str]:
    """The harness's own checks: it killed enough of each kind, the load (``loaded`` messages
    in ``load_s``) kept up, and no life ended other than by SIGKILL."""
    found = []
    if connector_kills < wanted or gateway_kills < wanted:
        found.append(
            f"the harness did not kill enough: {connector_kills} connector and "
            f"{gateway_kills} gateway kills, {wanted} of each wanted"
        )
    if loaded < MIN_RATE_PER_S * load_s:
        found.append(
            f"the load fell below {MIN_RATE_PER_S:g} messages/s ({loaded} in {load_s:.1f} s)"
        )
    if other_exits:
        found.append(f"lives that ended other than by SIGKILL: {list(other_exits)}")
    return found


def ready_spreads(children: Children) -> Mapping[str, tuple[float, ...]]:
    """Seconds to READY of every restart (the first lives left out), by kind."""
    return {
        "connector": tuple(children.connectors.ready_times[1:]),
        "gateway": tuple(children.gateways.ready_times[1:]),
    }

"""One chaos run, start to end: the system under fault started, the users writing, the faults
made, the quiet period, everything stopped, the history checked and the throughput measured.

The system (all real processes on 127.0.0.1): the harness's own PostgreSQL server
(:mod:`tests.chaos.pg`) with one database and two schemas -- the gateways' ledger and the
connector cluster's store; :data:`GATEWAYS` gateway processes (:mod:`tests.chaos.gateway_child`)
and :data:`NODES` connector nodes (:mod:`tests.chaos.node_child`), each of their sockets to
PostgreSQL and each gateway's socket to the cluster through its own link of the fault proxy
(:mod:`tests.chaos.proxy`); the chat platform (:mod:`tests.chaos.platform`) in the harness.

Every child is killed and reaped in a ``finally`` (KeyboardInterrupt included), the server
stopped and the temporary directory removed -- kept, with each child's log, when the run failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import attrs

from statecore.obligation import OBLIGATION_KIND
from stores import PostgresStore
from tests.chaos.faults import KINDS, Fault, Injector
from tests.chaos.gateway_child import REPLY_PREFIX, secret_of
from tests.chaos.measure import GOAL_EXTRA_S, GOAL_SHARE, WINDOW_S, Measured, Series, measure
from tests.chaos.pg import ChaosServer
from tests.chaos.platform import ChaosPlatform, chat_id
from tests.chaos.processes import Children
from tests.chaos.proxy import Proxy
from tests.chaos.transcript import Transcript
from tests.chaos.verdict import OWED_STATES, Verdict, check

__all__ = ["GATEWAYS", "NODES", "Config", "Outcome", "run"]

GATEWAYS = 3
NODES = 2
LEDGER_SCHEMA = "chaos_ledger"
CONNECTOR_SCHEMA = "chaos_connector"
DATABASE = "chaos"


@attrs.frozen
class Config:
    """What to run (the command line's options, :mod:`tests.chaos.__main__`)."""

    faults: int = 20
    seed: int = 28
    seconds: float = 60.0
    """The fault schedule's nominal length (isolated faults wait on top of it)."""
    rate: float = 10.0
    """User messages per second, over every chat."""
    chats: int = 6
    lease_s: float = 3.0
    warmup_s: float = 10.0
    """How long the steady rate is measured, once every chat is answered."""
    quiet_s: float = 60.0
    isolate_every: int = 10
    kinds: tuple[str, ...] = KINDS
    """The fault kinds drawn from."""
    keep: bool = False
    """Keep the working directory (logs, fault log, transcript) even when the run passed."""
    tail_s: float | None = None
    """Load after the last fault (default: its goal window and one measuring window)."""
    quiet_output: bool = False


@attrs.frozen
class Outcome:
    """Everything a run measured."""

    config: Config
    steady: float
    faults: tuple[Fault, ...]
    measured: tuple[Measured, ...]
    verdict: Verdict
    messages: int
    replies: int
    quiet_s: float
    settled: bool
    harness_problems: tuple[str, ...]
    wall_s: float
    spawn_retries: int
    pushes: int
    push_refusals: int

    @property
    def ok(self) -> bool:
        """No violation, no harness problem."""
        return self.verdict.ok and not self.harness_problems


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answered(transcript: Transcript) -> tuple[int, int]:
    """(user messages, of them answered in their chat) -- the quiet period's progress."""
    answered = {
        (b.chat_id, b.text.rpartition(REPLY_PREFIX)[2])
        for b in transcript.bots()
        if REPLY_PREFIX in b.text
    }
    users = [(m.chat_id, m.text) for m in transcript.users()]
    return len(users), sum(key in answered for key in users)


class _System:
    """The running system of one run (built by :func:`run`)."""

    def __init__(self, config: Config, workdir: Path, log: Callable[[str], None]) -> None:
        self.config = config
        self.workdir = workdir
        self.log = log
        self.rng = random.Random(config.seed)
        self.server: ChaosServer | None = None
        self.proxy = Proxy()
        self.children = Children()
        self.platform: ChaosPlatform | None = None
        self.monitor: PostgresStore | None = None
        self.db_url = ""
        self.writing = True

    async def start(self) -> None:
        self.server = server = await asyncio.to_thread(ChaosServer)
        self.db_url = await asyncio.to_thread(server.create_database, DATABASE)
        for schema in (LEDGER_SCHEMA, CONNECTOR_SCHEMA):
            # The schemas and the ledger's kind exist before any child opens them.
            store = PostgresStore(self.db_url, schema=schema, pool_size=1)
            if schema == LEDGER_SCHEMA:
                store.register(OBLIGATION_KIND)
            store.close()
        self.monitor = PostgresStore(self.db_url, schema=LEDGER_SCHEMA, pool_size=2)
        self.monitor.register(OBLIGATION_KIND)
        node_ports = [_free_port() for _ in range(NODES)]
        hook_ports = [_free_port() for _ in range(NODES)]
        self.platform = platform = ChaosPlatform(hook_ports)
        await platform.start()
        pg_port = server.port
        for j in range(NODES):
            link = await self.proxy.link(f"pg:node-{j}", [pg_port])
            self.children.add(
                f"node-{j}",
                "tests.chaos.node_child",
                [
                    "--name",
                    f"node-{j}",
                    "--port",
                    str(node_ports[j]),
                    "--hook-port",
                    str(hook_ports[j]),
                    "--api-url",
                    platform.api_url,
                    "--schema",
                    CONNECTOR_SCHEMA,
                    "--gateways",
                    str(GATEWAYS),
                ],
                {"STATECORE_CHAOS_PG_URL": self._via(link.port)},
                self.workdir / f"node-{j}.log",
            )
        for i in range(GATEWAYS):
            pg_link = await self.proxy.link(f"pg:gw-{i}", [pg_port])
            relay_link = await self.proxy.link(f"relay:gw-{i}", node_ports)
            self.children.add(
                f"gw-{i}",
                "tests.chaos.gateway_child",
                [
                    "--url",
                    f"ws://127.0.0.1:{relay_link.port}",
                    "--index",
                    str(i),
                    "--gateways",
                    str(GATEWAYS),
                    "--secret",
                    secret_of(i),
                    "--schema",
                    LEDGER_SCHEMA,
                    "--lease",
                    str(self.config.lease_s),
                ],
                {"STATECORE_CHAOS_PG_URL": self._via(pg_link.port)},
                self.workdir / f"gw-{i}.log",
            )
        injector = self.injector()
        # The nodes first (as a deployment starts them), then the gateways together.
        names = list(self.children.slots)
        await asyncio.gather(*(injector.respawn(n) for n in names if n.startswith("node-")))
        await asyncio.gather(*(injector.respawn(n) for n in names if n.startswith("gw-")))
        if injector.spawn_failures:
            raise RuntimeError(f"children did not start: {injector.spawn_failures}")

    def _via(self, port: int) -> str:
        assert self.server is not None
        return self.db_url.replace(f":{self.server.port}/", f":{port}/", 1)

    def injector(self) -> Injector:
        assert self.server is not None
        if not hasattr(self, "_injector"):
            self._injector = Injector(
                children=self.children,
                proxy=self.proxy,
                server=self.server,
                rng=self.rng,
                lease_s=self.config.lease_s,
                gateways=GATEWAYS,
                nodes=NODES,
                owed=self.owed,
                log=self.log,
                kinds=self.config.kinds,
            )
        return self._injector

    async def owed(self) -> int:
        assert self.monitor is not None
        return await asyncio.to_thread(self.monitor.count, OBLIGATION_KIND, states=OWED_STATES)

    async def load(self) -> None:
        """The users: one message every ``1 / rate`` s, round-robin over the chats."""
        assert self.platform is not None
        interval = 1.0 / self.config.rate
        next_at = time.monotonic()
        n = 0
        while self.writing:
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            k = n % self.config.chats
            self.platform.write(chat_id(k), f"c{k}-m{n // self.config.chats}", f"user-{k}")
            n += 1
            next_at += interval

    async def answering(self) -> None:
        """Wait (bounded) until every chat got an answer, and what the start held back was
        answered: from then on the replies keep pace with the users."""
        assert self.platform is not None
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            chats = {b.chat_id for b in self.platform.transcript.bots()}
            total, answered = _answered(self.platform.transcript)
            if len(chats) == self.config.chats and total - answered <= self.config.rate:
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)

    def bot_times(self) -> Series:
        assert self.platform is not None
        return Series(b.at for b in self.platform.transcript.bots())

    async def settle(self, steady: float, *, after_fault: bool) -> None:
        """Wait (bounded by the goal window and a little) until the last window performed
        >= 95 % of ``steady``; ``after_fault``: not before one window has passed since now
        (the window that proves the recovery must end before the next fault begins)."""
        deadline = time.monotonic() + self.config.lease_s + GOAL_EXTRA_S + WINDOW_S + 4.0
        if after_fault:
            await asyncio.sleep(WINDOW_S)
        while time.monotonic() < deadline:
            now = time.time()
            if self.bot_times().count(now - WINDOW_S, now) >= GOAL_SHARE * steady * WINDOW_S:
                return
            await asyncio.sleep(0.2)

    async def quiesce(self) -> tuple[float, bool]:
        """Heal everything, bring every process back, stop writing, and wait (bounded) until
        every message is answered and nothing is owed."""
        assert self.server is not None
        assert self.platform is not None
        injector = self.injector()
        await injector.cancel()
        self.proxy.heal_all()
        for name in self.children.slots:
            self.children.resume(name)
        if not self.server.running:
            await asyncio.to_thread(self.server.start)
        for name, slot in self.children.slots.items():
            if slot.current is None:
                await injector.respawn(name)
        self.writing = False
        start = time.monotonic()
        next_note = start + 5.0
        while time.monotonic() - start < self.config.quiet_s:
            total, answered = _answered(self.platform.transcript)
            try:
                owed = await asyncio.wait_for(self.owed(), 5.0)
            except Exception as exc:
                owed = -1
                self.log(f"quiet: the ledger could not be read: {exc!r}")
            if answered == total and owed == 0 and not self.platform.pending:
                return time.monotonic() - start, True
            if time.monotonic() >= next_note:
                next_note += 5.0
                self.log(
                    f"quiet: {answered}/{total} answered, {owed} owed, "
                    f"{len(self.platform.pending)} pushes pending"
                )
            await asyncio.sleep(0.5)
        return time.monotonic() - start, False

    async def stop(self) -> None:
        await self.children.kill_all()
        if self.platform is not None:
            await self.platform.stop()
        await self.proxy.stop()
        monitor, self.monitor = self.monitor, None
        if monitor is not None:
            monitor.close()


async def _run(
    config: Config, workdir: Path, log: Callable[[str], None], systems: list[_System]
) -> Outcome:
    began = time.time()
    system = _System(config, workdir, log)
    systems.append(system)
    try:
        await system.start()
        log(f"system up in {time.time() - began:.1f} s; warming up {config.warmup_s:g} s")
        loader = asyncio.ensure_future(system.load())
        await system.answering()
        warm_start = time.time()
        await asyncio.sleep(config.warmup_s)
        steady = system.bot_times().rate(warm_start, time.time())
        log(f"steady rate {steady:.2f} replies/s (users write {config.rate:g}/s)")
        harness: list[str] = []
        if steady < 0.8 * config.rate:
            harness.append(f"the steady rate {steady:.2f}/s is below 80 % of the write rate")
        injector = system.injector()

        async def settle(after_fault: bool) -> None:
            await system.settle(steady, after_fault=after_fault)

        await injector.schedule(
            config.faults, config.seconds, isolate_every=config.isolate_every, settle=settle
        )
        tail = config.lease_s + GOAL_EXTRA_S + WINDOW_S if config.tail_s is None else config.tail_s
        await asyncio.sleep(tail)  # the last fault's after-window
        run_end = time.time()
        log(f"faults done at {run_end - began:.1f} s; quiet period")
        system.children.check()
        quiet_s, settled = await system.quiesce()
        loader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loader
        await system.stop()
        assert system.platform is not None
        transcript = system.platform.transcript
        transcript.dump(workdir / "transcript.jsonl")
        log(f"everything stopped at {time.time() - began:.1f} s; checking the history")
        verdict = await asyncio.to_thread(
            check,
            pg_url=system.db_url,
            ledger_schema=LEDGER_SCHEMA,
            connector_schema=CONNECTOR_SCHEMA,
            transcript=transcript,
        )
        measured = measure(
            system.bot_times(),
            injector.faults,
            steady=steady,
            lease_s=config.lease_s,
            run_end=run_end,
            isolated=injector.isolated,
        )
        harness.extend(system.children.unexpected)
        harness.extend(f"{name} could not be restarted" for name in injector.spawn_failures)
        harness.extend(f.line() for f in injector.faults if "HARNESS ERROR" in f.detail)
        if len(injector.faults) < config.faults:
            harness.append(f"only {len(injector.faults)} of {config.faults} faults were made")
        if not settled:
            harness.append(f"not settled within {config.quiet_s:g} s of quiet")
        total, _ = _answered(transcript)
        return Outcome(
            config=config,
            steady=steady,
            faults=tuple(injector.faults),
            measured=tuple(measured),
            verdict=verdict,
            messages=total,
            replies=sum(1 for _ in transcript.bots()),
            quiet_s=quiet_s,
            settled=settled,
            harness_problems=tuple(harness),
            wall_s=time.time() - began,
            spawn_retries=injector.spawn_retries,
            pushes=system.platform.pushes,
            push_refusals=system.platform.refused,
        )
    finally:
        await system.stop()
        if system.server is not None:
            await asyncio.to_thread(system.server.stop)


def _last_resort(system: _System) -> None:
    for slot in system.children.slots.values():
        for life in slot.lives:
            if life.proc.returncode is None:
                with contextlib.suppress(OSError):
                    os.kill(life.proc.pid, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.waitpid(life.proc.pid, 0)
    if system.server is not None:
        system.server.stop()


def run(config: Config, log: Callable[[str], None] = print) -> tuple[Outcome | None, Path]:
    """Run ``config``; returns the outcome (None when the harness itself broke: the exception
    is logged) and the working directory -- removed already when the run passed, kept with
    every child's log, the fault log and the transcript otherwise."""
    workdir = Path(tempfile.mkdtemp(prefix="statecore-chaos-"))
    fault_log = (workdir / "faults.log").open("a", encoding="utf-8")

    def both(line: str) -> None:
        fault_log.write(line + "\n")
        fault_log.flush()
        if not config.quiet_output:
            log(line)

    outcome: Outcome | None = None
    systems: list[_System] = []
    try:
        outcome = asyncio.run(_run(config, workdir, both, systems))
    except Exception:  # the harness broke: say so, keep the logs
        log(f"the chaos harness failed:\n{traceback.format_exc()}")
    finally:
        # Whatever the event loop could not finish (a KeyboardInterrupt cancels its awaits):
        # every child still running is killed and reaped here, the server stopped.
        for system in systems:
            _last_resort(system)
        fault_log.close()
        if outcome is not None and outcome.ok and not config.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return outcome, workdir

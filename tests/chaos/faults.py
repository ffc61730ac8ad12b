"""The faults of a chaos run: drawn from the seed, made, healed, and logged with their start and
end times (the harness's wall clock).

Each kind (:data:`KINDS`) names what it does to which target:

* ``gw-pg-partition`` / ``gw-relay-partition`` / ``node-pg-partition``: the link of one gateway
  to PostgreSQL, of one gateway to the connector cluster, or of one node to PostgreSQL becomes a
  black hole both ways for 1-4 s.  A node cut from PostgreSQL while the other node keeps it is
  the partition *between the nodes*: they speak only through the shared tables and NOTIFY.
* ``*-oneway``: the same links, one direction held (``up``: what the client sends; ``down``:
  what it receives), the other flowing, 1-4 s.
* ``link-reset``: every live connection of one link closed at once (an instant).
* ``gw-pause`` / ``node-pause``: SIGSTOP of a gateway for lease + 1-3 s (its peers presume it
  dead and claim its rows; then SIGCONT: the zombie wakes up and must be fenced), of a node for
  2-5 s.
* ``pg-restart``: a fast shutdown of PostgreSQL and a start on the same data directory;
  ``pg-kill``: SIGKILL of the postmaster and every backend, then a start (crash recovery) --
  both with claims and settles in flight (the ledger's owed rows are counted just before).
* ``gw-kill`` / ``node-kill``: SIGKILL, dead 1-3 s, a new life.
* ``clock-skew``: a gateway or node restarted with its wall clock off by 1-2.5 s either way,
  kept so 4-8 s, then restarted with a small offset again.

Every life starts with a small offset of its own (|offset| <= :data:`BASE_OFFSET_S`).  Faults
may overlap (at most :data:`MAX_CONCURRENT` at once, never two on one target: a process and its
links are one target, PostgreSQL is another).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable

import attrs

from tests.chaos.pg import ChaosServer
from tests.chaos.processes import Children
from tests.chaos.proxy import Mode, Proxy

__all__ = ["BASE_OFFSET_S", "KINDS", "MAX_CONCURRENT", "Fault", "Injector"]

KINDS: tuple[str, ...] = (
    "gw-pg-partition",
    "gw-pg-oneway",
    "gw-relay-partition",
    "gw-relay-oneway",
    "node-pg-partition",
    "node-pg-oneway",
    "link-reset",
    "gw-pause",
    "node-pause",
    "pg-restart",
    "pg-kill",
    "gw-kill",
    "node-kill",
    "clock-skew",
)
_WEIGHTS: dict[str, float] = dict.fromkeys(KINDS, 1.0) | {"pg-restart": 0.6, "pg-kill": 0.6}
MAX_CONCURRENT = 3
BASE_OFFSET_S = 0.5
SPAWN_TRIES = 6
"""A new life that cannot start (PostgreSQL down at that moment) is tried again this often."""


@attrs.define
class Fault:
    """One fault as it was made."""

    number: int
    kind: str
    target: str
    start: float
    end: float = 0.0
    detail: str = ""

    def line(self) -> str:
        """The log line of the fault."""
        return (
            f"fault {self.number:4d} {self.kind:<18} {self.target:<8} "
            f"{self.start:.3f} -> {self.end:.3f} ({self.end - self.start:5.2f} s) {self.detail}"
        )


class Injector:
    """Makes faults on a running system (see the module docs)."""

    def __init__(
        self,
        *,
        children: Children,
        proxy: Proxy,
        server: ChaosServer,
        rng: random.Random,
        lease_s: float,
        gateways: int,
        nodes: int,
        owed: Callable[[], Awaitable[int]],
        log: Callable[[str], None],
        kinds: tuple[str, ...] = KINDS,
    ) -> None:
        unknown = set(kinds) - set(KINDS)
        if unknown or not kinds:
            raise ValueError(f"fault kinds must be some of {KINDS}, not {sorted(unknown)}")
        self.kinds = kinds
        self.children = children
        self.proxy = proxy
        self.server = server
        self.rng = rng
        self.lease_s = lease_s
        self.gateways = [f"gw-{i}" for i in range(gateways)]
        self.nodes = [f"node-{j}" for j in range(nodes)]
        self.owed = owed
        self.log = log
        self.faults: list[Fault] = []
        self.spawn_retries = 0
        self.spawn_failures: list[str] = []
        self.isolated: set[int] = set()
        """The numbers of the faults made alone."""
        self._busy: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._pg_lock = asyncio.Lock()

    def offset(self) -> float:
        """A life's ordinary clock offset."""
        return round(self.rng.uniform(-BASE_OFFSET_S, BASE_OFFSET_S), 3)

    async def respawn(self, name: str, offset: float | None = None) -> None:
        """Start a new life of ``name``, again after a refusal (up to :data:`SPAWN_TRIES`);
        a slot that cannot be started is noted in :attr:`spawn_failures`."""
        chosen = self.offset() if offset is None else offset
        for attempt in range(SPAWN_TRIES):
            try:
                await self.children.spawn(name, chosen)
                return
            except RuntimeError as exc:
                self.spawn_retries += 1
                self.log(f"{name}: start {attempt + 1} failed: {str(exc).splitlines()[0]}")
                await asyncio.sleep(1.0)
        self.spawn_failures.append(name)

    # -- scheduling -------------------------------------------------------------------------

    async def schedule(
        self,
        count: int,
        seconds: float,
        *,
        isolate_every: int = 0,
        settle: Callable[[bool], Awaitable[None]] | None = None,
    ) -> None:
        """Make ``count`` faults over about ``seconds`` seconds (waits for the last to end).

        Every ``isolate_every``-th fault is made alone: after the others ended and
        ``settle(False)`` returned (the throughput is back), and nothing else starts until
        ``settle(True)`` returns -- those are the faults whose recovery is measured
        (:attr:`isolated`)."""
        mean = seconds / max(count, 1)
        for number in range(1, count + 1):
            await asyncio.sleep(self.rng.uniform(0.3, 1.7) * mean)
            alone = isolate_every > 0 and number % isolate_every == 0
            limit = 1 if alone else MAX_CONCURRENT
            while len(self._tasks) >= limit:
                await asyncio.wait(list(self._tasks), return_when=asyncio.FIRST_COMPLETED)
            if alone and settle is not None:
                await settle(False)
            kind, target = self._draw()
            self._busy.add(_lock_of(target))
            task = asyncio.ensure_future(self._one(number, kind, target))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            if alone:
                self.isolated.add(number)
                await asyncio.wait([task])
                if settle is not None:
                    await settle(True)
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    def _draw(self) -> tuple[str, str]:
        while True:
            kinds = self.kinds
            kind = self.rng.choices(kinds, weights=[_WEIGHTS[k] for k in kinds])[0]
            candidates = [t for t in self._targets(kind) if _lock_of(t) not in self._busy]
            if candidates:
                return kind, self.rng.choice(candidates)

    def _targets(self, kind: str) -> list[str]:
        if kind.startswith("pg-"):
            return ["pg"]
        if kind.startswith("gw-"):
            return list(self.gateways)
        if kind.startswith("node-"):
            return list(self.nodes)
        if kind == "link-reset":
            return list(self.proxy.links)
        return self.gateways + self.nodes  # clock-skew

    async def _one(self, number: int, kind: str, target: str) -> None:
        fault = Fault(number, kind, target, time.time())
        try:
            fault.detail = await self._make(kind, target)
        except Exception as exc:  # a harness failure: logged, the run's verdict sees it
            fault.detail = f"HARNESS ERROR {exc!r}"
        finally:
            fault.end = time.time()
            self._busy.discard(_lock_of(target))
            self.faults.append(fault)
            self.log(fault.line())

    # -- making each kind -------------------------------------------------------------------

    async def _make(self, kind: str, target: str) -> str:
        rng = self.rng
        if kind.endswith(("-partition", "-oneway")):
            mode: Mode = "blackhole" if kind.endswith("-partition") else rng.choice(("up", "down"))
            link = self.proxy.links[f"{'relay' if 'relay' in kind else 'pg'}:{target}"]
            hold = rng.uniform(1.0, 4.0)
            link.set_mode(mode)
            try:
                await asyncio.sleep(hold)
            finally:
                link.heal()
            return f"{link.name} {mode} {hold:.2f} s"
        if kind == "link-reset":
            return f"{target}: {self.proxy.links[target].reset()} connections reset"
        if kind.endswith("-pause"):
            hold = self.lease_s + rng.uniform(1.0, 3.0) if kind == "gw-pause" else rng.uniform(2, 5)
            if not self.children.pause(target):
                return "not running"
            try:
                await asyncio.sleep(hold)
            finally:
                self.children.resume(target)
            return f"SIGSTOP {hold:.2f} s, SIGCONT"
        if kind.endswith("-kill") and not kind.startswith("pg-"):
            dead = rng.uniform(1.0, 3.0)
            await self.children.kill(target)
            await asyncio.sleep(dead)
            await self.respawn(target)
            return f"SIGKILL, dead {dead:.2f} s, restarted"
        if kind.startswith("pg-"):
            return await self._pg(kind)
        if kind == "clock-skew":
            skew = round(rng.choice((-1, 1)) * rng.uniform(1.0, 2.5), 3)
            hold = rng.uniform(4.0, 8.0)
            await self.children.kill(target)
            await self.respawn(target, skew)
            await asyncio.sleep(hold)
            await self.children.kill(target)
            await self.respawn(target)
            return f"restarted with clock {skew:+.2f} s for {hold:.2f} s"
        raise ValueError(f"unknown fault kind {kind!r}")

    async def _pg(self, kind: str) -> str:
        async with self._pg_lock:
            owed = -1
            with contextlib.suppress(Exception):
                owed = await asyncio.wait_for(self.owed(), 2.0)
            if kind == "pg-restart":
                await asyncio.to_thread(self.server.restart)
                how = "fast shutdown + start"
            else:
                await asyncio.to_thread(self.server.kill)
                self.server.crashes += 1
                await asyncio.to_thread(self.server.start)
                how = "SIGKILL postmaster + backends, start"
            return f"{how}; {owed} owed rows in the ledger when it began"

    async def cancel(self) -> None:
        """Cancel the faults still running (each heals in its ``finally``); bounded."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=30.0)


def _lock_of(target: str) -> str:
    """The target a fault takes: a link's process (``pg:gw-1`` -> ``gw-1``), or itself."""
    return target.partition(":")[2] or target

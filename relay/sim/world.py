"""The world's clock, scheduler and trace: virtual time, one event at a time, in seed order."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

__all__ = ["ProcessClock", "SimClock", "World"]

EPOCH = 1_800_000_000.0
"""The wall clock's reading at virtual time 0."""


class SimClock:
    """The project's clock seam on virtual time: ``monotonic()`` is the scheduler's time and
    never jumps; ``now()`` (the wall clock) is it plus an offset a fault may move back or
    forward."""

    def __init__(self) -> None:
        self.mono = 0.0
        self.wall_offset = EPOCH

    def now(self) -> float:
        """The wall clock (seconds since the epoch)."""
        return self.mono + self.wall_offset

    def monotonic(self) -> float:
        """The monotonic clock (seconds of virtual time)."""
        return self.mono

    async def sleep(self, seconds: float) -> None:
        """Not used by the simulated parts (they schedule events instead)."""
        raise RuntimeError("the simulation schedules events; nothing sleeps")


class ProcessClock:
    """One process's view of the clocks: the world's monotonic clock, and a wall clock with
    the process's own offset (a host whose clock jumped); a :class:`~statecore.clock.Clock`."""

    def __init__(self, world: SimClock) -> None:
        self.world = world
        self.offset = 0.0

    def now(self) -> float:
        """This process's wall clock."""
        return self.world.now() + self.offset

    def monotonic(self) -> float:
        """The monotonic clock (never jumps)."""
        return self.world.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Not used by the simulated parts."""
        raise RuntimeError("the simulation schedules events; nothing sleeps")


class World:
    """The scheduler: events run in (time, order scheduled) order, each to completion.

    ``rng`` is the run's only source of randomness; ``trace`` records every step (time, what)
    so that two runs of one seed can be compared line by line.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.clock = SimClock()
        self.trace: list[str] = []
        self._queue: list[tuple[float, int, str, Callable[[], None]]] = []
        self._order = 0
        self._pid = 1000
        self.steps = 0

    def next_pid(self) -> int:
        """A pid for a new process life (never reused within the world)."""
        self._pid += 1
        return self._pid

    @property
    def now(self) -> float:
        """Virtual time (the monotonic clock)."""
        return self.clock.mono

    def at(self, delay: float, what: str, fn: Callable[[], None]) -> None:
        """Run ``fn`` ``delay`` seconds of virtual time from now (``what`` names it)."""
        self._order += 1
        heapq.heappush(self._queue, (self.clock.mono + max(0.0, delay), self._order, what, fn))

    def log(self, what: str) -> None:
        """Record one step in the trace."""
        self.trace.append(f"{self.clock.mono:10.4f} {what}")

    def run(self, until: float, *, idle: Callable[[], bool] | None = None) -> None:
        """Run events up to virtual time ``until`` (or, with ``idle``, until it says the world
        is quiet when no event is due before ``until``)."""
        while self._queue and self._queue[0][0] <= until:
            when, _, _what, fn = heapq.heappop(self._queue)
            self.clock.mono = when
            self.steps += 1
            fn()
            if idle is not None and idle():
                return
        self.clock.mono = max(self.clock.mono, until)

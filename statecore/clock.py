"""Injectable time: a wall clock for persisted timestamps, a monotonic one for timeouts.

Runtime code never calls ``time.time()`` or ``asyncio.sleep()`` directly; it receives a
:class:`Clock`.  Tests pass a :class:`FakeClock` and move time with :meth:`FakeClock.advance`
instead of sleeping, so leases, stale cutoffs and backoffs expire instantly and deterministically.
Deadlines passed between layers are absolute :class:`Deadline` values, never re-derived durations.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import threading
import time
from typing import Protocol, runtime_checkable

import attrs

__all__ = ["Clock", "Deadline", "FakeClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """A source of time.  ``now()`` is wall time (epoch seconds, for persisted timestamps);
    ``monotonic()`` never goes backwards (for timeouts and backoff); ``sleep()`` waits on the
    monotonic clock."""

    def now(self) -> float:
        """Wall-clock time in seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Monotonic seconds, for measuring durations."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's monotonic time (cancellable)."""
        ...


class SystemClock:
    """The real clock: ``time.time``, ``time.monotonic``, ``asyncio.sleep``."""

    __slots__ = ()

    def now(self) -> float:
        """Wall-clock time in seconds since the epoch."""
        return time.time()

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """``asyncio.sleep(seconds)``; a negative or NaN duration sleeps zero."""
        await asyncio.sleep(_duration(seconds))

    def __repr__(self) -> str:
        return "SystemClock()"


class FakeClock:
    """A clock that moves only when told to: for tests.

    Wall and monotonic time advance together.  :meth:`sleep` suspends until
    :meth:`advance` moves monotonic time to (or past) the sleeper's deadline; the sleeper then
    wakes on the next turn of its event loop.  Sleepers on several loops and an ``advance``
    from another thread are supported.
    """

    def __init__(self, start: float = 1_700_000_000.0, *, monotonic_start: float = 0.0) -> None:
        self._wall_offset = float(start) - float(monotonic_start)
        self._mono = float(monotonic_start)
        self._lock = threading.Lock()
        self._order = itertools.count()
        # (deadline, order, future): the order breaks deadline ties in sleep-call order.
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []

    def now(self) -> float:
        """Fake wall-clock time."""
        with self._lock:
            return self._wall_offset + self._mono

    def monotonic(self) -> float:
        """Fake monotonic time."""
        with self._lock:
            return self._mono

    @property
    def sleepers(self) -> int:
        """How many sleeps are waiting for time to move (cancelled ones excluded)."""
        with self._lock:
            return sum(1 for _, _, fut in self._sleepers if not fut.done())

    @property
    def next_deadline(self) -> float | None:
        """The monotonic time the earliest waiting sleeper wakes at, or None."""
        with self._lock:
            live = [d for d, _, fut in self._sleepers if not fut.done()]
        return min(live) if live else None

    async def sleep(self, seconds: float) -> None:
        """Wait until :meth:`advance` moves time by ``seconds``; ``<= 0`` yields once."""
        delay = _duration(seconds)
        if delay == 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            # The deadline is read under the lock: an advance() from another thread cannot
            # slip between reading the time and registering the sleeper.
            entry = (self._mono + delay, next(self._order), fut)
            heapq.heappush(self._sleepers, entry)
        try:
            await fut
        finally:
            if not fut.done() or fut.cancelled():
                self._forget(entry)

    def _forget(self, entry: tuple[float, int, asyncio.Future[None]]) -> None:
        """Drop a cancelled sleeper so abandoned waits do not accumulate."""
        with self._lock:
            if entry in self._sleepers:
                self._sleepers.remove(entry)
                heapq.heapify(self._sleepers)

    def advance(self, seconds: float) -> None:
        """Move both clocks forward and wake every sleeper whose deadline has come.

        Raises ``ValueError`` for a negative or non-finite step (time never goes backwards).
        """
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not math.isfinite(float(seconds) if abs(seconds) < 1e308 else math.inf)
            or seconds < 0
        ):
            raise ValueError(f"advance() needs a finite, non-negative number, not {seconds!r}")
        due: list[asyncio.Future[None]] = []
        with self._lock:
            self._mono += float(seconds)
            while self._sleepers and self._sleepers[0][0] <= self._mono:
                due.append(heapq.heappop(self._sleepers)[2])
        for fut in due:
            _wake(fut)

    def set_wall(self, wall: float) -> None:
        """Jump wall time only (as NTP might); monotonic time and sleepers are unaffected."""
        with self._lock:
            self._wall_offset = float(wall) - self._mono

    def __repr__(self) -> str:
        return f"FakeClock(monotonic={self._mono!r})"


@attrs.frozen
class Deadline:
    """An absolute point on a clock's monotonic time line.

    Create with :meth:`after`; pass it down instead of a duration so every layer spends the same
    budget.  :meth:`remaining` is never negative.
    """

    clock: Clock
    at: float

    @classmethod
    def after(cls, clock: Clock, seconds: float) -> Deadline:
        """The deadline ``seconds`` from now (negative or NaN means already expired)."""
        return cls(clock, clock.monotonic() + _duration(seconds))

    def remaining(self) -> float:
        """Seconds left, clamped at zero."""
        return max(0.0, self.at - self.clock.monotonic())

    @property
    def expired(self) -> bool:
        """True once no time is left."""
        return self.clock.monotonic() >= self.at


def _duration(seconds: float) -> float:
    """Clamp a duration to ``[0, inf)``: negative and NaN durations mean 'no time at all'."""
    if not isinstance(seconds, int | float):
        raise TypeError(f"a duration must be a number of seconds, not {seconds!r}")
    if math.isnan(seconds) or seconds <= 0:
        return 0.0
    return float(seconds)


def _wake(fut: asyncio.Future[None]) -> None:
    loop = fut.get_loop()
    if loop.is_closed():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        if not fut.done():
            fut.set_result(None)
    else:
        loop.call_soon_threadsafe(_resolve, fut)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)

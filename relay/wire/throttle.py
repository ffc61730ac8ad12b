"""Bounded logging for what a peer controls: a hostile peer must not be able to fill the log.

A connection that sends ten thousand junk lines, or acks ten thousand unknown bufferIds, gets a
handful of log lines and a count, not ten thousand lines.
"""

from __future__ import annotations

from statecore.clock import Clock, SystemClock

__all__ = ["LogThrottle"]


class LogThrottle:
    """At most ``burst`` lines per ``interval_s`` window; the rest are counted, not logged.

    Call :meth:`allow` before logging one occurrence: ``None`` means "suppressed: do not log";
    an int means "log it", and is how many occurrences were suppressed since the last line that
    was logged (add it to the line so nothing is lost silently).  Not thread-safe: one per
    connection, on the event loop.
    """

    __slots__ = ("_clock", "_suppressed", "_used", "_window_start", "burst", "interval_s")

    def __init__(self, *, burst: int = 5, interval_s: float = 60.0, clock: Clock | None = None):
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ValueError(f"burst must be a positive int, not {burst!r}")
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, not {interval_s!r}")
        self.burst = burst
        self.interval_s = float(interval_s)
        self._clock: Clock = clock or SystemClock()
        self._window_start = self._clock.monotonic()
        self._used = 0
        self._suppressed = 0

    @property
    def suppressed(self) -> int:
        """Occurrences suppressed since the last line that was allowed."""
        return self._suppressed

    def allow(self) -> int | None:
        """Account for one occurrence; return None to suppress it, else the suppressed count."""
        now = self._clock.monotonic()
        if now - self._window_start >= self.interval_s:
            self._window_start = now
            self._used = 0
        if self._used >= self.burst:
            self._suppressed += 1
            return None
        self._used += 1
        suppressed, self._suppressed = self._suppressed, 0
        return suppressed

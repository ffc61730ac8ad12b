"""Bounded logging for what a peer controls: a hostile peer must not be able to fill the log.

A connection that sends ten thousand junk lines, or acks ten thousand unknown bufferIds, gets a
handful of log lines and a count, not ten thousand lines.  :class:`LogThrottle` bounds one kind
of line; :class:`LogLimits` keeps one per kind.  The text a peer chose is made safe for the
line by :mod:`relay.wire.logtext`.
"""

from __future__ import annotations

import logging

from statecore.clock import Clock, SystemClock

__all__ = ["LogLimits", "LogThrottle"]


class LogThrottle:
    """At most ``burst`` lines per ``interval_s`` window; the rest are counted, not logged.

    Call :meth:`allow` before logging one occurrence: ``None`` means "suppressed: do not log";
    an int means "log it", and is how many occurrences were suppressed since the last line that
    was logged (add it to the line so nothing is lost silently).  Not thread-safe: one per
    connection, on the event loop.
    """

    __slots__ = ("_clock", "_suppressed", "_used", "_window_start", "burst", "interval_s")

    def __init__(self, *, burst: int = 5, interval_s: float = 60.0, clock: Clock | None = None):
        _check(burst, interval_s)
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

    def take_suppressed(self) -> int:
        """The occurrences suppressed since the last line allowed, reported now: the count
        restarts at 0 (log it, e.g. when the source of the lines goes away)."""
        suppressed, self._suppressed = self._suppressed, 0
        return suppressed

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


class LogLimits:
    """One :class:`LogThrottle` per kind of line: a flood of one kind never silences another.

    ``kind`` names are chosen by the code (a fixed, small set), never by a peer: what is kept
    per kind stays bounded.  Call :meth:`allow` before logging one occurrence (the same answer
    as :meth:`LogThrottle.allow`); when the source of the lines goes away (a connection
    closes, a connector stops), call :meth:`drain` and log what it returns, so that no
    suppressed count is lost silently.  Not thread-safe: one per connection (or connector),
    on the event loop.  Raises ``ValueError`` as :class:`LogThrottle` does.
    """

    __slots__ = ("_clock", "_throttles", "burst", "interval_s")

    def __init__(self, *, burst: int = 5, interval_s: float = 60.0, clock: Clock | None = None):
        _check(burst, interval_s)
        self.burst = burst
        self.interval_s = float(interval_s)
        self._clock = clock
        self._throttles: dict[str, LogThrottle] = {}

    def allow(self, kind: str) -> int | None:
        """Account for one occurrence of ``kind``; None to suppress it, else how many lines of
        that kind were suppressed since the last one logged (add it to the line)."""
        throttle = self._throttles.get(kind)
        if throttle is None:
            throttle = self._throttles[kind] = LogThrottle(
                burst=self.burst, interval_s=self.interval_s, clock=self._clock
            )
        return throttle.allow()

    def check(self, logger: logging.Logger, level: int, kind: str) -> str | None:
        """Whether to log one occurrence of ``kind`` at ``level`` on ``logger``: None when not
        (the level is off -- nothing is counted then -- or the kind's limit is reached: it is
        counted); else the suffix the line must end with, ``""`` or `` (N more not logged)``."""
        if not logger.isEnabledFor(level):
            return None
        suppressed = self.allow(kind)
        if suppressed is None:
            return None
        return f" ({suppressed} more not logged)" if suppressed else ""

    def report(self, logger: logging.Logger, source: str) -> None:
        """Log on ``logger`` (WARNING, one line) the lines suppressed and not reported yet, by
        kind (the counts restart at 0); nothing when there are none.  Call it as the source of
        those lines goes away (a connection closes, a connector stops); ``source`` names it
        and must not be a peer's text."""
        drained = self.drain()
        if drained:
            counts = ", ".join(f"{count} {kind}" for kind, count in drained.items())
            logger.warning(
                "%s: lines not logged (rate-limited): %s",
                source,
                counts,
                extra={"suppressed": drained},
            )

    def drain(self) -> dict[str, int]:
        """The kinds with suppressed lines not reported yet and how many of each (the counts
        restart at 0); log them once, e.g. as the source of the lines goes away."""
        drained: dict[str, int] = {}
        for kind, throttle in self._throttles.items():
            count = throttle.take_suppressed()
            if count:
                drained[kind] = count
        return drained


def _check(burst: int, interval_s: float) -> None:
    """Refuse (``ValueError``) a burst that is not a positive int, an interval not positive."""
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise ValueError(f"burst must be a positive int, not {burst!r}")
    if not interval_s > 0:
        raise ValueError(f"interval_s must be positive, not {interval_s!r}")

"""Throughput under faults, from the platform's transcript alone: the times of the bot messages
the platform performed, in sliding windows, against the steady rate measured before any fault.

* ``during``: the replies performed from a fault's start to its end (at least
  :data:`MIN_SPAN_S` for an instant fault), as a share of what the steady rate performs then;
* ``after``: the same over the goal window ``[end, end + lease + 5 s]``;
* recovery: from the fault's end until the first window of :data:`WINDOW_S` (starting at or
  after the end, stepped by :data:`STEP_S`) performs >= 95 % of the steady rate.  It is only
  definite for an *isolated* fault (no other fault began or ran between its start and its
  recovery); the harness makes every few faults isolated on purpose (:mod:`tests.chaos.run`).
* after a PostgreSQL restart or kill: whether some window wholly after its end (within the
  goal window) performed nothing at all (0 %).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

import attrs

from tests.chaos.faults import Fault

__all__ = [
    "GOAL_SHARE",
    "WINDOW_S",
    "KindRow",
    "Measured",
    "Series",
    "measure",
    "table",
]

WINDOW_S = 3.0
STEP_S = 0.1
MIN_SPAN_S = 1.0
GOAL_SHARE = 0.95
GOAL_EXTRA_S = 5.0
"""The goal: back to 95 % within the lease + this."""


class Series:
    """Sorted event times, counted in intervals."""

    def __init__(self, times: Iterable[float]) -> None:
        self.times = sorted(times)

    def count(self, start: float, end: float) -> int:
        """Events in ``[start, end)``."""
        return bisect.bisect_left(self.times, end) - bisect.bisect_left(self.times, start)

    def rate(self, start: float, end: float) -> float:
        """Events per second in ``[start, end)`` (0 for an empty interval)."""
        return self.count(start, end) / (end - start) if end > start else 0.0

    def recovered_at(
        self, start: float, steady: float, horizon: float, share: float = GOAL_SHARE
    ) -> float | None:
        """The first ``t`` in ``[start, horizon]`` (steps of :data:`STEP_S`) whose window
        ``[t, t + WINDOW_S)`` reaches ``share`` of ``steady``; None when none does."""
        need = share * steady * WINDOW_S
        steps = int(max(0.0, horizon - start) / STEP_S)
        for k in range(steps + 1):
            t = start + k * STEP_S
            if self.count(t, t + WINDOW_S) >= need:
                return t
        return None


@attrs.frozen
class Measured:
    """One fault, measured."""

    fault: Fault
    isolated: bool
    during: float
    after: float
    recovery_s: float | None
    """None: not back to 95 % before the horizon (or censored by the next fault)."""
    zero_after: bool
    """A window wholly after the end (within the goal window) with no reply at all."""


def measure(
    series: Series,
    faults: Sequence[Fault],
    *,
    steady: float,
    lease_s: float,
    run_end: float,
    isolated: set[int],
) -> list[Measured]:
    """Measure every fault (see the module docs); ``isolated`` holds the numbers of the faults
    the harness made alone."""
    goal = lease_s + GOAL_EXTRA_S
    ordered = sorted(faults, key=lambda f: f.start)
    starts = [f.start for f in ordered]
    out = []
    for fault in ordered:
        span_end = max(fault.end, fault.start + MIN_SPAN_S)
        during = series.rate(fault.start, span_end) / steady
        after_end = min(fault.end + goal, run_end)
        after = series.rate(fault.end, after_end) / steady if after_end > fault.end else math.nan
        later = bisect.bisect_right(starts, fault.start)
        next_start = starts[later] if later < len(starts) else run_end
        horizon = min(next_start, run_end) - WINDOW_S
        recovered = series.recovered_at(fault.end, steady, horizon)
        zero = False
        if fault.kind.startswith("pg-"):
            t = fault.end
            while t + WINDOW_S <= min(fault.end + goal, run_end):
                if series.count(t, t + WINDOW_S) == 0:
                    zero = True
                    break
                t += STEP_S
        out.append(
            Measured(
                fault=fault,
                isolated=fault.number in isolated,
                during=during,
                after=after,
                recovery_s=None if recovered is None else recovered - fault.end,
                zero_after=zero,
            )
        )
    return out


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@attrs.frozen
class KindRow:
    """The table's row of one fault kind."""

    kind: str
    count: int
    isolated: int
    during: float
    """Mean share of the steady rate during the fault."""
    after: float
    recovery_p50: float
    recovery_p99: float
    """Over the isolated faults; inf when one of them never got back."""
    goal_met: int
    """Isolated faults back to 95 % within the goal."""
    zero_after: int

    @property
    def met(self) -> bool:
        """Every isolated fault of the kind met the goal, and no PostgreSQL fault left 0 %."""
        return self.isolated > 0 and self.goal_met == self.isolated and self.zero_after == 0


def table(measured: Sequence[Measured], lease_s: float) -> list[KindRow]:
    """One row per fault kind, in the order the kinds first occur."""
    goal = lease_s + GOAL_EXTRA_S
    kinds = list(dict.fromkeys(m.fault.kind for m in measured))
    rows = []
    for kind in sorted(kinds):
        ms = [m for m in measured if m.fault.kind == kind]
        alone = [m for m in ms if m.isolated]
        recoveries = [math.inf if m.recovery_s is None else m.recovery_s for m in alone]
        afters = [m.after for m in ms if not math.isnan(m.after)]
        rows.append(
            KindRow(
                kind=kind,
                count=len(ms),
                isolated=len(alone),
                during=sum(m.during for m in ms) / len(ms),
                after=sum(afters) / len(afters) if afters else math.nan,
                recovery_p50=_percentile(recoveries, 0.5),
                recovery_p99=_percentile(recoveries, 0.99),
                goal_met=sum(r <= goal for r in recoveries),
                zero_after=sum(m.zero_after for m in ms),
            )
        )
    return rows

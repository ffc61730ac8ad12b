"""The gateway's housekeeping: every table with settled rows is pruned on the gateway's timer.

A *job* is ``async job() -> int``: it deletes the settled rows of one table that are past their
retention and returns how many it deleted.  It must never delete an owed row (each store API's
``prune`` already keeps them: owed obligations, active sessions, running or owed delegations,
unacknowledged undeliverable records).  The gateway registers its own jobs (obligations past the
policy's retention; owner records ended long ago; ended sessions and settled delegations past
``retention_s``), an adapter that declares ``AdapterAbilities(keeps_house=True)`` contributes
its own (the relay adapter: the handled-replay keys and dismissed undeliverable records of its
dedupe store), and an application adds any other with ``Gateway.add_housekeeping(name, job)``.

Each round runs every job in turn; each job's count is reported (``metrics.pruned(name, rows)``)
and the round is logged at INFO with every count (``extra``: ``pruned``, a name-to-count
mapping, ``rows`` and ``duration_s``).  A job that raises is logged at WARNING and the others
still run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from statecore.clock import Clock
from statecore.metrics import Metrics

__all__ = ["Housekeeping", "HousekeepingJob"]

log = logging.getLogger("statecore.gateway.runtime")

HousekeepingJob = Callable[[], Awaitable[int]]
"""``await job()``: delete one table's settled rows past their retention; return how many."""


class Housekeeping:
    """The housekeeping jobs of one gateway, by name, and the rounds that run them."""

    def __init__(self, *, clock: Clock, metrics: Metrics) -> None:
        self._clock = clock
        self._metrics = metrics
        self._jobs: dict[str, HousekeepingJob] = {}

    def names(self) -> list[str]:
        """The registered jobs' names, in the order they run."""
        return list(self._jobs)

    def add(self, name: str, job: HousekeepingJob) -> None:
        """Run ``job`` in every round under ``name`` (a job already of that name is replaced).
        Raises ``ValueError`` for an empty name and ``TypeError`` for a job that is not
        callable."""
        _check(name, job)
        self._jobs[name] = job

    def merge(self, name: str, job: HousekeepingJob) -> None:
        """Run ``job`` under ``name`` *as well as* any job already of that name, their counts
        added up (adapters over different stores each contribute theirs)."""
        _check(name, job)
        earlier = self._jobs.get(name)
        if earlier is None:
            self._jobs[name] = job
            return

        async def both() -> int:
            return int(await earlier()) + int(await job())

        self._jobs[name] = both

    async def run(self) -> dict[str, int]:
        """One round: every job in turn; returns each job's count (a job that raised is
        missing).  Counted and logged as the module docs say."""
        began = self._clock.monotonic()
        counts: dict[str, int] = {}
        for name, job in list(self._jobs.items()):
            try:
                rows = int(await job())
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning(
                    "housekeeping: pruning %s failed", name, exc_info=True, extra={"what": name}
                )
                continue
            counts[name] = rows
            self._metrics.pruned(name, rows)
        took = self._clock.monotonic() - began
        log.info(
            "housekeeping: pruned %s in %.3f s",
            ", ".join(f"{rows} {name}" for name, rows in counts.items()) or "nothing",
            took,
            extra={"pruned": dict(counts), "rows": sum(counts.values()), "duration_s": took},
        )
        return counts


def _check(name: str, job: object) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a housekeeping job needs a non-empty name, not {name!r}")
    if not callable(job):
        raise TypeError(f"a housekeeping job must be callable, not {type(job).__name__}")

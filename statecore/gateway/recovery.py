"""The gateway's timer and its recoveries: one loop on the gateway's clock, several cadences.

The loop runs, each when it is due:

* the **beat**, every ``policy.lease_s / 3``: renews this gateway's owner lease
  (:meth:`~statecore.AsyncLedger.heartbeat`), so that gateways on other hosts never reclaim
  its rows while it runs, and may once it stopped beating for a lease (at once after the
  ``leave`` that :meth:`Gateway.stop` writes);
* the **retry round**, every ``retry_interval_s``: this incarnation's retryable failures per
  connected (platform, profile), then its own stuck rows, then -- once ``prune_interval_s``
  passed since the last -- a housekeeping round;
* the **recover tick**, every ``recover_interval_s`` (0: never): the startup sweep again,
  scoped to the connected targets, so that rows of a peer that died (SIGKILL, a crashed
  container) are picked up by a live gateway -- at once when the peer ran on this host (the
  process probe), after its lease when it ran on another host.

Each chore that raises is logged at WARNING and the loop goes on.  The beat runs first in a
round, so a slow retry round never costs the lease; the recover tick's redeliveries run in the
background (:meth:`Gateway.start` does the same), so they never hold the loop.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from functools import partial

import attrs

from statecore.clock import Clock
from statecore.gateway.sending import SendPath
from statecore.obligation import Claim

__all__ = ["Cadences", "clear_flags", "cleared_or_released", "log_recovery", "run_timer"]

log = logging.getLogger("statecore.gateway.runtime")

Chore = Callable[[], Awaitable[object]]
"""``await chore()``: one of the timer's jobs."""


@attrs.frozen
class Cadences:
    """How often the timer runs each chore, in seconds on the gateway's clock: the retry
    round, the beat and the recover tick (0: never)."""

    retry_s: float
    beat_s: float
    recover_s: float


async def run_timer(
    clock: Clock,
    cadences: Cadences,
    *,
    beat: Chore,
    targets: Callable[[], Iterable[tuple[str, str]]],
    retry: Callable[[str, str], Awaitable[object]],
    stuck: Chore,
    recover: Chore,
    housekeep: Chore,
    prune_s: float,
) -> None:
    """Run the chores on their cadences until cancelled (see the module docs).  Each period
    is counted from the end of the chore's previous run; a round runs everything due, in the
    order: ``beat()``; ``retry(platform, profile)`` for each of ``targets()``, ``stuck()`` and,
    when ``prune_s`` (0: never) passed since the last, ``housekeep()``; ``recover()``."""
    start = clock.monotonic()
    next_beat = start + cadences.beat_s
    next_retry = start + cadences.retry_s
    next_recover = start + cadences.recover_s if cadences.recover_s else math.inf
    last_prune = start
    while True:  # until cancelled
        await clock.sleep(min(next_beat, next_retry, next_recover) - clock.monotonic())
        now = clock.monotonic()
        if now >= next_beat:
            await _run("renewing the owner lease", beat)
            next_beat = clock.monotonic() + cadences.beat_s
        if now >= next_retry:
            for platform, profile in sorted(targets()):
                await _run(
                    f"runtime retry for {platform}/{profile}", partial(retry, platform, profile)
                )
            await _run("recovering stuck obligations", stuck)
            if prune_s and clock.monotonic() - last_prune >= prune_s:
                last_prune = clock.monotonic()
                await _run("housekeeping", housekeep)  # settled rows past retention only
            next_retry = clock.monotonic() + cadences.retry_s
        if now >= next_recover:
            await _run("recovering dead owners' rows", recover)
            next_recover = clock.monotonic() + cadences.recover_s


async def _run(what: str, chore: Chore) -> None:
    try:
        await chore()
    except Exception:  # a failed chore is tried again on its next turn
        log.warning("%s failed", what, exc_info=True, extra={"chore": what})


async def log_recovery(
    clock: Clock,
    what: str,
    claims: int,
    began: float,
    redeliver: Callable[[], Awaitable[tuple[int, int]]],
) -> None:
    """Run ``redeliver()`` (returning replies delivered and labelled) for a recovery that
    claimed ``claims`` rows, then log it once at INFO with its counts and duration since
    ``began`` (on ``clock``) -- also when a stop interrupted it (the cancellation propagates).
    """
    delivered = labelled = 0
    interrupted = True
    try:
        delivered, labelled = await redeliver()
        interrupted = False
    finally:
        took = clock.monotonic() - began
        log.info(
            "%s recovery: %d replies owed by dead owners claimed, %d delivered "
            "(%d labelled as possible repeats) in %.3f s%s",
            what,
            claims,
            delivered,
            labelled,
            took,
            " (interrupted by stop)" if interrupted else "",
            extra={
                "recovery": what,
                "claimed": claims,
                "delivered": delivered,
                "labelled": labelled,
                "duration_s": took,
                "interrupted": interrupted,
            },
        )


async def clear_flags(claims: list[Claim], clear: Callable[[str], Awaitable[object]]) -> None:
    """Clear each claim's session ``resume_pending`` (``clear(session_key)``) before it is
    sent, as a recovery at start does: a clear that fails is logged and the claim still sent."""
    for claim in claims:
        try:
            await clear(claim.obligation.session_key)
        except Exception:
            log.warning(
                "could not clear resume_pending for %s; sending anyway",
                claim.obligation.session_key,
                exc_info=True,
            )


async def cleared_or_released(
    claims: list[Claim], clear: Callable[[str], Awaitable[object]], path: SendPath
) -> list[Claim]:
    """Clear each claim's ``resume_pending`` as a runtime recovery does: a claim whose clear
    failed sends nothing -- it is released (refunded) through ``path`` and let go.  Returns
    the claims ready to send (still held)."""
    ready: list[Claim] = []
    for claim in claims:
        oid = claim.obligation_id
        try:
            await clear(claim.obligation.session_key)
        except Exception:
            log.warning("could not clear resume_pending; releasing %s", oid)
            try:
                await path.release(oid)
            finally:
                path.let_go(oid)
            continue
        ready.append(claim)
    return ready

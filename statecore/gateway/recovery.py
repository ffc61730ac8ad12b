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

When the gateway's store is a :class:`~statecore.claims.NotifyingStore` (PostgreSQL) and the
recover tick runs at all, the loop also listens on :data:`statecore.wakeups.CHANNEL`: a peer that
leaves cleanly with rows owed announces it, and the recover tick runs at once instead of up to
``recover_interval_s`` later (then counts its period from there).  The timer still runs it too:
a lease that expires (a peer SIGKILLed on another host) announces nothing, and a wake-up sent
while the listener reconnects is lost.  The subscription ends with the loop (on stop).  On any
other store nothing listens and the loop is exactly the timer.

Each chore that raises is logged at WARNING and the loop goes on.  The beat runs first in a
round, so a slow retry round never costs the lease; the recover tick's redeliveries run in the
background (:meth:`Gateway.start` does the same), so they never hold the loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from functools import partial

import attrs

from statecore.claims import NotifyingStore
from statecore.clock import Clock
from statecore.gateway.sending import SendPath
from statecore.obligation import Claim
from statecore.store import Store
from statecore.wakeups import listen_for_work

__all__ = [
    "Cadences",
    "RepeatedWarning",
    "clear_flags",
    "cleared_or_released",
    "log_recovery",
    "run_timer",
]

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
    store: Store | None = None,
) -> None:
    """Run the chores on their cadences until cancelled (see the module docs).  Each period
    is counted from the end of the chore's previous run; a round runs everything due, in the
    order: ``beat()``; ``retry(platform, profile)`` for each of ``targets()``, ``stuck()`` and,
    when ``prune_s`` (0: never) passed since the last, ``housekeep()``; ``recover()``.

    ``store`` is the one whose announcements wake the recover tick (module docs); by default
    the store of the ledger of the gateway ``recover`` is a bound method of
    (``gateway.ledger.store``), if any.  It is only listened to when it is a
    :class:`~statecore.claims.NotifyingStore` and ``cadences.recover_s`` is not 0; the
    subscription ends (bounded) when the loop does."""
    woken = asyncio.Event()
    unsubscribe = None
    if cadences.recover_s:
        unsubscribe = await _subscribe(_store_behind(recover) if store is None else store, woken)
    try:
        await _rounds(
            clock,
            cadences,
            None if unsubscribe is None else woken,
            beat=beat,
            targets=targets,
            retry=retry,
            stuck=stuck,
            recover=recover,
            housekeep=housekeep,
            prune_s=prune_s,
        )
    finally:
        if unsubscribe is not None:
            unsubscribe()


async def _rounds(
    clock: Clock,
    cadences: Cadences,
    woken: asyncio.Event | None,
    *,
    beat: Chore,
    targets: Callable[[], Iterable[tuple[str, str]]],
    retry: Callable[[str, str], Awaitable[object]],
    stuck: Chore,
    recover: Chore,
    housekeep: Chore,
    prune_s: float,
) -> None:
    """The loop of :func:`run_timer`; ``woken`` (None: nothing listens) set by a wake-up runs
    the recover tick at once."""
    start = clock.monotonic()
    next_beat = start + cadences.beat_s
    next_retry = start + cadences.retry_s
    next_recover = start + cadences.recover_s if cadences.recover_s else math.inf
    last_prune = start
    while True:  # until cancelled
        woke = await _pause(clock, min(next_beat, next_retry, next_recover), woken)
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
        if woke or now >= next_recover:
            if woke:
                log.debug("woken by a peer that left rows owed: recovering at once")
            await _run("recovering dead owners' rows", recover)
            next_recover = clock.monotonic() + cadences.recover_s


async def _pause(clock: Clock, until: float, woken: asyncio.Event | None) -> bool:
    """Sleep on ``clock`` until its monotonic time ``until``, or less when ``woken`` is set
    first; returns whether it was (clearing it, so wake-ups during a recovery coalesce into
    one more)."""
    if woken is None:
        await clock.sleep(until - clock.monotonic())
        return False
    if not woken.is_set():
        sleeping = asyncio.ensure_future(clock.sleep(until - clock.monotonic()))
        waking = asyncio.ensure_future(woken.wait())
        try:
            await asyncio.wait((sleeping, waking), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeping.cancel()
            waking.cancel()
            await asyncio.gather(sleeping, waking, return_exceptions=True)
    woke = woken.is_set()
    woken.clear()
    return woke


def _store_behind(chore: Chore) -> Store | None:
    """The store of the ledger of the object ``chore`` is a bound method of (a gateway's
    ``ledger.store``), or None."""
    ledger = getattr(getattr(chore, "__self__", None), "ledger", None)
    store = getattr(ledger, "store", None)
    return store if isinstance(store, NotifyingStore) else None


async def _subscribe(store: Store | None, woken: asyncio.Event) -> Callable[[], None] | None:
    """Listen for announcements on ``store`` (off the event loop), each setting ``woken``;
    returns ``unsubscribe``, or None when nothing listens (see
    :func:`~statecore.wakeups.listen_for_work`).  Cancelled while subscribing, the subscription
    is ended as soon as it is made."""
    if not isinstance(store, NotifyingStore):
        return None
    loop = asyncio.get_running_loop()

    def wake() -> None:
        loop.call_soon_threadsafe(woken.set)

    subscribing = asyncio.ensure_future(asyncio.to_thread(listen_for_work, store, wake))
    try:
        return await asyncio.shield(subscribing)
    except asyncio.CancelledError:
        subscribing.add_done_callback(_end_subscription)
        raise


def _end_subscription(subscribing: asyncio.Future[Callable[[], None] | None]) -> None:
    """Unsubscribe what a cancelled :func:`_subscribe` went on to subscribe, if anything."""
    if subscribing.cancelled() or subscribing.exception() is not None:
        return
    unsubscribe = subscribing.result()
    if unsubscribe is not None:
        unsubscribe()


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


class RepeatedWarning:
    """A warning that would otherwise repeat on every round of the timer: the first failure of
    each cause is logged at WARNING with that cause, later ones of the same cause at DEBUG (with
    their count), and the next success once at INFO, so that the log says what is wrong and
    when it stopped, not the same line every few seconds."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._cause: str | None = None
        self._count = 0

    def failed(self, exc: BaseException, consequence: str) -> None:
        """Report one failure of ``what`` with ``exc``; ``consequence`` says what was done."""
        cause = f"{type(exc).__name__}: {exc}"
        if cause != self._cause:
            self._cause, self._count = cause, 1
            log.warning(
                "%s failed: %s; %s (further failures with this cause are logged at DEBUG)",
                self.what,
                cause,
                consequence,
                exc_info=exc,
                extra={"cause": cause},
            )
            return
        self._count += 1
        log.debug("%s failed again (%d times): %s; %s", self.what, self._count, cause, consequence)

    def succeeded(self) -> None:
        """Report a success: logged once when it ends a run of failures."""
        if self._cause is not None:
            log.info("%s works again after %d failures (%s)", self.what, self._count, self._cause)
            self._cause, self._count = None, 0


async def clear_flags(
    claims: list[Claim],
    clear: Callable[[str], Awaitable[object]],
    warning: RepeatedWarning | None = None,
) -> None:
    """Clear each claim's session ``resume_pending`` (``clear(session_key)``) before it is
    sent, as a recovery at start does: a clear that fails is reported to ``warning`` (its
    cause) and the claim still sent."""
    warning = warning or RepeatedWarning("clearing resume_pending")
    for claim in claims:
        try:
            await clear(claim.obligation.session_key)
        except Exception as exc:
            warning.failed(exc, f"sending {claim.obligation_id} anyway")
        else:
            warning.succeeded()


async def cleared_or_released(
    claims: list[Claim],
    clear: Callable[[str], Awaitable[object]],
    path: SendPath,
    warning: RepeatedWarning | None = None,
) -> list[Claim]:
    """Clear each claim's ``resume_pending`` as a runtime recovery does: a claim whose clear
    failed sends nothing -- it is released (refunded) through ``path`` and let go, the failure
    reported to ``warning`` with its cause.  Returns the claims ready to send (still held)."""
    warning = warning or RepeatedWarning("clearing resume_pending")
    ready: list[Claim] = []
    for claim in claims:
        oid = claim.obligation_id
        try:
            await clear(claim.obligation.session_key)
        except Exception as exc:
            warning.failed(exc, f"releasing {oid} unsent, to be retried")
            try:
                await path.release(oid)
            finally:
                path.let_go(oid)
            continue
        warning.succeeded()
        ready.append(claim)
    return ready

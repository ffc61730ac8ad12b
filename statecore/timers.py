"""Durable timers: the moves a lifecycle declares with ``after``, fired by the store's rows.

A timer is not a task of a process.  It is a property of a stored row: the row is in the
timer's source state, it entered that state at a known time (its last write's audit time),
and the timer falls due that many seconds later (a fixed duration, or one read from a field of
the row).  So a timer survives every restart, fires late rather than never when every process
was down, and needs no row of its own to be created with the entity's write.

:class:`Timers` fires what is due: it asks the store for due rows
(:meth:`~statecore.store.TimerStore.due_timers`) and moves each with one guarded write fenced
by the fence it read, so that of several processes (or threads) firing the same timer exactly
one write is accepted and every other gets :class:`~statecore.errors.StaleState`, which is
counted and passed over.  Each firing is audited like any transition, its reason saying which
timer fired (``fired by timer after 30 s``).  ``on_fire`` runs inside the same transaction as
the firing: what it writes to the store (an obligation recorded for a reminder, say) commits
with the move or not at all; if it raises, the firing is undone too, logged, and the timer is
due again on the next run.

:class:`AsyncTimers` runs the same on an event loop: the store's blocking calls go to a worker
thread, and :meth:`AsyncTimers.run` sleeps on the clock until the next timer is due (at most
``poll_s``, so rows written by other processes are seen), so a :class:`~statecore.FakeClock`
drives it in tests.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

import attrs

from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind
from statecore.errors import InvalidTransition, StaleState, UnknownEntity
from statecore.lifecycle import Timer
from statecore.store import Audit, Due, Row, Store, TimerStore

__all__ = ["AsyncTimers", "Fired", "Timers"]

log = logging.getLogger(__name__)


@attrs.frozen
class Fired:
    """One timer that fired: the move written and when it fell due."""

    kind: str
    entity_id: str
    event: str
    from_state: Enum
    to_state: Enum
    due_at: float
    fired_at: float
    row: Row[Any]
    """The row as the firing wrote it."""

    @property
    def late_s(self) -> float:
        """How long after falling due it fired (0 or more)."""
        return max(0.0, self.fired_at - self.due_at)


OnFire = Callable[[Fired], None]


def _check_positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, not {value!r}")
    return value


class Timers:
    """Fires the due timers of ``kinds`` in ``store`` (each kind is registered, idempotently).

    ``Timers(store, kinds, *, clock=None, owner=None, batch=100, on_fire=None)``.  Call
    :meth:`run_due` whenever timers may be due (a loop, a cron, :class:`AsyncTimers`); it
    returns what it fired.  Safe to run in any number of processes and threads at once: a
    timer fires once.  Raises ``ValueError`` for a kind whose lifecycle declares no timer or
    a bad ``batch``, ``TypeError`` for a kind that is not an :class:`EntityKind`; what the
    store's ``register`` raises.
    """

    def __init__(
        self,
        store: Store,
        kinds: Iterable[EntityKind[Any]],
        *,
        clock: Clock | None = None,
        owner: str | None = None,
        batch: int = 100,
        on_fire: OnFire | None = None,
    ) -> None:
        self._store = store
        self._kinds = tuple(kinds)
        for kind in self._kinds:
            if not isinstance(kind, EntityKind):
                raise TypeError(f"Timers runs entity kinds, not {kind!r}")
            if not kind.lifecycle.timers:
                raise ValueError(
                    f"entity kind {kind.name!r}: lifecycle {kind.lifecycle.name!r} declares "
                    "no timer"
                )
        if not self._kinds:
            raise ValueError("Timers needs at least one entity kind with timers")
        self._clock = clock or SystemClock()
        self._owner = owner or f"timers@{socket.gethostname()}:{os.getpid()}"
        self._batch = _check_positive_int("batch", batch)
        self._on_fire = on_fire
        self.fired = 0
        """Timers fired by this object."""
        self.lost_races = 0
        """Due rows another writer moved first (fired elsewhere, or moved by the application)."""
        self.failed = 0
        """Firings undone because ``on_fire`` raised."""
        for kind in self._kinds:
            store.register(kind)

    @property
    def kinds(self) -> tuple[EntityKind[Any], ...]:
        """The kinds whose timers this object fires."""
        return self._kinds

    def run_due(self, *, now: float | None = None) -> list[Fired]:
        """Fire every timer due at ``now`` (default: the clock's), oldest due first, in
        transactions of up to ``batch`` firings; return them.  A row moved meanwhile by
        another writer is passed over (:attr:`lost_races`).  Raises ``StoreError`` when the
        store fails (firings of the failed transaction are undone; earlier ones stand)."""
        at = self._clock.now() if now is None else now
        fired: list[Fired] = []
        for kind in self._kinds:
            for timer in kind.lifecycle.timers:
                while True:
                    done, progress = self._round(kind, timer, at)
                    fired.extend(done)
                    if not progress:
                        break
        return fired

    def next_due(self) -> float | None:
        """When the next timer of these kinds falls due (None: no row has a timer)."""
        soonest: float | None = None
        for kind in self._kinds:
            for timer in kind.lifecycle.timers:
                due = self._due(kind, timer, None, 1)
                if due and (soonest is None or due[0].due_at < soonest):
                    soonest = due[0].due_at
        return soonest

    def pending(self) -> dict[str, int]:
        """How many rows have a timer running, by ``kind.event`` (a full read: for tools)."""
        counts: dict[str, int] = {}
        for kind in self._kinds:
            for timer in kind.lifecycle.timers:
                key = f"{kind.name}.{timer.event}"
                counts[key] = counts.get(key, 0) + len(self._due(kind, timer, None, 2**62))
        return counts

    # -- one round ----------------------------------------------------------------------------

    def _round(
        self, kind: EntityKind[Any], timer: Timer[Any], at: float
    ) -> tuple[list[Fired], bool]:
        """One transaction: read up to ``batch`` due rows and fire each.  Returns the firings
        and whether another round may find more (a full batch that made progress)."""
        store = self._store
        fired: list[Fired] = []
        with store.atomic():
            due = self._due(kind, timer, at, self._batch)
            for item in due:
                one = self._fire(kind, timer, item, at)
                if one is not None:
                    fired.append(one)
        # A full batch in which every row was fired may hide more; a batch with refusals or
        # failures stops here, so a row whose on_fire keeps failing is not retried in a loop.
        return fired, len(due) == self._batch and len(fired) == len(due)

    def _fire(
        self, kind: EntityKind[Any], timer: Timer[Any], item: Due[Any], at: float
    ) -> Fired | None:
        store = self._store
        row = item.row
        audit = Audit(
            at=at, owner=self._owner, reason=timer.describe(item.due_at - item.entered_at)
        )
        try:
            with store.atomic():  # a savepoint: on_fire's failure undoes this firing only
                written = store.transition(kind, row.id, timer.event, audit=audit, fence=row.fence)
                fired = Fired(
                    kind.name,
                    row.id,
                    timer.event,
                    row.state,
                    written.state,
                    item.due_at,
                    at,
                    written,
                )
                if self._on_fire is not None:
                    self._on_fire(fired)
        except (StaleState, InvalidTransition, UnknownEntity):
            self.lost_races += 1
            return None
        except Exception:
            self.failed += 1
            log.exception(
                "%s %s: on_fire failed for timer %s; the firing is undone and stays due",
                kind.name,
                row.id,
                timer.event,
            )
            return None
        self.fired += 1
        return fired

    def _due(
        self, kind: EntityKind[Any], timer: Timer[Any], now: float | None, limit: int
    ) -> list[Due[Any]]:
        store = self._store
        if isinstance(store, TimerStore):
            return store.due_timers(kind, timer, now=now, limit=limit)
        return _due_by_reading(store, kind, timer, now, limit)


def _due_by_reading(
    store: Store, kind: EntityKind[Any], timer: Timer[Any], now: float | None, limit: int
) -> list[Due[Any]]:
    """Due rows of a store without ``due_timers``: every row of the source state read, its
    entered time taken from its last audit entry (a full read per call)."""
    found: list[Due[Any]] = []
    for row in store.select(kind, states=[timer.source]):
        history = store.history(kind, row.id)
        if not history:
            continue
        entered = history[-1].at
        seconds = timer.seconds if timer.field is None else row.values.get(timer.field)
        if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
            continue
        due_at = entered + float(seconds)
        if now is None or due_at <= now:
            found.append(Due(row, entered, due_at))
    found.sort(key=lambda d: (d.due_at, d.row.id))
    return found[:limit]


class AsyncTimers:
    """:class:`Timers` on an event loop: the same arguments, plus ``poll_s`` (the longest
    :meth:`run` sleeps, so rows other processes write are seen; default 1 s).

    ``await run_due()`` fires what is due now; ``await run()`` fires until :meth:`stop`.  The
    store's calls run in a worker thread, never on the loop.  Raises as :class:`Timers`, and
    ``ValueError`` for a ``poll_s`` that is not a positive number.
    """

    def __init__(
        self,
        store: Store,
        kinds: Iterable[EntityKind[Any]],
        *,
        clock: Clock | None = None,
        owner: str | None = None,
        batch: int = 100,
        on_fire: OnFire | None = None,
        poll_s: float = 1.0,
    ) -> None:
        if (
            isinstance(poll_s, bool)
            or not isinstance(poll_s, int | float)
            or not math.isfinite(poll_s)
            or poll_s <= 0
        ):
            raise ValueError(f"poll_s must be a positive number, not {poll_s!r}")
        self._clock = clock or SystemClock()
        self._timers = Timers(
            store, kinds, clock=self._clock, owner=owner, batch=batch, on_fire=on_fire
        )
        self._poll_s = float(poll_s)
        self._stopping = asyncio.Event()

    @property
    def timers(self) -> Timers:
        """The synchronous service underneath (its counters)."""
        return self._timers

    async def run_due(self, *, now: float | None = None) -> list[Fired]:
        """Fire every timer due now; see :meth:`Timers.run_due`."""
        return await asyncio.to_thread(self._timers.run_due, now=now)

    async def next_due(self) -> float | None:
        """See :meth:`Timers.next_due`."""
        return await asyncio.to_thread(self._timers.next_due)

    async def run(self) -> None:
        """Fire timers as they fall due until :meth:`stop` is called.  A store failure is
        logged and retried after ``poll_s``; cancellation stops it at once."""
        while not self._stopping.is_set():
            wait = self._poll_s
            try:
                fired = await self.run_due()
                soonest = await self.next_due()
                if soonest is not None:
                    ahead = soonest - self._clock.now()
                    # Due now yet not fired (its on_fire failed, or another process holds
                    # it): wait a poll rather than spin.
                    if ahead > 0 or fired:
                        wait = min(wait, max(0.0, ahead))
            except Exception:
                log.exception("timers: a round failed; retrying in %s s", self._poll_s)
            if self._stopping.is_set():
                break
            sleeper = asyncio.ensure_future(self._clock.sleep(wait))
            stopper = asyncio.ensure_future(self._stopping.wait())
            try:
                await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                stopper.cancel()

    def stop(self) -> None:
        """Ask :meth:`run` to return after the round in progress (idempotent)."""
        self._stopping.set()

"""An in-memory stand-in for the connector's side of a driver, for the platform drivers' own
tests (tests/relay/{matrix,slack,telegram,discord}/test_driver.py and the Telegram webhook and
pacing tests).

It keeps what a real connector keeps (notes, rejections, the events taken) in memory, and can be
told to refuse the next events (:class:`~relay.connector.intake.IntakeFull`), to fail the next
intake calls or note saves (:class:`~statecore.errors.StoreError`) or to take its time, so a
test can watch a driver keep its cursor or hold its ack.  Every offer is written down with the
notes saved by then, the cursor note at that moment and (for Telegram) how many ``getUpdates``
calls the fake server had answered.  It does not deduplicate: every copy a driver offers is in
``events``.  The real connector's intake is tested in tests/relay/connector; the whole path in
each platform's test_bot.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, TypeVar

from relay.connector.intake import IntakeFull
from relay.wire.frames import InboundEvent
from statecore.errors import StoreError


class NotesIntake:
    """A :class:`~relay.connector.intake.DriverIntake` in memory.

    ``calls`` counts what the fake server answered so far (written down for each event taken in
    ``taken_after_calls``); ``wait_s`` is the default bound of :meth:`wait_for`.
    """

    def __init__(self, calls: Callable[[], int] | None = None, *, wait_s: float = 20.0) -> None:
        self.notes: dict[tuple[str, str], str] = {}
        self.events: list[InboundEvent] = []
        self.rejected: list[tuple[str | None, str, str]] = []
        self.refuse = 0
        """Refuse this many intake calls (IntakeFull) before taking again."""
        self.refused = 0
        self.break_takes = 0
        """Fail this many intake calls with a StoreError (the store is failing)."""
        self.fail_saves = 0
        """Fail this many note saves (StoreError) before saving again."""
        self.delay_s = 0.0
        """Each intake call takes this long before it answers."""
        self.saves: list[tuple[str, str]] = []
        self.log: list[tuple[str, int]] = []
        """Each offer as ("refused" | "taken", how many notes had been saved by then)."""
        self.offers: list[tuple[str, str | None, str | None]] = []
        """Each offer: ("refused" | "taken", the event's id, the cursor note at that moment)."""
        self.cursor_note = "gateway_session"
        """The note whose value :attr:`offers` writes down."""
        self.taken_after_calls: list[int] = []
        """For each event taken: the fake server's calls answered by then."""
        self._calls = calls or (lambda: 0)
        self.wait_s = wait_s
        self.arrived = asyncio.Event()

    async def __call__(self, platform: str, event: InboundEvent) -> None:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        note = self.notes.get((platform, self.cursor_note))
        if self.refuse:
            self.refuse -= 1
            self.refused += 1
            self.log.append(("refused", len(self.saves)))
            self.offers.append(("refused", event.message_id, note))
            raise IntakeFull("the test refuses this event")
        if self.break_takes:
            self.break_takes -= 1
            raise StoreError("the test's store fails")
        self.log.append(("taken", len(self.saves)))
        self.offers.append(("taken", event.message_id, note))
        self.events.append(event)
        self.taken_after_calls.append(self._calls())
        self.arrived.set()

    async def reject(
        self, platform: str, raw: str, reason: str, *, event_id: str | None = None
    ) -> None:
        self.rejected.append((event_id, reason, raw))
        self.arrived.set()

    async def load(self, platform: str, name: str) -> str | None:
        return self.notes.get((platform, name))

    async def save(self, platform: str, name: str, value: str) -> None:
        if self.fail_saves:
            self.fail_saves -= 1
            raise StoreError("the test fails this save")
        self.notes[(platform, name)] = value
        self.saves.append((name, value))

    def texts(self) -> list[str]:
        """The texts taken, in order."""
        return [event.text for event in self.events]

    async def wait_for(self, count: int, timeout_s: float | None = None) -> None:
        """Until ``count`` events (and rejections) arrived; TimeoutError after the bound
        (``timeout_s``, else :attr:`wait_s`)."""
        async with asyncio.timeout(self.wait_s if timeout_s is None else timeout_s):
            while len(self.events) + len(self.rejected) < count:
                self.arrived.clear()
                await self.arrived.wait()


class Driver(Protocol):
    """What :func:`running` needs of a platform driver."""

    def attach(self, intake: NotesIntake) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


D = TypeVar("D", bound=Driver)


@contextlib.asynccontextmanager
async def running(driver: D, notes: NotesIntake) -> AsyncIterator[D]:
    """``driver`` attached to ``notes`` and started; stopped afterwards."""
    driver.attach(notes)
    await driver.start()
    try:
        yield driver
    finally:
        await driver.stop()


class Until(Protocol):
    """The signature of :func:`until` with a bound of its own."""

    def __call__(
        self, check: Callable[[], bool], what: str, timeout_s: float | None = None
    ) -> Awaitable[None]: ...


async def until(
    check: Callable[[], bool], what: str, timeout_s: float = 15.0, *, poll_s: float = 0.02
) -> None:
    """Poll ``check`` (every ``poll_s``) until it holds; AssertionError naming ``what`` after
    the bound."""
    try:
        async with asyncio.timeout(timeout_s):
            while not check():
                await asyncio.sleep(poll_s)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s} s: {what}") from None


def until_within(bound_s: float, *, poll_s: float = 0.02) -> Until:
    """:func:`until` whose default bound is ``bound_s`` (polling every ``poll_s``)."""

    def bounded(
        check: Callable[[], bool], what: str, timeout_s: float | None = None
    ) -> Awaitable[None]:
        return until(check, what, bound_s if timeout_s is None else timeout_s, poll_s=poll_s)

    return bounded

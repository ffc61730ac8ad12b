"""An in-memory stand-in for the connector's side of a driver, for the Telegram driver's tests.

It keeps what a real connector keeps (notes, rejections, the events taken) in dictionaries, can
be told to refuse the next events (:class:`~relay.connector.intake.IntakeFull`) or to fail the
next note saves, and writes down, for every event taken, how many ``getUpdates`` calls the fake
server had answered by then, so a test can check that no call confirmed an update before it was
taken.  The real connector's intake is tested in tests/relay/connector; the whole path in
tests/relay/telegram/test_bot.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from relay.connector.intake import IntakeFull
from relay.telegram import TelegramDriver
from relay.wire.frames import InboundEvent
from statecore.errors import StoreError


class NotesIntake:
    """A :class:`~relay.connector.intake.DriverIntake` in memory."""

    def __init__(self, calls: Callable[[], int] | None = None) -> None:
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
        self.saves: list[tuple[str, str]] = []
        self.taken_after_calls: list[int] = []
        """For each event taken: the fake server's getUpdates calls answered by then."""
        self._calls = calls or (lambda: 0)
        self.arrived = asyncio.Event()

    async def __call__(self, platform: str, event: InboundEvent) -> None:
        if self.refuse:
            self.refuse -= 1
            self.refused += 1
            raise IntakeFull("the test refuses this event")
        if self.break_takes:
            self.break_takes -= 1
            raise StoreError("the test's store fails")
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

    async def wait_for(self, count: int, timeout_s: float = 15.0) -> None:
        """Until ``count`` events (and rejections) arrived; TimeoutError after the bound."""
        async with asyncio.timeout(timeout_s):
            while len(self.events) + len(self.rejected) < count:
                self.arrived.clear()
                await self.arrived.wait()


@contextlib.asynccontextmanager
async def running(driver: TelegramDriver, notes: NotesIntake) -> AsyncIterator[TelegramDriver]:
    """``driver`` attached to ``notes`` and started; stopped afterwards."""
    driver.attach(notes)
    await driver.start()
    try:
        yield driver
    finally:
        await driver.stop()


async def until(check: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    """Poll ``check`` until it holds; AssertionError naming ``what`` after the bound."""
    try:
        async with asyncio.timeout(timeout_s):
            while not check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s} s: {what}") from None

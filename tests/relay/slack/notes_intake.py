"""An in-memory stand-in for the connector's side of a driver, for the Slack driver's own tests.

It keeps what a real connector keeps (notes, rejections, the events taken) in lists, can be
told to refuse the next events (:class:`~relay.connector.intake.IntakeFull`) or to take its
time, so a test can watch the driver hold its ack.  It does not deduplicate: every copy the
driver offers is in ``events`` (the real connector's dedupe is tested with it in test_bot.py).
"""

from __future__ import annotations

import asyncio

from relay.connector.intake import IntakeFull
from relay.wire.frames import InboundEvent


class NotesIntake:
    """A :class:`~relay.connector.intake.DriverIntake` in memory."""

    def __init__(self) -> None:
        self.notes: dict[tuple[str, str], str] = {}
        self.events: list[InboundEvent] = []
        self.rejected: list[tuple[str | None, str, str]] = []
        self.refuse = 0
        """Refuse this many intake calls (IntakeFull) before taking again."""
        self.refused = 0
        self.delay_s = 0.0
        """Each intake call takes this long before it returns."""
        self.arrived = asyncio.Event()

    async def __call__(self, platform: str, event: InboundEvent) -> None:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.refuse:
            self.refuse -= 1
            self.refused += 1
            raise IntakeFull("the test refuses this event")
        self.events.append(event)
        self.arrived.set()

    async def reject(
        self, platform: str, raw: str, reason: str, *, event_id: str | None = None
    ) -> None:
        self.rejected.append((event_id, reason, raw))
        self.arrived.set()

    async def load(self, platform: str, name: str) -> str | None:
        return self.notes.get((platform, name))

    async def save(self, platform: str, name: str, value: str) -> None:
        self.notes[(platform, name)] = value

    def texts(self) -> list[str]:
        """The texts taken, in order."""
        return [event.text for event in self.events]

    async def wait_for(self, count: int, timeout_s: float = 10.0) -> None:
        """Until ``count`` events and rejections arrived; TimeoutError after the bound."""
        async with asyncio.timeout(timeout_s):
            while len(self.events) + len(self.rejected) < count:
                self.arrived.clear()
                await self.arrived.wait()

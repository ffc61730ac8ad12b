"""An in-memory stand-in for the connector's side of a driver, for the Discord driver's tests.

It keeps what a real connector keeps (notes, rejections, the events taken) in dictionaries, and
can be told to refuse the next events (:class:`~relay.connector.intake.IntakeFull`) or fail the
next saves, so a test can watch the driver keep its cursor.  The real connector's intake is
tested in tests/relay/connector; the whole path in tests/relay/discord/test_bot.py.
"""

from __future__ import annotations

import asyncio

from relay.connector.intake import IntakeFull
from relay.wire.frames import InboundEvent
from statecore.errors import StoreError


class NotesIntake:
    """A :class:`~relay.connector.intake.DriverIntake` in memory."""

    def __init__(self) -> None:
        self.notes: dict[tuple[str, str], str] = {}
        self.events: list[InboundEvent] = []
        self.rejected: list[tuple[str | None, str, str]] = []
        self.refuse = 0
        """Refuse this many intake calls (IntakeFull) before taking again."""
        self.fail_saves = 0
        """Fail this many saves (StoreError) before saving again."""
        self.refused = 0
        self.saves: list[tuple[str, str]] = []
        self.offers: list[tuple[str, str | None, str | None]] = []
        """Each offer: ("refused" | "taken", the event's id, the cursor note at that moment)."""
        self.arrived = asyncio.Event()
        self.cursor_note = "gateway_session"

    async def __call__(self, platform: str, event: InboundEvent) -> None:
        note = self.notes.get((platform, self.cursor_note))
        if self.refuse:
            self.refuse -= 1
            self.refused += 1
            self.offers.append(("refused", event.message_id, note))
            raise IntakeFull("the test refuses this event")
        self.offers.append(("taken", event.message_id, note))
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
        if self.fail_saves:
            self.fail_saves -= 1
            raise StoreError("the test fails this save")
        self.notes[(platform, name)] = value
        self.saves.append((name, value))

    def texts(self) -> list[str]:
        """The texts taken, in order."""
        return [event.text for event in self.events]

    async def wait_for(self, count: int, timeout_s: float = 20.0) -> None:
        """Until ``count`` events (and rejections) arrived; TimeoutError after the bound."""
        async with asyncio.timeout(timeout_s):
            while len(self.events) + len(self.rejected) < count:
                self.arrived.clear()
                await self.arrived.wait()

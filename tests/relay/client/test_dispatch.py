"""Tests for relay.client.dispatch.InboundDispatcher.

Concurrent across chats, ordered within a chat, bounded, acks after handling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

import pytest

from relay.client.dispatch import InboundDispatcher

pytestmark = pytest.mark.asyncio

Item = tuple[str, int]  # (chat, n)


class Harness:
    """A dispatcher whose handler blocks until the test releases each item."""

    def __init__(self, bound: int = 8) -> None:
        self.started: list[Item] = []
        self.gates: dict[Item, asyncio.Event] = {}
        self.acks: list[list[str]] = []
        self.dispatcher: InboundDispatcher[Item] = InboundDispatcher(
            lane_of=self.lane, handle=self.handle, send_acks=self.send_acks, max_in_flight=bound
        )

    @staticmethod
    def lane(item: Item) -> Hashable:
        return item[0]

    async def handle(self, item: Item) -> str | None:
        self.started.append(item)
        gate = self.gates.setdefault(item, asyncio.Event())
        await gate.wait()
        if item[1] < 0:
            raise RuntimeError("handler bug")
        return f"{item[0]}-{item[1]}"

    async def send_acks(self, ids: list[str]) -> None:
        self.acks.append(ids)

    def release(self, item: Item) -> None:
        self.gates.setdefault(item, asyncio.Event()).set()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_chats_run_concurrently_and_each_chat_in_order() -> None:
    """Two chats' first messages are handled at once; a chat's second message starts only after
    its first finished, whatever the other chat does."""
    h = Harness()
    for item in (("a", 1), ("a", 2), ("b", 1)):
        h.dispatcher.put(item)
    await settle()
    assert h.started == [("a", 1), ("b", 1)]
    h.release(("b", 1))
    await settle()
    assert ("a", 2) not in h.started
    h.release(("a", 1))
    await settle()
    assert h.started[-1] == ("a", 2)
    h.release(("a", 2))
    await settle()
    assert [a for batch in h.acks for a in batch] == ["b-1", "a-1", "a-2"]
    assert h.dispatcher.in_flight == 0


async def test_in_flight_counts_what_is_queued_or_in_hand() -> None:
    """in_flight counts deliveries queued or being handled; peak_in_flight remembers the most."""
    h = Harness(bound=3)
    for n in range(3):
        h.dispatcher.put((f"c{n}", n))
    assert h.dispatcher.in_flight == 3
    h.release(("c1", 1))
    await settle()
    assert h.dispatcher.in_flight == 2
    assert h.dispatcher.peak_in_flight == 3


async def test_a_failing_handler_leaves_its_delivery_unacked_and_the_lane_goes_on() -> None:
    """A handle() that raises (a bug) is logged; that delivery is not acked; the next one in
    the same lane still runs."""
    h = Harness()
    h.dispatcher.put(("a", -1))
    h.dispatcher.put(("a", 2))
    h.release(("a", -1))
    h.release(("a", 2))
    await settle()
    assert [a for batch in h.acks for a in batch] == ["a-2"]


async def test_close_cancels_workers_and_drops_the_queue() -> None:
    """close() cancels handlers in progress, forgets what was queued (it stays unacked) and
    sends acks that were already due."""
    h = Harness()
    h.dispatcher.put(("a", 1))
    h.dispatcher.put(("b", 1))
    h.release(("b", 1))
    await settle()
    await h.dispatcher.close(1.0)
    assert h.dispatcher.in_flight == 0
    assert [a for batch in h.acks for a in batch] == ["b-1"]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
async def test_a_bad_bound_is_refused(bad: object) -> None:
    """max_in_flight must be a positive int."""
    with pytest.raises((TypeError, ValueError)):
        InboundDispatcher(
            lane_of=Harness.lane,
            handle=Harness().handle,
            send_acks=Harness().send_acks,
            max_in_flight=bad,  # type: ignore[arg-type]
        )

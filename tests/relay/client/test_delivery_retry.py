"""A buffered delivery whose handling raised is tried again on the same connection (the
connector replays unacked entries only to a new connection): the handler again while it
raises, only the dedupe's ``remember`` when the handler had returned, never a live delivery,
and after the last wait it stays unacked.  On a fake clock: no test sleeps."""

from __future__ import annotations

import asyncio

import pytest

from relay.client.delivery import RETRY_S, Deliveries
from relay.wire.frames import EventSource, Inbound, InboundEvent
from relay.wire.throttle import LogLimits
from statecore.clock import FakeClock
from statecore.errors import StoreUnreachable

BOUND_S = 5.0


def _frame(buffer_id: str | None) -> Inbound:
    source = EventSource(platform="loopback", chat_id="c1", chat_type="dm")
    return Inbound(InboundEvent(text="hi", message_id="m1", source=source), buffer_id)


class _Dedupe:
    """Remembers buffer ids; ``remember`` raises its first ``failures`` times."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.remembered: list[str] = []

    async def seen(self, buffer_id: str) -> bool:
        return buffer_id in self.remembered

    async def remember(self, buffer_id: str) -> None:
        if self.failures:
            self.failures -= 1
            raise StoreUnreachable("the store is away")
        self.remembered.append(buffer_id)

    async def record_undeliverable(
        self, buffer_id: str, *, frame_type: str, reason: str, raw_line: str
    ) -> None:
        raise AssertionError("nothing here is undeliverable")


async def _run(deliveries: Deliveries, clock: FakeClock, frame: Inbound) -> str | None:
    """Handle ``frame``, moving the fake clock past every wait the handling sleeps."""
    task = asyncio.ensure_future(deliveries.handle(frame))
    async with asyncio.timeout(BOUND_S):
        while not task.done():
            await asyncio.sleep(0)
            if clock.sleepers:
                clock.advance(max(RETRY_S))
    return task.result()


def _deliveries(clock: FakeClock, dedupe: _Dedupe | None) -> Deliveries:
    return Deliveries("ws://test", dedupe, LogLimits(clock=clock), clock)


@pytest.mark.asyncio
async def test_a_handler_that_raised_is_tried_again_until_it_returns() -> None:
    """The handler raises twice (its store away), then returns: acked after two waits."""
    clock = FakeClock()
    dedupe = _Dedupe()
    deliveries = _deliveries(clock, dedupe)
    calls: list[str] = []

    async def handler(event: InboundEvent) -> None:
        calls.append(event.text)
        if len(calls) <= 2:
            raise StoreUnreachable("the store is away")

    deliveries.handler = handler
    assert await _run(deliveries, clock, _frame("b-1")) == "b-1"
    assert calls == ["hi", "hi", "hi"]
    assert deliveries.retries == 2
    assert dedupe.remembered == ["b-1"]


@pytest.mark.asyncio
async def test_a_failed_remember_is_tried_again_without_handling_twice() -> None:
    """The handler returned but ``remember`` raised: only ``remember`` is tried again."""
    clock = FakeClock()
    dedupe = _Dedupe(failures=1)
    deliveries = _deliveries(clock, dedupe)
    calls: list[str] = []

    async def handler(event: InboundEvent) -> None:
        calls.append(event.text)

    deliveries.handler = handler
    assert await _run(deliveries, clock, _frame("b-2")) == "b-2"
    assert calls == ["hi"]
    assert dedupe.remembered == ["b-2"]


@pytest.mark.asyncio
async def test_after_the_last_wait_a_buffered_delivery_stays_unacked() -> None:
    """A handler that always raises: one try per wait and one more, then None (unacked)."""
    clock = FakeClock()
    deliveries = _deliveries(clock, _Dedupe())
    calls: list[str] = []

    async def handler(event: InboundEvent) -> None:
        calls.append(event.text)
        raise StoreUnreachable("the store is away")

    deliveries.handler = handler
    assert await _run(deliveries, clock, _frame("b-3")) is None
    assert len(calls) == len(RETRY_S) + 1
    assert deliveries.retries == len(RETRY_S)


@pytest.mark.asyncio
async def test_a_live_delivery_is_not_tried_again() -> None:
    """No bufferId: nothing to ack and nothing the connector keeps, so one try only."""
    clock = FakeClock()
    deliveries = _deliveries(clock, None)
    calls: list[str] = []

    async def handler(event: InboundEvent) -> None:
        calls.append(event.text)
        raise RuntimeError("a bug")

    deliveries.handler = handler
    assert await _run(deliveries, clock, _frame(None)) is None
    assert calls == ["hi"]
    assert deliveries.retries == 0


@pytest.mark.asyncio
async def test_an_application_error_is_not_tried_again_and_the_chat_goes_on() -> None:
    """The handler's own bug (not a store error): one try, unacked at once, no wait."""
    clock = FakeClock()
    deliveries = _deliveries(clock, _Dedupe())
    calls: list[str] = []

    async def handler(event: InboundEvent) -> None:
        calls.append(event.text)
        raise RuntimeError("the bot's logic failed")

    deliveries.handler = handler
    assert await deliveries.handle(_frame("b-4")) is None
    assert calls == ["hi"]
    assert deliveries.retries == 0


@pytest.mark.asyncio
async def test_an_error_raised_from_a_store_error_is_tried_again() -> None:
    """The gateway wrapped the store's error in its own: still a store failure, tried again."""
    clock = FakeClock()
    deliveries = _deliveries(clock, _Dedupe())
    calls: list[str] = []

    async def handler(event: InboundEvent) -> None:
        calls.append(event.text)
        if len(calls) == 1:
            try:
                raise StoreUnreachable("the store is away")
            except StoreUnreachable as exc:
                raise RuntimeError("recording the reply failed") from exc

    deliveries.handler = handler
    assert await _run(deliveries, clock, _frame("b-5")) == "b-5"
    assert calls == ["hi", "hi"]
    assert deliveries.retries == 1

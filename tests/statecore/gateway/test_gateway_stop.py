"""A clean ``Gateway.stop()`` settles what was sent, within its budget.

A reply whose send the platform acknowledged must be marked delivered even when the task that
asked for it is cancelled before the ledger's mark is written (the relay closes a handler's lane
as the gateway stops): otherwise the next start resends it with the "recovered" label.  The
ledger's writer is held inside its transaction (:class:`GatedStore`) so that the cancellation
lands exactly between the platform's answer and the mark, every run.  Claims a stop cuts short
before they were sent are handed back (released), and ``async with Gateway(...)`` starts and
stops the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from relay.wire.frames import OutboundOutcome
from statecore.errors import StoreError
from statecore.gateway import Gateway, Turn
from statecore.lifecycles import ObligationState
from stores.memory import InMemoryStore
from tests.statecore.gateway.gateway_rig import (
    BOUND,
    SLACK,
    FakeAdapter,
    FakeSessions,
    Relay,
    events,
    oid_of,
    owe,
    reply,
    row,
    rows,
)
from tests.waiting import eventually

_O = ObligationState

WRITER = "statecore-ledger"
"""The AsyncLedger's writer thread: the only one the gate holds."""


class GatedStore(InMemoryStore):
    """An in-memory store whose next transaction on the ledger's writer thread, once ``armed``,
    waits for ``gate`` before it begins (``entered`` says it is waiting)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.entered = threading.Event()
        self.gate = threading.Event()

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """Hold the writer here once, when armed; then the ordinary transaction."""
        if self.armed and threading.current_thread().name == WRITER:
            self.armed = False
            self.entered.set()
            self.gate.wait(BOUND)
        with super().atomic():
            yield


async def writer_held(store: GatedStore) -> None:
    """Wait (bounded) until the ledger's writer is held at the gate."""
    assert await asyncio.to_thread(store.entered.wait, BOUND), "the writer never reached the gate"


@pytest.mark.asyncio
async def test_a_reply_answered_as_its_asker_is_cancelled_is_still_marked_delivered() -> None:
    """The platform acknowledged the send; the task that asked for it is cancelled while the
    ledger's mark waits in the writer's queue.  The mark is written all the same, and stop()
    waits for it: the row is delivered, never left attempting."""
    store = GatedStore()
    adapter = FakeAdapter(on_send=lambda _sent: setattr(store, "armed", True))
    gateway = Gateway(store, sessions=FakeSessions())
    gateway.add_adapter(SLACK, adapter)
    await asyncio.wait_for(gateway.start(), BOUND)
    try:
        asker = asyncio.create_task(reply(gateway))
        await writer_held(store)  # the send returned; its mark is queued behind the gate
        asker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asker
        store.gate.set()
    finally:
        store.gate.set()
        await asyncio.wait_for(gateway.stop(budget_s=3.0), BOUND)
    oid = oid_of()
    assert row(store, oid).state is _O.DELIVERED
    assert events(store, oid)[-1] == "deliver"
    assert gateway.delivered == 1
    store.close()


@pytest.mark.asyncio
async def test_stop_right_after_the_platform_acknowledged_a_handlers_reply_settles_it(
    relay: Relay,
) -> None:
    """The README bot's shutdown, made deterministic: a user writes, the handler replies, the
    platform performs the send -- and the gateway is stopped while the ledger's mark is still
    queued.  Stopping closes the relay's lanes, cancelling the handler; the reply is settled
    delivered anyway (the old stop left it attempting, to be resent labelled)."""
    store = GatedStore()
    perform = relay.platform.perform

    async def performing(action: Mapping[str, Any]) -> OutboundOutcome:
        if action.get("op") == "send":
            store.armed = True  # the next ledger write is this reply's mark
        return await perform(action)

    relay.platform.perform = performing  # type: ignore[method-assign]
    cancelled = asyncio.Event()

    async def answer(turn: Turn) -> None:
        try:
            await turn.reply(f"you said: {turn.message.text}")
        except asyncio.CancelledError:
            cancelled.set()
            raise

    _, adapter = relay.adapter()
    gateway = Gateway(store, sessions=FakeSessions())
    gateway.add_adapter("loopback", adapter)
    gateway.on_message(answer)
    await asyncio.wait_for(gateway.start(), BOUND)
    await eventually(relay.connected, "the gateway to connect")
    try:
        message_id = await relay.platform.inject("chat-1", "hello")
        await writer_held(store)
        assert relay.platform.texts("chat-1") == ["you said: hello"]
        stopping = asyncio.create_task(gateway.stop(budget_s=3.0))
        await asyncio.wait_for(cancelled.wait(), BOUND)  # the handler's lane was closed
        store.gate.set()
        await asyncio.wait_for(stopping, BOUND)
    finally:
        store.gate.set()
        await asyncio.wait_for(gateway.stop(budget_s=1.0), BOUND)
    [ob] = rows(store)
    assert ob.reply_to == message_id
    assert ob.state is _O.DELIVERED
    store.close()


@pytest.mark.asyncio
async def test_claims_a_stop_cuts_short_are_released_not_left_attempting() -> None:
    """A startup redelivery of two replies hangs on the first send; stop(budget) cancels it
    within the budget.  The first (in flight, unanswered) stays attempting; the second, never
    sent, is handed back: failed, its attempt refunded, its history saying so."""
    store = InMemoryStore()
    first = owe(store, message_ref="m1", content="first")
    second = owe(store, message_ref="m2", content="second")
    hung = FakeAdapter(hang=asyncio.Event())
    gateway = Gateway(store, sessions=FakeSessions())
    gateway.add_adapter(SLACK, hung)
    assert await asyncio.wait_for(gateway.start(), BOUND) == 2
    await eventually(lambda: len(hung.calls) == 1, "the first redelivery to hang")
    await asyncio.wait_for(gateway.stop(budget_s=0.6), BOUND)
    sent_first = hung.calls[0].metadata["idempotency_key"]
    unsent = second if sent_first == first else first
    assert row(store, sent_first).state is _O.ATTEMPTING
    assert row(store, unsent).state is _O.FAILED
    assert row(store, unsent).attempts == 0
    assert events(store, unsent)[-2:] == ["claim", "release"]
    assert len(hung.calls) == 1
    store.close()


@pytest.mark.asyncio
async def test_async_with_starts_and_stops_the_gateway() -> None:
    """``async with Gateway(...)`` starts it (adapters connected, replies sent) and stops it
    at the end of the block (the ledger is closed), also when the block raises."""
    store = InMemoryStore()
    adapter = FakeAdapter(connected=False)
    gateway = Gateway(store, sessions=FakeSessions())
    gateway.add_adapter(SLACK, adapter)
    async with gateway as entered:
        assert entered is gateway
        assert adapter.connects == 1
        assert (await reply(gateway)).success
    with pytest.raises(StoreError, match="closed"):
        await gateway.ledger.get(oid_of())

    other = Gateway(store, sessions=FakeSessions())
    with pytest.raises(RuntimeError, match="inside"):
        async with other:
            raise RuntimeError("inside the block")
    with pytest.raises(StoreError, match="closed"):
        await other.ledger.get(oid_of())
    store.close()


@pytest.mark.asyncio
async def test_async_with_closes_the_ledger_when_the_start_fails() -> None:
    """A start that raises (the store is unusable) leaves nothing running: the error
    propagates and the gateway's ledger is closed."""
    store = InMemoryStore()
    gateway = Gateway(store, sessions=FakeSessions())
    store.close()  # the store check at start fails
    with pytest.raises(StoreError):
        async with gateway:
            pytest.fail("the block must not run")
    with pytest.raises(StoreError, match="ledger is closed"):
        await gateway.ledger.get(oid_of())

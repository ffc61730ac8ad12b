"""Tests for relay.client.dedupe.StoreBufferDedupe, the gateway's memory of handled bufferIds.

Alone and as the transport's ``dedupe=`` hook against a real connector."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from relay.client.dedupe import DEDUPE_KIND, MAX_RAW_LINE_CHARS, DedupeState, StoreBufferDedupe
from relay.client.transport import WebSocketRelayTransport
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from relay.wire.frames import EventSource, InboundEvent
from statecore.clock import FakeClock
from statecore.errors import InvalidTransition, StoreUnreachable
from statecore.store import Store
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from tests.waiting import BOUND, eventually

SECRETS: dict[str, list[str | bytes]] = {"gw-a": ["secret-a"]}


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A store of each kind, closed afterwards."""
    db: Store = InMemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "gw.db")
    try:
        yield db
    finally:
        db.close()


@pytest.mark.asyncio
async def test_remember_then_seen(store: Store) -> None:
    """A bufferId is unseen until remembered, then seen; remembering it again is harmless."""
    dedupe = StoreBufferDedupe(store)
    assert not await dedupe.seen("b1")
    await dedupe.remember("b1")
    await dedupe.remember("b1")
    assert await dedupe.seen("b1")
    assert not await dedupe.seen("b2")
    row = store.get(DEDUPE_KIND, "b1")
    assert row is not None
    assert row.state is DedupeState.HANDLED
    assert [h.event for h in store.history(DEDUPE_KIND, "b1")] == ["handle"]


@pytest.mark.asyncio
async def test_an_undeliverable_delivery_is_recorded_listed_and_dismissable(store: Store) -> None:
    """record_undeliverable keeps the raw line and reason, counts as seen (a replay is acked
    without a second record), is listed oldest first, and an operator can dismiss it."""
    clock = FakeClock()
    dedupe = StoreBufferDedupe(store, clock=clock)
    raw = '{"type":"inbound","event":{"source":{}},"bufferId":"b1"}'
    await dedupe.record_undeliverable("b1", frame_type="inbound", reason="no chat_id", raw_line=raw)
    clock.advance(1)
    await dedupe.record_undeliverable(
        "b2", frame_type="passthrough_forward", reason="no handler", raw_line="{}"
    )
    await dedupe.record_undeliverable("b1", frame_type="inbound", reason="again", raw_line=raw)
    assert await dedupe.seen("b1")
    listed = dedupe.undeliverable()
    assert [(u.buffer_id, u.frame_type, u.reason, u.raw_line) for u in listed] == [
        ("b1", "inbound", "no chat_id", raw),
        ("b2", "passthrough_forward", "no handler", "{}"),
    ]
    assert listed[1].recorded_at - listed[0].recorded_at == 1
    dedupe.dismiss("b1")
    assert [u.buffer_id for u in dedupe.undeliverable()] == ["b2"]
    assert [u.state.value for u in dedupe.undeliverable(include_dismissed=True)] == [
        "dismissed",
        "recorded",
    ]
    with pytest.raises(InvalidTransition):
        dedupe.dismiss("b1")


@pytest.mark.asyncio
async def test_a_huge_raw_line_is_kept_truncated(store: Store) -> None:
    """A raw line longer than MAX_RAW_LINE_CHARS is kept, truncated to it."""
    dedupe = StoreBufferDedupe(store)
    await dedupe.record_undeliverable(
        "b1", frame_type="inbound", reason="r", raw_line="x" * (MAX_RAW_LINE_CHARS + 10)
    )
    assert len(dedupe.undeliverable()[0].raw_line) == MAX_RAW_LINE_CHARS


@pytest.mark.asyncio
async def test_concurrent_remembers_are_all_kept(store: Store) -> None:
    """Many concurrent remembers (run off the loop) each land exactly once."""
    dedupe = StoreBufferDedupe(store)
    ids = [f"b{n}" for n in range(50)]
    await asyncio.wait_for(asyncio.gather(*(dedupe.remember(b) for b in ids + ids)), BOUND)
    assert all(await asyncio.gather(*(dedupe.seen(b) for b in ids)))
    assert store.count(DEDUPE_KIND) == 50


@pytest.mark.asyncio
async def test_memory_survives_a_restart(tmp_path: Path) -> None:
    """Remembered bufferIds are still seen by a new dedupe over the reopened SQLite file."""
    path = tmp_path / "gateway.db"
    first = SQLiteStore(path)
    try:
        await StoreBufferDedupe(first).remember("b-handled")
    finally:
        first.close()
    second = SQLiteStore(path)
    try:
        dedupe = StoreBufferDedupe(second)
        assert await dedupe.seen("b-handled")
        assert not await dedupe.seen("b-other")
    finally:
        second.close()


@pytest.mark.asyncio
async def test_forget_older_than_drops_only_old_keys(store: Store) -> None:
    """forget_older_than forgets and prunes keys handled before the horizon, keeping newer ones."""
    clock = FakeClock()
    dedupe = StoreBufferDedupe(store, clock=clock)
    await dedupe.remember("old")
    clock.advance(100)
    await dedupe.remember("new")
    clock.advance(10)
    assert dedupe.forget_older_than(50) == 1
    assert not await dedupe.seen("old")
    assert await dedupe.seen("new")
    assert store.get(DEDUPE_KIND, "old") is None
    assert dedupe.forget_older_than(50) == 0
    clock.advance(100)
    assert dedupe.forget_older_than(50) == 1
    assert store.count(DEDUPE_KIND) == 0


# -- as the transport's hook ----------------------------------------------------------------------


def make_event(n: int) -> InboundEvent:
    return InboundEvent(
        text=f"e{n}",
        message_id=f"x{n}",
        source=EventSource(platform="loopback", chat_id="c1", chat_type="dm", user_id="u"),
    )


class Setup:
    """A running connector with a gateway store for the dedupe; everything closed afterwards."""

    def __init__(self, gateway_store: Store) -> None:
        self.connector_store = InMemoryStore()
        self.platform = LoopbackPlatform()
        self.connector = Connector(
            self.connector_store, secrets=SECRETS, drivers={"loopback": self.platform}
        )
        self.dedupe = StoreBufferDedupe(gateway_store)
        self.transports: list[WebSocketRelayTransport] = []

    def transport(
        self, handler: Callable[[InboundEvent], Awaitable[None]], **options: Any
    ) -> WebSocketRelayTransport:
        transport = WebSocketRelayTransport(
            self.connector.url,
            "loopback",
            "bot",
            gateway_id="gw-a",
            secret="secret-a",
            reconnect=False,
            dedupe=self.dedupe,
            **options,
        )
        transport.set_inbound_handler(handler)
        self.transports.append(transport)
        return transport

    def buffer(self, n: int) -> list[str]:
        return [self.connector.buffer.append("gw-a", "loopback", make_event(i)) for i in range(n)]


@pytest_asyncio.fixture
async def setup(store: Store) -> AsyncIterator[Setup]:
    """A started Setup over each gateway store kind."""
    s = Setup(store)
    await s.connector.start()
    try:
        yield s
    finally:
        for transport in s.transports:
            await transport.disconnect(budget_s=2)
        await s.connector.stop()
        s.connector_store.close()


@pytest.mark.asyncio
async def test_transport_acks_a_remembered_replay_without_handling_it(setup: Setup) -> None:
    """A replayed bufferId the gateway already handled is acked but not handled again; the
    others are handled, remembered and acked."""
    ids = setup.buffer(3)
    await setup.dedupe.remember(ids[1])
    handled: list[str] = []

    async def handler(event: InboundEvent) -> None:
        handled.append(event.text)

    transport = setup.transport(handler)
    await transport.connect()
    await transport.handshake(BOUND)
    await eventually(lambda: setup.connector.buffered("gw-a") == 0, "all three acked")
    assert handled == ["e0", "e2"]
    assert all([await setup.dedupe.seen(b) for b in ids])


@pytest.mark.asyncio
async def test_failed_handling_is_not_remembered_and_is_replayed(setup: Setup) -> None:
    """An event whose handler raised is neither remembered nor acked, so the next connection
    gets it again and handles it then."""
    ids = setup.buffer(2)
    handled: list[str] = []
    fail = {"e0"}

    async def handler(event: InboundEvent) -> None:
        if event.text in fail:
            fail.discard(event.text)
            raise RuntimeError("handler bug")
        handled.append(event.text)

    first = setup.transport(handler)
    await first.connect()
    await first.handshake(BOUND)
    await eventually(lambda: handled == ["e1"], "second event handled")
    await eventually(lambda: setup.connector.buffered("gw-a") == 1, "only e1 acked")
    assert not await setup.dedupe.seen(ids[0])
    assert await setup.dedupe.seen(ids[1])
    await first.disconnect(budget_s=2)
    second = setup.transport(handler)
    await second.connect()
    await second.handshake(BOUND)
    await eventually(lambda: setup.connector.buffered("gw-a") == 0, "replay acked")
    assert handled == ["e1", "e0"]


@pytest.mark.asyncio
async def test_a_store_failure_is_not_remembered_and_is_tried_again(
    setup: Setup,
) -> None:
    """An event whose handler raised a store error is neither remembered nor acked then; it is
    tried again on the same connection (the connector would replay it only to a new one), in its
    lane before the next event, and remembered and acked once its handler returned
    (tests/relay/client/test_delivery_retry.py: what happens when every try fails)."""
    ids = setup.buffer(2)
    handled: list[str] = []
    fail = {"e0"}
    failed_unremembered: list[bool] = []

    async def handler(event: InboundEvent) -> None:
        if event.text in fail:
            fail.discard(event.text)
            failed_unremembered.append(not await setup.dedupe.seen(ids[0]))
            raise StoreUnreachable("the store is away")
        handled.append(event.text)

    first = setup.transport(handler)
    await first.connect()
    await first.handshake(BOUND)
    await eventually(lambda: setup.connector.buffered("gw-a") == 0, "both acked")
    assert handled == ["e0", "e1"]
    assert failed_unremembered == [True]
    assert all([await setup.dedupe.seen(b) for b in ids])


@pytest.mark.asyncio
@pytest.mark.parametrize("acked_live", [True, False], ids=["acked-live", "original"])
async def test_live_deliveries_are_remembered_only_when_they_are_acked(
    setup: Setup, store: Store, acked_live: bool
) -> None:
    """With acked live delivery (our default) a live event carries a bufferId: it is handled,
    remembered and acked, so nothing stays owed; an original-contract gateway's live event
    carries none and touches nothing."""
    handled: list[str] = []

    async def handler(event: InboundEvent) -> None:
        handled.append(event.text)

    transport = setup.transport(handler, **({} if acked_live else {"features": ()}))
    await transport.connect()
    await transport.handshake(BOUND)
    # Wait for the connector to go live (its post-handshake replay must have finished).
    await eventually(
        lambda: (
            setup.connector.connected("gw-a")
            and all(i.live for i in getattr(setup.connector, "_instances", {}).values())
        ),
        "connector live",
    )
    await setup.platform.inject("c1", "live one")
    await eventually(lambda: handled == ["live one"], "live delivery")
    await eventually(lambda: setup.connector.buffered("gw-a") == 0, "nothing owed")
    assert store.count(DEDUPE_KIND) == (1 if acked_live else 0)

"""Conformance: our gateway side (transport, adapter, dedupe) against an original connector.

The peer is :class:`OriginalConnector`, written from the contract alone: one line per message,
descriptors without ``supported_ops`` or ``features``, ``content`` as the body field, 4401 (with
``expired`` for an expired token), a replay of one buffered entry at a time that waits for each
ack, a second connection of a gateway refused.  Each test names the defect it pins.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from relay import RelayAdapter, StoreBufferDedupe, WebSocketRelayTransport
from relay.client.lifecycle import TransportState
from relay.client.requests import RequestOutcome
from relay.wire.frames import InboundEvent, InterruptInbound
from statecore.clock import FakeClock
from stores.sqlite import SQLiteStore
from tests.relay.client.connector_stub import next_sleep
from tests.relay.conformance.original_peers import (
    BOT_ID,
    GATEWAY_ID,
    PLATFORM,
    SECRET,
    OriginalConnector,
    eventually,
)

BOUND = 5.0


def event(text: str | None, chat_id: str | None = "c1", **source: Any) -> dict[str, Any]:
    """An event object as an original connector writes it (``text`` omitted when None)."""
    obj: dict[str, Any] = {"source": {"platform": PLATFORM, **source}}
    if chat_id is not None:
        obj["source"]["chat_id"] = chat_id
    if text is not None:
        obj["text"] = text
    return obj


@pytest_asyncio.fixture
async def connector() -> AsyncIterator[OriginalConnector]:
    """A running original connector; stopped afterwards."""
    peer = OriginalConnector(secrets={GATEWAY_ID: [SECRET]}, ack_timeout_s=BOUND)
    await peer.start()
    try:
        yield peer
    finally:
        await peer.stop()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    """The gateway's SQLite store (its dedupe and undeliverable records)."""
    db = SQLiteStore(tmp_path / "gateway.db")
    try:
        yield db
    finally:
        db.close()


class Transports:
    """Builds our transports aimed at the original connector and tears them all down."""

    def __init__(self, connector: OriginalConnector) -> None:
        self.connector = connector
        self.built: list[WebSocketRelayTransport] = []

    def __call__(self, **options: Any) -> WebSocketRelayTransport:
        options.setdefault("gateway_id", GATEWAY_ID)
        options.setdefault("secret", SECRET)
        options.setdefault("reconnect_backoff_s", 0.05)
        options.setdefault("reconnect_max_s", 0.2)
        options.setdefault("handshake_timeout_s", BOUND)
        transport = WebSocketRelayTransport(self.connector.url, PLATFORM, BOT_ID, **options)
        self.built.append(transport)
        return transport

    async def close(self) -> None:
        for transport in self.built:
            await asyncio.wait_for(transport.disconnect(budget_s=1.0), BOUND)


@pytest_asyncio.fixture
async def transports(connector: OriginalConnector) -> AsyncIterator[Transports]:
    """A factory of our transports; every one is disconnected afterwards."""
    made = Transports(connector)
    try:
        yield made
    finally:
        await made.close()


async def connected(transport: WebSocketRelayTransport) -> None:
    await asyncio.wait_for(transport.connect(), BOUND)
    await transport.handshake(BOUND)


# -- 1. every reply failed: the body field is ``content`` --------------------------------------


@pytest.mark.asyncio
async def test_our_replies_carry_content_and_an_original_connector_performs_them(
    connector: OriginalConnector, transports: Transports
) -> None:
    """Defect 1: a send through RelayAdapter reaches an original connector with ``content``
    (it answered "empty content" to ``text``) and succeeds; so do edit and typing."""
    transport = transports()
    adapter = RelayAdapter(transport)
    assert await adapter.connect()
    result = await adapter.send("c1", "hello from our gateway")
    assert result.success, result
    assert result.message_id is not None
    sent = connector.performed[-1]
    assert (sent["op"], sent["chat_id"], sent["content"]) == (
        "send",
        "c1",
        "hello from our gateway",
    )
    assert "text" not in sent
    edit = {"op": "edit", "chat_id": "c1", "message_id": result.message_id, "content": "v2"}
    assert (await transport.request(edit, timeout_s=BOUND)).success
    assert (await transport.request({"op": "typing", "chat_id": "c1"}, timeout_s=BOUND)).success


# -- 2. one event stalled a whole buffer ----------------------------------------------------------


@pytest.mark.asyncio
async def test_a_backlog_of_odd_and_poison_entries_is_acked_one_by_one_and_never_stalls(
    connector: OriginalConnector, transports: Transports, store: SQLiteStore
) -> None:
    """Defect 2: an original connector replays one entry at a time and waits for each ack.  A
    forum chat, a missing text, a poison event (no chat_id) and original frames nobody handles
    are each acked, in order; the readable ones reach the handler, the others are recorded
    durably as undeliverable (raw line and reason); live traffic flows afterwards."""
    ids = [
        connector.buffer(GATEWAY_ID, event("in a forum", chat_type="forum")),
        connector.buffer(GATEWAY_ID, event(None, chat_type="group")),
        connector.buffer(GATEWAY_ID, event("who am I?", chat_id=None, chat_type="dm")),
        connector.buffer_frame(
            GATEWAY_ID,
            {
                "type": "passthrough_forward",
                "forward": {
                    "platform": PLATFORM,
                    "botId": BOT_ID,
                    "method": "POST",
                    "path": "/webhook",
                    "headers": {},
                    "bodyB64": "e30",
                },
            },
        ),
        connector.buffer_frame(
            GATEWAY_ID, {"type": "interrupt_inbound", "session_key": "s1", "chat_id": "c1"}
        ),
        connector.buffer(GATEWAY_ID, event("after them all", chat_type="channel")),
    ]
    seen: list[InboundEvent] = []

    async def handler(inbound: InboundEvent) -> None:
        seen.append(inbound)

    dedupe = StoreBufferDedupe(store)
    transport = transports(dedupe=dedupe)
    transport.set_inbound_handler(handler)
    await connected(transport)
    await eventually(lambda: connector.pending(GATEWAY_ID) == [], timeout=BOUND)
    assert connector.acked == ids
    assert connector.max_unacked_in_flight == 1
    assert [(e.text, e.source.chat_type) for e in seen] == [
        ("in a forum", "forum"),
        ("", "group"),
        ("after them all", "channel"),
    ]
    records = await asyncio.to_thread(dedupe.undeliverable)
    assert [(r.buffer_id, r.frame_type) for r in records] == [
        (ids[2], "inbound"),
        (ids[3], "passthrough_forward"),
        (ids[4], "interrupt_inbound"),
    ]
    assert "chat_id" in records[0].reason
    poison = json.loads(records[0].raw_line)
    assert poison["bufferId"] == ids[2]
    assert poison["event"]["text"] == "who am I?"
    assert "no handler" in records[1].reason
    assert transport.undeliverable == 3
    assert await connector.deliver(GATEWAY_ID, event("live now")) is None
    await eventually(lambda: seen[-1].text == "live now", timeout=BOUND)


@pytest.mark.asyncio
async def test_a_replay_after_a_restart_does_not_record_or_handle_twice(
    connector: OriginalConnector, transports: Transports, store: SQLiteStore
) -> None:
    """A poison entry and an interrupt a handler took, replayed again (the ack was lost), are
    acked from the durable dedupe without being recorded or handled a second time."""
    poison = event("no chat", chat_id=None)
    interrupt = {"type": "interrupt_inbound", "session_key": "s1", "chat_id": "c1"}
    first_poison = connector.buffer(GATEWAY_ID, poison)
    first_interrupt = connector.buffer_frame(GATEWAY_ID, interrupt)
    interrupts: list[InterruptInbound] = []

    async def on_interrupt(frame: Any) -> None:
        interrupts.append(frame)

    dedupe = StoreBufferDedupe(store)
    transport = transports(dedupe=dedupe)
    transport.set_interrupt_handler(on_interrupt)
    await connected(transport)
    await eventually(lambda: connector.pending(GATEWAY_ID) == [], timeout=BOUND)
    # The connector lost those acks: the same entries come again with the same bufferIds.
    for buffer_id, frame in (
        (first_poison, {"type": "inbound", "event": poison}),
        (first_interrupt, interrupt),
    ):
        await connector.push(GATEWAY_ID, {**frame, "bufferId": buffer_id})
    await eventually(lambda: connector.stray_acks.count(first_interrupt) == 1, timeout=BOUND)
    assert connector.stray_acks == [first_poison, first_interrupt]
    assert [f.session_key for f in interrupts] == ["s1"]
    assert len(await asyncio.to_thread(dedupe.undeliverable)) == 1


# -- 4. one early 4401 locked the gateway out ----------------------------------------------------


@pytest.mark.asyncio
async def test_an_early_4401_from_an_original_connector_is_retried_until_it_knows_us(
    connector: OriginalConnector, transports: Transports
) -> None:
    """Defect 4: an original connector refuses the first dials with 4401 (it has not loaded
    our gateway yet); our transport retries with backoff instead of concluding revocation."""
    connector.refuse_next = 2
    clock = FakeClock(time.time())
    transport = transports(clock=clock, reconnect_backoff_s=1.0, reconnect_max_s=30.0)
    await asyncio.wait_for(transport.connect(), BOUND)
    with pytest.raises(Exception, match="lost before the handshake"):
        await transport.handshake(BOUND)
    assert transport.state is TransportState.RECONNECTING
    waited = 0.0
    for _ in range(5):
        if transport.state is TransportState.CONNECTED:
            break
        assert transport.state is not TransportState.REVOKED
        before = connector.upgrades
        delay = await next_sleep(clock)
        waited += delay
        clock.advance(delay)  # the backoff ends: the next dial goes out
        await eventually(lambda b=before: connector.upgrades > b, timeout=BOUND)
        await eventually(
            lambda: transport.state in (TransportState.RECONNECTING, TransportState.CONNECTED),
            timeout=BOUND,
        )
    await eventually(lambda: transport.state is TransportState.CONNECTED, timeout=BOUND)
    assert waited > 0  # backoff between the refusals, never a tight loop
    assert connector.upgrades == 3
    assert [c.close_code for c in connector.connections[:2]] == [4401, 4401]


# -- 3 (gateway side). a second connection refused: no fight ------------------------------------


@pytest.mark.asyncio
async def test_a_second_gateway_refused_by_an_original_connector_backs_off(
    connector: OriginalConnector, transports: Transports
) -> None:
    """Two of our transports with one gateway id: the original connector refuses the second
    (1008) every time; it redials with a growing backoff (a handful of dials in a minute, not a
    fight), and the first keeps every event, each once."""
    first_seen: list[str] = []

    async def first_handler(inbound: InboundEvent) -> None:
        first_seen.append(inbound.text)

    first = transports()
    first.set_inbound_handler(first_handler)
    await connected(first)
    clock = FakeClock(time.time())
    second = transports(
        clock=clock, reconnect_backoff_s=1.0, reconnect_max_s=30.0, rng=random.Random(7)
    )
    await asyncio.wait_for(second.connect(), BOUND)
    with pytest.raises(Exception, match="lost before the handshake"):
        await second.handshake(BOUND)
    start = clock.monotonic()
    while True:
        dialed = connector.dials_by_gateway[GATEWAY_ID]
        delay = await next_sleep(clock)
        if clock.monotonic() + delay - start > 60.0:
            break  # the next dial would fall outside the first minute
        clock.advance(delay)
        await eventually(lambda d=dialed: connector.dials_by_gateway[GATEWAY_ID] > d, timeout=BOUND)
        await eventually(lambda: second.state is TransportState.RECONNECTING, timeout=BOUND)
    second_dials = connector.dials_by_gateway[GATEWAY_ID] - 1  # the first gateway dialed once
    # Backoff 1, 2, 4, 8, 16, 30 s (jittered to [d/2, d]): at most 8 dials in the first minute,
    # then two a minute -- where the original contract's "redial at once" would be hundreds.
    assert 5 <= second_dials <= 8
    for n in range(3):
        await connector.deliver(GATEWAY_ID, event(f"m{n}"))
    await eventually(lambda: first_seen == ["m0", "m1", "m2"], timeout=BOUND)
    assert first.state is TransportState.CONNECTED


# -- 5. minor: no additions toward an original connector; legacy ops; expiry ---------------------


@pytest.mark.asyncio
async def test_no_error_frames_are_sent_to_an_original_connector(
    connector: OriginalConnector, transports: Transports
) -> None:
    """Defect 5: invalid lines from a connector that announced nothing are logged, never
    answered with our ``error`` frame (which it does not know); the connection survives."""
    transport = transports()
    await connected(transport)
    await connector.push_raw(GATEWAY_ID, "not json\n")
    await connector.push_raw(GATEWAY_ID, '{"type":"outbound_result","requestId":7}\n')
    result = await transport.request({"op": "typing", "chat_id": "c1"}, timeout_s=BOUND)
    assert result.success
    assert connector.error_frames_received == 0
    assert connector.received_of("error") == []
    assert transport.state is TransportState.CONNECTED


@pytest.mark.asyncio
async def test_the_legacy_op_set_includes_follow_up(
    connector: OriginalConnector, transports: Transports
) -> None:
    """Defect 5: a descriptor without supported_ops means send, edit, typing and follow_up; a
    follow_up is performed with ``content``."""
    transport = transports()
    await connected(transport)
    assert transport.descriptor is not None
    assert transport.descriptor.supported_ops == ("send", "edit", "typing", "follow_up")
    assert transport.descriptor.supports("follow_up")
    assert transport.descriptor.features == ()  # an original connector announces nothing
    action = {"op": "follow_up", "session_key": "s1", "kind": "result", "content": "done"}
    result = await transport.request(action, timeout_s=BOUND)
    assert result.outcome is RequestOutcome.OK


@pytest.mark.asyncio
async def test_an_expired_4401_from_an_original_connector_redials_at_once(
    transports: Transports,
) -> None:
    """An original connector signals expiry with 4401 + ``expired``: our transport re-dials at
    once with a fresh token (no backoff, no revocation)."""
    calls = 0

    def skewed_clock() -> float:
        nonlocal calls
        calls += 1
        return time.time() + (10_000 if calls == 1 else 0)  # the first check sees it expired

    peer = OriginalConnector(secrets={GATEWAY_ID: [SECRET]}, clock=skewed_clock)
    await peer.start()
    try:
        clock = FakeClock(time.time())
        transport = WebSocketRelayTransport(
            peer.url,
            PLATFORM,
            BOT_ID,
            gateway_id=GATEWAY_ID,
            secret=SECRET,
            clock=clock,
            handshake_timeout_s=BOUND,
        )
        transports.built.append(transport)
        await asyncio.wait_for(transport.connect(), BOUND)
        await transport.handshake(BOUND)  # the immediate re-dial completes it: no time moved
        assert transport.state is TransportState.CONNECTED
        assert clock.monotonic() == 0.0
        assert peer.upgrades == 2
        assert (peer.connections[0].close_code, peer.connections[0].close_reason) == (
            4401,
            "expired",
        )
    finally:
        await peer.stop()

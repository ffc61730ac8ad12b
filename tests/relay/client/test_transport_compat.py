"""Tests for the transport's interoperability rules: what it announces, what it sends only to a
connector that announced it, and how it settles deliveries it can never handle (poison events
and original-contract frames) so that a buffer never stalls behind them."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from relay.wire.compat import OUR_FEATURES
from relay.wire.frames import InboundEvent, InterruptInbound, PassthroughForward
from tests.relay.client.connector_stub import (
    MemoryDedupe,
    StubConnector,
    TransportFactory,
    eventually,
    inbound_event,
)

pytestmark = pytest.mark.asyncio

GUARD = 3.0
POISON: dict[str, Any] = {"text": "no chat", "source": {"platform": "discord"}}


async def test_the_transport_announces_itself_on_the_upgrade_and_in_every_hello(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """Our features go in the X-Relay-Features header (read before any frame, e.g. for 4419)
    and in each hello with protocol 1; features=() speaks exactly the original contract."""
    await transports.connected()
    assert connector.conns[0].features == ", ".join(OUR_FEATURES)
    hello = connector.conns[0].frames_of("hello")[0]
    assert (hello["protocol"], hello["features"]) == (1, list(OUR_FEATURES))
    await transports.connected(features=())
    assert connector.conns[1].features is None
    assert connector.conns[1].frames_of("hello")[0] == {
        "type": "hello",
        "platform": "discord",
        "botId": "app-1",
    }


async def test_error_frames_go_only_to_a_connector_that_announced_them(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """An invalid line from a connector whose descriptor announced nothing is logged only; one
    that announced error_frames gets our error frame."""
    await transports.connected()
    await connector.push("not json\n")
    await eventually(lambda: connector.conns[0].is_open, what="still open")
    connector.descriptor = {**connector.descriptor, "features": ["error_frames"]}
    await transports.connected()
    await connector.push("not json\n", connector.conns[1])
    await eventually(lambda: len(connector.error_frames) == 1, what="the announced one answered")
    assert connector.conns[0].frames_of("error") == []


async def test_a_flood_of_invalid_lines_stops_at_the_limit_with_bounded_logging(
    connector: StubConnector, transports: TransportFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """One message of 10,000 junk lines: the transport closes with 4400 once past its limit,
    does not read the rest of that message, and logs a handful of lines."""
    transport = await transports.connected()
    with caplog.at_level(logging.DEBUG, logger="relay.client.transport"):
        await connector.push("junk\n" * 10_000)
        await eventually(lambda: not connector.conns[0].is_open, what="closed")
    assert connector.conns[0].close_code == 4400
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert 1 <= len(warnings) <= 10
    assert transport.connections == 1


async def test_a_buffered_poison_event_is_recorded_then_acked_in_order(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A buffered event with no chat_id is recorded durably (raw line, reason) before its ack,
    and the events around it are handled and acked in order: nothing stalls."""
    dedupe = MemoryDedupe(connector)
    handled: list[str] = []

    async def handler(event: InboundEvent) -> None:
        handled.append(event.text)

    transport = await transports.connected(dedupe=dedupe)
    transport.set_inbound_handler(handler)
    await connector.push_inbound(inbound_event("before"), "b-1")
    await connector.push_inbound(POISON, "b-2")
    await connector.push_inbound(inbound_event("after"), "b-3")
    await eventually(lambda: connector.inbound_acks == ["b-1", "b-2", "b-3"], what="all acked")
    assert handled == ["before", "after"]
    [(buffer_id, frame_type, reason, raw)] = dedupe.undeliverable
    assert (buffer_id, frame_type) == ("b-2", "inbound")
    assert "chat_id" in reason
    assert json.loads(raw) == {"type": "inbound", "event": POISON, "bufferId": "b-2"}
    assert dedupe.acked_before_remembered["b-2"] is False
    assert transport.undeliverable == 1


async def test_a_poison_event_that_cannot_be_recorded_stays_unacked(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """When the durable record fails, the poison entry is not acked (the connector replays it);
    the entries behind it still go through."""
    dedupe = MemoryDedupe(connector)
    dedupe.fail_records = True
    transport = await transports.connected(dedupe=dedupe)
    transport.set_inbound_handler(lambda event: asyncio.sleep(0))
    await connector.push_inbound(POISON, "b-1")
    await connector.push_inbound(inbound_event("next"), "b-2")
    await eventually(lambda: connector.inbound_acks == ["b-2"], what="the next one acked")
    assert dedupe.undeliverable == []


async def test_without_a_dedupe_a_buffered_poison_event_is_logged_with_its_line_and_acked(
    connector: StubConnector, transports: TransportFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """No durable record is configured: the ERROR line (with the raw line) is the record, and
    the entry is acked so that the buffer moves on."""
    transport = await transports.connected()
    transport.set_inbound_handler(lambda event: asyncio.sleep(0))
    with caplog.at_level(logging.ERROR, logger="relay.client.transport"):
        await connector.push_inbound(POISON, "b-9")
        await eventually(lambda: connector.inbound_acks == ["b-9"], what="acked")
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "b-9" in record.getMessage()
    assert '"no chat"' in record.getMessage()


async def test_a_live_poison_event_is_counted_and_never_acked(
    connector: StubConnector, transports: TransportFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A live event with no chat_id cannot be acked (it has no bufferId): it is counted and
    logged (rate-limited), never a protocol violation that could close the connection."""
    transport = await transports.connected()
    transport.set_inbound_handler(lambda event: asyncio.sleep(0))
    with caplog.at_level(logging.WARNING, logger="relay.client.transport"):
        for _ in range(60):  # more than the violation limit: still no close
            await connector.push_inbound(POISON)
        await eventually(lambda: transport.undeliverable == 60, what="all counted")
    assert connector.inbound_acks == []
    assert connector.conns[0].is_open
    assert 1 <= len(caplog.records) <= 6


async def test_original_frames_go_to_their_handlers_or_are_recorded_as_unhandled(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """interrupt_inbound and passthrough_forward reach their handlers (then are acked when
    buffered); with no handler a buffered one is recorded as unhandled and acked."""
    dedupe = MemoryDedupe(connector)
    interrupts: list[InterruptInbound] = []

    async def on_interrupt(frame: Any) -> None:
        interrupts.append(frame)

    transport = await transports.connected(dedupe=dedupe)
    transport.set_interrupt_handler(on_interrupt)
    forward = {"platform": "discord", "botId": "app-1", "method": "POST", "path": "/h"}
    await connector.push({"type": "interrupt_inbound", "session_key": "s1", "chat_id": 5})
    await connector.push({"type": "interrupt_inbound", "session_key": "s2", "bufferId": "b-1"})
    await connector.push({"type": "passthrough_forward", "forward": forward, "bufferId": "b-2"})
    await eventually(lambda: connector.inbound_acks == ["b-1", "b-2"], what="both acked")
    assert [(f.session_key, f.chat_id) for f in interrupts] == [("s1", "5"), ("s2", None)]
    assert dedupe.remembered == ["b-1"]
    [(buffer_id, frame_type, reason, raw)] = dedupe.undeliverable
    assert (buffer_id, frame_type) == ("b-2", "passthrough_forward")
    assert "no handler" in reason
    assert PassthroughForward.from_wire(json.loads(raw)).forward == forward


async def test_an_event_without_a_platform_takes_the_connections(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """An original connector may leave source.platform out: the event is read as coming from
    the transport's own platform."""
    seen: list[InboundEvent] = []

    async def handler(event: InboundEvent) -> None:
        seen.append(event)

    transport = await transports.connected()
    transport.set_inbound_handler(handler)
    await connector.push_inbound({"source": {"chat_id": "c1", "chat_type": "forum"}})
    await eventually(lambda: len(seen) == 1, what="handled")
    assert (seen[0].source.platform, seen[0].source.chat_type, seen[0].text) == (
        "discord",
        "forum",
        "",
    )

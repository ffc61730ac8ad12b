"""The relay transport against a misbehaving network or connector, through a fault-injecting
proxy: a connection cut mid-frame, a connector that accepts and then stalls, and connections
lost while a re-dial is still handshaking."""

from __future__ import annotations

import asyncio
import time

import pytest

from relay.client.lifecycle import TransportState as T
from relay.client.requests import RequestOutcome
from relay.wire.errors import RelayBroken
from relay.wire.frames import InboundEvent
from statecore.clock import FakeClock
from tests.relay.client.connector_stub import (
    FaultProxy,
    Reply,
    StubConnector,
    TransportFactory,
    eventually,
    inbound_event,
    next_sleep,
    state_of,
)

pytestmark = pytest.mark.asyncio

SEND = {"op": "send", "chat_id": "c1", "content": "hello"}
GUARD = 5.0


async def test_connection_dropped_mid_frame_fails_pending_and_reconnects(
    connector: StubConnector, proxy: FaultProxy, transports: TransportFactory
) -> None:
    """A connection cut halfway through a frame ends pending requests UNKNOWN and re-dials."""
    seen: list[str] = []

    async def handler(event: InboundEvent) -> None:
        seen.append(event.text)

    connector.reply = Reply.never()
    transport = await transports.connected(proxy.url, request_timeout_s=10.0)
    transport.set_inbound_handler(handler)
    pending = [asyncio.ensure_future(transport.request(SEND)) for _ in range(2)]
    await eventually(lambda: len(connector.unanswered) == 2, what="two requests sent")
    proxy.drop_next_server_message()
    started = time.monotonic()
    await connector.push_inbound(inbound_event("half a frame"), "buf-half")
    results = await asyncio.wait_for(asyncio.gather(*pending), GUARD)
    assert time.monotonic() - started < 2.0  # the loss, not the 10 s timeout, ended them
    assert [r.outcome for r in results] == [RequestOutcome.UNKNOWN] * 2
    assert proxy.dropped == 1
    await eventually(
        lambda: transport.connections == 2 and state_of(transport) is T.CONNECTED,
        what="reconnected through the proxy",
    )
    assert proxy.accepted == 2
    assert seen == []  # the half frame was never delivered
    connector.reply = Reply.ok("m-after")
    result = await asyncio.wait_for(transport.request(SEND), GUARD)
    assert (result.outcome, result.message_id) == (RequestOutcome.OK, "m-after")


async def test_request_to_a_stalled_connector_ends_unknown_on_timeout(
    connector: StubConnector, proxy: FaultProxy, clock: FakeClock, transports: TransportFactory
) -> None:
    """When the connector stops answering without closing, a request ends UNKNOWN at its timeout."""
    transport = await transports.connected(proxy.url, clock=clock, request_timeout_s=5.0)
    proxy.stall()
    task = asyncio.ensure_future(transport.request(SEND))
    assert await next_sleep(clock) == pytest.approx(5.0)
    clock.advance(5.0)
    result = await asyncio.wait_for(task, GUARD)
    assert result.outcome is RequestOutcome.UNKNOWN
    assert result.ambiguous
    assert state_of(transport) is T.CONNECTED  # nothing closed: the transport cannot know yet


async def test_stalled_upgrade_fails_the_dial_and_the_transport_keeps_redialing(
    connector: StubConnector, proxy: FaultProxy, transports: TransportFactory
) -> None:
    """A connector that accepts TCP but never upgrades fails the dial; re-dials continue."""
    proxy.mode = "stall"
    transport = transports(proxy.url, open_timeout_s=0.2)
    with pytest.raises(RelayBroken):
        await asyncio.wait_for(transport.connect(), GUARD)
    assert state_of(transport) is T.RECONNECTING
    await eventually(lambda: proxy.accepted >= 3, what="repeated re-dials")
    assert connector.connections == 0
    proxy.mode = "pass"
    await eventually(lambda: state_of(transport) is T.CONNECTED, what="connected once unstalled")
    assert transport.connections == 1


async def test_request_while_connecting_fails_fast(
    connector: StubConnector, proxy: FaultProxy, transports: TransportFactory
) -> None:
    """A request made while the upgrade is still in flight fails at once with NOT_SENT."""
    proxy.mode = "stall"
    transport = transports(proxy.url, open_timeout_s=5.0)
    dialing = asyncio.ensure_future(transport.connect())
    try:
        await eventually(lambda: state_of(transport) is T.CONNECTING, what="connecting")
        result = await asyncio.wait_for(transport.request(SEND), 0.5)
        assert result.outcome is RequestOutcome.NOT_SENT
        assert result.request_id is None
    finally:
        dialing.cancel()
        await asyncio.gather(dialing, return_exceptions=True)


async def test_handshake_times_out_against_a_silent_connector(
    connector: StubConnector, proxy: FaultProxy, clock: FakeClock, transports: TransportFactory
) -> None:
    """Upgraded but never answered: handshake() raises RelayBroken after its timeout."""
    proxy.mode = "stall_after_upgrade"
    transport = transports(proxy.url, clock=clock)
    await asyncio.wait_for(transport.connect(), GUARD)
    assert state_of(transport) is T.HANDSHAKING
    shake = asyncio.ensure_future(transport.handshake(timeout_s=30.0))
    assert await next_sleep(clock) == pytest.approx(30.0)
    clock.advance(30.0)
    with pytest.raises(RelayBroken):
        await asyncio.wait_for(shake, GUARD)


async def test_initial_handshake_timeout_leads_to_a_redial(
    connector: StubConnector, proxy: FaultProxy, transports: TransportFactory
) -> None:
    """A first connection whose handshake timed out is abandoned and the connector re-dialed."""
    proxy.mode = "stall_after_upgrade"
    transport = transports(proxy.url, handshake_timeout_s=0.2)
    await asyncio.wait_for(transport.connect(), GUARD)
    with pytest.raises(RelayBroken):
        await asyncio.wait_for(transport.handshake(), GUARD)
    proxy.mode = "pass"
    await eventually(lambda: proxy.accepted >= 2, timeout=1.0, what="a re-dial")
    await eventually(lambda: state_of(transport) is T.CONNECTED, what="connected")


async def test_silent_connector_on_redial_is_abandoned_and_redialed(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A re-dial whose handshake times out is closed and dialed again until one succeeds."""
    transport = await transports.connected(
        handshake_timeout_s=0.2, reconnect_backoff_s=0.05, reconnect_max_s=0.1
    )
    connector.answer_hello = False
    await connector.close_current(1011, "crash")
    await eventually(lambda: connector.connections >= 4, timeout=4.0, what="repeated re-dials")
    assert all(not c.is_open for c in connector.conns[1:-1])  # each silent one was closed
    assert connector.max_live == 1
    connector.answer_hello = True
    await eventually(lambda: state_of(transport) is T.CONNECTED, what="connected again")
    assert transport.connections == 2


async def test_backoff_ladder_after_handshake_timeouts_climbs_one_step_per_dial(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """Each re-dial that failed its handshake moves the backoff one step: [d/2, d], d doubling."""
    transport = await transports.connected(
        clock=clock, handshake_timeout_s=5.0, reconnect_backoff_s=1.0, reconnect_max_s=64.0
    )
    connector.answer_hello = False
    await connector.close_current(1011, "crash")
    for attempt in range(3):
        delay = await next_sleep(clock)
        ceiling = 2.0**attempt
        assert ceiling / 2 <= delay <= ceiling, (attempt, delay)
        clock.advance(delay)
        await eventually(lambda: state_of(transport) is T.HANDSHAKING, what="a silent re-dial")
        assert await next_sleep(clock) == pytest.approx(5.0)
        clock.advance(5.0)
        await eventually(lambda: state_of(transport) is T.RECONNECTING, what="handshake gave up")


@pytest.mark.parametrize(("code", "reason"), [(1011, "crash"), (4419, "expired")])
async def test_connection_lost_during_a_redial_handshake_is_retried_promptly(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory, code: int, reason: str
) -> None:
    """A re-dial closed before its descriptor is retried on the backoff (4419: at once), not
    after the handshake timeout."""
    transport = await transports.connected(
        clock=clock, handshake_timeout_s=1000.0, reconnect_backoff_s=1.0, reconnect_max_s=8.0
    )
    connector.close_on_connect = {2: (code, reason)}
    await connector.close_current(1011, "crash")
    clock.advance(await next_sleep(clock))
    if code == 4419:
        # An expired token is retried at once: no clock step needed (the re-dial and its
        # retry may follow each other faster than a poll can see the re-dial alone).
        await eventually(lambda: connector.connections == 3, timeout=1.0, what="the 4419 retry")
        assert not connector.conns[1].is_open
    else:
        await eventually(lambda: connector.connections == 2, what="the re-dial")
        await eventually(lambda: not connector.conns[1].is_open, what="the re-dial closed")
        await eventually(lambda: state_of(transport) is T.RECONNECTING, what="reconnecting")
        delay = await next_sleep(clock)
        assert delay <= 8.0, f"next dial waits {delay:g} s (the handshake timeout)"
        clock.advance(delay)
        await eventually(lambda: connector.connections == 3, timeout=1.0, what="the retry")
    await eventually(lambda: state_of(transport) is T.CONNECTED, what="connected")

"""WebSocketRelayTransport against a live in-process connector: handshake, going idle, inbound
delivery, requests, reconnection and dormancy (transport.md, "Behaviour that must hold").

Timing that the transport routes through its clock (backoff, dormant cadence, request and
handshake timeouts) is driven with a FakeClock where the exact value matters; every real wait is
bounded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from relay.client.lifecycle import TransportState as T
from relay.client.requests import RequestOutcome, RequestResult
from relay.client.transport import WebSocketRelayTransport
from relay.wire.auth import token_from_header, verify_token
from relay.wire.errors import RelayBroken, RelayClosed
from relay.wire.frames import InboundEvent
from statecore.clock import FakeClock
from statecore.errors import InvalidTransition
from tests.relay.client.connector_stub import (
    BOT_ID,
    PLATFORM,
    MemoryDedupe,
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
GUARD = 3.0

StateLog = list[tuple[T, T]]


def record_states(transport: WebSocketRelayTransport) -> StateLog:
    """Attach a listener that records every (from, to) state change."""
    log: StateLog = []
    transport.listeners.append(lambda before, after, _event: log.append((before, after)))
    return log


def record_events(transport: WebSocketRelayTransport) -> list[str]:
    """Attach a listener that records every lifecycle event name."""
    events: list[str] = []
    transport.listeners.append(lambda _before, _after, event: events.append(event))
    return events


def counted(events: list[str], name: str, count: int) -> Callable[[], bool]:
    """A predicate: ``name`` occurs exactly ``count`` times in ``events``."""
    return lambda: events.count(name) == count


def connections_reach(connector: StubConnector, count: int) -> Callable[[], bool]:
    """A predicate: the connector accepted exactly ``count`` connections."""
    return lambda: connector.connections == count


async def request(
    transport: WebSocketRelayTransport,
    *,
    timeout_s: float | None = None,
    idempotency_key: str | None = None,
) -> RequestResult:
    """A bounded request of :data:`SEND`."""
    return await asyncio.wait_for(
        transport.request(SEND, timeout_s=timeout_s, idempotency_key=idempotency_key), GUARD
    )


def outbound_count(connector: StubConnector) -> int:
    """How many outbound frames the connector received."""
    return len(connector.frames_of("outbound"))


# -- connect and handshake -------------------------------------------------------------------------


async def test_connect_and_handshake_reach_connected_and_adopt_descriptor(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """connect() + handshake() end connected with the connector's descriptor adopted."""
    transport = transports()
    assert state_of(transport) is T.NEW
    await asyncio.wait_for(transport.connect(), GUARD)
    descriptor = await asyncio.wait_for(transport.handshake(), GUARD)
    assert state_of(transport) is T.CONNECTED
    assert descriptor.label == "Discord"
    assert descriptor.max_message_length == 2000
    assert transport.descriptor == descriptor
    assert transport.connections == 1
    assert connector.connections == 1


async def test_first_descriptor_of_a_connection_wins(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A second descriptor on the same connection does not replace the adopted one."""
    connector.extra_descriptors = [{**connector.descriptor, "label": "Impostor"}]
    transport = await transports.connected()
    # A round trip after the extra descriptor was sent: it has been routed by now.
    assert (await request(transport)).success
    assert transport.descriptor is not None
    assert transport.descriptor.label == "Discord"
    assert transport.connections == 1


async def test_hello_frames_carry_identity_protocol_and_features(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """One hello per identity, the default first, each with platform, botId, protocol, features."""
    transport = await transports.connected(identities=[("slack", "bot-2")], features=["error"])
    hellos = connector.conns[0].frames_of("hello")
    assert hellos == [
        {
            "type": "hello",
            "platform": PLATFORM,
            "botId": BOT_ID,
            "protocol": 1,
            "features": ["error"],
        },
        {
            "type": "hello",
            "platform": "slack",
            "botId": "bot-2",
            "protocol": 1,
            "features": ["error"],
        },
    ]
    assert (await request(transport)).success
    assert transport.descriptor is not None
    assert transport.descriptor.platform == PLATFORM
    assert set(transport.descriptors) == {PLATFORM, "slack"}


async def test_listeners_see_new_connecting_handshaking_connected(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """Listeners observe new -> connecting -> handshaking -> connected, in that order."""
    transport = transports()
    states = record_states(transport)
    await asyncio.wait_for(transport.connect(), GUARD)
    await asyncio.wait_for(transport.handshake(), GUARD)
    assert states == [
        (T.NEW, T.CONNECTING),
        (T.CONNECTING, T.HANDSHAKING),
        (T.HANDSHAKING, T.CONNECTED),
    ]


async def test_a_raising_listener_does_not_break_the_transport(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A listener that raises is isolated: the transport still connects and serves."""

    def broken(_before: T, _after: T, _event: str) -> None:
        raise RuntimeError("listener bug")

    transport = transports()
    transport.listeners.append(broken)
    await asyncio.wait_for(transport.connect(), GUARD)
    await asyncio.wait_for(transport.handshake(), GUARD)
    assert state_of(transport) is T.CONNECTED
    assert (await request(transport)).success


async def test_connect_is_refused_once_dialed(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A second connect() raises InvalidTransition and never opens a second connection."""
    transport = await transports.connected()
    with pytest.raises(InvalidTransition):
        await transport.connect()
    assert connector.connections == 1


async def test_failed_first_dial_raises_broken_and_the_supervisor_keeps_dialing(
    clock: FakeClock, transports: TransportFactory
) -> None:
    """connect() to an unreachable connector raises RelayBroken and re-dials on the backoff."""
    connector = StubConnector()
    await connector.start()
    await connector.stop()  # the port is known and nobody listens on it
    transport = transports(
        connector.url, clock=clock, reconnect_backoff_s=1.0, reconnect_max_s=30.0
    )
    try:
        with pytest.raises(RelayBroken):
            await asyncio.wait_for(transport.connect(), GUARD)
        assert state_of(transport) is T.RECONNECTING
        delay = await next_sleep(clock)
        assert 0.5 <= delay <= 1.0
        await connector.start()
        clock.advance(delay)
        await eventually(lambda: state_of(transport) is T.CONNECTED, what="connected after re-dial")
        assert connector.connections == 1
    finally:
        await asyncio.wait_for(transport.disconnect(budget_s=1.0), GUARD)
        await connector.stop()


async def test_failed_first_dial_with_reconnect_off_ends_closed(
    transports: TransportFactory,
) -> None:
    """connect() failing with reconnect off raises RelayBroken and leaves the transport closed."""
    connector = StubConnector()
    await connector.start()
    await connector.stop()
    transport = transports(connector.url, reconnect=False)
    with pytest.raises(RelayBroken):
        await asyncio.wait_for(transport.connect(), GUARD)
    assert state_of(transport) is T.CLOSED
    assert transport.close_reason is not None


# -- going idle ------------------------------------------------------------------------------------


async def test_go_idle_true_after_ack_and_the_socket_stays_up(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """go_idle returns True once acked; the same socket stays up and requests still work."""
    transport = await transports.connected()
    assert await asyncio.wait_for(transport.go_idle(timeout_s=2), GUARD) is True
    assert connector.going_idle_count == 1
    assert state_of(transport) is T.CONNECTED
    assert (await request(transport)).success
    assert connector.connections == 1
    assert connector.conns[0].is_open


async def test_go_idle_false_on_timeout_and_the_socket_stays_up(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """go_idle returns False when the connector never acks (after its whole timeout), and the
    socket stays up."""
    connector.ack_going_idle = False
    transport = await transports.connected(clock=clock)
    idle = asyncio.ensure_future(transport.go_idle(timeout_s=30.0))
    assert await next_sleep(clock) == pytest.approx(30.0)
    clock.advance(29.0)
    await asyncio.sleep(0)
    assert not idle.done()
    clock.advance(1.0)
    assert await asyncio.wait_for(idle, GUARD) is False
    assert connector.going_idle_count == 1
    assert state_of(transport) is T.CONNECTED
    assert connector.conns[0].is_open
    assert (await request(transport)).success
    assert connector.connections == 1


async def test_go_idle_false_when_not_connected(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """go_idle returns False without sending anything when never connected or after closing."""
    fresh = transports()
    assert await asyncio.wait_for(fresh.go_idle(timeout_s=0.1), GUARD) is False
    assert state_of(fresh) is T.NEW
    closed = await transports.connected()
    await asyncio.wait_for(closed.disconnect(budget_s=1.0), GUARD)
    assert await asyncio.wait_for(closed.go_idle(timeout_s=0.1), GUARD) is False
    assert connector.going_idle_count == 0


# -- inbound ---------------------------------------------------------------------------------------


async def test_buffered_delivery_is_acked_only_after_the_handler_returned(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A bufferId delivery is acked after its handler returned, never while it still runs."""
    gate = asyncio.Event()
    entered = asyncio.Event()
    seen: list[str] = []

    async def handler(event: InboundEvent) -> None:
        entered.set()
        await gate.wait()
        seen.append(event.text)

    transport = await transports.connected()
    transport.set_inbound_handler(handler)
    await connector.push_inbound(inbound_event("buffered"), "buf-42")
    await asyncio.wait_for(entered.wait(), GUARD)
    await asyncio.sleep(0.1)
    assert connector.inbound_acks == []  # the handler has not returned yet
    gate.set()
    await eventually(lambda: connector.inbound_acks == ["buf-42"], what="the ack")
    assert seen == ["buffered"]


async def test_live_delivery_is_never_acked(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A delivery without bufferId is handled but never acked (both pushed at the handshake)."""
    seen: list[str] = []

    async def handler(event: InboundEvent) -> None:
        seen.append(event.text)

    connector.push_on_handshake = [
        {"type": "inbound", "event": inbound_event("live")},
        {"type": "inbound", "event": inbound_event("buffered"), "bufferId": "buf-1"},
    ]
    transport = transports()
    transport.set_inbound_handler(handler)
    await asyncio.wait_for(transport.connect(), GUARD)
    await asyncio.wait_for(transport.handshake(), GUARD)
    await eventually(lambda: connector.inbound_acks == ["buf-1"], what="the buffered ack")
    await asyncio.sleep(0.05)
    assert seen == ["live", "buffered"]
    assert connector.frames_of("inbound_ack") == [{"type": "inbound_ack", "bufferId": "buf-1"}]


async def test_slow_handler_does_not_stall_result_routing(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """The handler runs outside the reader: while it blocks, a request's result still arrives."""
    gate = asyncio.Event()
    entered = asyncio.Event()

    async def handler(_event: InboundEvent) -> None:
        entered.set()
        await gate.wait()

    transport = await transports.connected()
    transport.set_inbound_handler(handler)
    try:
        await connector.push_inbound(inbound_event("slow"), "buf-slow")
        await asyncio.wait_for(entered.wait(), GUARD)
        result = await request(transport)
        assert result.outcome is RequestOutcome.OK
        assert not gate.is_set()
        assert connector.inbound_acks == []
    finally:
        gate.set()
    await eventually(lambda: connector.inbound_acks == ["buf-slow"], what="the ack")


async def test_raising_handler_is_isolated_and_its_delivery_stays_unacked(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A handler that raises leaves its bufferId unacked (it is tried again in its chat's lane:
    tests/relay/client/test_delivery_retry.py); other chats' events and requests still work."""
    seen: list[str] = []

    async def handler(event: InboundEvent) -> None:
        seen.append(event.text)
        if event.text == "poison":
            raise ValueError("handler bug")

    transport = await transports.connected()
    transport.set_inbound_handler(handler)
    await connector.push_inbound(inbound_event("poison", chat_id="c-poison"), "buf-bad")
    await connector.push_inbound(inbound_event("fine"), "buf-good")
    await eventually(lambda: "buf-good" in connector.inbound_acks, what="the good ack")
    assert seen[:2] == ["poison", "fine"] or seen[:2] == ["fine", "poison"]
    assert connector.inbound_acks == ["buf-good"]
    assert state_of(transport) is T.CONNECTED
    assert (await request(transport)).success


async def test_inbound_events_are_handled_in_order(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """Events are handled one at a time in arrival order, even when handlers yield."""
    seen: list[str] = []
    active = 0
    overlap = False

    async def handler(event: InboundEvent) -> None:
        nonlocal active, overlap
        active += 1
        overlap = overlap or active > 1
        await asyncio.sleep(0.001 * (int(event.text) % 3))
        seen.append(event.text)
        active -= 1

    transport = await transports.connected()
    transport.set_inbound_handler(handler)
    texts = [str(n) for n in range(25)]
    for text in texts:
        await connector.push_inbound(inbound_event(text), f"buf-{text}")
    await eventually(lambda: len(connector.inbound_acks) == len(texts), what="every ack")
    assert seen == texts
    assert connector.inbound_acks == [f"buf-{t}" for t in texts]
    assert not overlap


async def test_dedupe_seen_buffer_id_is_acked_without_calling_the_handler(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A bufferId the dedupe has seen is acked but not handled again."""
    seen: list[str] = []

    async def handler(event: InboundEvent) -> None:
        seen.append(event.text)

    dedupe = MemoryDedupe(connector, seen=("buf-old",))
    transport = await transports.connected(dedupe=dedupe)
    transport.set_inbound_handler(handler)
    await connector.push_inbound(inbound_event("replayed"), "buf-old")
    await connector.push_inbound(inbound_event("new"), "buf-new")
    await eventually(lambda: len(connector.inbound_acks) == 2, what="both acks")
    assert connector.inbound_acks == ["buf-old", "buf-new"]
    assert seen == ["new"]
    assert dedupe.remembered == ["buf-new"]


async def test_dedupe_remembers_a_handled_buffer_id_before_acking_it(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A handled bufferId is remembered before its ack is sent; a failed one is not remembered."""

    async def handler(event: InboundEvent) -> None:
        if event.text == "poison":
            raise ValueError("handler bug")

    dedupe = MemoryDedupe(connector)
    transport = await transports.connected(dedupe=dedupe)
    transport.set_inbound_handler(handler)
    await connector.push_inbound(inbound_event("poison", chat_id="c-poison"), "buf-bad")
    await connector.push_inbound(inbound_event("ok"), "buf-1")
    await eventually(lambda: connector.inbound_acks == ["buf-1"], what="the ack")
    assert dedupe.remembered == ["buf-1"]
    assert dedupe.acked_before_remembered == {"buf-1": False}


# -- requests --------------------------------------------------------------------------------------


async def test_request_ok_carries_the_message_id(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """An acknowledged success is OK with the connector's message_id."""
    connector.reply = Reply.ok("msg-77")
    transport = await transports.connected()
    result = await request(transport)
    assert result.outcome is RequestOutcome.OK
    assert result.success
    assert not result.ambiguous
    assert result.message_id == "msg-77"
    sent = connector.frames_of("outbound")
    assert len(sent) == 1
    assert sent[0]["requestId"] == result.request_id
    assert sent[0]["action"] == SEND


async def test_request_failed_carries_error_and_code(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """An acknowledged failure is FAILED with the connector's error and code, not ambiguous."""
    connector.reply = Reply.failed("chat not found", "not_found")
    transport = await transports.connected()
    result = await request(transport)
    assert result.outcome is RequestOutcome.FAILED
    assert not result.success
    assert not result.ambiguous
    assert (result.error, result.code) == ("chat not found", "not_found")


async def test_request_declined_for_egress_declined(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """code egress_declined is a definite DECLINED, never ambiguous."""
    connector.reply = Reply.declined()
    transport = await transports.connected()
    result = await request(transport)
    assert result.outcome is RequestOutcome.DECLINED
    assert result.code == "egress_declined"
    assert not result.ambiguous


async def test_request_timeout_is_unknown(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """No result within the request timeout gives UNKNOWN (the clock's timeout, not a hang)."""
    connector.reply = Reply.never()
    transport = await transports.connected(clock=clock, request_timeout_s=30)
    task = asyncio.ensure_future(transport.request(SEND))
    assert await next_sleep(clock) == pytest.approx(30)
    clock.advance(29)
    await asyncio.sleep(0.05)
    assert not task.done()
    clock.advance(1)
    result = await asyncio.wait_for(task, GUARD)
    assert result.outcome is RequestOutcome.UNKNOWN
    assert result.ambiguous
    assert result.request_id == connector.unanswered[0]


async def test_connection_loss_fails_every_pending_request_at_once(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """Losing the connection ends every pending request as UNKNOWN at once, with no timeout."""
    connector.reply = Reply.never()
    transport = await transports.connected(clock=clock, request_timeout_s=1000)
    tasks = [asyncio.ensure_future(transport.request(SEND)) for _ in range(3)]
    await eventually(lambda: len(connector.unanswered) == 3, what="three requests sent")
    await connector.close_current(1011, "crash")
    # The fake clock never moves: only the loss itself can end these requests.
    results = await asyncio.wait_for(asyncio.gather(*tasks), GUARD)
    assert [r.outcome for r in results] == [RequestOutcome.UNKNOWN] * 3
    assert all(r.error and "lost" in r.error for r in results)


async def test_request_while_handshaking_waits_for_the_handshake(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A request made while handshaking is sent once the descriptor arrives, and succeeds."""
    connector.answer_hello = False
    transport = transports()
    await asyncio.wait_for(transport.connect(), GUARD)
    assert state_of(transport) is T.HANDSHAKING
    task = asyncio.ensure_future(transport.request(SEND))
    await asyncio.sleep(0.1)
    assert not task.done()
    assert outbound_count(connector) == 0
    await connector.push({"type": "descriptor", "descriptor": connector.descriptor})
    result = await asyncio.wait_for(task, GUARD)
    assert result.outcome is RequestOutcome.OK
    assert state_of(transport) is T.CONNECTED


async def test_idempotency_key_is_sent_and_reused_across_retries(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """The caller's key is sent as idempotencyKey, unchanged on a retry of an ambiguous send."""
    connector.reply = lambda frame: Reply.never() if len(connector.unanswered) == 0 else Reply.ok()
    transport = await transports.connected(clock=clock)
    pending = asyncio.ensure_future(
        transport.request(SEND, idempotency_key="reply-123", timeout_s=5.0)
    )
    clock.advance(await next_sleep(clock))
    first = await asyncio.wait_for(pending, GUARD)
    assert first.outcome is RequestOutcome.UNKNOWN
    retry = await request(transport, idempotency_key="reply-123")
    assert retry.outcome is RequestOutcome.OK
    sent = connector.frames_of("outbound")
    assert [f["idempotencyKey"] for f in sent] == ["reply-123", "reply-123"]
    assert sent[0]["requestId"] != sent[1]["requestId"]


async def test_requests_without_a_key_get_distinct_keys(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """Without a caller key every request still carries its own non-empty idempotencyKey."""
    transport = await transports.connected()
    for _ in range(3):
        assert (await request(transport)).success
    keys = [f.get("idempotencyKey") for f in connector.frames_of("outbound")]
    assert all(isinstance(k, str) and k for k in keys)
    assert len(set(keys)) == 3


async def test_late_and_unknown_results_are_ignored(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """A result for an unknown or timed-out requestId is ignored; later requests are unaffected."""
    connector.reply = Reply.never()
    transport = await transports.connected(clock=clock)
    pending = asyncio.ensure_future(transport.request(SEND, timeout_s=5.0))
    clock.advance(await next_sleep(clock))
    late = await asyncio.wait_for(pending, GUARD)
    assert late.outcome is RequestOutcome.UNKNOWN
    assert late.request_id is not None
    await connector.answer(late.request_id, message_id="too-late")
    await connector.answer("no-such-request", message_id="stray")
    connector.reply = Reply.ok("fresh")
    result = await request(transport)
    assert (result.outcome, result.message_id) == (RequestOutcome.OK, "fresh")
    assert state_of(transport) is T.CONNECTED
    assert connector.error_frames == []


async def test_malformed_frame_is_answered_with_an_error_frame_and_only_warned(
    connector: StubConnector, transports: TransportFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A malformed frame gets an error frame back, a WARNING (no ERROR), and pending requests
    are unaffected."""
    caplog.set_level(logging.WARNING)
    connector.reply = Reply.never()
    connector.descriptor = {**connector.descriptor, "features": ["error_frames"]}
    transport = await transports.connected()
    pending = asyncio.ensure_future(transport.request(SEND))
    await eventually(lambda: len(connector.unanswered) == 1, what="the request sent")
    await connector.push("this is not json\n")
    await connector.push({"type": "outbound_result", "requestId": 7, "result": {}})
    await eventually(lambda: len(connector.error_frames) == 2, what="two error frames")
    assert connector.error_frames[0]["code"] == "malformed_json"
    assert connector.error_frames[1]["code"] in ("bad_field", "missing_field")
    await connector.answer(connector.unanswered[0], message_id="m-ok")
    result = await asyncio.wait_for(pending, GUARD)
    assert (result.outcome, result.message_id) == (RequestOutcome.OK, "m-ok")
    assert state_of(transport) is T.CONNECTED
    assert connector.connections == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any(r.name.startswith("relay") for r in warnings)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_unknown_frame_type_is_ignored(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A frame of an unknown type is skipped silently: no error frame, the connection serves."""
    transport = await transports.connected()
    await connector.push({"type": "from_the_future", "payload": [1, 2, 3]})
    assert (await request(transport)).success
    assert connector.error_frames == []
    assert state_of(transport) is T.CONNECTED
    assert connector.connections == 1


async def test_connector_error_frame_fails_the_referenced_request(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """An error frame whose ref names a pending request ends it as a definite failure."""
    connector.reply = Reply.never()
    transport = await transports.connected()
    pending = asyncio.ensure_future(transport.request(SEND))
    await eventually(lambda: len(connector.unanswered) == 1, what="the request sent")
    ref = connector.unanswered[0]
    await connector.push({"type": "error", "code": "bad_field", "message": "no", "ref": ref})
    result = await asyncio.wait_for(pending, GUARD)
    assert result.outcome is RequestOutcome.FAILED
    assert result.code == "bad_field"
    assert state_of(transport) is T.CONNECTED


async def test_an_action_without_op_is_a_type_error(transports: TransportFactory) -> None:
    """request() refuses an action without a string op (the caller's bug)."""
    transport = transports()
    with pytest.raises(TypeError):
        await transport.request({"text": "no op"})


# -- requests that fail fast -----------------------------------------------------------------------


Setup = Callable[[StubConnector, FakeClock, TransportFactory], Awaitable[WebSocketRelayTransport]]


async def _new(_c: StubConnector, _k: FakeClock, f: TransportFactory) -> WebSocketRelayTransport:
    return f(clock=_k)


async def _closed(_c: StubConnector, k: FakeClock, f: TransportFactory) -> WebSocketRelayTransport:
    transport = await f.connected(clock=k)
    await asyncio.wait_for(transport.disconnect(budget_s=1.0), GUARD)
    return transport


async def _dormant(_c: StubConnector, k: FakeClock, f: TransportFactory) -> WebSocketRelayTransport:
    transport = await f.connected(clock=k)
    assert await asyncio.wait_for(transport.go_dormant(timeout_s=5), GUARD)
    return transport


async def _reconnecting(
    c: StubConnector, k: FakeClock, f: TransportFactory
) -> WebSocketRelayTransport:
    transport = await f.connected(clock=k, reconnect_backoff_s=10.0)
    await c.close_current(1011, "crash")
    await eventually(lambda: state_of(transport) is T.RECONNECTING, what="reconnecting")
    return transport


async def _revoked(c: StubConnector, k: FakeClock, f: TransportFactory) -> WebSocketRelayTransport:
    c.close_on_connect = {1: (4401, "unknown gateway")}
    transport = f(clock=k, refusal_grace_s=0)
    await asyncio.wait_for(transport.connect(), GUARD)
    with pytest.raises(RelayClosed):
        await asyncio.wait_for(transport.handshake(), GUARD)
    return transport


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (_new, (T.NEW, "not connected")),
        (_closed, (T.CLOSED, "closed")),
        (_dormant, (T.DORMANT, "not connected")),
        (_reconnecting, (T.RECONNECTING, "not connected")),
        (_revoked, (T.REVOKED, "revoked")),
    ],
    ids=["new", "closed", "dormant", "reconnecting", "revoked"],
)
async def test_request_fails_fast_not_sent_when_not_serving(
    connector: StubConnector,
    clock: FakeClock,
    transports: TransportFactory,
    setup: Setup,
    expected: tuple[T, str],
) -> None:
    """Outside connected/handshaking a request fails at once with NOT_SENT and sends nothing."""
    state, error = expected
    transport = await setup(connector, clock, transports)
    assert state_of(transport) is state
    before = outbound_count(connector)
    sleepers = clock.sleepers
    result = await asyncio.wait_for(transport.request(SEND), 0.5)
    assert result.outcome is RequestOutcome.NOT_SENT
    assert not result.ambiguous
    assert result.request_id is None  # nothing was registered
    assert result.error is not None
    assert error in result.error
    assert outbound_count(connector) == before
    assert clock.sleepers == sleepers  # nobody is waiting on a timeout for it


# -- reconnecting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["1011", "1000", "4400", "abrupt"])
async def test_unexpected_close_redials_and_rehandshakes(
    connector: StubConnector, transports: TransportFactory, how: str
) -> None:
    """A close we did not ask for (1011, 1000, 4400 or a cut TCP stream) is followed by a re-dial
    and a new handshake."""
    transport = await transports.connected()
    states = record_states(transport)
    connector.descriptor = {**connector.descriptor, "label": "Discord v2"}
    if how == "abrupt":
        connector.abort_current()
    else:
        await connector.close_current(int(how), "going")
    await eventually(
        lambda: transport.connections == 2 and state_of(transport) is T.CONNECTED,
        what="re-handshake",
    )
    assert connector.connections == 2
    assert len(connector.conns[1].frames_of("hello")) == 1
    assert (T.CONNECTED, T.RECONNECTING) in states
    assert transport.descriptor is not None
    assert transport.descriptor.label == "Discord v2"  # the new connection's descriptor
    assert (await request(transport)).success


async def test_backoff_is_jittered_and_doubles_up_to_the_cap_across_failed_dials(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """Each failed re-dial waits uniform [d/2, d], d doubling from the base up to the cap."""
    transport = await transports.connected(
        clock=clock, reconnect_backoff_s=1.0, reconnect_max_s=8.0
    )
    events = record_events(transport)
    await connector.stop()
    delays: list[float] = []
    for attempt in range(7):
        delay = await next_sleep(clock)
        delays.append(delay)
        ceiling = min(8.0, 2.0**attempt)
        assert ceiling / 2 <= delay <= ceiling, (attempt, delays)
        assert state_of(transport) is T.RECONNECTING
        clock.advance(delay)
        dials = attempt + 1
        await eventually(counted(events, "dial", dials), what="a re-dial")
    assert len(set(delays)) == len(delays)  # jittered, not a fixed ladder
    assert connector.connections == 1


async def test_backoff_ladder_resets_only_after_a_stable_connection(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """Short-lived connections keep climbing the ladder; one up for stable_after_s resets it."""
    transport = await transports.connected(
        clock=clock, reconnect_backoff_s=1.0, reconnect_max_s=30.0, stable_after_s=10.0
    )

    async def drop_and_measure(up_for: float) -> float:
        clock.advance(up_for)
        await connector.close_current(1011, "crash")
        delay = await next_sleep(clock)
        expected = transport.connections + 1
        clock.advance(delay)
        await eventually(
            lambda: transport.connections == expected and state_of(transport) is T.CONNECTED,
            what="reconnected",
        )
        return delay

    assert 0.5 <= await drop_and_measure(0.0) <= 1.0
    assert 1.0 <= await drop_and_measure(0.0) <= 2.0  # the ladder persists across dials
    assert 2.0 <= await drop_and_measure(9.0) <= 4.0  # 9 s < stable_after_s: no reset
    assert 0.5 <= await drop_and_measure(10.0) <= 1.0  # stayed up 10 s: reset


async def test_exactly_one_dialer_connections_never_overlap(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """Through a crash-looping connector, dials are strictly one at a time."""
    connector.close_after_handshake = dict.fromkeys(range(1, 6), (1011, "crash loop"))
    transport = transports(reconnect_backoff_s=0.05, reconnect_max_s=0.1)
    events = record_events(transport)
    await asyncio.wait_for(transport.connect(), GUARD)
    await eventually(
        lambda: connector.connections == 6 and state_of(transport) is T.CONNECTED,
        timeout=5.0,
        what="six connections",
    )
    with pytest.raises(InvalidTransition):
        await transport.connect()
    await asyncio.sleep(0.1)
    assert connector.max_live == 1
    assert connector.connections == 6
    assert events.count("dial") == 6


async def test_exactly_one_dialer_is_armed_when_redials_die_before_the_handshake(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """Re-dials closed before their descriptor never leave more than one dialer waiting."""
    connector.close_on_connect = dict.fromkeys(range(2, 5), (1011, "crash loop"))
    transport = await transports.connected(
        clock=clock, handshake_timeout_s=1000.0, reconnect_backoff_s=1.0, reconnect_max_s=8.0
    )
    await connector.close_current(1011, "crash")
    for number in range(2, 5):
        clock.advance(await next_sleep(clock))
        await eventually(connections_reach(connector, number), what="the re-dial")
        await eventually(
            lambda: state_of(transport) is T.RECONNECTING and clock.sleepers >= 1,
            what="waiting to re-dial",
        )
        await asyncio.sleep(0.05)
        assert clock.sleepers == 1  # one dialer waiting, nothing else
    clock.advance(await next_sleep(clock))
    await eventually(lambda: state_of(transport) is T.CONNECTED, what="connected")
    assert connector.max_live == 1
    assert connector.connections == 5


@pytest.mark.parametrize("start", ["connected", "reconnecting", "dormant"])
async def test_deliberate_disconnect_never_redials(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory, start: str
) -> None:
    """disconnect() from connected, reconnecting or dormant ends closed and never dials again."""
    transport = await transports.connected(
        clock=clock, reconnect_backoff_s=1.0, dormant_redial_s=1.0
    )
    if start == "reconnecting":
        await connector.close_current(1011, "crash")
        await next_sleep(clock)
        assert state_of(transport) is T.RECONNECTING
    elif start == "dormant":
        assert await asyncio.wait_for(transport.go_dormant(timeout_s=5), GUARD)
        await next_sleep(clock)
    before = connector.connections
    await asyncio.wait_for(transport.disconnect(budget_s=1.0), GUARD)
    assert state_of(transport) is T.CLOSED
    assert clock.sleepers == 0  # no dialer left armed
    clock.advance(3600)
    await asyncio.sleep(0.1)
    assert connector.connections == before
    assert state_of(transport) is T.CLOSED


async def test_replaced_4409_ends_closed_and_never_redials(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """A 4409 close ends the transport closed, says it was replaced, and does not re-dial."""
    transport = await transports.connected(clock=clock)
    await connector.close_current(4409, "replaced")
    await eventually(lambda: state_of(transport) is T.CLOSED, what="closed")
    assert transport.close_reason is not None
    assert "replaced" in transport.close_reason
    assert not transport.auth_revoked
    assert clock.sleepers == 0  # no dialer armed
    clock.advance(3600)
    await asyncio.sleep(0)
    assert connector.connections == 1
    assert (await request(transport)).outcome is RequestOutcome.NOT_SENT


async def test_4401_before_any_handshake_is_terminal_revocation_without_a_grace(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """With no start-up grace configured, a 4401 before any handshake revokes at once:
    terminal, no re-dial."""
    connector.secrets = {"someone-else": ["other-secret"]}
    transport = transports(gateway_id="gw-1", secret="s3cret", clock=clock, refusal_grace_s=0)
    await asyncio.wait_for(transport.connect(), GUARD)
    with pytest.raises(RelayClosed):
        await asyncio.wait_for(transport.handshake(), GUARD)
    assert state_of(transport) is T.REVOKED
    assert transport.auth_revoked is True
    assert transport.close_reason is not None
    assert "revoked" in transport.close_reason
    assert connector.conns[0].close_code == 4401
    assert clock.sleepers == 0  # no dialer armed
    clock.advance(3600)
    await asyncio.sleep(0)
    assert connector.connections == 1
    result = await request(transport)
    assert result.outcome is RequestOutcome.NOT_SENT
    with pytest.raises(RelayClosed):
        await transport.connect()


async def test_http_401_upgrade_refusal_is_revocation(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """With no start-up grace, an upgrade refused with HTTP 401 revokes the transport and never
    re-dials."""
    connector.reject_status = 401
    transport = transports(clock=clock, refusal_grace_s=0)
    with pytest.raises(RelayClosed):
        await asyncio.wait_for(transport.connect(), GUARD)
    assert state_of(transport) is T.REVOKED
    assert transport.auth_revoked
    assert clock.sleepers == 0  # no dialer armed
    clock.advance(3600)
    await asyncio.sleep(0)
    assert connector.upgrades == 1


async def test_an_early_4401_is_a_start_up_race_retried_with_backoff(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """A 4401 before this transport's first handshake is retried with backoff, not taken as
    revocation: a connector that refused the first two dials (it did not know us yet) gets a
    third, and the transport connects."""
    connector.close_on_connect = {1: (4401, "unknown"), 2: (4401, "unknown")}
    transport = transports(clock=clock, refusal_grace_s=120)
    await asyncio.wait_for(transport.connect(), GUARD)
    with pytest.raises(RelayBroken):
        await asyncio.wait_for(transport.handshake(), GUARD)
    assert state_of(transport) is T.RECONNECTING
    for dials in (2, 3):
        delay = await next_sleep(clock)
        assert delay > 0  # backoff, never a tight loop
        clock.advance(delay)
        await eventually(lambda n=dials: connector.connections == n, what=f"dial {dials}")
    await eventually(lambda: state_of(transport) is T.CONNECTED, what="connected at last")
    assert transport.close_reason is None


async def test_an_early_4401_that_persists_past_the_grace_is_revocation(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """Refused on every dial before any handshake, the transport retries with a growing backoff
    for the grace period only, then ends revoked (and says why); a handful of dials, no more."""
    connector.secrets = {"someone-else": ["other-secret"]}
    transport = transports(
        gateway_id="gw-1",
        secret="s3cret",
        clock=clock,
        refusal_grace_s=60,
        reconnect_backoff_s=1.0,
        reconnect_max_s=30,
    )
    await asyncio.wait_for(transport.connect(), GUARD)
    with pytest.raises(RelayBroken):
        await asyncio.wait_for(transport.handshake(), GUARD)
    while state_of(transport) is T.RECONNECTING:
        before = connector.connections
        clock.advance(await next_sleep(clock))
        await eventually(
            lambda b=before: connector.connections > b or state_of(transport) is T.REVOKED,
            what="the next dial",
        )
        await eventually(lambda: state_of(transport) is not T.CONNECTING, what="dial settled")
        await eventually(
            lambda: state_of(transport) in (T.RECONNECTING, T.REVOKED), what="refused again"
        )
    assert state_of(transport) is T.REVOKED
    assert transport.close_reason is not None
    assert "before any handshake" in transport.close_reason
    assert 3 <= connector.connections <= 10
    assert clock.sleepers == 0


async def test_an_early_http_401_is_retried_within_the_grace(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """An upgrade refused with HTTP 401 before any handshake is retried with backoff while the
    grace lasts; once the connector accepts, the transport connects."""
    connector.reject_status = 401
    transport = transports(clock=clock, refusal_grace_s=120)
    with pytest.raises(RelayBroken):
        await asyncio.wait_for(transport.connect(), GUARD)
    assert state_of(transport) is T.RECONNECTING
    connector.reject_status = None
    clock.advance(await next_sleep(clock))
    await eventually(lambda: state_of(transport) is T.CONNECTED, what="connected")
    assert connector.upgrades == 2


async def test_4419_redials_at_once_with_a_fresh_token(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """A 4419 (token expired) re-dials immediately, with a newly minted token."""
    secrets = {"gw-1": ["s3cret"]}
    connector.secrets = secrets
    connector.now = clock.now

    def time_passes(number: int) -> None:
        if number == 1:
            clock.advance(400)  # the first token (ttl 300) is now expired

    connector.on_connect = time_passes
    transport = transports(
        clock=clock,
        gateway_id="gw-1",
        secret="s3cret",
        reconnect_backoff_s=100.0,
        handshake_timeout_s=10_000,
    )
    await asyncio.wait_for(transport.connect(), GUARD)
    # No clock step happens from here on: only an immediate re-dial can complete this.
    await asyncio.wait_for(transport.handshake(), GUARD)
    assert state_of(transport) is T.CONNECTED
    assert not transport.auth_revoked
    assert [c.close_code for c in connector.conns[:1]] == [4419]
    first, second = connector.authorizations
    assert first is not None
    assert second is not None
    assert first != second
    assert verify_token(token_from_header(second), secrets, now=clock.now()) == "gw-1"


async def test_legacy_4401_after_a_handshake_gets_one_immediate_redial(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """A 4401 after a successful handshake re-dials at once instead of revoking."""
    connector.close_after_handshake = {1: (4401, "revoked")}
    transport = await transports.connected(clock=clock, reconnect_backoff_s=100.0)
    await eventually(
        lambda: transport.connections == 2 and state_of(transport) is T.CONNECTED,
        what="the immediate re-dial",
    )
    assert not transport.auth_revoked
    assert connector.connections == 2


async def test_legacy_4401_again_before_the_handshake_is_revocation(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """If the one legacy re-dial is refused with 4401 too, the transport is revoked."""
    connector.close_after_handshake = {1: (4401, "revoked")}
    connector.close_on_connect = {2: (4401, "revoked")}
    transport = await transports.connected(clock=clock, reconnect_backoff_s=100.0)
    await eventually(lambda: state_of(transport) is T.REVOKED, what="revoked")
    assert transport.auth_revoked
    assert clock.sleepers == 0  # no dialer armed
    clock.advance(3600)
    await asyncio.sleep(0)
    assert connector.connections == 2


async def test_connector_restart_is_survived(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """After the connector restarts on the same port, the transport reconnects and serves."""
    transport = await transports.connected(clock=clock)
    await connector.stop()
    await eventually(lambda: state_of(transport) is not T.CONNECTED, what="the loss noticed")
    for _ in range(3):  # three re-dials, refused while the connector is down
        clock.advance(await next_sleep(clock, after=clock.monotonic()))
    await connector.start()
    clock.advance(await next_sleep(clock, after=clock.monotonic()))
    await eventually(
        lambda: state_of(transport) is T.CONNECTED and transport.connections == 2,
        what="reconnected after the restart",
    )
    result = await request(transport)
    assert result.outcome is RequestOutcome.OK


async def test_reconnect_off_unexpected_close_ends_closed(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """With reconnect=False an unexpected close ends the transport closed, without re-dialing."""
    transport = await transports.connected(reconnect=False, clock=clock)
    await connector.close_current(1011, "crash")
    await eventually(lambda: state_of(transport) is T.CLOSED, what="closed")
    assert transport.close_reason is not None
    assert clock.sleepers == 0  # no dialer armed
    clock.advance(3600)
    await asyncio.sleep(0)
    assert connector.connections == 1


# -- dormancy --------------------------------------------------------------------------------------


async def test_go_dormant_acked_closes_the_socket_without_the_terminal_path(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """An acked go_dormant closes the socket and ends dormant: not closing, not revoked."""
    transport = await transports.connected(clock=clock)
    states = record_states(transport)
    assert await asyncio.wait_for(transport.go_dormant(timeout_s=5), GUARD) is True
    assert connector.going_idle_count == 1
    assert state_of(transport) is T.DORMANT
    assert transport.auth_revoked is False
    assert transport.close_reason is None
    await asyncio.wait_for(connector.conns[0].closed.wait(), GUARD)
    assert connector.conns[0].close_code == 1000
    visited = {after for _before, after in states}
    assert T.CLOSING not in visited
    assert T.REVOKED not in visited


async def test_go_dormant_without_ack_returns_false_and_stays_connected(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """go_dormant without an ack returns False after its timeout; the transport stays connected
    and serving."""
    connector.ack_going_idle = False
    transport = await transports.connected(clock=clock)
    dormant = asyncio.ensure_future(transport.go_dormant(timeout_s=10.0))
    assert await next_sleep(clock) == pytest.approx(10.0)
    clock.advance(10.0)
    assert await asyncio.wait_for(dormant, GUARD) is False
    assert state_of(transport) is T.CONNECTED
    assert connector.conns[0].is_open
    assert (await request(transport)).success


async def test_go_dormant_when_never_connected_is_a_noop(transports: TransportFactory) -> None:
    """go_dormant on a transport that never connected returns False and changes nothing."""
    transport = transports("ws://127.0.0.1:1")
    assert await asyncio.wait_for(transport.go_dormant(timeout_s=0.1), GUARD) is False
    assert state_of(transport) is T.NEW


async def test_go_dormant_fails_pending_requests_as_unknown(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """Requests pending when the socket goes dormant end UNKNOWN at once."""
    connector.reply = Reply.never()
    transport = await transports.connected(clock=clock, request_timeout_s=1000)
    pending = asyncio.ensure_future(transport.request(SEND))
    await eventually(lambda: len(connector.unanswered) == 1, what="the request sent")
    assert await asyncio.wait_for(transport.go_dormant(timeout_s=5), GUARD)
    result = await asyncio.wait_for(pending, GUARD)
    assert result.outcome is RequestOutcome.UNKNOWN


async def test_dormant_redials_on_its_cadence_and_drains_the_buffer(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """After go_dormant the supervisor re-dials on the dormant cadence (not the long backoff);
    the connector replays its buffer, which is handled and acked, and dormancy ends."""
    seen: list[str] = []

    async def handler(event: InboundEvent) -> None:
        seen.append(event.text)

    transport = await transports.connected(
        clock=clock, reconnect_backoff_s=1000.0, reconnect_max_s=1000.0, dormant_redial_s=1.0
    )
    transport.set_inbound_handler(handler)
    assert await asyncio.wait_for(transport.go_dormant(timeout_s=5), GUARD)
    buffer_id = await connector.deliver(inbound_event("while-asleep"))
    assert buffer_id is not None  # buffered: the gateway is asleep
    assert await next_sleep(clock) == pytest.approx(1.0)
    clock.advance(1.0)
    await eventually(
        lambda: state_of(transport) is T.CONNECTED and buffer_id in connector.inbound_acks,
        what="woken and drained",
    )
    assert seen == ["while-asleep"]
    assert connector.backlog == []
    assert transport.connections == 2


async def test_a_failed_wake_dial_stays_dormant_on_the_cadence(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """A wake-up dial that fails goes back to dormant and retries on the same cadence."""
    transport = await transports.connected(
        clock=clock, reconnect_backoff_s=1000.0, reconnect_max_s=1000.0, dormant_redial_s=1.0
    )
    events = record_events(transport)
    assert await asyncio.wait_for(transport.go_dormant(timeout_s=5), GUARD)
    await connector.stop()
    for _ in range(2):
        assert await next_sleep(clock) == pytest.approx(1.0)
        dials = events.count("dial") + 1
        clock.advance(1.0)
        await eventually(counted(events, "dial", dials), what="a wake dial")
        await eventually(lambda: state_of(transport) is T.DORMANT, what="dormant again")
    await connector.start()
    assert await next_sleep(clock) == pytest.approx(1.0)
    clock.advance(1.0)
    await eventually(lambda: state_of(transport) is T.CONNECTED, what="woken")


async def test_disconnect_is_terminal_while_go_dormant_stays_armed(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """Contrast: after disconnect nothing re-dials; after go_dormant the dialer stays armed."""
    ended = await transports.connected(clock=clock, dormant_redial_s=1.0)
    await asyncio.wait_for(ended.disconnect(budget_s=1.0), GUARD)
    assert state_of(ended) is T.CLOSED
    assert clock.sleepers == 0
    clock.advance(10)
    await asyncio.sleep(0.1)
    assert connector.connections == 1

    asleep = await transports.connected(clock=clock, dormant_redial_s=1.0)
    assert await asyncio.wait_for(asleep.go_dormant(timeout_s=5), GUARD)
    assert state_of(asleep) is T.DORMANT
    assert await next_sleep(clock) == pytest.approx(1.0)
    clock.advance(1.0)
    await eventually(lambda: state_of(asleep) is T.CONNECTED, what="re-dialed")
    assert connector.connections == 3
    assert state_of(ended) is T.CLOSED


async def test_a_connector_of_another_contract_version_ends_the_transport(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """A descriptor of another contract version cannot be used and a re-dial cannot fix it: the
    handshake fails with RelayClosed, the transport ends closed naming the versions, the peer
    gets an error frame, and nothing is re-dialed however much time passes."""
    connector.descriptor = {**connector.descriptor, "contract_version": 2}
    transport = transports(clock=clock)
    await asyncio.wait_for(transport.connect(), GUARD)
    with pytest.raises(RelayClosed):
        await asyncio.wait_for(transport.handshake(), GUARD)
    assert state_of(transport) is T.CLOSED
    assert transport.close_reason is not None
    assert "contract version" in transport.close_reason
    await eventually(lambda: connector.frames_of("error") != [], what="the error frame")
    assert connector.frames_of("error")[0]["code"] == "contract_version"
    assert clock.sleepers == 0  # no supervisor waiting to re-dial
    clock.advance(3600)
    await asyncio.sleep(0)
    assert connector.connections == 1
    assert (await request(transport)).outcome is RequestOutcome.NOT_SENT


async def test_protocol_violations_are_counted_per_connection(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """Each connection starts with a clean slate: malformed frames on an earlier connection do
    not make a later one close itself after a few more."""
    connector.push_on_handshake = ["this is not json\n"] * 30  # 30 < the limit, 60 > it
    connector.descriptor = {**connector.descriptor, "features": ["error_frames"]}
    transport = await transports.connected()
    await eventually(lambda: len(connector.frames_of("error")) == 30, what="30 error frames")
    await connector.close_current(1011, "restart")
    await eventually(lambda: transport.connections == 2, what="the second handshake")
    await eventually(lambda: len(connector.frames_of("error")) == 60, what="30 more")
    assert state_of(transport) is T.CONNECTED
    assert connector.connections == 2
    assert (await request(transport)).success


async def test_a_request_while_handshaking_waits_no_longer_than_its_bounds(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """While handshaking a request waits at most the handshake timeout (or its own, if shorter)
    for the descriptor; none arriving, it is NOT_SENT and registers nothing."""
    connector.answer_hello = False
    transport = transports(clock=clock, handshake_timeout_s=5.0, request_timeout_s=30.0)
    await asyncio.wait_for(transport.connect(), GUARD)
    task = asyncio.ensure_future(transport.request(SEND))
    assert await next_sleep(clock) == pytest.approx(5.0)
    clock.advance(5.0)
    result = await asyncio.wait_for(task, GUARD)
    assert result.outcome is RequestOutcome.NOT_SENT
    assert len(transport._pending) == 0
    assert outbound_count(connector) == 0
    shorter = asyncio.ensure_future(transport.request(SEND, timeout_s=2.0))
    assert await next_sleep(clock, after=clock.monotonic()) == pytest.approx(2.0)
    clock.advance(2.0)
    assert (await asyncio.wait_for(shorter, GUARD)).outcome is RequestOutcome.NOT_SENT


async def test_a_transport_going_idle_still_serves_requests(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """While going_idle waits for its ack, requests are sent and answered as usual."""
    connector.ack_going_idle = False
    transport = await transports.connected(clock=clock)
    idle = asyncio.ensure_future(transport.go_idle(timeout_s=30.0))
    await eventually(lambda: state_of(transport) is T.GOING_IDLE, what="going idle")
    result = await request(transport)
    assert result.outcome is RequestOutcome.OK
    assert outbound_count(connector) == 1
    await next_sleep(clock)
    clock.advance(30.0)
    assert await asyncio.wait_for(idle, GUARD) is False
    assert state_of(transport) is T.CONNECTED

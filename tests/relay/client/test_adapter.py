"""RelayAdapter over a live transport and over stand-in transports (transport.md, "Adapter"):
connecting, going idle on disconnect with the remaining budget, dormancy, typed send results
and the per-chat tenant route attached to outbound metadata."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from relay.client.adapter import RelayAdapter
from relay.client.lifecycle import TransportState as T
from relay.client.requests import RequestOutcome, RequestResult
from relay.client.teardown import DISCONNECT_TIMEOUT_ENV, default_disconnect_budget_s
from relay.wire.descriptor import CONTRACT_VERSION, CapabilityDescriptor
from relay.wire.errors import RelayBroken
from relay.wire.frames import InboundEvent
from statecore import ErrorKind, LedgerPolicy
from statecore.clock import Deadline, FakeClock
from statecore.gateway.adapter import SendResult
from tests.relay.client.connector_stub import (
    Reply,
    StubConnector,
    TransportFactory,
    eventually,
    inbound_event,
    next_sleep,
    state_of,
)

pytestmark = pytest.mark.asyncio

GUARD = 5.0

PLACEHOLDER = CapabilityDescriptor(
    contract_version=CONTRACT_VERSION,
    platform="discord",
    label="Relay",
    max_message_length=4096,
    supports_draft_streaming=False,
    supports_edit=True,
    supports_threads=False,
    markdown_dialect="plain",
    len_unit="chars",
)

Handler = Callable[[InboundEvent], Awaitable[None]]


class StubTransport:
    """A transport double: connects at once, goes idle and dormant on request, records calls."""

    platform = "loopback"

    def __init__(self) -> None:
        self.handler: Handler | None = None
        self.state = T.NEW
        self.listeners: list[Callable[[T, T, str], None]] = []
        self.calls: list[str] = []
        self.go_idle_timeout: float | None = None
        self.budget_s: float | None = None

    async def connect(self) -> None:
        self.state = T.HANDSHAKING

    async def handshake(self) -> CapabilityDescriptor:
        self.state = T.CONNECTED
        return PLACEHOLDER

    def set_inbound_handler(self, handler: Handler | None) -> None:
        self.handler = handler

    async def request(
        self, action: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> RequestResult:
        self.calls.append("request")
        return RequestResult(RequestOutcome.OK, "r1", "m1")

    async def go_idle(self, timeout_s: float = 10.0) -> bool:
        self.calls.append("go_idle")
        self.go_idle_timeout = timeout_s
        return True

    async def go_dormant(self, timeout_s: float = 10.0) -> bool:
        self.calls.append("go_dormant")
        return False

    async def disconnect(self, budget_s: float | None = None) -> None:
        self.calls.append("disconnect")
        self.budget_s = budget_s
        self.state = T.CLOSED


class BudgetTransport(StubTransport):
    """Its go_idle spends time first (to see that the disconnect budget shrinks by it)."""

    def __init__(self, spend: Callable[[], Awaitable[None]]) -> None:
        super().__init__()
        self.spend = spend

    async def go_idle(self, timeout_s: float = 10.0) -> bool:
        await super().go_idle(timeout_s)
        await self.spend()
        return True


def adapter_for(transport: Any, **kwargs: Any) -> RelayAdapter:
    """A RelayAdapter with the test placeholder."""
    return RelayAdapter(transport, placeholder=PLACEHOLDER, **kwargs)


# -- connecting ------------------------------------------------------------------------------------


async def test_connect_as_reconnect_is_accepted_and_adopts_the_descriptor(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """connect(is_reconnect=True) connects normally and adopts the connector's descriptor."""
    adapter = adapter_for(transports())
    assert adapter.descriptor is PLACEHOLDER
    assert await asyncio.wait_for(adapter.connect(is_reconnect=True), GUARD) is True
    assert adapter.connected
    assert adapter.descriptor.label == "Discord"
    assert adapter.descriptor.max_message_length == 2000
    assert connector.connections == 1


@pytest.mark.parametrize("reconnect", [True, False])
async def test_connect_returns_false_when_the_connector_is_unreachable(
    transports: TransportFactory, reconnect: bool
) -> None:
    """connect() returns False (never raises) when nothing listens at the connector's address."""
    gone = StubConnector()
    await gone.start()
    await gone.stop()
    adapter = adapter_for(transports(gone.url, reconnect=reconnect))
    assert await asyncio.wait_for(adapter.connect(), GUARD) is False
    assert not adapter.connected
    assert adapter.descriptor is PLACEHOLDER


async def test_connect_returns_false_when_credentials_are_refused(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """connect() returns False when the connector revokes the credentials (no grace for a
    start-up race configured, so the first refusal is final)."""
    connector.close_on_connect = {1: (4401, "unknown gateway")}
    transport = transports(refusal_grace_s=0)
    adapter = adapter_for(transport)
    assert await asyncio.wait_for(adapter.connect(), GUARD) is False
    assert state_of(transport) is T.REVOKED


# -- disconnect ------------------------------------------------------------------------------------


async def test_disconnect_emits_going_idle_then_tears_down(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """disconnect() sends going_idle on the live socket, then closes the transport."""
    transport = transports(clock=clock)
    adapter = adapter_for(transport)
    assert await asyncio.wait_for(adapter.connect(), GUARD)
    await asyncio.wait_for(adapter.disconnect(budget_s=3.0), GUARD)
    assert connector.going_idle_count == 1
    conn = connector.conns[0]
    assert conn.frames[-1]["type"] == "going_idle"
    await asyncio.wait_for(conn.closed.wait(), GUARD)
    assert (conn.close_code, conn.close_reason) == (1000, "disconnect")
    assert state_of(transport) is T.CLOSED
    assert not adapter.connected
    assert clock.sleepers == 0  # no dialer armed
    clock.advance(3600)
    await asyncio.sleep(0)
    assert connector.connections == 1


async def test_disconnect_threads_the_remaining_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The transport's disconnect gets a budget_s, no more than the full budget, minus go_idle."""
    monkeypatch.delenv(DISCONNECT_TIMEOUT_ENV, raising=False)

    async def spend() -> None:
        await asyncio.sleep(0.05)

    transport = BudgetTransport(spend)
    await asyncio.wait_for(adapter_for(transport).disconnect(), GUARD)
    full = default_disconnect_budget_s()
    assert transport.calls == ["go_idle", "disconnect"]
    assert transport.budget_s is not None
    assert transport.budget_s <= full
    assert transport.budget_s < full


@pytest.mark.parametrize("how", ["budget_s", "deadline"])
async def test_disconnect_subtracts_exactly_what_going_idle_spent(how: str) -> None:
    """On the adapter's clock, the transport gets the budget minus the time going_idle took."""
    clock = FakeClock()

    async def spend() -> None:
        clock.advance(1.5)

    transport = BudgetTransport(spend)
    adapter = adapter_for(transport, clock=clock)
    if how == "deadline":
        await asyncio.wait_for(adapter.disconnect(deadline=Deadline.after(clock, 4.0)), GUARD)
    else:
        await asyncio.wait_for(adapter.disconnect(budget_s=4.0), GUARD)
    assert transport.go_idle_timeout == pytest.approx(4.0)
    assert transport.budget_s == pytest.approx(2.5)


async def test_disconnect_with_an_exhausted_budget_passes_zero() -> None:
    """When going_idle used up the budget, the transport is still torn down, with budget 0."""
    clock = FakeClock()

    async def spend() -> None:
        clock.advance(10.0)

    transport = BudgetTransport(spend)
    await asyncio.wait_for(adapter_for(transport, clock=clock).disconnect(budget_s=2.0), GUARD)
    assert transport.calls == ["go_idle", "disconnect"]
    assert transport.budget_s == 0.0


async def test_failing_go_idle_still_tears_the_transport_down() -> None:
    """A go_idle that raises is logged; the transport is still disconnected with a budget."""

    async def spend() -> None:
        raise ConnectionError("socket gone")

    transport = BudgetTransport(spend)
    await asyncio.wait_for(adapter_for(transport).disconnect(budget_s=2.0), GUARD)
    assert transport.calls == ["go_idle", "disconnect"]
    assert transport.budget_s is not None
    assert 0.0 < transport.budget_s <= 2.0


async def test_a_stub_transport_is_connected_by_its_state_alone() -> None:
    """The adapter reads connectedness from the transport's state (no flag of its own): up
    after the handshake, down once the transport is torn down."""
    transport = StubTransport()
    adapter = adapter_for(transport)
    assert not adapter.connected
    assert await adapter.connect()
    assert adapter.connected
    await asyncio.wait_for(adapter.disconnect(budget_s=1.0), GUARD)
    assert transport.calls == ["go_idle", "disconnect"]
    assert not adapter.connected


# -- dormancy --------------------------------------------------------------------------------------


async def test_go_dormant_delegates_to_the_transport(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """go_dormant() drives the transport dormant (going_idle + close) without closing it."""
    transport = transports(clock=clock, dormant_redial_s=60.0)
    states: list[T] = []
    transport.listeners.append(lambda _b, after, _e: states.append(after))
    adapter = adapter_for(transport)
    assert await asyncio.wait_for(adapter.connect(), GUARD)
    assert await asyncio.wait_for(adapter.go_dormant(), GUARD) is True
    assert connector.going_idle_count == 1
    assert state_of(transport) is T.DORMANT
    assert T.CLOSING not in states
    assert not transport.auth_revoked
    assert await next_sleep(clock) == pytest.approx(60.0)  # the dialer stays armed


async def test_go_dormant_is_false_when_the_transport_raises() -> None:
    """A transport whose go_dormant raises gives False instead of an exception."""

    class Raising(StubTransport):
        async def go_dormant(self) -> bool:
            raise RuntimeError("boom")

    assert await adapter_for(Raising()).go_dormant() is False


async def test_go_dormant_is_false_when_not_connected(transports: TransportFactory) -> None:
    """go_dormant() over a transport that never connected returns False."""
    transport = transports()
    assert await asyncio.wait_for(adapter_for(transport).go_dormant(), GUARD) is False
    assert state_of(transport) is T.NEW


# -- sending ---------------------------------------------------------------------------------------


async def connected_adapter(transports: TransportFactory, **overrides: Any) -> RelayAdapter:
    """An adapter whose transport completed its handshake."""
    adapter = adapter_for(transports(**overrides))
    assert await asyncio.wait_for(adapter.connect(), GUARD)
    return adapter


async def test_send_success_returns_the_message_id(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """An acknowledged send is a SendResult success with the platform's message_id."""
    connector.reply = Reply.ok("m-123")
    adapter = await connected_adapter(transports)
    result = await asyncio.wait_for(adapter.send("c1", "hi there"), GUARD)
    assert result == SendResult.ok("m-123")
    action = connector.frames_of("outbound")[0]["action"]
    # The contract's body field is ``content`` (an original connector refuses a send without it).
    assert (action["op"], action["chat_id"], action["content"]) == ("send", "c1", "hi there")
    assert "text" not in action


@pytest.mark.parametrize(
    "reply",
    [Reply.failed("chat not found", "not_found"), Reply.declined()],
    ids=["failed", "declined"],
)
async def test_send_refusal_is_a_definite_failure(
    connector: StubConnector, transports: TransportFactory, reply: Reply
) -> None:
    """A failure or a tenant-guard refusal is a definite (not ambiguous) failed SendResult."""
    connector.reply = reply
    adapter = await connected_adapter(transports)
    result = await asyncio.wait_for(adapter.send("c1", "hi"), GUARD)
    assert not result.success
    assert not result.ambiguous
    assert result.error is not None
    assert reply.error is not None
    assert result.error.endswith(reply.error)
    # Both refusals ("chat not found", the tenant guard) are final for the ledger: the tenant
    # guard's by its kind, the platform's untyped text by the policy's reading of it.
    if result.kind is None:
        assert LedgerPolicy().classify(result.error) is ErrorKind.PERMANENT
    else:
        assert result.kind is ErrorKind.PERMANENT


async def test_a_tenant_guard_refusal_is_typed_permanent(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """The connector's definite refusal reaches the ledger as a kind, not as text to match."""
    connector.reply = Reply.declined()
    adapter = await connected_adapter(transports)
    result = await asyncio.wait_for(adapter.send("c1", "hi"), GUARD)
    assert (result.kind, result.ambiguous) == (ErrorKind.PERMANENT, False)


async def test_a_rate_limited_result_code_is_typed(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A platform failure whose code is known carries its kind whatever its text says."""
    connector.reply = Reply.failed("slow down please", "rate_limited")
    adapter = await connected_adapter(transports)
    result = await asyncio.wait_for(adapter.send("c1", "hi"), GUARD)
    assert (result.kind, result.error) == (ErrorKind.RATE_LIMITED, "slow down please")


async def test_send_timeout_is_ambiguous(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """A send whose result never comes is an ambiguous failure after the request timeout."""
    connector.reply = Reply.never()
    adapter = await connected_adapter(transports, clock=clock, request_timeout_s=30.0)
    task = asyncio.ensure_future(adapter.send("c1", "hi"))
    assert await next_sleep(clock) == pytest.approx(30.0)
    clock.advance(30.0)
    result = await asyncio.wait_for(task, GUARD)
    assert not result.success
    assert result.ambiguous
    assert result.kind is None  # the ledger keeps it transient: it may have gone out


async def test_send_when_not_connected_is_a_definite_failure(transports: TransportFactory) -> None:
    """A send that could not leave is a definite failure (a retry cannot duplicate it)."""
    adapter = adapter_for(transports())
    result = await asyncio.wait_for(adapter.send("c1", "hi"), GUARD)
    assert not result.success
    assert not result.ambiguous
    assert result.kind is ErrorKind.RECONNECT  # resent as soon as the relay is back


async def test_send_carries_idempotency_key_thread_and_reply_to(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """metadata idempotency_key, thread_id and reply_to reach the outbound frame."""
    adapter = await connected_adapter(transports)
    metadata = {"idempotency_key": "k-9", "thread_id": "t-1", "reply_to": "m-0"}
    assert (await asyncio.wait_for(adapter.send("c1", "hi", metadata), GUARD)).success
    frame = connector.frames_of("outbound")[0]
    assert frame["idempotencyKey"] == "k-9"
    assert (frame["action"]["thread_id"], frame["action"]["reply_to"]) == ("t-1", "m-0")


# -- the tenant route ------------------------------------------------------------------------------


async def test_route_learned_from_inbound_is_attached_to_outbound_metadata(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """scope_id/user_id seen on a chat's inbound are sent as that chat's outbound metadata."""
    adapter = await connected_adapter(transports)
    seen: list[InboundEvent] = []

    async def on_message(event: InboundEvent) -> None:
        seen.append(event)

    adapter.on_message(on_message)
    await connector.push_inbound(
        inbound_event("hi", chat_id="C123", chat_type="group", scope_id="G777", user_id="U9")
    )
    await connector.push_inbound(inbound_event("later", chat_id="C123", chat_type="group"))
    await eventually(lambda: len(seen) == 2, what="both events handled")
    assert await adapter.send("C123", "reply")
    assert await adapter.send("C999", "elsewhere")
    assert await adapter.send("C123", "override", {"scope_id": "G1"})
    sent = [f["action"]["metadata"] for f in connector.frames_of("outbound")]
    assert sent == [
        {"scope_id": "G777", "user_id": "U9"},  # kept though the later event had no scope
        {},
        {"scope_id": "G1", "user_id": "U9"},
    ]


@pytest.mark.parametrize(
    "origin",
    [
        {"chat_id": "C123", "scope_id": "G777", "user_id": "U9"},
        SimpleNamespace(chat_id="C123", scope_id="G777", user_id="U9"),
    ],
    ids=["mapping", "object"],
)
async def test_prime_from_a_persisted_origin_after_a_restart(
    connector: StubConnector, transports: TransportFactory, origin: object
) -> None:
    """A fresh adapter primed from a persisted routing origin attaches its scope and user."""
    adapter = await connected_adapter(transports)  # a "restarted" gateway: nothing learned yet
    adapter.prime(origin)
    adapter.prime({"scope_id": "ignored"})  # no chat_id: nothing to prime
    assert await adapter.send("C123", "recovered reply")
    frame = connector.frames_of("outbound")[0]
    assert frame["action"]["metadata"] == {"scope_id": "G777", "user_id": "U9"}


async def test_connect_returns_within_bounds_when_handshake_is_slow(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """connect() gives up with False once the handshake timeout passes."""
    connector.answer_hello = False
    adapter = adapter_for(transports(handshake_timeout_s=20.0, clock=clock))
    connecting = asyncio.ensure_future(adapter.connect())
    assert await next_sleep(clock) == pytest.approx(20.0)
    clock.advance(20.0)
    assert await asyncio.wait_for(connecting, GUARD) is False


@pytest.mark.asyncio
async def test_a_failed_connect_logs_the_connectors_text_escaped_on_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A connect that fails with text the connector chose (a close reason) is logged as one
    line, its control characters escaped: nothing it sends can forge a log record."""

    class Refused(StubTransport):
        async def connect(self) -> None:
            raise RelayBroken("closed: bye\nCRITICAL statecore.ledger: forged\x1b[2J")

    caplog.set_level(logging.WARNING, logger="relay.client.adapter")
    adapter = RelayAdapter(Refused())
    assert await adapter.connect() is False
    [record] = [r for r in caplog.records if "connect failed" in r.getMessage()]
    message = record.getMessage()
    assert "\n" not in message
    assert "\x1b" not in message
    assert "forged" in message  # still said, escaped

"""Teardown of the relay transport within a budget (transport.md, "Teardown with a budget"):
the drain-grace clamp and its environment fallback, closing before draining, cancellation-safe
failure of pending requests, idempotent disconnect, and a budget that holds against a stalled
connector."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from relay.client.lifecycle import TransportState as T
from relay.client.requests import RequestOutcome, RequestResult
from relay.client.teardown import (
    DISCONNECT_TIMEOUT_ENV,
    MAX_DRAIN_GRACE_S,
    TEARDOWN_AWAIT_S,
    TEARDOWN_AWAITS,
    default_disconnect_budget_s,
    drain_grace_s,
)
from statecore.clock import FakeClock
from tests.relay.client.connector_stub import (
    FaultProxy,
    Reply,
    StubConnector,
    TransportFactory,
    eventually,
    state_of,
)

SEND = {"op": "send", "chat_id": "c1", "content": "hello"}
GUARD = 5.0
RESERVED = TEARDOWN_AWAITS * TEARDOWN_AWAIT_S + 0.5


# -- the drain-grace clamp -------------------------------------------------------------------------


def test_env_variable_name_is_pinned() -> None:
    """The disconnect budget is read from STATECORE_ADAPTER_DISCONNECT_TIMEOUT."""
    assert DISCONNECT_TIMEOUT_ENV == "STATECORE_ADAPTER_DISCONNECT_TIMEOUT"


def test_reserve_counts_every_bounded_teardown_await() -> None:
    """The reserve covers the four bounded awaits: supervisor, socket close, reader, dispatcher."""
    assert TEARDOWN_AWAITS >= 4
    assert TEARDOWN_AWAIT_S > 0
    assert MAX_DRAIN_GRACE_S == 5.0


def test_drain_grace_is_the_surplus_of_an_explicit_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """grace = max(0, min(cap, budget - reserved)): plenty caps, reserved or less gives zero."""
    monkeypatch.delenv(DISCONNECT_TIMEOUT_ENV, raising=False)
    assert drain_grace_s(100.0) == MAX_DRAIN_GRACE_S
    assert drain_grace_s(RESERVED + MAX_DRAIN_GRACE_S) == pytest.approx(MAX_DRAIN_GRACE_S)
    assert drain_grace_s(RESERVED) == 0.0
    assert drain_grace_s(0.0) == 0.0
    assert drain_grace_s(RESERVED - 0.1) == 0.0
    assert drain_grace_s(-3.0) == 0.0
    assert drain_grace_s(RESERVED + 1.0) == pytest.approx(1.0)
    assert drain_grace_s(RESERVED + 0.25) == pytest.approx(0.25)


def test_explicit_budget_overrides_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A threaded budget wins over the environment default."""
    monkeypatch.setenv(DISCONNECT_TIMEOUT_ENV, "100")
    assert drain_grace_s(RESERVED) == 0.0
    assert drain_grace_s(RESERVED + 1.0) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("raw", "budget"),
    [
        ("10", 10.0),
        ("6", 6.0),
        ("4.75", 4.75),
        ("abc", 5.0),
        ("", 5.0),
        ("nan", 5.0),
        ("inf", 5.0),
        ("-3", 0.0),
        ("0", 0.0),
    ],
)
def test_drain_grace_falls_back_to_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str, budget: float
) -> None:
    """No budget: the environment's (invalid -> 5, negative -> 0) is clamped the same way."""
    monkeypatch.setenv(DISCONNECT_TIMEOUT_ENV, raw)
    assert default_disconnect_budget_s() == budget
    expected = max(0.0, min(MAX_DRAIN_GRACE_S, budget - RESERVED))
    assert drain_grace_s() == pytest.approx(expected)
    assert drain_grace_s() >= 0.0


def test_unset_environment_gives_the_default_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset, the budget is 5 s and the grace what it leaves after the reserve."""
    monkeypatch.delenv(DISCONNECT_TIMEOUT_ENV, raising=False)
    assert default_disconnect_budget_s() == 5.0
    assert drain_grace_s() == pytest.approx(max(0.0, min(MAX_DRAIN_GRACE_S, 5.0 - RESERVED)))
    assert drain_grace_s(None) == drain_grace_s()
    # A budget that is not a finite number falls back to the default budget's grace.
    assert drain_grace_s(math.inf) == pytest.approx(drain_grace_s(5.0))
    assert drain_grace_s(math.nan) == pytest.approx(drain_grace_s(5.0))


# -- disconnect ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_disconnect_enters_closing_first_so_racing_requests_fail_fast(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """Requests made once disconnect started fail at once with NOT_SENT and send nothing."""
    connector.reply = Reply.never()
    transport = await transports.connected(request_timeout_s=10.0)
    inflight = asyncio.ensure_future(transport.request(SEND))
    await eventually(lambda: len(connector.unanswered) == 1, what="the in-flight request")
    raced: list[asyncio.Future[RequestResult]] = []

    def race(_before: T, after: T, _event: str) -> None:
        if after is T.CLOSING:
            raced.append(asyncio.ensure_future(transport.request(SEND)))

    transport.listeners.append(race)
    closer = asyncio.ensure_future(transport.disconnect(budget_s=RESERVED + 0.5))
    await asyncio.sleep(0)
    assert state_of(transport) is T.CLOSING
    direct = await asyncio.wait_for(transport.request(SEND), 0.2)
    racing = await asyncio.wait_for(raced[0], 0.2)
    assert not closer.done()  # both returned while the drain was still running
    for result in (direct, racing):
        assert result.outcome is RequestOutcome.NOT_SENT
        assert result.request_id is None
        assert result.error is not None
        assert "closed" in result.error
    await asyncio.wait_for(closer, GUARD)
    assert len(connector.frames_of("outbound")) == 1
    drained = await asyncio.wait_for(inflight, GUARD)
    assert drained.outcome is RequestOutcome.UNKNOWN
    assert state_of(transport) is T.CLOSED


@pytest.mark.asyncio
async def test_cancelled_disconnect_still_fails_every_pending_request(
    connector: StubConnector, clock: FakeClock, transports: TransportFactory
) -> None:
    """A disconnect cancelled mid-drain still fails every pending request promptly."""
    connector.reply = Reply.never()
    # The fake clock never moves: the requests' own timeout can never end them.
    transport = await transports.connected(clock=clock, request_timeout_s=1000.0)
    pending = [asyncio.ensure_future(transport.request(SEND)) for _ in range(3)]
    await eventually(lambda: len(connector.unanswered) == 3, what="three requests sent")
    closer = asyncio.ensure_future(transport.disconnect(budget_s=60.0))
    await asyncio.sleep(0.05)
    assert state_of(transport) is T.CLOSING
    assert not closer.done()  # inside the drain
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer
    results = await asyncio.wait_for(asyncio.gather(*pending), 1.0)
    for result in results:
        assert result.outcome is RequestOutcome.UNKNOWN
        assert result.error is not None
        assert "closed" in result.error
    assert state_of(transport) is T.CLOSED
    await asyncio.wait_for(connector.conns[0].closed.wait(), GUARD)
    again = await asyncio.wait_for(transport.request(SEND), 0.5)
    assert again.outcome is RequestOutcome.NOT_SENT


@pytest.mark.asyncio
async def test_disconnect_twice_is_a_safe_noop(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A second disconnect after the first finished returns at once and changes nothing."""
    transport = await transports.connected()
    states: list[T] = []
    transport.listeners.append(lambda _b, after, _e: states.append(after))
    await asyncio.wait_for(transport.disconnect(budget_s=1.0), GUARD)
    started = time.monotonic()
    await asyncio.wait_for(transport.disconnect(budget_s=1.0), GUARD)
    await asyncio.wait_for(transport.disconnect(), GUARD)
    assert time.monotonic() - started < 0.5
    assert state_of(transport) is T.CLOSED
    assert states == [T.CLOSING, T.CLOSED]
    assert transport.close_reason == "disconnected"


@pytest.mark.asyncio
async def test_concurrent_second_disconnect_waits_for_the_first(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A disconnect called while another is draining returns only once teardown finished."""
    connector.reply = Reply.never()
    transport = await transports.connected(request_timeout_s=10.0)
    inflight = asyncio.ensure_future(transport.request(SEND))
    await eventually(lambda: len(connector.unanswered) == 1, what="the in-flight request")
    first = asyncio.ensure_future(transport.disconnect(budget_s=RESERVED + 0.4))
    await asyncio.sleep(0)
    assert state_of(transport) is T.CLOSING
    started = time.monotonic()
    await asyncio.wait_for(transport.disconnect(budget_s=1.0), GUARD)
    assert time.monotonic() - started >= 0.2  # it waited for the first one's drain
    assert first.done()
    assert state_of(transport) is T.CLOSED
    await first
    assert (await asyncio.wait_for(inflight, GUARD)).outcome is RequestOutcome.UNKNOWN


@pytest.mark.asyncio
async def test_disconnect_of_a_never_connected_transport_closes_it(
    transports: TransportFactory,
) -> None:
    """disconnect() on a new transport ends it closed without dialing."""
    transport = transports()
    await asyncio.wait_for(transport.disconnect(), GUARD)
    assert state_of(transport) is T.CLOSED
    assert transport.connections == 0


@pytest.mark.asyncio
async def test_in_flight_request_gets_the_grace_to_finish(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A request answered within the drain grace completes normally during disconnect."""
    connector.reply = Reply.ok("m-drained", delay_s=0.3)
    transport = await transports.connected(request_timeout_s=10.0)
    inflight = asyncio.ensure_future(transport.request(SEND))
    await eventually(lambda: len(connector.frames_of("outbound")) == 1, what="the request sent")
    started = time.monotonic()
    await asyncio.wait_for(transport.disconnect(budget_s=RESERVED + 2.0), GUARD)
    elapsed = time.monotonic() - started
    result = await asyncio.wait_for(inflight, GUARD)
    assert (result.outcome, result.message_id) == (RequestOutcome.OK, "m-drained")
    assert 0.2 <= elapsed < 1.5  # waited for the answer, not for the whole grace


@pytest.mark.asyncio
async def test_in_flight_request_beyond_the_grace_is_unknown(
    connector: StubConnector, transports: TransportFactory
) -> None:
    """A request still unanswered when the grace runs out ends UNKNOWN ("closed")."""
    connector.reply = Reply.ok(delay_s=5.0)
    transport = await transports.connected(request_timeout_s=10.0)
    inflight = asyncio.ensure_future(transport.request(SEND))
    await eventually(lambda: len(connector.frames_of("outbound")) == 1, what="the request sent")
    started = time.monotonic()
    await asyncio.wait_for(transport.disconnect(budget_s=RESERVED + 0.3), GUARD)
    elapsed = time.monotonic() - started
    result = await asyncio.wait_for(inflight, 0.5)
    assert result.outcome is RequestOutcome.UNKNOWN
    assert result.error is not None
    assert "closed" in result.error
    assert 0.25 <= elapsed < 2.0


@pytest.mark.asyncio
@pytest.mark.parametrize(("raw", "window"), [("0", (0.0, 0.8)), ("4.8", (0.25, 2.0))])
async def test_disconnect_without_budget_uses_the_environment_default(
    connector: StubConnector,
    transports: TransportFactory,
    monkeypatch: pytest.MonkeyPatch,
    raw: str,
    window: tuple[float, float],
) -> None:
    """disconnect() with no budget drains for the grace the environment's budget leaves."""
    monkeypatch.setenv(DISCONNECT_TIMEOUT_ENV, raw)
    connector.reply = Reply.never()
    transport = await transports.connected(request_timeout_s=10.0)
    inflight = asyncio.ensure_future(transport.request(SEND))
    await eventually(lambda: len(connector.unanswered) == 1, what="the request sent")
    started = time.monotonic()
    await asyncio.wait_for(transport.disconnect(), GUARD)
    elapsed = time.monotonic() - started
    least, most = window
    assert least <= elapsed < most
    assert (await asyncio.wait_for(inflight, 0.5)).outcome is RequestOutcome.UNKNOWN
    assert state_of(transport) is T.CLOSED


@pytest.mark.asyncio
@pytest.mark.parametrize("budget", [0.5, 2.0])
async def test_disconnect_with_a_stalled_connector_stays_within_its_budget(
    connector: StubConnector, proxy: FaultProxy, transports: TransportFactory, budget: float
) -> None:
    """Against a connector that stopped answering (even the close), disconnect keeps its budget."""
    connector.reply = Reply.never()
    transport = await transports.connected(proxy.url, request_timeout_s=10.0)
    inflight = asyncio.ensure_future(transport.request(SEND))
    await eventually(lambda: len(connector.unanswered) == 1, what="the request sent")
    proxy.stall()
    started = time.monotonic()
    await asyncio.wait_for(transport.disconnect(budget_s=budget), GUARD)
    elapsed = time.monotonic() - started
    assert elapsed <= budget + 0.3
    assert state_of(transport) is T.CLOSED
    result = await asyncio.wait_for(inflight, 0.5)
    assert result.outcome is RequestOutcome.UNKNOWN

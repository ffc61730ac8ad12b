"""What the transport tells an operator about its connection: a loss, a first connection, a
reconnection (how long it was down, after how many dials) and a wake-up from dormancy (how long
it slept) are logged at INFO with ``extra`` fields, and reconnections and wake-ups are reported
to the metrics hook.  Time is a FakeClock's; the connector is a live in-process one."""

from __future__ import annotations

import asyncio
import logging

import pytest

from relay.client.lifecycle import TransportState as T
from relay.client.transport import WebSocketRelayTransport
from statecore.clock import FakeClock
from tests.recording_metrics import RecordingMetrics
from tests.relay.client.connector_stub import (
    StubConnector,
    TransportFactory,
    eventually,
    next_sleep,
    state_of,
)

pytestmark = pytest.mark.asyncio

GUARD = 3.0
REDIAL_LOGGER = "relay.client.redial"


def lines(caplog: pytest.LogCaptureFixture, start: str) -> list[logging.LogRecord]:
    """The redial logger's records whose message (after the URL) starts with ``start``."""
    return [
        r
        for r in caplog.records
        if r.name == REDIAL_LOGGER and r.getMessage().split(": ", 1)[-1].startswith(start)
    ]


def dials(transport: WebSocketRelayTransport) -> list[str]:
    """Record every lifecycle event of ``transport``; the list fills as they happen."""
    events: list[str] = []
    transport.listeners.append(lambda _before, _after, event: events.append(event))
    return events


async def test_a_reconnection_is_logged_at_info_with_its_downtime_and_dials_and_counted(
    connector: StubConnector,
    clock: FakeClock,
    transports: TransportFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first connection is logged (attempt 1) and not counted as a reconnection; a loss is
    logged; after two failed re-dials the third reconnects: one INFO line saying so with the
    time it was down (on the transport's clock) and the attempt, and one metrics.reconnect."""
    metrics = RecordingMetrics()
    caplog.set_level(logging.INFO, logger=REDIAL_LOGGER)
    transport = await transports.connected(
        clock=clock, metrics=metrics, reconnect_backoff_s=1.0, reconnect_max_s=1.0
    )
    [first] = lines(caplog, "connected")
    assert first.__dict__["relay_url"] == transport.url
    assert first.__dict__["attempt"] == 1
    assert metrics.of("reconnect") == []

    events = dials(transport)
    lost_at = clock.monotonic()
    await connector.stop()
    await eventually(lambda: state_of(transport) is T.RECONNECTING, what="reconnecting")
    [lost] = lines(caplog, "connection lost")
    assert lost.levelno == logging.INFO
    assert lost.__dict__["close_code"] == 1001
    for failed in (1, 2):
        clock.advance(await next_sleep(clock))
        await eventually(lambda n=failed: events.count("dial") == n, what=f"dial {failed}")
        await eventually(lambda: state_of(transport) is T.RECONNECTING, what="still down")
    await connector.start()
    clock.advance(await next_sleep(clock))
    await eventually(lambda: state_of(transport) is T.CONNECTED, what="reconnected")

    [back] = lines(caplog, "reconnected after")
    assert back.levelno == logging.INFO
    assert back.__dict__["relay_url"] == transport.url
    assert back.__dict__["attempt"] == events.count("dial") == 3
    assert back.__dict__["down_s"] == pytest.approx(clock.monotonic() - lost_at)
    assert "(attempt 3)" in back.getMessage()
    assert metrics.of("reconnect") == [(transport.url,)]
    assert metrics.of("dormant") == []


async def test_a_wake_from_dormancy_is_logged_with_how_long_it_slept_and_reported(
    connector: StubConnector,
    clock: FakeClock,
    transports: TransportFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A transport that went dormant and woke on its cadence logs "woke after 2.0 s dormant"
    and reports dormant(url, 2.0); a wake-up is not a reconnection."""
    metrics = RecordingMetrics()
    caplog.set_level(logging.INFO, logger=REDIAL_LOGGER)
    transport = await transports.connected(
        clock=clock,
        metrics=metrics,
        reconnect_backoff_s=1000.0,
        reconnect_max_s=1000.0,
        dormant_redial_s=2.0,
    )
    assert await asyncio.wait_for(transport.go_dormant(timeout_s=5), GUARD)
    assert await next_sleep(clock) == pytest.approx(2.0)
    clock.advance(2.0)
    await eventually(lambda: state_of(transport) is T.CONNECTED, what="woken")

    [woke] = lines(caplog, "woke after")
    assert woke.levelno == logging.INFO
    assert woke.__dict__["dormant_s"] == pytest.approx(2.0)
    assert woke.__dict__["relay_url"] == transport.url
    assert "woke after 2.0 s dormant" in woke.getMessage()
    assert metrics.of("dormant") == [(transport.url, pytest.approx(2.0))]
    assert metrics.of("reconnect") == []
    assert lines(caplog, "reconnected") == []

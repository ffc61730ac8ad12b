"""What the gateway runtime tells an operator: one INFO line per startup recovery, with its
counts and duration as ``extra`` fields, and the metrics hook handed to its ledger."""

from __future__ import annotations

import asyncio
import logging

import pytest

from statecore.gateway import Gateway
from statecore.lifecycles import ObligationState
from statecore.metrics import Outcome
from statecore.store import Store
from tests.recording_metrics import RecordingMetrics
from tests.statecore.gateway.gateway_rig import (
    BOUND,
    PROBE,
    SLACK,
    FakeAdapter,
    FakeSessions,
    Rig,
    owe,
    reply,
    row,
)
from tests.waiting import eventually

_O = ObligationState
RUNTIME_LOGGER = "statecore.gateway.runtime"


def recovery_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The recovery records logged so far."""
    return [r for r in caplog.records if "recovery" in r.__dict__]


@pytest.mark.asyncio
async def test_a_startup_recovery_is_logged_once_at_info_with_its_counts(
    rig: Rig, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A start that resends what a dead owner owed (one reply never sent, one that may have
    been) logs exactly one INFO line once the resends are done: claimed 2, delivered 2,
    labelled 1, with its duration."""
    plain = owe(store, message_ref="m1", content="never sent")
    maybe = owe(store, message_ref="m2", content="maybe sent", state=_O.ATTEMPTING)
    adapter = FakeAdapter()
    gateway = rig.gateway()
    gateway.add_adapter(SLACK, adapter)
    with caplog.at_level(logging.INFO, logger=RUNTIME_LOGGER):
        assert await asyncio.wait_for(gateway.start(), BOUND) == 2
        await eventually(lambda: bool(recovery_lines(caplog)), "the recovery line")
    [line] = recovery_lines(caplog)
    assert line.name == RUNTIME_LOGGER
    assert line.levelno == logging.INFO
    fields = {k: line.__dict__[k] for k in ("recovery", "claimed", "delivered", "labelled")}
    assert fields == {"recovery": "startup", "claimed": 2, "delivered": 2, "labelled": 1}
    assert line.__dict__["interrupted"] is False
    assert isinstance(line.__dict__["duration_s"], float)
    assert "2 replies owed by dead owners claimed, 2 delivered (1 labelled" in line.getMessage()
    assert row(store, plain).state is _O.DELIVERED
    assert row(store, maybe).state is _O.DELIVERED


@pytest.mark.asyncio
async def test_a_start_with_nothing_owed_still_logs_its_recovery(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """Even a recovery that found nothing says so, once."""
    gateway = rig.gateway()
    gateway.add_adapter(SLACK, FakeAdapter())
    with caplog.at_level(logging.INFO, logger=RUNTIME_LOGGER):
        assert await asyncio.wait_for(gateway.start(), BOUND) == 0
        await eventually(lambda: bool(recovery_lines(caplog)), "the recovery line")
    [line] = recovery_lines(caplog)
    assert (line.__dict__["claimed"], line.__dict__["delivered"]) == (0, 0)


@pytest.mark.asyncio
async def test_the_gateways_metrics_reach_its_ledger(store: Store) -> None:
    """Gateway(metrics=...) hands the hook to its ledger: a reply's record, attempt and
    delivery are reported as transitions."""
    metrics = RecordingMetrics()
    gateway = Gateway(store, sessions=FakeSessions(), probe=PROBE, metrics=metrics)
    gateway.add_adapter(SLACK, FakeAdapter())
    assert gateway.metrics is metrics
    await asyncio.wait_for(gateway.start(), BOUND)
    try:
        assert (await reply(gateway)).success
    finally:
        await asyncio.wait_for(gateway.stop(budget_s=1.0), BOUND)
    events = {(event, outcome) for _, event, outcome, _ in metrics.of("transition")}
    assert {("record", Outcome.OK), ("attempt", Outcome.OK), ("deliver", Outcome.OK)} <= events

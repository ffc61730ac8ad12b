"""A runtime retry whose session flag cannot be cleared releases the claim unsent, and says
why once: the first failure of a cause is a WARNING naming it, repeats are DEBUG, and the
first success after them is one INFO line."""

from __future__ import annotations

import logging

import pytest

from statecore.clock import FakeClock
from statecore.gateway.adapter import SendResult
from statecore.lifecycles import ObligationState
from statecore.policy import ErrorKind, LedgerPolicy
from statecore.store import Store
from tests.statecore.gateway.gateway_rig import FakeAdapter, FakeSessions, Rig, reply, rows

_LOGGER = "statecore.gateway.runtime"


@pytest.mark.asyncio
async def test_a_failing_clear_is_warned_once_with_its_cause_and_its_end_once(
    rig: Rig, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Five rounds of a failing clear give one WARNING with the cause, the claim released each
    time (never sent, budget refunded); the round that succeeds logs one INFO and sends."""
    clock = FakeClock()
    sessions = FakeSessions()
    gateway = rig.gateway(
        clock=clock,
        sessions=sessions,
        policy=LedgerPolicy(retry_backoff=(1.0, 1.0), max_attempts=3),
    )
    adapter = FakeAdapter(SendResult.failed("upstream timeout", kind=ErrorKind.TRANSIENT))
    gateway.add_adapter("slack", adapter)
    await reply(gateway)
    sessions.fail = True
    caplog.set_level(logging.DEBUG, logger=_LOGGER)
    for _ in range(5):
        clock.advance(2.0)
        assert await gateway.redeliver_failed("slack") == 0
    (ob,) = rows(store)
    assert ob.state is ObligationState.FAILED
    assert ob.attempts == 0  # every claim was refunded
    assert len(adapter.calls) == 1
    mine = [r for r in caplog.records if r.name == _LOGGER and "resume_pending" in r.getMessage()]
    warnings = [r for r in mine if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "session store unavailable" in warnings[0].getMessage()  # the cause, not just "failed"
    assert len([r for r in mine if r.levelno == logging.DEBUG]) == 4
    sessions.fail = False
    clock.advance(2.0)
    assert await gateway.redeliver_failed("slack") == 1
    infos = [
        r
        for r in caplog.records
        if r.levelno == logging.INFO and "works again after 5 failures" in r.getMessage()
    ]
    assert len(infos) == 1

"""The send path's retried ledger writes: transient store errors tried again on the clock, a
definite refusal raised at once, and a refusal after a try whose commit outcome was unknown
taken as that try having been kept."""

from __future__ import annotations

import asyncio
import logging

import pytest

from statecore.clock import FakeClock
from statecore.errors import InvalidTransition, StaleState, StoreError, StoreOutcomeUnknown
from statecore.gateway.writes import retried_write

pytestmark = pytest.mark.asyncio


class Script:
    """A write that raises the scripted exceptions in turn, then returns ``"written"``."""

    def __init__(self, *outcomes: BaseException) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.outcomes:
            raise self.outcomes.pop(0)
        return "written"


async def run(script: Script, clock: FakeClock, delays: tuple[float, ...] = (1.0, 2.0)) -> object:
    task = asyncio.ensure_future(
        retried_write("mark_delivered", "ob-1", script, clock=clock, delays=delays, settling=True)
    )
    while not task.done():
        await asyncio.sleep(0)
        if not task.done():
            clock.advance(0.5)
    return task.result()


def refusal() -> InvalidTransition:
    return InvalidTransition("obligation", "delivered", "deliver")


async def test_a_transient_error_is_tried_again_after_each_delay() -> None:
    clock = FakeClock()
    script = Script(StoreError("busy"), StoreError("busy"))
    assert await run(script, clock) == "written"
    assert script.calls == 3
    assert clock.monotonic() >= 3.0


async def test_every_try_failing_gives_none() -> None:
    script = Script(StoreError("busy"), StoreError("busy"), StoreError("busy"))
    assert await run(script, FakeClock()) is None
    assert script.calls == 3


async def test_a_definite_refusal_is_raised_at_once() -> None:
    script = Script(refusal())
    with pytest.raises(InvalidTransition):
        await run(script, FakeClock())
    assert script.calls == 1


async def test_a_refusal_after_a_transient_error_is_still_raised() -> None:
    script = Script(StoreError("busy"), StaleState("ob-1", "pending", "delivered"))
    with pytest.raises(StaleState):
        await run(script, FakeClock())
    assert script.calls == 2


async def test_a_refusal_after_an_unknown_commit_outcome_means_that_try_was_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    script = Script(StoreOutcomeUnknown("transition"), refusal())
    with caplog.at_level(logging.INFO, logger="statecore.gateway.runtime"):
        assert await run(script, FakeClock()) is None
    assert script.calls == 2
    assert "most probably kept" in caplog.text

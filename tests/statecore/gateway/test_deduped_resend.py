"""A resend that may repeat needs no possible-repeat label when the adapter's platform shows a
send once per idempotency key and its window covers every attempt of the reply: sent plain,
counted as deduplicated, never as labelled.  Older than the window (less its margin), through an
adapter without a window, or through one without the ability: labelled as before.

Every test runs on the in-memory store and on SQLite, on a fake clock; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from statecore.clock import FakeClock
from statecore.gateway import Gateway
from statecore.gateway.adapter import AdapterAbilities, SendResult
from statecore.gateway.sending import DEDUPE_MARGIN_MIN_S, dedupe_covers
from statecore.lifecycles import ObligationState
from statecore.obligation import RECONNECTED_MARKER, RECOVERED_MARKER
from statecore.store import Store
from tests.statecore.gateway.gateway_rig import (
    ANSWER,
    BOUND,
    SLACK,
    FakeAdapter,
    Outcome,
    Rig,
    oid_of,
    owe,
    reply,
    row,
)
from tests.waiting import eventually

_O = ObligationState
DAY_S = 86_400.0
CUTOFF_S = DAY_S - 0.1 * DAY_S
"""The oldest a reply may be for a day's window to cover it (the margin is 10 % of it)."""


class DedupingAdapter(FakeAdapter):
    """A fake adapter whose platform shows a send once per idempotency key for ``window_s``."""

    abilities = AdapterAbilities(connects=True, dedupes_sends=True)

    def __init__(self, *outcomes: Outcome, window_s: float | None = DAY_S) -> None:
        super().__init__(*outcomes)
        self.window_s = window_s

    @property
    def dedupe_window_s(self) -> float | None:
        """The window given."""
        return self.window_s


def deduped(gateway: Gateway) -> int:
    """The gateway's count of resends sent without a label because the platform dedupes."""
    return gateway.deduped


async def recover(rig: Rig, clock: FakeClock, adapter: FakeAdapter) -> Gateway:
    """A new gateway on ``clock`` that redelivers what the dead owner owed through
    ``adapter``, to the end."""
    gateway = rig.gateway(clock=clock)
    gateway.add_adapter(SLACK, adapter)
    assert await asyncio.wait_for(gateway.redeliver_pending(), BOUND) == 1
    return gateway


# -- the rule ----------------------------------------------------------------------------------


def test_a_window_covers_a_reply_younger_than_it_less_its_margin() -> None:
    """10 % of the window, at least a minute: a day's window covers 21.6 h; a ten-minute
    window covers nine minutes; a window no longer than the least margin covers nothing."""
    assert dedupe_covers(DAY_S, 0.0, CUTOFF_S - 1)
    assert not dedupe_covers(DAY_S, 0.0, CUTOFF_S)
    assert dedupe_covers(600.0, 0.0, 539.0)
    assert not dedupe_covers(600.0, 0.0, 540.0)
    assert not dedupe_covers(DEDUPE_MARGIN_MIN_S, 0.0, 0.0)
    assert not dedupe_covers(None, 0.0, 0.0)


def test_a_reply_recorded_beyond_the_margin_in_the_future_is_not_covered() -> None:
    """Clocks that disagree by more than the margin prove nothing."""
    assert dedupe_covers(DAY_S, 100.0, 100.0 - CUTOFF_S / 10)
    assert not dedupe_covers(DAY_S, 100.0 + 0.1 * DAY_S, 100.0)


# -- recovered claims --------------------------------------------------------------------------


@pytest.mark.parametrize("state", [_O.ATTEMPTING, _O.FAILED])
@pytest.mark.asyncio
async def test_a_young_recovered_reply_through_a_deduping_adapter_goes_plain(
    rig: Rig, store: Store, state: ObligationState
) -> None:
    """A dead owner's reply that may have reached the user, recovered an hour later through a
    platform that dedupes for a day: the content alone, under the same idempotency key;
    delivered, counted as deduplicated and not as labelled."""
    clock = FakeClock()
    oid = owe(store, state=state, clock=clock)
    clock.advance(3600)
    adapter = DedupingAdapter()

    gateway = await recover(rig, clock, adapter)

    [sent] = adapter.calls
    assert sent.content == ANSWER
    assert sent.metadata["idempotency_key"] == oid
    assert row(store, oid).state is _O.DELIVERED
    assert (gateway.redelivered, gateway.labelled, deduped(gateway)) == (1, 0, 1)


@pytest.mark.parametrize(("age", "labelled"), [(CUTOFF_S - 1, False), (CUTOFF_S, True)])
@pytest.mark.asyncio
async def test_a_reply_as_old_as_the_window_less_its_margin_is_labelled(
    rig: Rig, store: Store, age: float, labelled: bool
) -> None:
    """Just inside the covered age the resend goes plain; from the cutoff on (the platform may
    have forgotten the first send) it carries the recovered banner, counted as labelled."""
    clock = FakeClock()
    oid = owe(store, state=_O.ATTEMPTING, clock=clock)
    clock.advance(age)
    adapter = DedupingAdapter()

    gateway = await recover(rig, clock, adapter)

    [sent] = adapter.calls
    assert sent.content.startswith(RECOVERED_MARKER) is labelled
    assert sent.content.endswith(ANSWER)
    assert sent.metadata["idempotency_key"] == oid
    assert (gateway.labelled, deduped(gateway)) == (int(labelled), int(not labelled))


@pytest.mark.asyncio
async def test_an_old_reply_through_a_deduping_adapter_is_labelled(rig: Rig, store: Store) -> None:
    """Recovered 23 hours after it was recorded (still owed: not stale yet), past what a day's
    window covers: labelled as before."""
    clock = FakeClock()
    owe(store, state=_O.ATTEMPTING, clock=clock)
    clock.advance(DAY_S - 3600)
    adapter = DedupingAdapter()

    gateway = await recover(rig, clock, adapter)

    [sent] = adapter.calls
    assert sent.content == f"{RECOVERED_MARKER}\n\n{ANSWER}"
    assert (gateway.redelivered, gateway.labelled, deduped(gateway)) == (1, 1, 0)


@pytest.mark.parametrize("ability", [False, True], ids=["without-the-ability", "without-a-window"])
@pytest.mark.asyncio
async def test_without_a_window_a_young_reply_is_labelled(
    rig: Rig, store: Store, ability: bool
) -> None:
    """An adapter that does not declare the ability, or has no window now: labelled."""
    adapter = DedupingAdapter(window_s=None) if ability else FakeAdapter()
    clock = FakeClock()
    owe(store, state=_O.ATTEMPTING, clock=clock)
    clock.advance(60)

    gateway = await recover(rig, clock, adapter)

    [sent] = adapter.calls
    assert sent.content.startswith(RECOVERED_MARKER)
    assert (gateway.labelled, deduped(gateway)) == (1, 0)


@pytest.mark.parametrize("window", [float("nan"), float("inf"), -1.0, 0.0, True, "86400"])
@pytest.mark.asyncio
async def test_a_window_that_is_not_a_positive_finite_number_is_no_window(
    rig: Rig, store: Store, window: object
) -> None:
    """Nonsense from an adapter is read as no window: labelled."""
    clock = FakeClock()
    owe(store, state=_O.ATTEMPTING, clock=clock)
    adapter = DedupingAdapter()
    adapter.window_s = window  # type: ignore[assignment]

    gateway = await recover(rig, clock, adapter)

    assert adapter.calls[0].content.startswith(RECOVERED_MARKER)
    assert (gateway.labelled, deduped(gateway)) == (1, 0)


@pytest.mark.asyncio
async def test_a_reply_never_sent_goes_plain_and_counts_as_neither(rig: Rig, store: Store) -> None:
    """A pending row needs no label anyway: plain, neither labelled nor deduplicated."""
    clock = FakeClock()
    owe(store, clock=clock)
    adapter = DedupingAdapter()

    gateway = await recover(rig, clock, adapter)

    assert adapter.contents == [ANSWER]
    assert (gateway.redelivered, gateway.labelled, deduped(gateway)) == (1, 0, 0)


@pytest.mark.asyncio
async def test_the_startup_recovery_line_counts_no_deduplicated_resend_as_labelled(
    rig: Rig, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The one recovery line of a start says 2 delivered, 1 labelled: the young reply went
    plain, the old one labelled."""
    clock = FakeClock()
    old = owe(store, state=_O.ATTEMPTING, clock=clock, message_ref="m0", content="old")
    clock.advance(DAY_S - 3600)
    young = owe(store, state=_O.ATTEMPTING, clock=clock, message_ref="m1", content="young")
    adapter = DedupingAdapter()
    gateway = rig.gateway(clock=clock)
    gateway.add_adapter(SLACK, adapter)

    def recovery_lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "recovery" in r.__dict__]

    with caplog.at_level(logging.INFO, logger="statecore.gateway.runtime"):
        assert await asyncio.wait_for(gateway.start(), BOUND) == 2
        await eventually(lambda: bool(recovery_lines()), "the recovery line")

    [line] = recovery_lines()
    assert (line.__dict__["delivered"], line.__dict__["labelled"]) == (2, 1)
    assert "2 delivered (1 labelled as possible repeats)" in line.getMessage()
    assert sorted(adapter.contents) == sorted([f"{RECOVERED_MARKER}\n\nold", "young"])
    assert row(store, old).state is _O.DELIVERED
    assert row(store, young).state is _O.DELIVERED
    assert deduped(gateway) == 1


# -- this gateway's own failures -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_runtime_retry_of_a_young_ambiguous_failure_goes_plain(
    rig: Rig, store: Store
) -> None:
    """A send that timed out (it may have gone out) is retried by redeliver_failed without the
    reconnected banner, under the same key."""
    clock = FakeClock()
    adapter = DedupingAdapter(SendResult.failed("request timed out", ambiguous=True))
    gateway = rig.gateway(clock=clock)
    gateway.add_adapter(SLACK, adapter)
    assert not (await reply(gateway)).success
    clock.advance(120)  # past the retry backoff

    assert await asyncio.wait_for(gateway.redeliver_failed(SLACK), BOUND) == 1

    first, again = adapter.calls
    assert again.content == ANSWER
    assert RECONNECTED_MARKER not in again.content
    assert again.metadata["idempotency_key"] == first.metadata["idempotency_key"] == oid_of()
    assert (gateway.labelled, deduped(gateway)) == (0, 1)

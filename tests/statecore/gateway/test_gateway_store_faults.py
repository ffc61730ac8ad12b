"""The Gateway runtime when its ledger's store misbehaves: ``start()`` checks the store before it
connects anything; the send path retries a ledger write that hit a transient lock, on the
gateway's clock; and the retry timer re-sends this process's own replies that a failed write left
stuck in ``pending`` or ``attempting`` -- plainly when the send never began, labelled when it may
have -- while never touching what this process is still sending, nor another owner's rows.

Locks are real: a second SQLite connection holds ``BEGIN IMMEDIATE`` on the ledger file, whose
store gives up after a short busy timeout.  Gateway time is a FakeClock (backoffs, grace and the
retry timer pass by ``advance``); every real wait is bounded.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from statecore.clock import FakeClock
from statecore.errors import InvalidTransition, StaleState, StoreError
from statecore.gateway import Gateway
from statecore.gateway.adapter import SendResult
from statecore.gateway.sessions import SessionStore
from statecore.ledger import Ledger
from statecore.lifecycles import ObligationState
from statecore.obligation import RECOVERED_MARKER, Obligation
from statecore.store import Store
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from tests.statecore.gateway.gateway_rig import (
    ANSWER,
    BOUND,
    DEAD,
    PROBE,
    SLACK,
    FakeAdapter,
    FakeSessions,
    Rig,
    Sent,
    events,
    live_incarnation,
    oid_of,
    owe,
    reply,
    row,
)
from tests.stores.sqlite_faults import ConnectionLock, corrupt_obligation_pages
from tests.waiting import eventually

_O = ObligationState
GRACE = 30.0
RETRY_EVERY = 60.0
DELAYS = (0.1, 0.3, 1.0)
QUICK_BUSY_S = 0.2
"""SQLite busy timeout of the gateway's store: a write blocked by the lock fails fast."""


class CountingClock(FakeClock):
    """A FakeClock that records the duration of every sleep."""

    def __init__(self) -> None:
        super().__init__()
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        """Record the duration, then sleep on fake time."""
        self.slept.append(seconds)
        await super().sleep(seconds)


class Faulty:
    """A gateway over a real SQLite ledger file, with the file's write lock at hand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = SQLiteStore(path, busy_timeout_s=QUICK_BUSY_S)
        self.clock = CountingClock()
        self.lock = ConnectionLock(path)
        self.gateways: list[Gateway] = []

    def gateway(self) -> Gateway:
        """A gateway on the file: fake session flags, the retry timer every RETRY_EVERY."""
        gateway = Gateway(
            self.store,
            sessions=FakeSessions(),
            clock=self.clock,
            incarnation=live_incarnation(),
            probe=PROBE,
            retry_interval_s=RETRY_EVERY,
            stuck_after_s=GRACE,
        )
        self.gateways.append(gateway)
        return gateway

    async def close(self) -> None:
        self.lock.close()
        for gateway in self.gateways:
            await asyncio.wait_for(gateway.stop(budget_s=1.0), BOUND)
        self.store.close()


@pytest_asyncio.fixture
async def faulty(tmp_path: Path) -> AsyncIterator[Faulty]:
    """A gateway factory over a SQLite file whose lock the test controls; torn down after."""
    made = Faulty(tmp_path / "ledger.db")
    try:
        yield made
    finally:
        await made.close()


def lock_after_record(monkeypatch: pytest.MonkeyPatch, gateway: Gateway, faulty: Faulty) -> None:
    """Take the write lock as soon as the gateway's ledger has recorded a reply: the next
    write of the send path (mark attempting) meets the lock."""
    record = gateway.ledger.record

    async def record_then_lock(**kwargs: Any) -> Obligation:
        recorded = await record(**kwargs)
        faulty.lock.lock()
        return recorded

    monkeypatch.setattr(gateway.ledger, "record", record_then_lock)


def lock_on_first_send(faulty: Faulty) -> Callable[[Sent], None]:
    """An ``on_send`` hook that takes the write lock while the first send is under way: the
    write settling it meets the lock."""
    sends: list[Sent] = []

    def hook(sent: Sent) -> None:
        sends.append(sent)
        if len(sends) == 1:
            faulty.lock.lock()

    return hook


async def backoff(clock: CountingClock, waiting: int, task: asyncio.Future[Any]) -> None:
    """Wait until the send path sleeps before a retry (``waiting`` other sleepers besides it),
    then move fake time past that sleep."""
    await eventually(lambda: clock.sleepers == waiting + 1 or task.done(), "a retry backoff")
    assert not task.done(), "the send path finished before its backoff"
    deadline = clock.next_deadline
    assert deadline is not None
    clock.advance(max(0.0, deadline - clock.monotonic()))


def gave_up(caplog: pytest.LogCaptureFixture, write: str, oid: str) -> bool:
    """True when the gateway logged, at WARNING, that it gave up ``write`` for ``oid``."""
    return any(
        rec.levelno == logging.WARNING and write in rec.getMessage() and oid in rec.getMessage()
        for rec in caplog.records
        if rec.name == "statecore.gateway.runtime"
    )


# -- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "30"])
def test_stuck_after_must_be_a_positive_finite_number(bad: Any) -> None:
    """A stuck grace that is not a positive finite number is refused at construction."""
    with pytest.raises(ValueError, match="stuck_after_s"):
        Gateway(InMemoryStore(), stuck_after_s=bad)


# -- start() checks the store first ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_start_refuses_a_locked_ledger_before_connecting_any_adapter(
    faulty: Faulty,
) -> None:
    """While another connection holds the ledger's write lock, start() raises StoreError
    naming it and no adapter's connect() was called; once the lock is gone start() works."""
    gateway = faulty.gateway()
    adapter = FakeAdapter(connected=False)
    gateway.add_adapter(SLACK, adapter)

    faulty.lock.lock()
    with pytest.raises(StoreError, match="write transaction") as caught:
        await asyncio.wait_for(gateway.start(), BOUND)
    assert "locked" in str(caught.value)
    assert adapter.connects == 0

    faulty.lock.unlock()
    assert await asyncio.wait_for(gateway.start(), BOUND) == 0
    assert (adapter.connects, adapter.connected) == (1, True)


@pytest.mark.asyncio
async def test_start_refuses_a_corrupt_ledger_before_connecting_any_adapter(
    tmp_path: Path,
) -> None:
    """A ledger file whose obligation pages are corrupt makes start() raise StoreError saying
    the store cannot be read, before any adapter's connect() is called."""
    path = tmp_path / "corrupt.db"
    setup = SQLiteStore(path)
    owe(setup, owner=live_incarnation())
    SessionStore(setup)
    setup.close()
    corrupt_obligation_pages(path)
    store = SQLiteStore(path, busy_timeout_s=QUICK_BUSY_S)
    gateway = Gateway(store, sessions=FakeSessions(), incarnation=live_incarnation(), probe=PROBE)
    adapter = FakeAdapter(connected=False)
    gateway.add_adapter(SLACK, adapter)
    try:
        with pytest.raises(StoreError, match="cannot read") as caught:
            await asyncio.wait_for(gateway.start(), BOUND)
        assert "not a usable SQLite database" in str(caught.value)
        assert adapter.connects == 0
    finally:
        await asyncio.wait_for(gateway.stop(budget_s=1.0), BOUND)
        store.close()


# -- the send path retries a write that met a lock -------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        ("attempt", SendResult.ok("pm1"), _O.DELIVERED, "deliver"),
        ("deliver", SendResult.ok("pm1"), _O.DELIVERED, "deliver"),
        ("fail", SendResult.failed("upstream timeout"), _O.FAILED, "fail"),
    ],
    ids=["attempt", "deliver", "fail"],
)
@pytest.mark.asyncio
async def test_a_write_that_met_a_lock_is_retried_after_a_backoff_and_succeeds(
    faulty: Faulty,
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[str, SendResult, ObligationState, str],
) -> None:
    """A mark (attempting, delivered or failed) that raised StoreError on another connection's
    lock is tried again after 0.1 s of gateway time; with the lock gone it succeeds, and the
    reply is sent once and settled."""
    blocked, outcome, settled, last = case
    gateway = faulty.gateway()
    hook = None if blocked == "attempt" else lock_on_first_send(faulty)
    adapter = FakeAdapter(outcome, on_send=hook)
    gateway.add_adapter(SLACK, adapter)
    if blocked == "attempt":
        lock_after_record(monkeypatch, gateway, faulty)

    task = asyncio.ensure_future(reply(gateway))
    await eventually(lambda: faulty.clock.sleepers == 1, "the first backoff")
    faulty.lock.unlock()
    faulty.clock.advance(DELAYS[0])
    result = await asyncio.wait_for(task, BOUND)

    assert result == outcome
    assert faulty.clock.slept == [DELAYS[0]]
    assert adapter.contents == [ANSWER]
    oid = oid_of()
    assert row(faulty.store, oid).state is settled
    assert events(faulty.store, oid) == ["record", "attempt", last]


@pytest.mark.asyncio
async def test_a_definite_refusal_of_a_settle_write_is_never_retried(faulty: Faulty) -> None:
    """A mark_delivered refused because another writer settled the row during the send (a lost
    compare-and-set) is raised at once: no backoff, no second try."""
    gateway = faulty.gateway()
    other = Ledger(
        faulty.store, incarnation=gateway.ledger.incarnation, clock=faulty.clock, probe=PROBE
    )

    def settle_elsewhere(_: Sent) -> None:
        other.mark_failed(oid_of(), "settled by another writer")

    gateway.add_adapter(SLACK, FakeAdapter(on_send=settle_elsewhere))

    with pytest.raises((StaleState, InvalidTransition)):
        await asyncio.wait_for(reply(gateway), BOUND)

    assert faulty.clock.slept == []
    assert events(faulty.store, oid_of()) == ["record", "attempt", "fail"]


# -- given up: the row is stuck, and the timer re-sends it -----------------------------------------


@pytest.mark.asyncio
async def test_a_reply_whose_attempt_mark_never_got_through_is_sent_plain_by_the_timer(
    faulty: Faulty, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """mark_attempting blocked by a lock through every retry: send_final gives up (WARNING with
    the id), sends nothing and keeps the reply pending; once the lock is gone and the grace has
    passed, the retry timer claims it and sends it plainly, exactly once."""
    gateway = faulty.gateway()
    adapter = FakeAdapter()
    gateway.add_adapter(SLACK, adapter)
    await asyncio.wait_for(gateway.start(), BOUND)  # the retry timer now sleeps
    lock_after_record(monkeypatch, gateway, faulty)
    oid = oid_of()

    with caplog.at_level(logging.INFO, logger="statecore.gateway.runtime"):
        task = asyncio.ensure_future(reply(gateway))
        for _ in DELAYS:
            await backoff(faulty.clock, 1, task)
        result = await asyncio.wait_for(task, BOUND)

    assert not result.success
    assert "kept owed" in (result.error or "")
    assert faulty.clock.slept[-3:] == list(DELAYS)
    assert gave_up(caplog, "mark_attempting", oid)
    assert adapter.calls == []
    stuck = row(faulty.store, oid)
    assert (stuck.state, stuck.owner.token) == (_O.PENDING, gateway.ledger.incarnation.token)
    assert oid not in gateway.in_flight()

    faulty.lock.unlock()
    faulty.clock.advance(RETRY_EVERY)
    await eventually(lambda: row(faulty.store, oid).state is _O.DELIVERED, "the stuck resend")
    # The row is delivered when the writer commits; the resend is counted when its sender
    # resumes, a turn of the loop later.
    await eventually(lambda: gateway.redelivered == 1, "the resend counted")

    assert adapter.contents == [ANSWER]
    assert events(faulty.store, oid) == ["record", "claim", "deliver"]
    assert (gateway.redelivered, gateway.labelled) == (1, 0)


@pytest.mark.asyncio
async def test_a_sent_reply_whose_delivered_mark_never_got_through_is_resent_labelled(
    faulty: Faulty, caplog: pytest.LogCaptureFixture
) -> None:
    """A lock between the platform's acknowledgement and the delivered write, through every
    retry: send_final returns the platform's success, logs the give-up at WARNING with the id
    and leaves the row attempting; after the grace the timer resends it with the recovered
    label (it may have gone out) and settles it delivered."""
    gateway = faulty.gateway()
    adapter = FakeAdapter(on_send=lock_on_first_send(faulty))
    gateway.add_adapter(SLACK, adapter)
    await asyncio.wait_for(gateway.start(), BOUND)
    oid = oid_of()

    with caplog.at_level(logging.INFO, logger="statecore.gateway.runtime"):
        task = asyncio.ensure_future(reply(gateway))
        for _ in DELAYS:
            await backoff(faulty.clock, 1, task)
        result = await asyncio.wait_for(task, BOUND)

    assert result.success
    assert gave_up(caplog, "mark_delivered", oid)
    assert row(faulty.store, oid).state is _O.ATTEMPTING
    assert gateway.delivered == 0

    faulty.lock.unlock()
    faulty.clock.advance(RETRY_EVERY)
    await eventually(lambda: row(faulty.store, oid).state is _O.DELIVERED, "the stuck resend")
    # The row is delivered when the writer commits; the resend is counted when its sender
    # resumes, a turn of the loop later.
    await eventually(lambda: gateway.redelivered == 1, "the resend counted")

    first, resent = adapter.contents
    assert first == ANSWER
    assert resent.startswith(RECOVERED_MARKER)
    assert resent.endswith(ANSWER)
    assert events(faulty.store, oid) == ["record", "attempt", "claim", "deliver"]
    assert row(faulty.store, oid).attempts == 1
    assert (gateway.redelivered, gateway.labelled) == (1, 1)


# -- the stuck sweep, on every store ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_own_stuck_rows_are_resent_and_other_owners_rows_left_alone(
    rig: Rig, store: Store
) -> None:
    """After the grace, this incarnation's own pending row is sent plain and its attempting row
    labelled; another live owner's and a dead owner's rows are untouched by this sweep."""
    clock = FakeClock()
    gateway = rig.gateway(clock=clock)
    adapter = FakeAdapter()
    gateway.add_adapter(SLACK, adapter)
    me = gateway.ledger.incarnation
    pending = owe(store, owner=me, clock=clock, content="plain one", message_ref="m1")
    attempting = owe(
        store, owner=me, clock=clock, state=_O.ATTEMPTING, content="maybe sent", message_ref="m2"
    )
    others = [
        owe(store, owner=live_incarnation(), clock=clock, content="theirs", message_ref="m3"),
        owe(store, owner=DEAD, clock=clock, content="the dead's", message_ref="m4"),
    ]
    untouched = {oid: row(store, oid) for oid in others}

    assert await asyncio.wait_for(gateway.redeliver_stuck(), BOUND) == 0  # not stuck yet
    clock.advance(GRACE + 1)
    assert await asyncio.wait_for(gateway.redeliver_stuck(), BOUND) == 2

    plain, labelled = adapter.contents
    assert plain == "plain one"
    assert labelled.startswith(RECOVERED_MARKER)
    assert labelled.endswith("maybe sent")
    assert row(store, pending).state is _O.DELIVERED
    assert row(store, attempting).state is _O.DELIVERED
    assert {oid: row(store, oid) for oid in others} == untouched
    assert (gateway.redelivered, gateway.labelled) == (2, 1)


@pytest.mark.asyncio
async def test_a_reply_still_being_sent_is_never_taken_for_stuck(rig: Rig, store: Store) -> None:
    """A send hanging for longer than the grace is in flight: the stuck sweep leaves its row
    alone, and the reply goes out once."""
    clock = FakeClock()
    gateway = rig.gateway(clock=clock)
    hang = asyncio.Event()
    adapter = FakeAdapter(hang=hang)
    gateway.add_adapter(SLACK, adapter)

    task = asyncio.ensure_future(reply(gateway))
    await eventually(lambda: len(adapter.calls) == 1, "the send under way")
    oid = oid_of()
    assert gateway.in_flight() == {oid}
    clock.advance(GRACE * 10)
    before = row(store, oid)

    assert await asyncio.wait_for(gateway.redeliver_stuck(), BOUND) == 0
    assert row(store, oid) == before

    hang.set()
    assert (await asyncio.wait_for(task, BOUND)).success
    assert row(store, oid).state is _O.DELIVERED
    assert len(adapter.calls) == 1
    assert gateway.in_flight() == frozenset()


@pytest.mark.asyncio
async def test_claims_waiting_their_turn_in_a_redelivery_are_never_taken_for_stuck(
    rig: Rig, store: Store
) -> None:
    """While a startup redelivery is stuck on its first send, neither that claim nor the ones
    queued behind it are claimed again by the stuck sweep; each goes out once."""
    clock = FakeClock()
    first = owe(store, owner=DEAD, clock=clock, content="first", message_ref="m1")
    clock.advance(1)
    second = owe(store, owner=DEAD, clock=clock, content="second", message_ref="m2")
    gateway = rig.gateway(clock=clock)
    hang = asyncio.Event()
    adapter = FakeAdapter(hang=hang)
    gateway.add_adapter(SLACK, adapter)

    task = asyncio.ensure_future(gateway.redeliver_pending())
    await eventually(lambda: len(adapter.calls) == 1, "the first redelivery under way")
    clock.advance(GRACE * 10)
    assert gateway.in_flight() == {first, second}

    assert await asyncio.wait_for(gateway.redeliver_stuck(), BOUND) == 0

    hang.set()
    assert await asyncio.wait_for(task, BOUND) == 2
    assert adapter.contents == ["first", "second"]
    assert [events(store, oid) for oid in (first, second)] == [["record", "claim", "deliver"]] * 2
    assert gateway.in_flight() == frozenset()

"""The ledger when its store misbehaves: the sweep of this incarnation's own stuck sends, the
store check run before a gateway connects anything, and AsyncLedger reads that never wait for
(or fail on) a write lock.

Sweeps run against the in-memory store and SQLite; faults use real SQLite files whose write
lock is held by a second connection or a child process, or whose obligation pages are corrupt.
Ledger time comes from a FakeClock; real time appears only as bounds and as SQLite's (short)
busy timeout.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statecore import (
    RECOVERED_MARKER,
    AsyncLedger,
    FakeClock,
    Ledger,
    LedgerPolicy,
    ObligationState,
    Store,
    StoreError,
)
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from tests.statecore.ledger_helpers import (
    DEAD,
    LIVE,
    OTHER_LIVE,
    FakeProbe,
    claim_chain,
    current,
    dead_incarnation,
    make,
    record,
    snapshot,
)
from tests.stores.sqlite_faults import ChildProcessLock, ConnectionLock, corrupt_obligation_pages

S = ObligationState
GRACE = 30.0
GUARD = 10.0
"""Real seconds any single await may take before the test fails."""
QUICK_BUSY_S = 0.2
"""SQLite busy timeout of the stores a lock is held against: a blocked write fails fast."""


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty store of each kind (closed at teardown)."""
    made: Store = (
        InMemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "ledger.db")
    )
    yield made
    made.close()


@pytest.fixture
def clock() -> FakeClock:
    """The only time source of every ledger in a test."""
    return FakeClock()


@pytest.fixture
def probe() -> FakeProbe:
    """A probe that knows LIVE and OTHER_LIVE as alive, and nobody else."""
    return FakeProbe(
        {LIVE.pid: LIVE.started_at, OTHER_LIVE.pid: OTHER_LIVE.started_at},
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """The path of a SQLite ledger file."""
    return tmp_path / "faults.db"


def quick_store(path: Path) -> SQLiteStore:
    """A SQLite store that gives up on a held lock after QUICK_BUSY_S."""
    return SQLiteStore(path, busy_timeout_s=QUICK_BUSY_S)


# -- sweep_stuck_own -------------------------------------------------------------------------------


def test_own_pending_row_past_the_grace_is_claimed_plain(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """An own row left pending past the grace is claimed once, plainly (its send never began),
    with one more attempt, a bumped fence and an audit entry saying "stuck"."""
    ledger = make(store, clock, probe)
    oid = record(ledger)
    before = current(ledger, oid)
    clock.advance(GRACE + 1)

    (claim,) = ledger.sweep_stuck_own(older_than_s=GRACE)

    assert (claim.obligation_id, claim.needs_marker, claim.reason) == (oid, False, None)
    assert claim.render() == "the final answer"
    after = current(ledger, oid)
    assert (after.state, after.attempts, after.owner.token) == (S.ATTEMPTING, 1, LIVE.token)
    assert after.fence == before.fence + 1
    last = ledger.history(oid)[-1]
    assert (last.event, last.from_state, last.reason) == ("claim", S.PENDING, "stuck")
    assert ledger.sweep_stuck_own(older_than_s=GRACE) == []
    assert ledger.mark_delivered(oid).state is S.DELIVERED


def test_own_attempting_row_past_the_grace_is_claimed_with_the_recovered_label(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """An own row left attempting past the grace may have gone out: its claim needs a marker
    with reason "stuck" and renders with the recovered banner."""
    ledger = make(store, clock, probe)
    oid = record(ledger)
    ledger.mark_attempting(oid)
    clock.advance(GRACE + 1)

    (claim,) = ledger.sweep_stuck_own(older_than_s=GRACE)

    assert (claim.needs_marker, claim.reason, claim.attempts) == (True, "stuck", 1)
    assert claim.render().startswith(RECOVERED_MARKER)
    assert ledger.history(oid)[-1].from_state is S.ATTEMPTING


def test_stuck_sweep_waits_for_the_grace_and_skips_excluded_ids(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Rows younger than the grace, and rows the caller is sending (excluded), are left as
    they are; the others are claimed oldest first."""
    ledger = make(store, clock, probe)
    first, sending = record(ledger, "ob-1"), record(ledger, "ob-2")
    clock.advance(GRACE / 2)
    young = record(ledger, "ob-3")
    assert ledger.sweep_stuck_own(older_than_s=GRACE) == []
    clock.advance(GRACE / 2 + 1)
    untouched = {oid: snapshot(ledger, oid) for oid in (sending, young)}

    claims = ledger.sweep_stuck_own(older_than_s=GRACE, exclude={sending})

    assert [c.obligation_id for c in claims] == [first]
    assert {oid: snapshot(ledger, oid) for oid in (sending, young)} == untouched


def test_stuck_sweep_never_touches_another_owners_rows_or_failed_rows(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Rows of another live owner, of a dead owner, and this owner's failed rows (the runtime
    sweep's) are neither claimed nor abandoned, whatever their age."""
    mine = make(store, clock, probe)
    other = make(store, clock, probe, OTHER_LIVE)
    dead = make(store, clock, probe, DEAD)
    theirs = [record(other, "ob-other"), record(dead, "ob-dead")]
    other.mark_attempting("ob-other")
    own_failed = record(mine, "ob-failed")
    mine.mark_attempting(own_failed)
    mine.mark_failed(own_failed, "upstream timeout")
    clock.advance(LedgerPolicy().stale_after + 1)  # stale too: still not this sweep's to abandon
    before = {oid: snapshot(mine, oid) for oid in [*theirs, own_failed]}

    assert mine.sweep_stuck_own(older_than_s=GRACE) == []

    assert {oid: snapshot(mine, oid) for oid in [*theirs, own_failed]} == before


def test_stuck_sweep_scopes_claims_to_deliverable_targets(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A stuck row whose (platform, profile) cannot be sent now keeps its budget untouched."""
    ledger = make(store, clock, probe)
    slack = record(ledger, "ob-slack")
    teams = record(ledger, "ob-teams", platform="teams")
    clock.advance(GRACE + 1)
    kept = snapshot(ledger, teams)

    claims = ledger.sweep_stuck_own(older_than_s=GRACE, deliverable_targets={("slack", "default")})

    assert [c.obligation_id for c in claims] == [slack]
    assert snapshot(ledger, teams) == kept


def test_stuck_row_at_its_attempt_cap_is_abandoned(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """An own attempting row that already spent its whole budget is abandoned, visibly."""
    oid = record(make(store, clock, probe, dead_incarnation()))
    claim_chain(store, clock, probe, oid, 2)
    ledger = make(store, clock, probe)
    (claim,) = ledger.sweep_recoverable()  # the third attempt, owned by LIVE now
    assert claim.attempts == ledger.policy.max_attempts
    clock.advance(GRACE + 1)

    assert ledger.sweep_stuck_own(older_than_s=GRACE) == []

    assert current(ledger, oid).state is S.ABANDONED
    assert "attempt budget spent" in (ledger.history(oid)[-1].reason or "")


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "30"])
def test_stuck_sweep_refuses_a_bad_grace(
    store: Store, clock: FakeClock, probe: FakeProbe, bad: Any
) -> None:
    """A grace that is not a positive finite number is refused before anything is read."""
    with pytest.raises(ValueError, match="older_than_s"):
        make(store, clock, probe).sweep_stuck_own(older_than_s=bad)


@pytest.mark.asyncio
async def test_async_stuck_sweep_claims_like_the_sync_one(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """AsyncLedger.sweep_stuck_own claims what Ledger.sweep_stuck_own would, off the loop."""
    async with AsyncLedger(store, clock=clock, incarnation=LIVE, probe=probe) as al:
        pending = (await al.record(**_request("ob-1"))).obligation_id
        attempting = (await al.record(**_request("ob-2"))).obligation_id
        await al.mark_attempting(attempting)
        clock.advance(GRACE + 1)
        claims = await asyncio.wait_for(
            al.sweep_stuck_own(older_than_s=GRACE, exclude=iter(())), GUARD
        )
        assert [(c.obligation_id, c.needs_marker) for c in claims] == [
            (pending, False),
            (attempting, True),
        ]


@pytest.mark.asyncio
async def test_async_stuck_sweep_with_nothing_stuck_takes_no_write_lock(
    db: Path, probe: FakeProbe
) -> None:
    """With nothing stuck (fresh or excluded rows only) the async sweep answers [] while
    another connection holds the write lock; with a stuck row it needs the lock and raises
    StoreError, claiming nothing."""
    clock = FakeClock()
    store = quick_store(db)
    try:
        async with AsyncLedger(store, clock=clock, incarnation=LIVE, probe=probe) as al:
            oid = (await al.record(**_request("ob-1"))).obligation_id
            with ConnectionLock(db):
                assert await asyncio.wait_for(al.sweep_stuck_own(older_than_s=GRACE), GUARD) == []
                clock.advance(GRACE + 1)
                sweep = al.sweep_stuck_own(older_than_s=GRACE, exclude={oid})
                assert await asyncio.wait_for(sweep, GUARD) == []
                with pytest.raises(StoreError, match="locked"):
                    await asyncio.wait_for(al.sweep_stuck_own(older_than_s=GRACE), GUARD)
            got = await al.get(oid)
            assert got is not None
            assert (got.state, got.fence) == (S.PENDING, 0)
    finally:
        store.close()


def _request(oid: str) -> dict[str, Any]:
    """Arguments of one AsyncLedger.record() call."""
    return {
        "obligation_id": oid,
        "session_key": f"agent:main:slack:channel:{oid}",
        "platform": "slack",
        "chat_id": "C1",
        "content": "the final answer",
    }


# -- check -----------------------------------------------------------------------------------------


def test_check_passes_on_a_usable_store(store: Store, clock: FakeClock, probe: FakeProbe) -> None:
    """A readable, writable store passes the check, and the check writes nothing."""
    ledger = make(store, clock, probe)
    oid = record(ledger)
    before = snapshot(ledger, oid)
    assert ledger.check() is None
    assert snapshot(ledger, oid) == before


def test_check_names_a_write_lock_held_by_another_connection(db: Path, probe: FakeProbe) -> None:
    """While another connection holds the write lock, the check raises StoreError saying no
    write transaction can be begun (reads still work)."""
    store = quick_store(db)
    try:
        ledger = Ledger(store, incarnation=LIVE, probe=probe, clock=FakeClock())
        with ConnectionLock(db), pytest.raises(StoreError, match="write transaction") as caught:
            ledger.check()
        assert "locked" in str(caught.value)
        assert isinstance(caught.value.__cause__, StoreError)
        assert ledger.check() is None  # the lock is gone
    finally:
        store.close()


def test_check_names_a_corrupt_ledger_file(db: Path, probe: FakeProbe) -> None:
    """A ledger file whose obligation pages are corrupt opens, but the check raises
    StoreError saying the store cannot be read."""
    setup = quick_store(db)
    record(Ledger(setup, incarnation=LIVE, probe=probe, clock=FakeClock()))
    setup.close()
    corrupt_obligation_pages(db)
    store = quick_store(db)
    try:
        ledger = Ledger(store, incarnation=LIVE, probe=probe, clock=FakeClock())
        with pytest.raises(StoreError, match="cannot read") as caught:
            ledger.check()
        assert "not a usable SQLite database" in str(caught.value)
    finally:
        store.close()


@pytest.mark.asyncio
async def test_async_check_raises_for_a_lock_and_after_close(db: Path, probe: FakeProbe) -> None:
    """AsyncLedger.check answers None on a usable store, raises StoreError under another
    connection's write lock, and raises StoreError once the ledger is closed."""
    store = quick_store(db)
    try:
        al = AsyncLedger(store, incarnation=LIVE, probe=probe, clock=FakeClock())
        assert await asyncio.wait_for(al.check(), GUARD) is None
        with ConnectionLock(db), pytest.raises(StoreError, match="write transaction"):
            await asyncio.wait_for(al.check(), GUARD)
        await al.aclose()
        with pytest.raises(StoreError, match="closed"):
            await al.check()
    finally:
        store.close()


# -- AsyncLedger reads never take the write lock ---------------------------------------------


async def _seed(al: AsyncLedger, clock: FakeClock) -> tuple[str, str]:
    """One row owed by this ledger and one abandoned row (a dead owner's, stale at startup)."""
    dead = Ledger(al.store, incarnation=DEAD, probe=al.ledger.probe, clock=clock)
    gone = record(dead, "ob-gone")
    clock.advance(LedgerPolicy().stale_after + 1)
    assert await al.sweep_recoverable() == []
    owed = (await al.record(**_request("ob-owed"))).obligation_id
    return owed, gone


async def _read_all(al: AsyncLedger, owed: str, gone: str) -> None:
    """Every AsyncLedger read answers, with what was committed."""
    got = await asyncio.wait_for(al.get(gone), GUARD)
    assert got is not None
    assert got.state is S.ABANDONED
    events = [e.event for e in await asyncio.wait_for(al.history(gone), GUARD)]
    assert events == ["record", "abandon"]
    assert [o.obligation_id for o in await asyncio.wait_for(al.owed(), GUARD)] == [owed]
    assert [o.obligation_id for o in await asyncio.wait_for(al.abandoned(), GUARD)] == [gone]


@pytest.mark.asyncio
async def test_reads_answer_while_another_connection_holds_the_write_lock(
    db: Path, probe: FakeProbe
) -> None:
    """get, history, owed and abandoned answer while a second connection holds BEGIN
    IMMEDIATE on the ledger file (and a write meanwhile fails with StoreError)."""
    clock = FakeClock()
    store = quick_store(db)
    try:
        async with AsyncLedger(store, incarnation=LIVE, probe=probe, clock=clock) as al:
            owed, gone = await _seed(al, clock)
            with ConnectionLock(db):
                await _read_all(al, owed, gone)
                with pytest.raises(StoreError, match="locked"):
                    await asyncio.wait_for(al.record(**_request("ob-late")), GUARD)
            await _read_all(al, owed, gone)
    finally:
        store.close()


@pytest.mark.asyncio
async def test_reads_answer_while_a_child_process_holds_the_write_lock(
    db: Path, probe: FakeProbe
) -> None:
    """The same reads answer while another process holds the ledger file's write lock."""
    clock = FakeClock()
    store = quick_store(db)
    try:
        async with AsyncLedger(store, incarnation=LIVE, probe=probe, clock=clock) as al:
            owed, gone = await _seed(al, clock)
            with ChildProcessLock(db):
                await _read_all(al, owed, gone)
    finally:
        store.close()


@pytest.mark.asyncio
async def test_a_read_does_not_wait_for_a_writer_busy_in_its_batch(
    db: Path, probe: FakeProbe
) -> None:
    """While the writer thread is held inside a batch, a read answers at once with what was
    committed before: reads are not queued behind writes."""
    inner = quick_store(db)
    store = _GatedWrites(inner)
    try:
        async with AsyncLedger(store, incarnation=LIVE, probe=probe, clock=FakeClock()) as al:
            oid = (await al.record(**_request("ob-1"))).obligation_id
            store.armed = True
            held = asyncio.ensure_future(al.mark_attempting(oid))
            assert await asyncio.to_thread(store.entered.wait, GUARD)
            got = await asyncio.wait_for(al.get(oid), GUARD)
            assert got is not None
            assert got.state is S.PENDING
            store.release.set()
            assert (await asyncio.wait_for(held, GUARD)).state is S.ATTEMPTING
            got = await asyncio.wait_for(al.get(oid), GUARD)
            assert got is not None
            assert got.state is S.ATTEMPTING
    finally:
        inner.close()


class _GatedWrites:
    """Forwards to ``inner``; once ``armed``, the next batched transition holds the writer
    thread (inside its transaction) until ``release`` is set (bounded)."""

    def __init__(self, inner: SQLiteStore) -> None:
        self.inner = inner
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def transition_each(self, kind: Any, moves: Any) -> Any:
        if self.armed:
            self.armed = False
            self.entered.set()
            self.release.wait(GUARD)
        return self.inner.transition_each(kind, moves)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

"""Tests for statecore.ledger: the delivery-obligation ledger over every store.

Every test runs against the in-memory store and the SQLite store.  Time comes from a
FakeClock (stale cutoffs, leases, backoff and retention expire by ``advance``, never by
sleeping); process liveness comes from a scripted probe, except where the real PsutilProbe is
the point.  Ownership is injected: a "dead" ledger is one whose incarnation the probe does not
know, a "live" one is known to the probe with its exact start time.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest

from statecore import (
    OBLIGATION_KIND,
    RECONNECTED_MARKER,
    RECOVERED_MARKER,
    Audit,
    Claim,
    ErrorKind,
    FakeClock,
    Incarnation,
    InvalidTransition,
    Ledger,
    LedgerPolicy,
    StaleState,
    Store,
    UnknownEntity,
    compute_obligation_id,
)
from statecore.claims import ClaimingStore
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from tests.statecore.ledger_helpers import (
    DEAD,
    HOST,
    LIVE,
    OTHER_LIVE,
    POLICY,
    FakeProbe,
    S,
    _live_procs,
    claim_chain,
    current,
    dead_incarnation,
    failed,
    insert_unowned,
    make,
    record,
    snapshot,
    spend_budget_at_runtime,
)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty store of each kind (closed at teardown)."""
    made: Store = (
        InMemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "ledger.db")
    )
    yield made
    made.close()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SQLiteStore]:
    """An empty SQLite store on tmp_path / ledger.db, for tests that edit the file directly."""
    made = SQLiteStore(tmp_path / "ledger.db")
    yield made
    made.close()


@pytest.fixture
def clock() -> FakeClock:
    """The only time source of every ledger in a test."""
    return FakeClock()


@pytest.fixture
def probe() -> FakeProbe:
    """A probe that knows LIVE and OTHER_LIVE as alive, and nobody else."""
    return FakeProbe(_live_procs())


# -- record ------------------------------------------------------------------------------------


def test_record_starts_pending_owned_by_this_incarnation(store: Store, clock: FakeClock) -> None:
    """A new obligation is pending, owned by the recording incarnation, with nothing spent."""
    ledger = make(store, clock, FakeProbe())
    ob = ledger.record(session_key="sk", platform="slack", chat_id="C1", content="hi")
    assert ob.state is S.PENDING
    assert (ob.owner.host, ob.owner.pid, ob.owner.started_at, ob.owner.token) == (
        LIVE.host,
        LIVE.pid,
        LIVE.started_at,
        LIVE.token,
    )
    assert (ob.attempts, ob.fence, ob.last_error) == (0, 0, None)
    assert ob.adapter_profile == "default"
    assert ob.created_at == ob.updated_at == clock.now()
    assert ledger.get(ob.obligation_id) == ob


def test_record_with_default_incarnation_is_owned_by_this_process(
    store: Store, clock: FakeClock
) -> None:
    """Without an injected incarnation the owner is Incarnation.current()."""
    ledger = Ledger(store, clock=clock)
    ob = ledger.record(session_key="sk", platform="slack", chat_id="C1", content="hi")
    me = Incarnation.current()
    assert (ob.owner.host, ob.owner.pid, ob.owner.started_at, ob.owner.token) == (
        me.host,
        me.pid,
        me.started_at,
        me.token,
    )


def test_record_is_idempotent_and_leaves_the_stored_row_untouched(
    store: Store, clock: FakeClock
) -> None:
    """Re-recording an existing id returns the stored row untouched, whatever the new content."""
    ledger = make(store, clock, FakeProbe())
    oid = record(ledger)
    ledger.mark_attempting(oid)
    before = snapshot(ledger, oid)
    clock.advance(10)
    again = ledger.record(
        obligation_id=oid, session_key="other", platform="telegram", chat_id="9", content="new"
    )
    assert again == current(ledger, oid)
    assert again.content == "the final answer"
    assert again.platform == "slack"
    assert again.state is S.ATTEMPTING
    assert snapshot(ledger, oid) == before


def test_record_computes_a_stable_id_from_the_turn(store: Store, clock: FakeClock) -> None:
    """Without an explicit id, the same turn and text give the same computed id and one row."""
    ledger = make(store, clock, FakeProbe())
    kwargs: dict[str, Any] = {
        "session_key": "agent:main:slack:channel:C1",
        "platform": "slack",
        "chat_id": "C1",
        "content": "the final answer",
        "message_ref": "msg-7",
    }
    first = ledger.record(**kwargs)
    second = ledger.record(**kwargs)
    assert first.obligation_id == second.obligation_id
    assert first.obligation_id == compute_obligation_id(
        "agent:main:slack:channel:C1", "msg-7", "the final answer"
    )
    assert len(ledger.owed()) == 1
    assert len(ledger.history(first.obligation_id)) == 1


def test_record_stores_int_platform_ids_as_text(store: Store, clock: FakeClock) -> None:
    """Integer chat, thread and reply ids are stored (and read back) as their decimal text."""
    ledger = make(store, clock, FakeProbe())
    ob = ledger.record(
        session_key="sk", platform="telegram", chat_id=-100123, thread_id=42, reply_to=7,
        content="hi",
    )  # fmt: skip
    stored = current(ledger, ob.obligation_id)
    assert (stored.chat_id, stored.thread_id, stored.reply_to) == ("-100123", "42", "7")


@pytest.mark.parametrize(
    ("override", "error"),
    [
        ({"content": b"bytes"}, TypeError),
        ({"content": None}, TypeError),
        ({"platform": ""}, ValueError),
        ({"chat_id": ""}, ValueError),
        ({"session_key": ""}, ValueError),
        ({"chat_id": True}, TypeError),
        ({"chat_id": None}, TypeError),
        ({"thread_id": False}, TypeError),
        ({"adapter_profile": ""}, ValueError),
        ({"obligation_id": ""}, ValueError),
    ],
)
def test_record_rejects_bad_input_writing_nothing(
    store: Store, clock: FakeClock, override: dict[str, Any], error: type[Exception]
) -> None:
    """Bad input raises TypeError/ValueError and leaves the store empty."""
    ledger = make(store, clock, FakeProbe())
    kwargs: dict[str, Any] = {
        "session_key": "sk",
        "platform": "slack",
        "chat_id": "C1",
        "content": "hi",
    }
    kwargs.update(override)
    with pytest.raises(error, match=r"must"):
        ledger.record(**kwargs)
    assert store.count(OBLIGATION_KIND) == 0


def test_record_writes_a_creation_history_entry(store: Store, clock: FakeClock) -> None:
    """The first history entry is the record event with no source state."""
    ledger = make(store, clock, FakeProbe())
    oid = record(ledger)
    (entry,) = ledger.history(oid)
    assert entry.event == "record"
    assert entry.from_state is None
    assert entry.to_state is S.PENDING
    assert entry.at == clock.now()
    assert entry.entity_id == oid


# -- the strict lifecycle ----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["mark_delivered", "mark_failed", "release"])
def test_settling_a_pending_row_is_refused_and_changes_nothing(
    store: Store, clock: FakeClock, method: str
) -> None:
    """deliver/fail/release on a pending row raise InvalidTransition and change nothing."""
    ledger = make(store, clock, FakeProbe())
    oid = record(ledger)
    before = snapshot(ledger, oid)
    clock.advance(5)
    args = (oid, "boom") if method == "mark_failed" else (oid,)
    with pytest.raises(InvalidTransition):
        getattr(ledger, method)(*args)
    assert snapshot(ledger, oid) == before


@pytest.mark.parametrize("method", ["mark_attempting", "mark_delivered", "mark_failed", "release"])
def test_settling_a_delivered_row_is_refused(store: Store, clock: FakeClock, method: str) -> None:
    """A delivered row is terminal: every further lifecycle call raises InvalidTransition."""
    ledger = make(store, clock, FakeProbe())
    oid = record(ledger)
    ledger.mark_attempting(oid)
    ledger.mark_delivered(oid)
    before = snapshot(ledger, oid)
    args = (oid, "boom") if method == "mark_failed" else (oid,)
    with pytest.raises(InvalidTransition):
        getattr(ledger, method)(*args)
    assert snapshot(ledger, oid) == before


def test_marking_attempting_twice_is_refused(store: Store, clock: FakeClock) -> None:
    """mark_attempting needs a pending row."""
    ledger = make(store, clock, FakeProbe())
    oid = record(ledger)
    ledger.mark_attempting(oid)
    before = snapshot(ledger, oid)
    with pytest.raises(InvalidTransition):
        ledger.mark_attempting(oid)
    assert snapshot(ledger, oid) == before


@pytest.mark.parametrize("method", ["mark_attempting", "mark_delivered", "mark_failed", "release"])
def test_lifecycle_calls_on_unknown_id_raise_unknown_entity(
    store: Store, clock: FakeClock, method: str
) -> None:
    """A call for an id that was never recorded raises UnknownEntity and writes nothing."""
    ledger = make(store, clock, FakeProbe())
    args = ("nope", "boom") if method == "mark_failed" else ("nope",)
    with pytest.raises(UnknownEntity):
        getattr(ledger, method)(*args)
    assert store.count(OBLIGATION_KIND) == 0


def test_mark_failed_rejects_non_text_error(store: Store, clock: FakeClock) -> None:
    """mark_failed with a non-str error raises TypeError and leaves the row attempting."""
    ledger = make(store, clock, FakeProbe())
    oid = record(ledger)
    ledger.mark_attempting(oid)
    before = snapshot(ledger, oid)
    with pytest.raises(TypeError):
        ledger.mark_failed(oid, 500)  # type: ignore[arg-type]
    assert snapshot(ledger, oid) == before


# -- the settle path ---------------------------------------------------------------------------


def test_record_attempt_deliver(store: Store, clock: FakeClock) -> None:
    """A send marked attempting and then delivered ends delivered, its fence bumped per move."""
    ledger = make(store, clock, FakeProbe())
    oid = record(ledger)
    attempting = ledger.mark_attempting(oid)
    assert (attempting.state, attempting.fence, attempting.attempts) == (S.ATTEMPTING, 1, 0)
    clock.advance(2)
    delivered = ledger.mark_delivered(oid)
    assert (delivered.state, delivered.fence, delivered.attempts) == (S.DELIVERED, 2, 0)
    assert delivered.updated_at == clock.now()
    assert current(ledger, oid) == delivered
    assert [e.event for e in ledger.history(oid)] == ["record", "attempt", "deliver"]


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ("Forbidden: bot was blocked by the user", ErrorKind.PERMANENT),
        ("connection reset", ErrorKind.TRANSIENT),
        ("429 Too Many Requests", ErrorKind.RATE_LIMITED),
        ("send_path_degraded", ErrorKind.RECONNECT),
    ],
)
def test_mark_failed_keeps_error_and_its_kind(
    store: Store, clock: FakeClock, error: str, kind: ErrorKind
) -> None:
    """A failed send keeps its error text and the policy's classification of it."""
    ledger = make(store, clock, FakeProbe())
    oid = failed(ledger, error=error)
    ob = current(ledger, oid)
    assert ob.state is S.FAILED
    assert ob.last_error == error
    assert ob.error_kind == kind.value
    assert ob.attempts == 0


def test_a_typed_failure_is_stored_with_its_kind_whatever_its_text(
    store: Store, clock: FakeClock
) -> None:
    """The adapter's kind wins over the text: a 'forbidden' text typed transient is retried,
    a plain 'timeout' typed permanent is not; the sweep acts on the stored kind."""
    ledger = make(store, clock, FakeProbe())
    record(ledger, "typed-transient")
    ledger.mark_attempting("typed-transient")
    ledger.mark_failed("typed-transient", "forbidden by a proxy", kind=ErrorKind.TRANSIENT)
    record(ledger, "typed-permanent", chat_id="C2")
    ledger.mark_attempting("typed-permanent")
    ledger.mark_failed("typed-permanent", "timeout", kind=ErrorKind.PERMANENT)
    assert current(ledger, "typed-transient").error_kind == "transient"
    assert current(ledger, "typed-permanent").error_kind == "permanent"
    clock.advance(ledger.policy.retry_backoff[0])
    claimed = [c.obligation_id for c in ledger.sweep_failed_for_runtime("slack")]
    assert claimed == ["typed-transient"]
    assert current(ledger, "typed-permanent").state is S.FAILED


def test_an_ambiguous_failure_is_never_a_reconnect_error_and_says_so(
    store: Store, clock: FakeClock
) -> None:
    """A send that may have gone out is kept as transient (never 'the platform did not see
    it'), and its history entry says it may have gone out."""
    ledger = make(store, clock, FakeProbe())
    oid = record(ledger)
    ledger.mark_attempting(oid)
    ob = ledger.mark_failed(oid, "send_path_degraded", ambiguous=True)
    assert ob.error_kind == ErrorKind.TRANSIENT.value
    assert ob.next_attempt_at == clock.now() + ledger.policy.retry_backoff[0]
    assert ledger.history(oid)[-1].reason == "may have gone out: send_path_degraded"


def test_mark_failed_rejects_a_kind_that_is_not_an_error_kind(
    store: Store, clock: FakeClock
) -> None:
    """A kind given as text is refused with TypeError and the row is unchanged."""
    ledger = make(store, clock, FakeProbe())
    oid = record(ledger)
    ledger.mark_attempting(oid)
    before = snapshot(ledger, oid)
    with pytest.raises(TypeError, match="ErrorKind"):
        ledger.mark_failed(oid, "boom", kind="permanent")  # type: ignore[arg-type]
    assert snapshot(ledger, oid) == before


def test_a_row_failed_without_a_stored_kind_is_classified_from_its_text(
    store: Store, clock: FakeClock
) -> None:
    """Rows written by other writers without a kind still follow the policy's reading of
    their text: a reconnect error is due at once, a permanent one stays."""
    ledger = make(store, clock, FakeProbe())
    for oid, error in (("untyped-reconnect", "send_path_degraded"), ("untyped-gone", "chat gone")):
        record(ledger, oid, chat_id=oid)
        ledger.mark_attempting(oid)
        # Failed by a writer that stores no kind (an older version, another tool).
        store.transition(
            OBLIGATION_KIND,
            oid,
            "fail",
            audit=Audit(clock.now(), reason=error),
            changes={"last_error": error, "error_kind": None},
        )
        assert current(ledger, oid).error_kind is None
    claimed = [c.obligation_id for c in ledger.sweep_failed_for_runtime("slack")]
    assert claimed == ["untyped-reconnect"]


def test_mark_failed_truncates_long_errors(store: Store, clock: FakeClock) -> None:
    """Stored error text is bounded by policy.max_error_length."""
    ledger = make(store, clock, FakeProbe(), policy=LedgerPolicy(max_error_length=40))
    oid = failed(ledger, error="x" * 5_000)
    stored = current(ledger, oid).last_error
    assert stored is not None
    assert len(stored) <= 40
    assert stored.startswith("x" * 30)


# -- zombie fencing ----------------------------------------------------------------------------


def test_zombie_cannot_settle_a_row_claimed_from_it(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A presumed-dead owner that wakes up after its row was claimed gets StaleState."""
    zombie = make(store, clock, probe, DEAD)
    oid = record(zombie)
    zombie.mark_attempting(oid)
    live = make(store, clock, probe)
    (claim,) = live.sweep_recoverable()
    assert claim.obligation_id == oid
    before = snapshot(live, oid)
    late_writes: list[Callable[[], object]] = [
        lambda: zombie.mark_delivered(oid),
        lambda: zombie.mark_failed(oid, "timeout"),
        lambda: zombie.release(oid),
    ]
    for late_write in late_writes:
        with pytest.raises(StaleState):
            late_write()
    assert snapshot(live, oid) == before
    ob = current(live, oid)
    assert ob.state is S.ATTEMPTING
    assert ob.owner.token == LIVE.token
    assert live.mark_delivered(oid).state is S.DELIVERED


def test_a_live_ledger_cannot_settle_another_live_ledgers_row(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Two live incarnations: one cannot attempt or settle the other's row (StaleState)."""
    mine = make(store, clock, probe, LIVE)
    theirs = make(store, clock, probe, OTHER_LIVE)
    oid = record(theirs)
    with pytest.raises(StaleState):
        mine.mark_attempting(oid)
    theirs.mark_attempting(oid)
    before = snapshot(theirs, oid)
    with pytest.raises(StaleState):
        mine.mark_delivered(oid)
    with pytest.raises(StaleState):
        mine.mark_failed(oid, "boom")
    assert snapshot(theirs, oid) == before
    assert theirs.mark_delivered(oid).state is S.DELIVERED


# -- the startup sweep -------------------------------------------------------------------------


def test_startup_sweep_never_claims_live_owners_rows(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Rows owned by live processes (this one or another) are not touched by a startup sweep."""
    mine = make(store, clock, probe, LIVE)
    theirs = make(store, clock, probe, OTHER_LIVE)
    a = record(mine, "ob-a")
    b = record(theirs, "ob-b")
    theirs.mark_attempting(b)
    c = failed(theirs, "ob-c", error="connection reset")
    before = [snapshot(mine, oid) for oid in (a, b, c)]
    assert mine.sweep_recoverable() == []
    assert theirs.sweep_recoverable() == []
    assert [snapshot(mine, oid) for oid in (a, b, c)] == before


class LockCountingStore(InMemoryStore):
    """An in-memory store with the claim capability (a ClaimingStore: rows are locked by the
    block, here simply read inside it), counting the locked reads a sweep makes."""

    def __init__(self) -> None:
        super().__init__()
        self.locked_reads: list[int] = []

    def claim_candidates(self, kind: Any, **kw: Any) -> list[Any]:
        rows = self.select(kind, **kw)
        self.locked_reads.append(len(rows))
        return rows


def test_a_sweep_among_live_owners_locks_nothing(clock: FakeClock, probe: FakeProbe) -> None:
    """Owners are judged on the sweep's plain listing: while every owner lives, a recovery
    sweep takes no row lock at all (on a server, locking writes to its log and waits for a
    flush); once an owner is dead, only its rows are locked and claimed."""
    store = LockCountingStore()
    assert isinstance(store, ClaimingStore)
    mine = make(store, clock, probe, LIVE)
    theirs = make(store, clock, probe, OTHER_LIVE)
    gone = make(store, clock, probe, dead_incarnation())
    record(theirs, "ob-live-1")
    record(theirs, "ob-live-2")
    assert mine.sweep_recoverable() == []
    assert store.locked_reads == []
    record(gone, "ob-dead")
    claims = mine.sweep_recoverable()
    assert [c.obligation_id for c in claims] == ["ob-dead"]
    assert store.locked_reads == [1]  # the dead owner's row alone


def test_startup_sweep_with_real_probe_leaves_this_process_rows(
    store: Store, clock: FakeClock
) -> None:
    """With the real PsutilProbe, rows recorded by this very process are never claimed."""
    ledger = Ledger(store, clock=clock)
    oid = record(ledger)
    ledger.mark_attempting(oid)
    before = snapshot(ledger, oid)
    assert ledger.sweep_recoverable() == []
    assert Ledger(store, clock=clock).sweep_recoverable() == []
    assert snapshot(ledger, oid) == before


def _missing_pid() -> int:
    """A pid no process holds right now."""
    pid = 3_999_999
    while psutil.pid_exists(pid):
        pid -= 1
    return pid


def test_startup_sweep_with_real_probe_claims_a_vanished_pid(
    store: Store, clock: FakeClock
) -> None:
    """With the real PsutilProbe, a same-host owner whose pid does not exist is dead."""
    dead = Ledger(store, clock=clock, incarnation=dead_incarnation(_missing_pid()))
    oid = record(dead)
    (claim,) = Ledger(store, clock=clock).sweep_recoverable()
    assert claim.obligation_id == oid
    assert current(dead, oid).owner.token == Incarnation.current().token


def test_dead_owner_pending_row_is_claimed_plain_once(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A dead owner's pending row is claimed without a marker, and only by the first sweep."""
    oid = record(make(store, clock, probe, DEAD))
    live = make(store, clock, probe)
    clock.advance(60)
    (claim,) = live.sweep_recoverable()
    assert claim.obligation_id == oid
    assert claim.needs_marker is False
    assert claim.reason is None
    assert claim.attempts == 1
    assert claim.profile == "default"
    ob = current(live, oid)
    assert claim.obligation == ob
    assert (ob.state, ob.attempts, ob.fence) == (S.ATTEMPTING, 1, 1)
    assert ob.owner.token == LIVE.token
    assert ob.owner.pid == LIVE.pid
    assert ob.updated_at == clock.now()
    assert live.sweep_recoverable() == []
    assert current(live, oid) == ob
    assert claim.render() == "the final answer"


def test_dead_owner_attempting_row_is_claimed_with_recovered_marker(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A row whose send had begun may have reached the user: claimed with reason 'recovered'."""
    dead = make(store, clock, probe, DEAD)
    oid = record(dead)
    dead.mark_attempting(oid)
    (claim,) = make(store, clock, probe).sweep_recoverable()
    assert (claim.needs_marker, claim.reason, claim.attempts) == (True, "recovered", 1)
    assert current(dead, oid).state is S.ATTEMPTING
    assert claim.render().startswith(RECOVERED_MARKER)
    assert claim.render().endswith("the final answer")


def test_dead_owner_failed_row_is_claimed_with_marker(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A dead owner's failed row is claimed for a labelled resend."""
    oid = failed(make(store, clock, probe, DEAD), error="Forbidden: bot was blocked by the user")
    (claim,) = make(store, clock, probe).sweep_recoverable()
    assert claim.obligation_id == oid
    assert (claim.needs_marker, claim.reason, claim.attempts) == (True, "recovered", 1)
    assert claim.obligation.state is S.ATTEMPTING


def test_pending_row_claimed_by_an_earlier_boot_gets_a_marker(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A pending row that already spent an attempt (an earlier boot claimed it) needs a marker."""
    make(store, clock, probe)  # registers the kind
    insert_unowned(
        store, "ob-1", clock.now(), attempts=1, owner_host=HOST, owner_pid=DEAD.pid,
        owner_started_at=1,
    )  # fmt: skip
    (claim,) = make(store, clock, probe).sweep_recoverable()
    assert (claim.needs_marker, claim.reason, claim.attempts) == (True, "recovered", 2)


def test_row_orphaned_twice_is_claimed_with_marker(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A row claimed by a boot that then died too is claimed again, labelled, budget counted."""
    oid = record(make(store, clock, probe, DEAD))
    claim_chain(store, clock, probe, oid, hops=1)
    (claim,) = make(store, clock, probe).sweep_recoverable()
    assert (claim.needs_marker, claim.reason, claim.attempts) == (True, "recovered", 2)


def test_over_budget_row_is_abandoned_with_reason(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A dead owner's row that spent max_attempts is abandoned, and history says why."""
    oid = record(make(store, clock, probe, DEAD))
    claim_chain(store, clock, probe, oid, hops=POLICY.max_attempts)
    live = make(store, clock, probe)
    assert live.sweep_recoverable() == []
    ob = current(live, oid)
    assert ob.state is S.ABANDONED
    assert ob.attempts == POLICY.max_attempts
    last = live.history(oid)[-1]
    assert (last.event, last.from_state, last.to_state) == ("abandon", S.ATTEMPTING, S.ABANDONED)
    assert last.reason is not None
    assert "budget" in last.reason
    assert [o.obligation_id for o in live.abandoned()] == [oid]
    assert live.owed() == []


@pytest.mark.parametrize("prepare", ["pending", "attempting", "failed"])
def test_stale_dead_owner_row_is_abandoned_with_reason(
    store: Store, clock: FakeClock, probe: FakeProbe, prepare: str
) -> None:
    """A dead owner's row older than stale_after is abandoned, never sent late."""
    dead = make(store, clock, probe, DEAD)
    oid = record(dead)
    if prepare != "pending":
        dead.mark_attempting(oid)
    if prepare == "failed":
        dead.mark_failed(oid, "connection reset")
    live = make(store, clock, probe)
    clock.advance(POLICY.stale_after - 1)
    claimed_young = make(store, clock, probe, dead_incarnation(6_000))
    assert len(claimed_young.sweep_recoverable()) == 1  # not stale yet: claimed
    clock.advance(2)
    assert live.sweep_recoverable() == []
    assert current(live, oid).state is S.ABANDONED
    last = live.history(oid)[-1]
    assert last.event == "abandon"
    assert last.reason is not None
    assert "stale" in last.reason


def test_undeliverable_platform_keeps_its_budget_across_many_boots(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Boots that cannot send to a row's platform leave it untouched, never abandoning it."""
    dead = make(store, clock, probe, DEAD)
    oid = record(dead, platform="telegram")
    dead.mark_attempting(oid)
    before = snapshot(dead, oid)
    for boot in range(POLICY.max_attempts + 2):
        booted = make(store, clock, probe, dead_incarnation(7_000 + boot))
        assert booted.sweep_recoverable(deliverable_platforms={"discord"}) == []
        assert booted.sweep_recoverable(deliverable_platforms=set()) == []
    assert snapshot(dead, oid) == before
    ob = current(dead, oid)
    assert (ob.state, ob.attempts) == (S.ATTEMPTING, 0)
    (claim,) = make(store, clock, probe).sweep_recoverable(deliverable_platforms={"telegram"})
    assert claim.obligation_id == oid
    assert claim.attempts == 1


def test_pending_row_is_claimed_once_its_platform_returns(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A pending row skipped while its platform was down is claimed plain, first attempt."""
    oid = record(make(store, clock, probe, DEAD), platform="telegram")
    for boot in range(POLICY.max_attempts + 2):
        booted = make(store, clock, probe, dead_incarnation(7_000 + boot))
        assert booted.sweep_recoverable(deliverable_platforms=["discord"]) == []
    (claim,) = make(store, clock, probe).sweep_recoverable(deliverable_platforms=["telegram"])
    assert (claim.obligation_id, claim.attempts, claim.needs_marker) == (oid, 1, False)


def test_deliverable_targets_scope_claims_by_platform_and_profile(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A row of another bot profile is claimed only when that (platform, profile) can send."""
    oid = record(
        make(store, clock, probe, DEAD),
        session_key="agent:routed-profile:slack:channel:C1",
        adapter_profile="credential-owner",
    )
    live = make(store, clock, probe)
    before = snapshot(live, oid)
    assert live.sweep_recoverable(deliverable_targets={("slack", "default")}) == []
    assert live.sweep_recoverable(deliverable_targets={("telegram", "credential-owner")}) == []
    assert snapshot(live, oid) == before
    assert current(live, oid).attempts == 0
    (claim,) = live.sweep_recoverable(deliverable_targets={("slack", "credential-owner")})
    assert claim.obligation_id == oid
    assert claim.profile == "credential-owner"
    assert claim.obligation.adapter_profile == "credential-owner"
    assert claim.attempts == 1


def test_each_owner_is_probed_once_per_sweep(store: Store, clock: FakeClock) -> None:
    """Many rows of three dead owners cost exactly three liveness probes in one sweep."""
    counting = FakeProbe(_live_procs())
    owners = [dead_incarnation(8_000 + n) for n in range(3)]
    for owner in owners:
        ledger = make(store, clock, counting, owner)
        for k in range(4):
            record(ledger, f"ob-{owner.pid}-{k}")
    claims = make(store, clock, counting).sweep_recoverable()
    assert len(claims) == 12
    assert sorted(counting.start_time_calls) == [o.pid for o in owners]
    assert sorted(counting.pid_exists_calls) == [o.pid for o in owners]


def test_raising_probe_means_dead(store: Store, clock: FakeClock) -> None:
    """A probe that raises proves nothing about the owner: its rows are claimed."""
    oid = record(make(store, clock, FakeProbe(), DEAD))
    (claim,) = make(store, clock, FakeProbe(raises=True)).sweep_recoverable()
    assert claim.obligation_id == oid


def test_raising_probe_never_makes_a_sweep_claim_its_own_rows(
    store: Store, clock: FakeClock
) -> None:
    """This incarnation is alive by definition: its own rows are never claimed by its sweep."""
    ledger = make(store, clock, FakeProbe(raises=True))
    oid = record(ledger)
    assert ledger.sweep_recoverable() == []
    assert current(ledger, oid).state is S.PENDING


@pytest.mark.parametrize(("pid_exists", "claimed"), [(True, False), (False, True)])
def test_unreadable_start_time_falls_back_to_pid_exists(
    store: Store, clock: FakeClock, pid_exists: bool, claimed: bool
) -> None:
    """When the owner's start time cannot be read, the owner lives exactly if its pid exists."""
    owner = dead_incarnation(9_001)
    oid = record(make(store, clock, FakeProbe(), owner))
    procs: dict[int, int | None] = {LIVE.pid: LIVE.started_at}
    if pid_exists:
        procs[owner.pid] = None
    claims = make(store, clock, FakeProbe(procs)).sweep_recoverable()
    assert [c.obligation_id for c in claims] == ([oid] if claimed else [])


def test_reused_pid_with_another_start_time_is_dead(store: Store, clock: FakeClock) -> None:
    """An owner pid now held by a process with a different start time is a dead owner."""
    owner = Incarnation(HOST, 9_002, 111, "old")
    oid = record(make(store, clock, FakeProbe(), owner))
    alive_same = FakeProbe({LIVE.pid: LIVE.started_at, owner.pid: 111})
    assert make(store, clock, alive_same).sweep_recoverable() == []
    reused = FakeProbe({LIVE.pid: LIVE.started_at, owner.pid: 222})
    (claim,) = make(store, clock, reused).sweep_recoverable()
    assert claim.obligation_id == oid


def test_other_host_rows_wait_for_their_lease(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A row owned on another host is claimed only after its lease expired, never probed."""
    remote = Incarnation("some-other-host", LIVE.pid, LIVE.started_at or 1, "remote")
    oid = record(make(store, clock, probe, remote))
    lease = current(make(store, clock, probe), oid).lease_expires_at
    assert lease == clock.now() + POLICY.lease_s
    live = make(store, clock, probe)
    clock.advance(POLICY.lease_s - 1)
    assert live.sweep_recoverable() == []
    assert current(live, oid).attempts == 0
    clock.advance(2)
    (claim,) = live.sweep_recoverable()
    assert claim.obligation_id == oid
    assert claim.needs_marker is False


def test_unowned_rows_are_claimed_at_startup(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A row with no recorded owner has nobody alive to send it: the startup sweep claims it."""
    live = make(store, clock, probe)
    insert_unowned(store, "ob-1", clock.now())
    (claim,) = live.sweep_recoverable()
    assert (claim.obligation_id, claim.attempts, claim.needs_marker) == ("ob-1", 1, False)
    assert current(live, "ob-1").owner.token == LIVE.token


def test_startup_sweep_claims_oldest_first_and_skips_settled(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Claims come oldest first; delivered rows of dead owners are never claimed."""
    dead = make(store, clock, probe, DEAD)
    record(dead, "ob-z")
    clock.advance(1)
    record(dead, "ob-a")
    clock.advance(1)
    done = record(dead, "ob-done")
    dead.mark_attempting(done)
    dead.mark_delivered(done)
    claims = make(store, clock, probe).sweep_recoverable()
    assert [c.obligation_id for c in claims] == ["ob-z", "ob-a"]
    assert current(dead, done).state is S.DELIVERED


def test_startup_sweep_claims_many_rows_of_mixed_kinds_in_age_order(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Rows of several dead owners, states and attempt counts, interleaved by age: every one is
    claimed once, oldest first, each with its own marker, attempt count and audit entry."""
    owners = [make(store, clock, probe, dead_incarnation(pid)) for pid in (900_001, 900_002)]
    expected: list[tuple[str, bool, int]] = []  # (id, needs_marker, attempts), oldest first
    # The oldest rows were orphaned once already: a process claimed them, then died too.
    for i in range(4):
        expected.append((record(owners[i % 2], f"ob-old-{i}"), True, 2))
        clock.advance(1)
    orphaner = make(store, clock, probe, dead_incarnation(900_003))
    assert len(orphaner.sweep_recoverable()) == 4
    for i in range(8):
        ledger = owners[i % 2]
        oid = record(ledger, f"ob-{i}")
        if i % 2:
            ledger.mark_attempting(oid)  # a send may have happened: marker
            expected.append((oid, True, 1))
        else:
            expected.append((oid, False, 1))
        clock.advance(1)
    claims = make(store, clock, probe).sweep_recoverable()
    assert [(c.obligation_id, c.needs_marker, c.attempts) for c in claims] == expected
    for claim in claims:
        assert claim.reason == ("recovered" if claim.needs_marker else None)
        ob = current(owners[0], claim.obligation_id)
        assert (ob.state, ob.attempts, ob.owner.token) == (S.ATTEMPTING, claim.attempts, LIVE.token)
        assert claim.obligation == ob
        last = store.history(OBLIGATION_KIND, claim.obligation_id)[-1]
        assert (last.event, last.attempts, last.owner) == (
            "claim",
            claim.attempts,
            f"{LIVE.host}:{LIVE.pid}:{LIVE.token}",
        )
    assert make(store, clock, probe).sweep_recoverable() == []


def test_startup_sweep_skips_a_row_that_changed_after_it_was_read(
    store: Store, clock: FakeClock, probe: FakeProbe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row claimed by another sweeper between this sweep's read and its claim is skipped; the
    other rows read with it (same owner, fence and attempts: one bulk claim) are still claimed,
    each exactly once."""
    dead = make(store, clock, probe, DEAD)
    oids = [record(dead, f"ob-{i}") for i in range(5)]
    rival = make(store, clock, probe, OTHER_LIVE)
    real_select = store.select

    def select_then_race(*args: Any, **kwargs: Any) -> Any:
        rows = real_select(*args, **kwargs)
        # The rival claims the oldest row under the fence it read, right after our read.
        assert rival._claim(rows[0], clock.now(), False, None) is not None
        return rows

    monkeypatch.setattr(store, "select", select_then_race)
    claims = make(store, clock, probe).sweep_recoverable()
    monkeypatch.undo()
    assert [c.obligation_id for c in claims] == oids[1:]
    assert current(dead, oids[0]).owner.token == OTHER_LIVE.token
    claim_entries = [
        e for oid in oids for e in store.history(OBLIGATION_KIND, oid) if e.event == "claim"
    ]
    assert len(claim_entries) == len(oids)  # one claim per row, never two


# -- the runtime sweep -------------------------------------------------------------------------


def test_runtime_sweep_claims_own_reconnect_failure(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """This incarnation's send_path_degraded failure is claimed at once, labelled 'reconnected'."""
    ledger = make(store, clock, probe)
    oid = failed(ledger, platform="telegram")
    (claim,) = ledger.sweep_failed_for_runtime("telegram")
    assert claim.obligation_id == oid
    assert (claim.needs_marker, claim.reason, claim.attempts) == (True, "reconnected", 1)
    ob = current(ledger, oid)
    assert (ob.state, ob.attempts) == (S.ATTEMPTING, 1)
    assert ob.owner.token == LIVE.token
    assert claim.render().startswith(RECONNECTED_MARKER)
    assert ledger.mark_delivered(oid).state is S.DELIVERED


def test_runtime_sweep_leaves_permanent_failures(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A permanent failure is never retried in-process: it stays failed with its budget intact."""
    ledger = make(store, clock, probe)
    oid = failed(ledger, platform="telegram", error="Forbidden: bot was blocked by the user")
    assert ledger.sweep_failed_for_runtime("telegram") == []
    clock.advance(3_600)
    assert ledger.sweep_failed_for_runtime("telegram") == []
    ob = current(ledger, oid)
    assert (ob.state, ob.attempts) == (S.FAILED, 0)


def test_runtime_sweep_is_platform_scoped_and_does_not_reclaim(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Only the named platform's rows are claimed, and a claimed row is not claimed again."""
    ledger = make(store, clock, probe)
    tg = failed(ledger, "ob-1", platform="telegram")
    sl = failed(ledger, "ob-2", platform="slack", chat_id="C2")
    assert [c.obligation_id for c in ledger.sweep_failed_for_runtime("telegram")] == [tg]
    assert ledger.sweep_failed_for_runtime("telegram") == []
    ob = current(ledger, sl)
    assert (ob.state, ob.attempts) == (S.FAILED, 0)
    assert current(ledger, tg).attempts == 1


def test_runtime_sweep_leaves_another_live_owners_row_even_at_cap(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Another live process's failed row at the attempt cap is neither claimed nor abandoned."""
    theirs = make(store, clock, probe, OTHER_LIVE)
    oid = failed(theirs, platform="telegram")
    spend_budget_at_runtime(theirs, oid)
    mine = make(store, clock, probe)
    before = snapshot(mine, oid)
    assert mine.sweep_failed_for_runtime("telegram") == []
    assert mine.sweep_recoverable() == []
    assert snapshot(mine, oid) == before
    ob = current(mine, oid)
    assert (ob.state, ob.attempts) == (S.FAILED, POLICY.max_attempts)


def test_runtime_sweep_leaves_unowned_rows(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A failed row with no recorded owner is not this incarnation's: never claimed at runtime."""
    ledger = make(store, clock, probe)
    insert_unowned(store, "ob-1", clock.now(), platform="telegram")
    store.transition(OBLIGATION_KIND, "ob-1", "claim", audit=Audit(clock.now()))
    store.transition(
        OBLIGATION_KIND,
        "ob-1",
        "fail",
        audit=Audit(clock.now()),
        changes={"last_error": "send_path_degraded", "error_kind": "reconnect"},
    )
    assert current(ledger, "ob-1").owner.pid is None
    assert ledger.sweep_failed_for_runtime("telegram") == []
    assert current(ledger, "ob-1").state is S.FAILED


def test_runtime_sweep_fails_closed_without_own_start_time(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """An incarnation that cannot read its own start time claims nothing at runtime."""
    blind = make(store, clock, probe, Incarnation(HOST, LIVE.pid, None, "blind"))
    oid = failed(blind, platform="telegram")
    assert blind.sweep_failed_for_runtime("telegram") == []
    ob = current(blind, oid)
    assert (ob.state, ob.attempts) == (S.FAILED, 0)


def test_runtime_sweep_same_pid_other_start_time_is_not_self(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A row of an earlier process that had our pid (other start time) is not claimed at runtime."""
    earlier = make(store, clock, probe, Incarnation(HOST, LIVE.pid, 101, "earlier"))
    oid = failed(earlier, platform="telegram")
    now = make(store, clock, probe, Incarnation(HOST, LIVE.pid, 202, "now"))
    assert now.sweep_failed_for_runtime("telegram") == []
    ob = current(now, oid)
    assert (ob.state, ob.attempts) == (S.FAILED, 0)


def test_runtime_sweep_is_profile_scoped(store: Store, clock: FakeClock, probe: FakeProbe) -> None:
    """profile= claims only that bot identity's rows; the default profile is the default."""
    ledger = make(store, clock, probe)
    plain = failed(ledger, "ob-1", platform="telegram")
    reviewer = failed(
        ledger,
        "ob-2",
        platform="telegram",
        session_key="agent:reviewer:telegram:dm:C2",
        chat_id="C2",
        adapter_profile="reviewer",
    )
    (claim,) = ledger.sweep_failed_for_runtime("telegram", profile="reviewer")
    assert claim.obligation_id == reviewer
    assert claim.profile == "reviewer"
    assert current(ledger, plain).state is S.FAILED
    assert [c.obligation_id for c in ledger.sweep_failed_for_runtime("telegram")] == [plain]


def test_runtime_sweep_abandons_own_row_at_cap(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """This incarnation's own failed row at the attempt cap is abandoned, history saying why."""
    ledger = make(store, clock, probe)
    oid = failed(ledger, platform="telegram")
    spend_budget_at_runtime(ledger, oid)
    assert ledger.sweep_failed_for_runtime("telegram") == []
    assert current(ledger, oid).state is S.ABANDONED
    reason = ledger.history(oid)[-1].reason
    assert reason is not None
    assert "budget" in reason


def test_delivered_row_is_never_reclaimed_even_with_a_retryable_error(
    sqlite_store: SQLiteStore, clock: FakeClock, probe: FakeProbe
) -> None:
    """Only the state guard protects a delivered row whose last_error is forced retryable."""
    ledger = make(sqlite_store, clock, probe)
    oid = failed(ledger, platform="telegram")
    assert len(ledger.sweep_failed_for_runtime("telegram")) == 1
    ledger.mark_delivered(oid)
    with contextlib.closing(sqlite3.connect(sqlite_store.path)) as raw, raw:
        raw.execute(
            "UPDATE delivery_obligations SET last_error = 'send_path_degraded', "
            "error_kind = 'reconnect', next_attempt_at = 0 WHERE obligation_id = ?",
            (oid,),
        )
    assert current(ledger, oid).last_error == "send_path_degraded"
    clock.advance(60)
    assert ledger.sweep_failed_for_runtime("telegram") == []
    assert make(sqlite_store, clock, FakeProbe()).sweep_recoverable() == []
    ob = current(ledger, oid)
    assert (ob.state, ob.attempts) == (S.DELIVERED, 1)


def test_runtime_sweep_abandons_own_stale_row(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """This incarnation's own failed row older than stale_after is abandoned, not resent."""
    ledger = make(store, clock, probe)
    oid = failed(ledger, platform="telegram")
    clock.advance(POLICY.stale_after + 1)
    assert ledger.sweep_failed_for_runtime("telegram") == []
    assert current(ledger, oid).state is S.ABANDONED
    reason = ledger.history(oid)[-1].reason
    assert reason is not None
    assert "stale" in reason


@pytest.mark.parametrize(
    ("error", "reason"),
    [("connection reset", "reconnected"), ("429 Too Many Requests", "rate_limited")],
)
def test_runtime_sweep_waits_out_the_backoff(
    store: Store, clock: FakeClock, probe: FakeProbe, error: str, reason: str
) -> None:
    """Transient and rate-limit failures are claimed only once retry_backoff[0] has passed."""
    ledger = make(store, clock, probe)
    oid = failed(ledger, platform="telegram", error=error)
    assert ledger.sweep_failed_for_runtime("telegram") == []
    clock.advance(POLICY.retry_backoff[0] - 1)
    assert ledger.sweep_failed_for_runtime("telegram") == []
    assert current(ledger, oid).attempts == 0
    clock.advance(1)
    (claim,) = ledger.sweep_failed_for_runtime("telegram")
    assert (claim.obligation_id, claim.reason, claim.needs_marker) == (oid, reason, True)
    assert claim.attempts == 1
    assert claim.render().startswith(RECONNECTED_MARKER)


def test_runtime_sweep_keeps_the_last_budgeted_attempt_for_a_restart(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """After in_process_retries runtime retries a transient failure waits for a restart."""
    ledger = make(store, clock, probe)
    oid = failed(ledger, platform="telegram", error="connection reset")
    retries = POLICY.in_process_retries
    assert 0 < retries < POLICY.max_attempts
    for n in range(retries):
        clock.advance(POLICY.retry_backoff[n])
        (claim,) = ledger.sweep_failed_for_runtime("telegram")
        assert claim.attempts == n + 1
        ledger.mark_failed(oid, "connection reset")
    clock.advance(max(POLICY.retry_backoff) * 10)
    assert ledger.sweep_failed_for_runtime("telegram") == []
    ob = current(ledger, oid)
    assert (ob.state, ob.attempts) == (S.FAILED, retries)
    assert ob in ledger.owed()
    # The process dies; the next boot claims the row with the budget it has left.
    restarted = make(store, clock, FakeProbe({9_500: 3}), Incarnation(HOST, 9_500, 3, "boot2"))
    (claim,) = restarted.sweep_recoverable()
    assert (claim.obligation_id, claim.attempts, claim.reason) == (oid, retries + 1, "recovered")


# -- release -----------------------------------------------------------------------------------


def test_release_refunds_the_attempt_and_keeps_the_previous_error(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """An unsent claim handed back is failed again with its attempt refunded and error kept."""
    oid = failed(make(store, clock, probe, DEAD), error="connection reset")
    live = make(store, clock, probe)
    (claim,) = live.sweep_recoverable()
    assert claim.attempts == 1
    released = live.release(oid)
    assert (released.state, released.attempts) == (S.FAILED, 0)
    assert released.last_error == "connection reset"
    assert released.error_kind == ErrorKind.TRANSIENT.value
    assert released.owner.token == LIVE.token
    assert live.history(oid)[-1].event == "release"


def test_release_without_previous_error_is_due_on_reconnect(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A released claim with no previous error gets send_path_degraded and is due at once."""
    oid = record(make(store, clock, probe, DEAD), platform="telegram")
    live = make(store, clock, probe)
    live.sweep_recoverable()
    released = live.release(oid)
    assert (released.state, released.attempts) == (S.FAILED, 0)
    assert released.last_error == "send_path_degraded"
    (claim,) = live.sweep_failed_for_runtime("telegram")
    assert (claim.obligation_id, claim.reason, claim.attempts) == (oid, "reconnected", 1)


def test_release_with_explicit_error_keeps_it(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """release(id, error=...) on a row without a previous error stores that error."""
    oid = record(make(store, clock, probe, DEAD))
    live = make(store, clock, probe)
    live.sweep_recoverable()
    assert live.release(oid, error="x").last_error == "x"


def test_release_never_takes_attempts_below_zero(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Releasing a first send that spent no attempt leaves attempts at zero."""
    ledger = make(store, clock, probe)
    oid = record(ledger)
    ledger.mark_attempting(oid)
    released = ledger.release(oid)
    assert (released.state, released.attempts) == (S.FAILED, 0)


# -- Claim.render ------------------------------------------------------------------------------


def _claim(store: Store, clock: FakeClock, needs_marker: bool, reason: str | None) -> Claim:
    ledger = make(store, clock, FakeProbe())
    oid = record(ledger, content="line one\nline two")
    return Claim(current(ledger, oid), needs_marker, reason, 1, "default")


def test_render_plain_claim_is_the_content(store: Store, clock: FakeClock) -> None:
    """A claim that needs no marker renders exactly the content."""
    assert _claim(store, clock, False, None).render() == "line one\nline two"


@pytest.mark.parametrize(
    ("reason", "banner"),
    [
        ("recovered", RECOVERED_MARKER),
        ("reconnected", RECONNECTED_MARKER),
        ("rate_limited", RECONNECTED_MARKER),
    ],
)
def test_render_labels_a_possible_duplicate(
    store: Store, clock: FakeClock, reason: str, banner: str
) -> None:
    """A marked claim starts with the banner for its reason and ends with the content."""
    text = _claim(store, clock, True, reason).render()
    assert text.startswith(banner)
    assert text.endswith("line one\nline two")
    other = RECONNECTED_MARKER if banner == RECOVERED_MARKER else RECOVERED_MARKER
    assert other not in text


def test_render_accepts_custom_banners(store: Store, clock: FakeClock) -> None:
    """Callers can replace the default banners."""
    claim = _claim(store, clock, True, "recovered")
    assert claim.render(recovered="[again]").startswith("[again]")
    assert claim.obligation_id == claim.obligation.obligation_id


# -- prune -------------------------------------------------------------------------------------


def test_prune_deletes_only_old_settled_rows(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Delivered and abandoned rows past retention are deleted with their history; owed rows
    and younger settled rows stay."""
    live = make(store, clock, probe)
    delivered = record(live, "ob-delivered")
    live.mark_attempting(delivered)
    live.mark_delivered(delivered)
    doomed = record(make(store, clock, probe, DEAD), "ob-abandoned")
    pending = record(live, "ob-pending")
    attempting = record(live, "ob-attempting")
    live.mark_attempting(attempting)
    failing = failed(live, "ob-failed", error="Forbidden")
    clock.advance(POLICY.stale_after + 1)
    assert live.sweep_recoverable() == []
    assert current(live, doomed).state is S.ABANDONED
    clock.advance(POLICY.retention + 1)
    young = record(live, "ob-young")
    live.mark_attempting(young)
    live.mark_delivered(young)
    assert live.prune() == 2
    assert live.get(delivered) is None
    assert live.get(doomed) is None
    assert live.history(delivered) == []
    assert live.history(doomed) == []
    for oid in (pending, attempting, failing, young):
        assert live.get(oid) is not None
        assert live.history(oid) != []
    assert live.prune() == 0
    clock.advance(POLICY.retention * 10)
    assert live.prune() == 1  # only the young delivered row; owed rows never
    assert {o.obligation_id for o in live.owed()} == {pending, attempting, failing}


def test_prune_keeps_rows_younger_than_retention(store: Store, clock: FakeClock) -> None:
    """A delivered row just inside retention is kept."""
    ledger = make(store, clock, FakeProbe())
    oid = record(ledger)
    ledger.mark_attempting(oid)
    ledger.mark_delivered(oid)
    clock.advance(POLICY.retention - 1)
    assert ledger.prune() == 0
    assert ledger.get(oid) is not None


# -- history -----------------------------------------------------------------------------------


def test_history_tells_the_story_oldest_first(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """history() lists every move oldest first, with who made it and why it was abandoned."""
    dead = make(store, clock, probe, DEAD)
    oid = record(dead)
    clock.advance(1)
    dead.mark_attempting(oid)
    clock.advance(1)
    live = make(store, clock, probe)
    live.sweep_recoverable()
    clock.advance(1)
    live.mark_failed(oid, "connection reset")
    clock.advance(POLICY.stale_after)
    # A later boot abandons the now-stale row of the (by then dead) live ledger.
    later = make(store, clock, FakeProbe(), Incarnation(HOST, 9_700, 7, "later"))
    assert later.sweep_recoverable() == []
    history = live.history(oid)
    assert [(e.event, e.from_state, e.to_state) for e in history] == [
        ("record", None, S.PENDING),
        ("attempt", S.PENDING, S.ATTEMPTING),
        ("claim", S.ATTEMPTING, S.ATTEMPTING),
        ("fail", S.ATTEMPTING, S.FAILED),
        ("abandon", S.FAILED, S.ABANDONED),
    ]
    times = [e.at for e in history]
    assert times == sorted(times)
    assert len(set(times)) == len(times)
    owners = [e.owner or "" for e in history]
    assert all(DEAD.token in o for o in owners[:2])
    assert all(LIVE.token in o for o in owners[2:4])
    assert "later" in owners[4]
    assert history[2].attempts == 1
    assert history[3].reason == "connection reset"
    assert history[4].reason is not None
    assert "stale" in history[4].reason
    assert {e.entity_id for e in history} == {oid}


def test_history_of_unknown_id_is_empty(store: Store, clock: FakeClock) -> None:
    """An id never recorded has no history."""
    assert make(store, clock, FakeProbe()).history("nope") == []


# -- LedgerPolicy ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": -1},
        {"max_attempts": 1.5},
        {"stale_after": 0},
        {"stale_after": -5},
        {"stale_after": math.nan},
        {"stale_after": math.inf},
        {"retention": 0},
        {"retention": math.nan},
        {"retry_backoff": [30, 120]},
        {"retry_backoff": (30, -1)},
        {"retry_backoff": (math.nan,)},
        {"lease_s": 0},
        {"max_error_length": -1},
    ],
)
def test_policy_rejects_invalid_values(kwargs: dict[str, Any]) -> None:
    """Negative, zero, NaN or wrongly typed budget values raise ValueError naming the field."""
    (name,) = kwargs
    with pytest.raises(ValueError, match=name):
        LedgerPolicy(**kwargs)


def test_policy_defaults() -> None:
    """The documented defaults: 3 attempts, one day stale, a week retention, 30/120 s backoff."""
    assert (POLICY.max_attempts, POLICY.stale_after, POLICY.retention) == (3, 86_400, 604_800)
    assert POLICY.retry_backoff == (30.0, 120.0)
    assert POLICY.reconnect_errors == frozenset({"send_path_degraded"})
    assert POLICY.in_process_retries == 2
    single = attrs.evolve(POLICY, max_attempts=1)
    assert single.in_process_retries == 0


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (None, ErrorKind.RECONNECT),
        ("send_path_degraded", ErrorKind.RECONNECT),
        ("Forbidden: bot was blocked by the user", ErrorKind.PERMANENT),
        ("Bad Request: CHAT NOT FOUND", ErrorKind.PERMANENT),
        ("channel_not_found", ErrorKind.PERMANENT),
        ("429 Too Many Requests", ErrorKind.RATE_LIMITED),
        ("Flood control exceeded. Retry after 7", ErrorKind.RATE_LIMITED),
        ("connection reset", ErrorKind.TRANSIENT),
        ("", ErrorKind.TRANSIENT),
    ],
)
def test_policy_classifies_errors(error: str | None, kind: ErrorKind) -> None:
    """Send errors classify as reconnect, permanent, rate-limited or (otherwise) transient."""
    assert POLICY.classify(error) is kind


def test_policy_next_attempt_at() -> None:
    """Timer retries follow the backoff until the last budgeted attempt; others never."""
    assert POLICY.next_attempt_at(ErrorKind.TRANSIENT, 0, 100.0) == 130.0
    assert POLICY.next_attempt_at(ErrorKind.RATE_LIMITED, 1, 100.0) == 220.0
    assert POLICY.next_attempt_at(ErrorKind.TRANSIENT, 2, 100.0) is None
    assert POLICY.next_attempt_at(ErrorKind.RECONNECT, 0, 100.0) is None
    assert POLICY.next_attempt_at(ErrorKind.PERMANENT, 0, 100.0) is None

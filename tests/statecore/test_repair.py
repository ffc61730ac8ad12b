"""An operator's repairs and reads of the ledger (statecore.repair, statecore.survey), on the
in-memory store and on a real SQLite file: who and why are audited, a refusal writes nothing,
a retry never revives a terminal row and the next gateway's startup sweep sends it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statecore import (
    OBLIGATION_KIND,
    RECOVERED_MARKER,
    FakeClock,
    Incarnation,
    InvalidTransition,
    Ledger,
    LedgerPolicy,
    ObligationState,
    Row,
    StaleState,
    Store,
    UnknownEntity,
)
from statecore.ownership import host_identity
from statecore.repair import abandon, prune_settled, retried_from, retry_abandoned, retry_id
from statecore.survey import OwnerStatus, ledger_stats, list_obligations, stuck_rows
from stores import InMemoryStore, SQLiteStore

S = ObligationState
K = OBLIGATION_KIND
START = 1_700_000_000.0
HOST = host_identity()
# Our own pid with a start time it never had: provably dead to the real probe.
DEAD = Incarnation(HOST, os.getpid(), 1, "deadbeefdeadbeef")


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty store: in memory, then a real SQLite file."""
    opened: Store = InMemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "l.db")
    yield opened
    opened.close()


@pytest.fixture
def clock() -> FakeClock:
    """Time as the rows were written."""
    return FakeClock(START)


def _ledger(store: Store, clock: FakeClock, incarnation: Incarnation | None = None) -> Ledger:
    return Ledger(store, clock=clock, incarnation=incarnation or DEAD)


def _record(ledger: Ledger, n: int, **values: Any) -> str:
    fields: dict[str, Any] = {
        "session_key": "s",
        "platform": "loopback",
        "chat_id": "c",
        "content": f"reply {n}",
        "message_ref": n,
    }
    fields.update(values)
    return ledger.record(**fields).obligation_id


def _state(store: Store, obligation_id: str) -> tuple[Row[ObligationState] | None, int]:
    return store.get(K, obligation_id), len(store.history(K, obligation_id))


def _abandoned(store: Store, clock: FakeClock, *, attempted: bool) -> str:
    ledger = _ledger(store, clock)
    oid = _record(ledger, 1, thread_id="t9", reply_to="m9", adapter_profile="bot2")
    if attempted:
        ledger.mark_attempting(oid)
    abandon(store, oid, by="bob", reason="stuck", clock=clock)
    return oid


@pytest.mark.parametrize("steps", [(), ("attempt",), ("attempt", "fail")])
def test_abandon_moves_an_owed_row_and_audits_who_and_why(
    store: Store, clock: FakeClock, steps: tuple[str, ...]
) -> None:
    """Pending, attempting and failed rows are abandoned with the operator as the owner of the
    audit entry and the reason in it; the fence moves on."""
    ledger = _ledger(store, clock)
    oid = _record(ledger, 1)
    if "attempt" in steps:
        ledger.mark_attempting(oid)
    if "fail" in steps:
        ledger.mark_failed(oid, "boom")
    before = store.get(K, oid)
    assert before is not None
    clock.advance(5)
    done = abandon(store, oid, by="alice", reason="customer left", clock=clock)
    assert done.state is S.ABANDONED
    assert done.fence == before.fence + 1
    assert done.updated_at == START + 5
    last = store.history(K, oid)[-1]
    assert (last.event, last.from_state, last.to_state) == ("abandon", before.state, S.ABANDONED)
    assert last.owner == "cli:alice"
    assert last.reason == "abandoned by alice: customer left"
    assert last.at == START + 5


@pytest.mark.parametrize("settle", ["deliver", "abandon"])
def test_abandon_refuses_a_settled_row_and_writes_nothing(
    store: Store, clock: FakeClock, settle: str
) -> None:
    """A delivered or abandoned row cannot be abandoned: InvalidTransition, row and history as
    they were."""
    ledger = _ledger(store, clock)
    oid = _record(ledger, 1)
    if settle == "deliver":
        ledger.mark_attempting(oid)
        ledger.mark_delivered(oid)
    else:
        abandon(store, oid, by="bob", reason="first", clock=clock)
    before = _state(store, oid)
    with pytest.raises(InvalidTransition, match="only an owed obligation"):
        abandon(store, oid, by="alice", reason="again", clock=clock)
    assert _state(store, oid) == before


def test_repairs_of_an_unknown_id_raise_unknown_entity(store: Store, clock: FakeClock) -> None:
    """An id that was never recorded is refused by both repairs, and nothing is created."""
    for repair in (abandon, retry_abandoned):
        with pytest.raises(UnknownEntity, match="nope"):
            repair(store, "nope", by="alice", reason="why", clock=clock)
    assert store.count(K) == 0


@pytest.mark.parametrize(("by", "reason"), [("", "why"), ("alice", "")])
def test_repairs_need_who_and_why(store: Store, clock: FakeClock, by: str, reason: str) -> None:
    """Without an operator name or a reason, nothing is written."""
    oid = _abandoned(store, clock, attempted=False)
    before = _state(store, oid)
    for repair in (abandon, retry_abandoned):
        with pytest.raises(ValueError, match="must not be empty"):
            repair(store, oid, by=by, reason=reason, clock=clock)
    assert _state(store, oid) == before
    assert store.count(K) == 1


class _Racing:
    """A store whose first read of one row is followed by a gateway's write to it."""

    def __init__(self, store: Store, write: Any) -> None:
        self._store = store
        self._write = write

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def get(self, kind: Any, entity_id: str) -> Any:
        row = self._store.get(kind, entity_id)
        write, self._write = self._write, None
        if write is not None:
            write()
        return row


def test_abandon_is_fenced_by_the_row_it_read(store: Store, clock: FakeClock) -> None:
    """A row a gateway changed between the operator's read and write is not abandoned."""
    ledger = _ledger(store, clock)
    oid = _record(ledger, 1)
    racing: Any = _Racing(store, lambda: ledger.mark_attempting(oid))
    with pytest.raises(StaleState):
        abandon(racing, oid, by="alice", reason="stuck", clock=clock)
    row = store.get(K, oid)
    assert row is not None
    assert row.state is S.ATTEMPTING


def test_retry_records_a_new_unowned_obligation_and_leaves_the_old_one(
    store: Store, clock: FakeClock
) -> None:
    """The retry is a new pending row with the abandoned row's chat and content, no owner and
    a creation entry naming the abandoned id; the abandoned row is not written."""
    old = _abandoned(store, clock, attempted=True)
    before = _state(store, old)
    clock.advance(60)
    new = retry_abandoned(store, old, by="alice", reason="chat is back", clock=clock)
    assert new.obligation_id == retry_id(old) != old
    assert new.state is S.PENDING
    assert (new.session_key, new.platform, new.chat_id) == ("s", "loopback", "c")
    assert (new.thread_id, new.reply_to, new.adapter_profile) == ("t9", "m9", "bot2")
    assert new.content == "reply 1"
    assert (new.owner.host, new.owner.pid, new.owner.token) == (None, None, None)
    assert new.lease_expires_at is None
    assert new.created_at == START + 60
    assert _state(store, old) == before
    [created] = store.history(K, new.obligation_id)
    assert (created.event, created.from_state, created.to_state) == ("record", None, S.PENDING)
    assert created.owner == "cli:alice"
    assert created.reason == f"retry of {old} by alice: chat is back"
    assert retried_from(store.history(K, new.obligation_id)) == old
    assert retried_from(store.history(K, old)) is None


def test_retrying_twice_is_refused_and_names_the_first_retry(
    store: Store, clock: FakeClock
) -> None:
    """A second retry of the same row owes nothing twice: InvalidTransition naming the retry,
    nothing written."""
    old = _abandoned(store, clock, attempted=False)
    new = retry_abandoned(store, old, by="alice", reason="once", clock=clock)
    rows = {r.id: (r, len(store.history(K, r.id))) for r in store.select(K)}
    with pytest.raises(InvalidTransition, match=f"already retried as {new.obligation_id}"):
        retry_abandoned(store, old, by="alice", reason="twice", clock=clock)
    assert {r.id: (r, len(store.history(K, r.id))) for r in store.select(K)} == rows


@pytest.mark.parametrize("steps", [(), ("attempt",), ("attempt", "deliver")])
def test_retry_refuses_a_row_that_is_not_abandoned(
    store: Store, clock: FakeClock, steps: tuple[str, ...]
) -> None:
    """Only abandoned rows are retried: owed and delivered ones raise InvalidTransition and
    nothing is created."""
    ledger = _ledger(store, clock)
    oid = _record(ledger, 1)
    if steps:
        ledger.mark_attempting(oid)
    if "deliver" in steps:
        ledger.mark_delivered(oid)
    before = _state(store, oid)
    with pytest.raises(InvalidTransition, match="only an abandoned obligation"):
        retry_abandoned(store, oid, by="alice", reason="why", clock=clock)
    assert _state(store, oid) == before
    assert store.count(K) == 1


@pytest.mark.parametrize("attempted", [True, False])
def test_the_next_gateways_startup_sweep_sends_the_retry(
    store: Store, clock: FakeClock, attempted: bool
) -> None:
    """A new gateway's startup sweep claims the unowned retry; its send carries the 'may
    repeat' banner exactly when a send of the abandoned row had begun."""
    old = _abandoned(store, clock, attempted=attempted)
    new = retry_abandoned(store, old, by="alice", reason="again", clock=clock)
    gateway = Ledger(store, clock=clock, incarnation=Incarnation.current())
    [claim] = gateway.sweep_recoverable()
    assert claim.obligation_id == new.obligation_id
    assert claim.needs_marker is attempted
    assert claim.render().startswith(RECOVERED_MARKER) is attempted
    gateway.mark_delivered(claim.obligation_id)
    old_row = store.get(K, old)
    assert old_row is not None
    assert old_row.state is S.ABANDONED
    assert gateway.sweep_recoverable() == []


def test_a_retry_abandoned_in_turn_is_retried_under_its_own_id(
    store: Store, clock: FakeClock
) -> None:
    """Retries chain: each retry names the row it retries."""
    first = _abandoned(store, clock, attempted=False)
    second = retry_abandoned(store, first, by="alice", reason="1", clock=clock).obligation_id
    abandon(store, second, by="bob", reason="still stuck", clock=clock)
    third = retry_abandoned(store, second, by="alice", reason="2", clock=clock).obligation_id
    assert len({first, second, third}) == 3
    assert retried_from(store.history(K, third)) == second
    assert retried_from(store.history(K, second)) == first


def test_prune_deletes_only_settled_rows_past_the_age_in_chunks(
    store: Store, clock: FakeClock
) -> None:
    """Old delivered and abandoned rows go, chunk by chunk with progress reported; owed rows
    and recent settled rows stay."""
    ledger = _ledger(store, clock)
    old = [_record(ledger, n) for n in range(5)]
    for oid in old[:3]:
        ledger.mark_attempting(oid)
        ledger.mark_delivered(oid)
    abandon(store, old[3], by="bob", reason="x", clock=clock)
    clock.advance(3600)
    recent = _record(ledger, 99)
    ledger.mark_attempting(recent)
    ledger.mark_delivered(recent)
    seen: list[tuple[int, int]] = []
    pruned = prune_settled(store, older_than_s=1800, clock=clock, chunk=2, progress=_add(seen))
    assert pruned == 4
    assert seen == [(0, 4), (2, 4), (4, 4)]
    assert sorted(r.id for r in store.select(K)) == sorted([old[4], recent])
    assert store.history(K, old[0]) == []
    assert prune_settled(store, older_than_s=1800, clock=clock) == 0


def _add(seen: list[tuple[int, int]]) -> Any:
    return lambda done, total: seen.append((done, total))


@pytest.mark.parametrize("bad", [0, -1.0, float("inf")])
def test_prune_refuses_a_bad_age(store: Store, clock: FakeClock, bad: float) -> None:
    """The age must be a positive finite number of seconds."""
    with pytest.raises(ValueError, match="older_than_s"):
        prune_settled(store, older_than_s=bad, clock=clock)


def test_stats_count_every_state_and_age_the_oldest_owed(store: Store, clock: FakeClock) -> None:
    """Every declared state is counted (0 when empty); the oldest owed row is found by
    creation time."""
    empty = ledger_stats(store, now=START)
    assert dict(empty.counts) == dict.fromkeys(ObligationState, 0)
    assert (empty.oldest_owed, empty.oldest_owed_age_s, empty.total) == (None, None, 0)
    ledger = _ledger(store, clock)
    first = _record(ledger, 1)
    ledger.mark_attempting(first)
    ledger.mark_delivered(first)
    clock.advance(10)
    owed = _record(ledger, 2)
    clock.advance(10)
    _record(ledger, 3)
    stats = ledger_stats(store, now=START + 100)
    assert stats.counts[S.DELIVERED] == 1
    assert stats.counts[S.PENDING] == 2
    assert (stats.total, stats.owed) == (3, 2)
    assert stats.oldest_owed is not None
    assert stats.oldest_owed.obligation_id == owed
    assert stats.oldest_owed_age_s == pytest.approx(90.0)


def test_list_filters_by_state_and_platform_and_counts_past_the_limit(
    store: Store, clock: FakeClock
) -> None:
    """Oldest first, at most the limit, with the total that matched."""
    ledger = _ledger(store, clock)
    ids = []
    for n in range(4):
        clock.advance(1)
        ids.append(_record(ledger, n, platform="a" if n % 2 else "b"))
    found, total = list_obligations(store, states=[S.PENDING], platform="a", limit=1)
    assert ([o.obligation_id for o in found], total) == ([ids[1]], 2)
    everything, total = list_obligations(store)
    assert ([o.obligation_id for o in everything], total) == (ids, 4)
    assert list_obligations(store, states=[S.DELIVERED]) == ([], 0)


def test_stuck_rows_carry_their_owners_liveness(store: Store, clock: FakeClock) -> None:
    """Old pending/attempting rows are stuck; each owner is judged as the sweeps judge it:
    a live local process, a dead one, another host (lease), or no owner at all."""
    alive = _record(_ledger(store, clock, Incarnation.current()), 1)
    dead = _record(_ledger(store, clock, DEAD), 2)
    remote = Incarnation("elsewhere", 4242, 7, "remotetoken")
    leased = _record(Ledger(store, clock=clock, incarnation=remote), 3)
    expired = _record(
        Ledger(store, clock=clock, incarnation=remote, policy=LedgerPolicy(lease_s=1)), 4
    )
    abandon(store, dead, by="bob", reason="x", clock=clock)
    unowned = retry_abandoned(store, dead, by="bob", reason="y", clock=clock).obligation_id
    failed = _record(_ledger(store, clock, DEAD), 5)
    _ledger(store, clock, DEAD).mark_attempting(failed)
    _ledger(store, clock, DEAD).mark_failed(failed, "boom")
    now = START + 120
    found = {r.obligation.obligation_id: r for r in stuck_rows(store, older_than_s=60, now=now)}
    assert {k: v.owner for k, v in found.items()} == {
        alive: OwnerStatus.ALIVE,
        leased: OwnerStatus.REMOTE,
        expired: OwnerStatus.DEAD,
        unowned: OwnerStatus.UNOWNED,
    }
    assert found[alive].stuck_for_s == pytest.approx(120.0)
    assert stuck_rows(store, older_than_s=600, now=now) == []
    with pytest.raises(ValueError, match="older_than_s"):
        stuck_rows(store, older_than_s=0, now=now)

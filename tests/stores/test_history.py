"""The audit checker (stores.testing.history) on real stores: the histories a real ledger writes
pass on the in-memory store and on a SQLite file, and every broken rule is caught -- a forged
write through raw SQL on the SQLite file, a fake store's doctored history, a fenced-off owner's
write the store itself accepts."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from statecore import OBLIGATION_KIND, Audit, FakeClock, Ledger, ObligationState, Store
from statecore.store import TransitionRecord
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from stores.testing._kit import TICKET_KIND, file_ticket
from stores.testing.history import (
    OBLIGATION_OWNERSHIP,
    HistoryReport,
    Ownership,
    check_catalog,
    check_histories,
    check_store,
    check_walk,
    rows_with_histories,
)
from tests.statecore.ledger_helpers import DEAD, LIVE, FakeProbe, record

S = ObligationState
TABLE = OBLIGATION_KIND.table


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened: Store = InMemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "h.db")
    try:
        yield opened
    finally:
        opened.close()


def write_runs(store: Store) -> None:
    """Rows a real ledger writes: delivered by their recorder (ob-1), failed then retried and
    delivered (ob-2), recorded by a process that died and redelivered by another (ob-3, ob-4 in
    attempting when it died), pending (ob-5), abandoned over budget (ob-6)."""
    clock = FakeClock()
    probe = FakeProbe({LIVE.pid: LIVE.started_at})
    dead = Ledger(store, clock=clock, probe=probe, incarnation=DEAD)
    for oid in ("ob-3", "ob-4", "ob-6"):
        record(dead, oid)
    dead.mark_attempting("ob-4")
    live = Ledger(store, clock=clock, probe=probe, incarnation=LIVE)
    record(live, "ob-1")
    live.mark_attempting("ob-1")
    live.mark_delivered("ob-1")
    record(live, "ob-2")
    live.mark_attempting("ob-2")
    live.mark_failed("ob-2", "timeout")
    for spent in (1, 2, 3, 4):  # ob-6 spends its budget (claimed, sent, failed), then abandoned
        store.transition(
            OBLIGATION_KIND,
            "ob-6",
            "claim",
            audit=Audit(clock.now(), LIVE.label),
            changes={"attempts": spent},
        )
        store.transition(OBLIGATION_KIND, "ob-6", "fail", audit=Audit(clock.now(), LIVE.label))
    claims = live.sweep_recoverable()
    assert sorted(c.obligation_id for c in claims) == ["ob-3", "ob-4"]
    assert store.get(OBLIGATION_KIND, "ob-6").state is S.ABANDONED  # type: ignore[union-attr]
    for claim in claims:
        live.mark_delivered(claim.obligation_id)
    clock.advance(31.0)
    (retry,) = live.sweep_failed_for_runtime("slack")
    live.mark_delivered(retry.obligation_id)
    record(live, "ob-5")


def obligations(store: Store) -> HistoryReport:
    return check_store(store, OBLIGATION_KIND, ownership=OBLIGATION_OWNERSHIP, page=2)


def test_a_real_ledgers_histories_pass(store: Store) -> None:
    """Every row a ledger wrote -- sends, failures, retries, claims of a dead owner's rows --
    walks its declared lifecycle, and the counts say how much was read (pages of 2 rows)."""
    write_runs(store)
    report = obligations(store)
    assert report.problems == ()
    assert report.ok
    assert report.rows == 6
    assert report.entries == sum(
        len(store.history(OBLIGATION_KIND, f"ob-{n}")) for n in range(1, 7)
    )
    assert report.entries > report.rows * 2


def test_rows_are_read_a_page_at_a_time_by_id(store: Store) -> None:
    """The reader pages by id (any page size gives every row once, in id order)."""
    write_runs(store)
    for page in (1, 2, 5, 6, 500):
        ids = [i for i, _, _ in rows_with_histories(store, OBLIGATION_KIND, page=page)]
        assert ids == [f"ob-{n}" for n in range(1, 7)]
    with pytest.raises(ValueError, match="page"):
        next(rows_with_histories(store, OBLIGATION_KIND, page=0))


def test_a_fenced_off_owners_write_the_store_accepted_is_caught(store: Store) -> None:
    """A zombie's settle after another process claimed its row -- a write guarded by the state
    alone, which the store accepts -- is a fenced write; the claimant's own settle is not."""
    clock = FakeClock()
    probe = FakeProbe({LIVE.pid: LIVE.started_at})
    record(Ledger(store, clock=clock, probe=probe, incarnation=DEAD), "zombie")
    live = Ledger(store, clock=clock, probe=probe, incarnation=LIVE)
    assert [c.obligation_id for c in live.sweep_recoverable()] == ["zombie"]
    store.transition(OBLIGATION_KIND, "zombie", "deliver", audit=Audit(1.0, DEAD.label))
    report = obligations(store)
    assert (report.fenced_writes, report.bad_walks, report.double_settles) == (1, 0, 0)
    assert report.problems == (
        f"obligation fenced_write: zombie entry 2: 'deliver' by {DEAD.label!r} accepted while "
        f"{LIVE.label!r} held the row",
    )


def test_a_write_by_the_holder_after_a_strangers_attempt(store: Store) -> None:
    """A stranger's attempt on a pending row is fenced off; the recorder still holds the row
    (an attempt takes nothing over), so its deliver afterwards is legal."""
    write_runs(store)
    store.transition(OBLIGATION_KIND, "ob-5", "attempt", audit=Audit(1.0, "stranger"))
    assert obligations(store).fenced_writes == 1
    store.transition(OBLIGATION_KIND, "ob-5", "deliver", audit=Audit(2.0, LIVE.label))
    report = obligations(store)
    assert report.fenced_writes == 1
    assert "ob-5 entry 1: 'attempt' by 'stranger'" in report.problems[0]


def test_without_an_ownership_rule_owners_are_not_judged(store: Store) -> None:
    write_runs(store)
    store.transition(OBLIGATION_KIND, "ob-5", "attempt", audit=Audit(1.0, "stranger"))
    assert check_store(store, OBLIGATION_KIND).ok


def _forge(path: Path, sql: str, *params: Any) -> None:
    """A write from outside the store on the SQLite file (its audit triggers still run)."""
    with sqlite3.connect(path) as raw:
        raw.execute(sql, params)
    raw.close()


def test_raw_sql_writes_on_a_sqlite_file_are_caught(tmp_path: Path) -> None:
    """A forged settle of a delivered row, a forged move the lifecycle does not declare, and a
    fence bumped without an audit entry (triggers dropped), written by raw SQL, are each caught
    as their own kind of problem."""
    path = tmp_path / "forged.db"
    store = SQLiteStore(path)
    try:
        write_runs(store)
        assert obligations(store).ok
        forged = (
            f"UPDATE {TABLE} SET state = ?, fence = fence + 1, audit_event = ?, audit_at = 9.0, "
            "audit_owner = 'forger' WHERE obligation_id = ?"
        )
        _forge(path, forged, "abandoned", "abandon", "ob-1")  # delivered, then abandoned
        report = obligations(store)
        assert (report.double_settles, report.bad_walks, report.bad_fences) == (1, 0, 0)
        assert "ob-1" in report.problems[0]
        assert "after it settled" in report.problems[0]
        _forge(path, forged, "delivered", "deliver", "ob-5")  # pending --deliver--> delivered
        report = obligations(store)
        assert (report.double_settles, report.bad_walks, report.bad_fences) == (1, 1, 0)
        assert any("'deliver' is not declared from pending" in p for p in report.problems)
        _forge(path, f"DROP TRIGGER {TABLE}_audit_move_many")
        _forge(path, f"UPDATE {TABLE} SET fence = fence + 1 WHERE obligation_id = 'ob-2'")
        report = obligations(store)
        assert (report.double_settles, report.bad_walks, report.bad_fences) == (1, 1, 1)
        assert any("ob-2 row: fence" in p for p in report.problems)
        assert not report.ok
    finally:
        store.close()


@attrs.define
class DoctoredStore(InMemoryStore):
    """An in-memory store whose history() of one row is passed through ``doctor``."""

    doctor: Callable[[list[TransitionRecord]], list[TransitionRecord]] = lambda h: h
    target: str = ""

    def __attrs_post_init__(self) -> None:
        InMemoryStore.__init__(self)

    def history(self, kind: Any, entity_id: str) -> list[TransitionRecord]:
        entries = super().history(kind, entity_id)
        return self.doctor(entries) if entity_id == self.target else entries


def _swap(entries: list[TransitionRecord], index: int, **changes: Any) -> list[TransitionRecord]:
    return [attrs.evolve(e, **changes) if i == index else e for i, e in enumerate(entries)]


Doctor = Callable[[list[TransitionRecord]], list[TransitionRecord]]
W, F, D, FW = "bad_walk", "bad_fence", "double_settle", "fenced_write"


def _then(event: str, target: ObligationState) -> Doctor:
    """An entry appended after the delivered one (the row itself stays delivered)."""
    return lambda h: [
        *h,
        attrs.evolve(h[-1], from_state=S.DELIVERED, event=event, to_state=target),
    ]


DOCTORED: dict[str, tuple[str, Doctor, dict[str, int]]] = {
    # name: (row, doctor, every problem found)
    "entry lost": ("ob-2", lambda h: h[:1] + h[2:], {W: 1, F: 1}),  # a broken chain
    "creation lost": ("ob-1", lambda h: h[1:], {W: 1, F: 1}),
    "wrong target": ("ob-1", lambda h: _swap(h, 1, to_state=S.FAILED), {W: 2}),  # and the next
    "undeclared event": ("ob-2", lambda h: _swap(h, 2, event="deliver"), {W: 1}),
    # The row ends delivered while its history ends elsewhere: a bad walk too.
    "second settle": ("ob-1", _then("abandon", S.ABANDONED), {D: 1, W: 1, F: 1}),
    "written after settling": ("ob-1", _then("claim", S.ATTEMPTING), {W: 2, F: 1}),
    "claimant fenced off": ("ob-3", lambda h: _swap(h, len(h) - 1, owner=DEAD.label), {FW: 1}),
}


@pytest.mark.parametrize("case", sorted(DOCTORED))
def test_a_doctored_history_is_caught(case: str) -> None:
    """Each kind of broken history, served by a fake store, is reported on the row it is in,
    and nothing else is."""
    row, doctor, expected = DOCTORED[case]
    store = DoctoredStore(doctor, row)
    try:
        write_runs(store)
        report = obligations(store)
        counts = {
            W: report.bad_walks,
            F: report.bad_fences,
            D: report.double_settles,
            FW: report.fenced_writes,
        }
        assert {k: n for k, n in counts.items() if n} == expected, report.problems
        assert len(report.problems) == sum(expected.values())
        assert all(f": {row} " in p for p in report.problems)  # no other row is blamed
        store.doctor = lambda h: h
        assert obligations(store).ok
    finally:
        store.close()


def test_migrate_entries_may_move_any_state_and_older_entries_are_loosely_checked() -> None:
    """A ``migrate`` entry moves a settled row too, without counting as a settle; entries
    before it are checked for chaining only."""
    T = TICKET_KIND.lifecycle.state_type
    states = list(T)
    first, other = states[0], states[-1]
    creation = TransitionRecord("t", "file", None, first, 1.0, None, None, None)
    odd = TransitionRecord("t", "no-such-event", first, other, 2.0, None, None, None)
    migrated = TransitionRecord("t", "migrate", other, first, 3.0, "statecore migration", None, "v")
    assert check_walk(TICKET_KIND, "t", [creation, odd, migrated]) == []
    assert check_walk(TICKET_KIND, "t", [creation, odd])[0].kind == "bad_walk"
    broken = TransitionRecord("t", "migrate", first, first, 3.0, None, None, None)
    assert [p.kind for p in check_walk(TICKET_KIND, "t", [creation, odd, broken])] == ["bad_walk"]


def test_the_report_keeps_a_bounded_number_of_problem_texts() -> None:
    bad = TransitionRecord("x", "deliver", None, S.DELIVERED, 1.0, None, None, None)
    histories = ((f"x{i}", None, [bad]) for i in range(1000))
    report = check_histories(OBLIGATION_KIND, histories, max_problems=3)
    assert (report.rows, report.entries, report.bad_walks) == (1000, 1000, 1000)
    assert len(report.problems) == 3
    with pytest.raises(ValueError, match="max_problems"):
        check_histories(OBLIGATION_KIND, [], max_problems=-1)


def test_ownership_rules_are_checked() -> None:
    with pytest.raises(ValueError, match="both"):
        Ownership(takeovers={"claim"}, fenced={"claim"})
    with pytest.raises(TypeError):
        Ownership(takeovers="claim", fenced=())
    declared = set(OBLIGATION_KIND.lifecycle.events)
    assert OBLIGATION_OWNERSHIP.takeovers | OBLIGATION_OWNERSHIP.fenced <= declared


def test_every_kind_of_the_catalog_is_checked_as_declared_there(store: Store) -> None:
    """The ledger's kinds (obligations, owner records) are checked from the catalog's
    declarations, leaving the catalog as it was; a broken obligation history is found there
    too, and a skipped kind is not read."""
    write_runs(store)
    Ledger(store, clock=FakeClock(), probe=FakeProbe(), incarnation=LIVE).heartbeat(now=5.0)
    before = store.catalog()  # type: ignore[attr-defined]
    reports = check_catalog(store)
    assert [(r.kind, r.ok) for r in reports] == [("obligation", True), ("owner", True)]
    assert reports[0].rows == 6
    assert reports[1].rows >= 1
    assert store.catalog() == before  # type: ignore[attr-defined]
    store.transition(OBLIGATION_KIND, "ob-5", "attempt", audit=Audit(1.0, "stranger"))
    assert [r.fenced_writes for r in check_catalog(store)] == [1, 0]
    assert [r.kind for r in check_catalog(store, skip={"obligation"})] == ["owner"]
    assert check_catalog(store, ownership={})[0].ok  # no rule: owners not judged
    with pytest.raises(TypeError, match="no catalog"):
        check_catalog(object())  # type: ignore[arg-type]


def test_a_kind_this_process_cannot_import_is_checked_from_its_declaration(
    tmp_path: Path,
) -> None:
    """A SQLite file's ticket kind -- known to no entry point -- is rebuilt from the catalog
    and checked: a clean history passes, a forged undeclared move is caught."""
    path = tmp_path / "tickets.db"
    with SQLiteStore(path) as writer:
        writer.register(TICKET_KIND)
        file_ticket(writer, "t1")
        file_ticket(writer, "t2")
        writer.transition(TICKET_KIND, "t2", "hold", audit=Audit(2.0))
    with SQLiteStore(path) as reader:
        (report,) = check_catalog(reader)
        assert (report.kind, report.rows, report.entries, report.ok) == ("ticket", 2, 3, True)
    _forge(
        path,
        "UPDATE kit_tickets SET state = 'done', fence = fence + 1, audit_event = 'resume' "
        "WHERE ticket_id = 't2'",
    )
    with SQLiteStore(path) as reader:
        (report,) = check_catalog(reader)
        assert report.bad_walks == 1
        assert "'resume' from held leads to open, not done" in report.problems[0]

"""Transitions of a row the SQLite store knows: proved in the statement, not read back.

The store keeps the row it last wrote for each id (a few).  A later transition of that id adds
to its guarded ``UPDATE`` a proof that the row is still exactly that one (state, fence and every
field the move leaves) and returns nothing; the row written is then the known one, moved.  When
the proof fails -- another writer changed the row, a transaction rolled back, the row was pruned
and recorded again -- the store runs the ``UPDATE ... RETURNING`` it runs for any other row.
These tests pin both: the proof is what runs when nothing else wrote, and whatever else wrote,
each transition returns exactly what a read returns.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from statecore import (
    OBLIGATION_KIND,
    Audit,
    FakeClock,
    InvalidTransition,
    Ledger,
    Obligation,
    ObligationState,
    StaleState,
)
from stores import SQLiteStore
from stores._sqlite_shortcuts import KNOWN_ROWS

S = ObligationState
K = OBLIGATION_KIND


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    """A SQLite store on a new file, closed at teardown."""
    with SQLiteStore(tmp_path / "ledger.db") as opened:
        yield opened


class Updates:
    """The UPDATE statements a connection ran (its trace callback), each marked by whether it
    returned the row.  The callback reports each step of a statement's triggers with the text of
    the statement that fired them: a repeat of the previous text is not a new statement."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.seen: list[str] = []
        self._last = ""
        conn.set_trace_callback(self._trace)

    def _trace(self, statement: str) -> None:
        if statement == self._last:
            return
        self._last = statement
        if statement.startswith("UPDATE delivery_obligations"):
            self.seen.append("returning" if " RETURNING " in statement else "proved")

    def take(self) -> list[str]:
        seen, self.seen = self.seen, []
        return seen


def warmed(ledger: Ledger) -> Ledger:
    """The ledger after one whole lifecycle: its store has planned (and learned) the shapes of
    its marks, which it proves from then on."""
    record(ledger, "warm-up")
    ledger.mark_attempting("warm-up")
    ledger.mark_delivered("warm-up")
    return ledger


def record(ledger: Ledger, oid: str, content: str = "hello") -> Obligation:
    return ledger.record(
        session_key="agent:main:slack:channel:C1",
        platform="slack",
        chat_id="C1",
        content=content,
        obligation_id=oid,
    )


def raw(store: SQLiteStore) -> contextlib.closing[sqlite3.Connection]:
    """Another writer: a plain connection to the store's file (autocommit)."""
    return contextlib.closing(sqlite3.connect(store.path, isolation_level=None))


def test_a_known_row_is_moved_by_one_proved_statement(store: SQLiteStore) -> None:
    """record -> attempt -> deliver: each mark is one UPDATE that returns nothing, and each
    returns exactly what a read returns."""
    ledger = warmed(Ledger(store, clock=FakeClock()))
    updates = Updates(store._conn())
    record(ledger, "ob-1")
    attempting = ledger.mark_attempting("ob-1")
    assert updates.take() == ["proved"]
    assert attempting == ledger.get("ob-1")
    assert (attempting.state, attempting.fence) == (S.ATTEMPTING, 1)
    delivered = ledger.mark_delivered("ob-1")
    assert updates.take() == ["proved"]
    assert delivered == ledger.get("ob-1")
    assert [h.event for h in ledger.history("ob-1")] == ["record", "attempt", "deliver"]


def test_a_failure_with_changes_is_proved_and_returns_its_changes(store: SQLiteStore) -> None:
    """A mark that changes fields (a failure: error, kind, attempts, next attempt) returns the
    row a read returns, on the plain path and on the proved one alike."""
    clock = FakeClock()
    ledger = Ledger(store, clock=clock)
    updates = Updates(store._conn())
    for oid in ("ob-1", "ob-2"):
        record(ledger, oid)
        ledger.mark_attempting(oid)
        clock.advance(1.5)
        failed = ledger.mark_failed(oid, "connection reset")
        assert failed == ledger.get(oid)
        assert failed.last_error == "connection reset"
        assert failed.state is S.FAILED
    assert "proved" in updates.take()


def test_an_outside_change_fails_the_proof_and_the_row_is_read_back(
    store: SQLiteStore,
) -> None:
    """A column changed by another writer without a transition (no fence moved): the proof
    fails, the plain UPDATE runs, and the mark returns the row as it is now."""
    ledger = warmed(Ledger(store, clock=FakeClock()))
    record(ledger, "ob-1")
    ledger.mark_attempting("ob-1")
    with raw(store) as conn:
        conn.execute(
            "UPDATE delivery_obligations SET content = 'changed by hand' "
            "WHERE obligation_id = 'ob-1'"
        )
    updates = Updates(store._conn())
    delivered = ledger.mark_delivered("ob-1")
    assert updates.take() == ["proved", "returning"]
    assert delivered.content == "changed by hand"
    assert delivered == ledger.get("ob-1")


def test_a_row_recorded_again_is_not_taken_for_the_known_one(tmp_path: Path) -> None:
    """A row pruned and recorded again under the same id, by the same owner, at the same fence
    but with other content: the proof compares every field, fails, and the mark returns the
    new row."""
    path = tmp_path / "ledger.db"
    with SQLiteStore(path) as first_store, SQLiteStore(path) as second_store:
        clock = FakeClock()
        first = warmed(Ledger(first_store, clock=clock))
        record(first, "ob-1", content="first words")
        with raw(first_store) as conn:  # pruned, as far as this writer can tell
            conn.execute("DELETE FROM delivery_obligations WHERE obligation_id = 'ob-1'")
        # Recorded again by the same owner, through another store on the file.
        second = Ledger(second_store, clock=clock, incarnation=first.incarnation)
        record(second, "ob-1", content="second words")
        updates = Updates(first_store._conn())
        attempting = first.mark_attempting("ob-1")
        assert updates.take() == ["proved", "returning"]
        assert attempting.content == "second words"
        assert attempting == first.get("ob-1")


def test_a_rolled_back_move_is_not_taken_for_the_row(store: SQLiteStore) -> None:
    """A move rolled back with its transaction leaves the store keeping a row the file never
    had; the next move of that row (a claim: its kept state is one the claim leaves from too)
    fails the proof, and returns the row as the file has it."""
    ledger = Ledger(store, clock=FakeClock())
    for oid in ("warm-up", "ob-1"):
        record(ledger, oid)

    def claim(oid: str, at: float) -> object:
        audit = Audit(at, "test", 0, None)
        return store.transition(K, oid, "claim", audit=audit, changes={"updated_at": at})

    claim("warm-up", 1_700_000_001.0)  # the claim's shape is learned: later ones are proved
    with contextlib.suppress(RuntimeError), store.atomic():
        claim("ob-1", 1_700_000_002.0)
        raise RuntimeError("undo it")
    before = store.get(K, "ob-1")
    assert before is not None
    assert (before.state, before.fence) == (S.PENDING, 0)
    updates = Updates(store._conn())
    moved = claim("ob-1", 1_700_000_003.0)
    assert updates.take() == ["proved", "returning"]
    assert moved == store.get(K, "ob-1")
    assert (moved.state, moved.fence) == (S.ATTEMPTING, 1)
    assert [h.at for h in store.history(K, "ob-1")] == [
        pytest.approx(1_700_000_000.0),
        1_700_000_003.0,
    ]


def test_a_refused_move_of_a_known_row_is_refused_as_before(store: SQLiteStore) -> None:
    """A mark the guard refuses (a stale fence after another owner's claim) raises what it
    always raised and changes nothing."""
    ledger = Ledger(store, clock=FakeClock())
    record(ledger, "ob-1")
    ledger.mark_attempting("ob-1")
    with raw(store) as conn:  # another owner took it: a transition, the fence moved
        conn.execute(
            "UPDATE delivery_obligations SET fence = fence + 1, owner_token = 'someone else', "
            "audit_event = 'claim' WHERE obligation_id = 'ob-1'"
        )
    before = ledger.get("ob-1")
    with pytest.raises(StaleState):
        ledger.mark_delivered("ob-1")
    assert ledger.get("ob-1") == before


def test_known_rows_are_bounded_and_settled_ones_forgotten(store: SQLiteStore) -> None:
    """The store keeps at most KNOWN_ROWS rows, and none in a state no transition leaves."""
    ledger = Ledger(store, clock=FakeClock())
    compiled = store._compiled(K)
    for i in range(KNOWN_ROWS + 20):
        record(ledger, f"ob-{i}")
    assert len(compiled.known) == KNOWN_ROWS
    assert "ob-0" not in compiled.known  # the oldest went first
    last = f"ob-{KNOWN_ROWS + 19}"
    ledger.mark_attempting(last)
    assert compiled.known[last].state is S.ATTEMPTING
    ledger.mark_delivered(last)  # delivered: final
    assert last not in compiled.known


def test_racing_writers_each_get_the_row_they_wrote(tmp_path: Path) -> None:
    """Three threads on two stores (two kept-row memories) move the same rows back and forth:
    every move that succeeds returns the row it wrote, so the successes of each row, in fence
    order, are its audit history, and the last is what a read returns."""
    path = tmp_path / "ledger.db"
    ids = [f"ob-{i}" for i in range(4)]
    with SQLiteStore(path) as one, SQLiteStore(path) as two:
        ledger = Ledger(one, clock=FakeClock())
        two.register(K)
        for oid in ids:
            record(ledger, oid)
        wrote: list[tuple[str, int, ObligationState, float, int]] = []
        failures: list[BaseException] = []
        lock = threading.Lock()

        def writer(store: SQLiteStore, start: float) -> None:
            try:
                write(store, start)
            except BaseException as exc:  # handed to the test's thread below
                failures.append(exc)

        def write(store: SQLiteStore, start: float) -> None:
            for n in range(150):
                oid = ids[n % len(ids)]
                at = start + n
                event = "claim" if n % 3 else "fail"
                # A move may be refused (InvalidTransition) or lose the race to another
                # writer between its read and its guarded write (StaleState): either way
                # nothing was written; what is proved is that every success is what it wrote.
                with contextlib.suppress(InvalidTransition, StaleState):
                    row = store.transition(
                        K,
                        oid,
                        event,
                        audit=Audit(at, "test", n, None),
                        changes={"updated_at": at, "attempts": n},
                    )
                    assert (row.values["updated_at"], row.values["attempts"]) == (at, n)
                    with lock:
                        wrote.append((oid, row.fence, row.state, at, n))

        threads = [
            threading.Thread(target=writer, args=(store, start))
            for store, start in ((one, 1e9), (two, 2e9), (one, 3e9))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads)
        assert failures == []
        for oid in ids:
            mine = sorted(w for w in wrote if w[0] == oid)
            moves = one.history(K, oid)[1:]  # after the record
            assert [w[1] for w in mine] == list(range(1, len(moves) + 1))
            assert [(w[2], w[3]) for w in mine] == [(h.to_state, h.at) for h in moves]
            last = one.get(K, oid)
            assert last is not None
            _, fence, state, _, attempts = mine[-1]
            assert (last.fence, last.state, last.values["attempts"]) == (fence, state, attempts)

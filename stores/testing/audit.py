"""The store contract: the audit row every transition writes in the same transaction."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress

from statecore.errors import InvalidTransition, StaleState
from statecore.obligation import OBLIGATION_KIND
from statecore.store import (
    Audit,
    Store,
    TransitionRecord,
)
from stores.testing._base import KitFixtures
from stores.testing._kit import (
    AUDIT,
    OS,
    TICKET_KIND,
    TS,
    TicketState,
    file_ticket,
    get_ticket,
    move,
    record_obligation,
)


class AuditContract(KitFixtures):
    """The audit row every transition writes in the same transaction."""

    def test_audit_records_every_write_as_given(self, db: Store) -> None:
        """Each insert and transition appends one TransitionRecord carrying the Audit's fields,
        oldest first."""
        file_ticket(db, "t1", Audit(at=10.0, owner="alice", reason="filed"))
        move(db, "t1", "hold", Audit(at=20.5, attempts=2))
        move(db, "t1", "resume", Audit(at=30.25, owner="bob", attempts=3, reason="back"))
        move(db, "t1", "touch", Audit(at=30.25))
        move(db, "t1", "finish", Audit(at=40.0, owner="carol", attempts=0, reason=""))
        history = db.history(TICKET_KIND, "t1")
        assert history == [
            TransitionRecord("t1", "file", None, TS.OPEN, 10.0, "alice", None, "filed"),
            TransitionRecord("t1", "hold", TS.OPEN, TS.HELD, 20.5, None, 2, None),
            TransitionRecord("t1", "resume", TS.HELD, TS.OPEN, 30.25, "bob", 3, "back"),
            TransitionRecord("t1", "touch", TS.OPEN, TS.OPEN, 30.25, None, None, None),
            TransitionRecord("t1", "finish", TS.OPEN, TS.DONE, 40.0, "carol", 0, ""),
        ]
        for record in history:
            assert record.from_state is None or isinstance(record.from_state, TicketState)
            assert isinstance(record.to_state, TicketState)
            assert type(record.at) is float

    def test_history_is_per_entity(self, db: Store) -> None:
        """history() returns only the asked entity's entries, in the order they were written."""
        file_ticket(db, "t1", Audit(at=1.0))
        file_ticket(db, "t2", Audit(at=2.0))
        move(db, "t2", "hold", Audit(at=3.0))
        move(db, "t1", "drop", Audit(at=4.0))
        move(db, "t2", "resume", Audit(at=5.0))
        assert [(r.entity_id, r.event, r.at) for r in db.history(TICKET_KIND, "t1")] == [
            ("t1", "file", 1.0),
            ("t1", "drop", 4.0),
        ]
        assert [(r.entity_id, r.event, r.at) for r in db.history(TICKET_KIND, "t2")] == [
            ("t2", "file", 2.0),
            ("t2", "hold", 3.0),
            ("t2", "resume", 5.0),
        ]

    def test_failed_operations_append_no_history(self, db: Store) -> None:
        """Refused inserts and transitions leave the audit history untouched."""
        file_ticket(db, "t1")
        move(db, "t1", "hold")
        before = db.history(TICKET_KIND, "t1")
        attempts: list[Callable[[], object]] = [
            lambda: db.insert(TICKET_KIND, "t1", {"title": "x"}, event="file", audit=AUDIT),
            lambda: move(db, "t1", "touch"),
            lambda: move(db, "t1", "resume", fence=0),
            lambda: move(db, "t1", "resume", expect={"assignee": "nobody"}),
            lambda: move(db, "t1", "resume", changes={"title": "x"}),
            lambda: move(db, "t1", "resume", changes={"nope": 1}),
            lambda: move(db, "t1", "purge"),
        ]
        for attempt in attempts:
            with suppress(InvalidTransition, StaleState, ValueError, KeyError):
                attempt()
        assert db.history(TICKET_KIND, "t1") == before
        assert len(before) == 2

    def test_kinds_with_the_same_id_are_independent(self, db: Store) -> None:
        """Entities of different kinds sharing an id keep separate rows, histories and prunes."""
        file_ticket(db, "same")
        move(db, "same", "finish")
        record_obligation(db, "same", 5.0)
        assert get_ticket(db, "same").state is TS.DONE
        obligation = db.get(OBLIGATION_KIND, "same")
        assert obligation is not None
        assert obligation.state is OS.PENDING
        assert [r.event for r in db.history(TICKET_KIND, "same")] == ["file", "finish"]
        assert [r.event for r in db.history(OBLIGATION_KIND, "same")] == ["record"]
        assert db.prune(TICKET_KIND, "purge") == 1
        assert db.get(OBLIGATION_KIND, "same") == obligation
        assert [r.event for r in db.history(OBLIGATION_KIND, "same")] == ["record"]
        assert (db.count(TICKET_KIND), db.count(OBLIGATION_KIND)) == (0, 1)

    def test_history_of_unknown_id_is_empty(self, db: Store) -> None:
        """history() of an id that never existed is an empty list."""
        assert db.history(TICKET_KIND, "ghost") == []
        file_ticket(db, "t1")
        assert db.history(TICKET_KIND, "ghost") == []
        assert db.history(OBLIGATION_KIND, "t1") == []

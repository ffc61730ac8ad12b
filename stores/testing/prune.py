"""The store contract: removing entities that reached a terminal state."""

from __future__ import annotations

import pytest

from statecore.errors import InvalidTransition
from statecore.store import (
    Store,
    le,
    lt,
)
from stores.testing._base import KitFixtures
from stores.testing._kit import (
    TICKET_KIND,
    TS,
    file_ticket,
    get_ticket,
    ids_of,
    move,
    snapshot,
)


class PruneContract(KitFixtures):
    """Removing entities that reached a terminal state."""

    def _prune_fixture(self, db: Store) -> None:
        """p1 done@10, p2 dropped@20, p3 done@40, p4 open@5, p5 held@5, p6 done@NULL."""
        file_ticket(db, "p1", due_at=10.0)
        file_ticket(db, "p2", due_at=20.0)
        file_ticket(db, "p3", due_at=40.0)
        file_ticket(db, "p4", due_at=5.0)
        file_ticket(db, "p5", due_at=5.0)
        file_ticket(db, "p6")
        move(db, "p1", "finish")
        move(db, "p2", "drop")
        move(db, "p3", "finish")
        move(db, "p5", "hold")
        move(db, "p6", "finish")

    def test_prune_deletes_only_terminal_rows_matching_where(self, db: Store) -> None:
        """prune() deletes the terminal rows matching where, with their history, and never a
        non-terminal row."""
        self._prune_fixture(db)
        survivors = {i: snapshot(db, i) for i in ("p3", "p4", "p5", "p6")}
        assert db.prune(TICKET_KIND, "purge", where={"due_at": lt(30.0)}) == 2
        for gone in ("p1", "p2"):
            assert db.get(TICKET_KIND, gone) is None
            assert db.history(TICKET_KIND, gone) == []
        assert {i: snapshot(db, i) for i in survivors} == survivors
        assert db.count(TICKET_KIND) == 4
        assert db.prune(TICKET_KIND, "purge", where={"due_at": lt(30.0)}) == 0
        assert db.prune(TICKET_KIND, "purge", where={"due_at": le(5.0)}) == 0
        assert db.prune(TICKET_KIND, "purge") == 2
        assert ids_of(db.select(TICKET_KIND)) == ["p4", "p5"]
        assert len(db.history(TICKET_KIND, "p5")) == 2

    def test_prune_only_removes_states_the_event_allows(self, db: Store) -> None:
        """A removal event deletes only rows in its own source states."""
        self._prune_fixture(db)
        assert db.prune(TICKET_KIND, "archive") == 3
        assert ids_of(db.select(TICKET_KIND)) == ["p2", "p4", "p5"]
        assert get_ticket(db, "p2").state is TS.DROPPED

    def test_prune_respects_limit(self, db: Store) -> None:
        """prune() deletes at most limit rows and returns how many it deleted."""
        for n in range(5):
            file_ticket(db, f"d{n}")
            move(db, f"d{n}", "finish")
        file_ticket(db, "live")
        assert db.prune(TICKET_KIND, "purge", limit=0) == 0
        assert db.count(TICKET_KIND) == 6
        assert db.prune(TICKET_KIND, "purge", limit=2) == 2
        assert db.count(TICKET_KIND, states=[TS.DONE]) == 3
        assert db.prune(TICKET_KIND, "purge", limit=10) == 3
        assert db.count(TICKET_KIND, states=[TS.DONE]) == 0
        assert ids_of(db.select(TICKET_KIND)) == ["live"]
        with pytest.raises(ValueError, match="limit"):
            db.prune(TICKET_KIND, "purge", limit=-1)

    def test_prune_with_non_removal_event_raises_invalid_transition(self, db: Store) -> None:
        """prune() through a move, creation or undeclared event raises InvalidTransition and
        deletes nothing."""
        self._prune_fixture(db)
        for event in ("finish", "touch", "file", "no_such_event"):
            with pytest.raises(InvalidTransition):
                db.prune(TICKET_KIND, event)
        with pytest.raises(KeyError):
            db.prune(TICKET_KIND, "purge", where={"nope": 1})
        with pytest.raises(TypeError):
            db.prune(TICKET_KIND, "purge", where={"due_at": "old"})
        assert db.count(TICKET_KIND) == 6

    def test_pruned_id_can_be_inserted_again(self, db: Store) -> None:
        """After a prune the id is free: inserting it creates a new entity with a new history."""
        file_ticket(db, "t1", assignee="old")
        move(db, "t1", "finish")
        assert db.prune(TICKET_KIND, "purge") == 1
        row = file_ticket(db, "t1", assignee="new")
        assert (row.state, row.fence, row["assignee"]) == (TS.OPEN, 0, "new")
        assert [r.event for r in db.history(TICKET_KIND, "t1")] == ["file"]

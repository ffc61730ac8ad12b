"""The store contract: many entities moved by one guarded write."""

from __future__ import annotations

import pytest

from statecore.errors import InvalidTransition
from statecore.store import (
    Store,
)
from stores.testing._base import KitFixtures
from stores.testing._kit import (
    AUDIT,
    TICKET_KIND,
    TS,
    abort_block,
)


class BulkTransitionContract(KitFixtures):
    """Many entities moved by one guarded write."""

    def test_transition_many_moves_admitted_rows_and_skips_the_rest(self, db: Store) -> None:
        """transition_many applies the guard row by row: admitted rows move (fence + 1, one
        audit entry each, in the order asked); unknown, wrong-state or failing rows are skipped."""
        k = TICKET_KIND
        for ticket_id in ("t1", "t2", "t3", "t4"):
            db.insert(
                k, ticket_id, {"title": ticket_id, "assignee": "ann"}, event="file", audit=AUDIT
            )
        db.transition(k, "t2", "hold", audit=AUDIT)
        db.transition(k, "t4", "drop", audit=AUDIT)
        moved = db.transition_many(
            k, ["t3", "t2", "missing", "t4", "t1"], "hold", audit=AUDIT, changes={"score": 1.5}
        )
        assert [(r.id, r.state, r.fence, r["score"]) for r in moved] == [
            ("t3", TS.HELD, 1, 1.5),
            ("t1", TS.HELD, 1, 1.5),
        ]
        state = {r.id: (r.state, r.fence) for r in db.select(k)}
        assert state["t2"] == (TS.HELD, 1)
        assert state["t4"] == (TS.DROPPED, 1)
        assert [h.event for h in db.history(k, "t3")] == ["file", "hold"]
        assert [h.event for h in db.history(k, "t2")] == ["file", "hold"]

    def test_transition_many_respects_expect_and_increments(self, db: Store) -> None:
        """Rows failing ``expect`` are skipped; ``increments`` add to int fields."""
        k = TICKET_KIND
        db.insert(k, "mine", {"title": "m", "assignee": "ann"}, event="file", audit=AUDIT)
        db.insert(k, "theirs", {"title": "t", "assignee": "bob"}, event="file", audit=AUDIT)
        moved = db.transition_many(
            k,
            ["mine", "theirs"],
            "touch",
            audit=AUDIT,
            expect={"assignee": "ann"},
            increments={"priority": 2},
        )
        assert [(r.id, r["priority"], r.fence) for r in moved] == [("mine", 5, 1)]
        theirs = db.get(k, "theirs")
        assert theirs is not None
        assert (theirs["priority"], theirs.fence) == (3, 0)

    def test_transition_many_refuses_bad_input_before_writing(self, db: Store) -> None:
        """Bad events, changes or increments raise before any row is written."""
        k = TICKET_KIND
        db.insert(k, "t1", {"title": "x"}, event="file", audit=AUDIT)
        with pytest.raises(InvalidTransition):
            db.transition_many(k, ["t1"], "purge", audit=AUDIT)
        with pytest.raises(ValueError, match="immutable"):
            db.transition_many(k, ["t1"], "touch", audit=AUDIT, changes={"title": "y"})
        with pytest.raises(ValueError, match="cannot be incremented"):
            db.transition_many(k, ["t1"], "touch", audit=AUDIT, increments={"score": 1})
        with pytest.raises(TypeError):
            db.transition_many(k, "t1", "touch", audit=AUDIT)
        with pytest.raises(ValueError, match="both changed and incremented"):
            db.transition_many(
                k,
                ["t1"],
                "touch",
                audit=AUDIT,
                changes={"priority": 10},
                increments={"priority": 2},
            )
        row = db.get(k, "t1")
        assert row is not None
        assert (row.state, row.fence, row["title"], row["priority"]) == (TS.OPEN, 0, "x", 3)

    def test_transition_many_inside_a_failed_block_is_undone(self, db: Store) -> None:
        """A bulk transition in an atomic block that raises leaves nothing behind."""
        k = TICKET_KIND
        db.insert(k, "t1", {"title": "x"}, event="file", audit=AUDIT)
        abort_block(db, lambda: db.transition_many(k, ["t1"], "hold", audit=AUDIT))
        row = db.get(k, "t1")
        assert row is not None
        assert (row.state, row.fence) == (TS.OPEN, 0)
        assert [h.event for h in db.history(k, "t1")] == ["file"]

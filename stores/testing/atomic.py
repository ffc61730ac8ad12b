"""The store contract: transactions: all or nothing, nested blocks."""

from __future__ import annotations

import threading

import pytest

from statecore.errors import InvalidTransition, StaleState, UnknownEntity
from statecore.store import (
    Store,
)
from stores.testing._base import KitFixtures
from stores.testing._kit import (
    JOIN_TIMEOUT,
    TICKET_KIND,
    TS,
    abort_block,
    file_ticket,
    get_ticket,
    move,
    snapshot,
)


class AtomicContract(KitFixtures):
    """Transactions: all or nothing, nested blocks."""

    def test_atomic_block_that_raises_undoes_every_write(self, db: Store) -> None:
        """An exception escaping atomic() undoes its inserts, transitions and prunes, history
        included."""
        file_ticket(db, "x1")
        file_ticket(db, "x2")
        move(db, "x2", "finish")
        before = {i: snapshot(db, i) for i in ("x1", "x2", "n1")}

        def body() -> None:
            file_ticket(db, "n1")
            move(db, "n1", "hold")
            move(db, "x1", "touch", changes={"assignee": "inside"})
            move(db, "x1", "drop")
            assert db.prune(TICKET_KIND, "purge") == 2
            assert db.get(TICKET_KIND, "x2") is None

        abort_block(db, body)
        assert {i: snapshot(db, i) for i in before} == before
        assert db.count(TICKET_KIND) == 2
        assert move(db, "x1", "hold", fence=0).fence == 1

    def test_nested_block_that_raises_undoes_only_its_own_writes(self, db: Store) -> None:
        """A failing nested atomic() block undoes only its writes; the outer block still
        commits."""
        file_ticket(db, "base")
        with db.atomic():
            file_ticket(db, "outer")
            move(db, "base", "touch")

            def inner() -> None:
                file_ticket(db, "inner")
                move(db, "outer", "hold")
                move(db, "base", "touch")

            abort_block(db, inner)
            assert db.get(TICKET_KIND, "inner") is None
            assert get_ticket(db, "outer").state is TS.OPEN
            move(db, "outer", "drop")
        assert db.get(TICKET_KIND, "inner") is None
        assert db.history(TICKET_KIND, "inner") == []
        assert [r.event for r in db.history(TICKET_KIND, "outer")] == ["file", "drop"]
        assert (get_ticket(db, "base").fence, len(db.history(TICKET_KIND, "base"))) == (1, 2)

    def test_outer_failure_undoes_committed_inner_block(self, db: Store) -> None:
        """Writes of a nested block that completed are undone when the outer block fails."""
        file_ticket(db, "base")

        def body() -> None:
            with db.atomic():
                file_ticket(db, "inner")
                move(db, "base", "hold")
            assert db.get(TICKET_KIND, "inner") is not None

        abort_block(db, body)
        assert db.get(TICKET_KIND, "inner") is None
        assert db.history(TICKET_KIND, "inner") == []
        assert (get_ticket(db, "base").state, get_ticket(db, "base").fence) == (TS.OPEN, 0)

    def test_committed_block_is_visible_after(self, db: Store) -> None:
        """Writes of an atomic() block that completes are visible afterwards, from any thread."""
        file_ticket(db, "old")
        move(db, "old", "finish")
        with db.atomic():
            file_ticket(db, "c1")
            move(db, "c1", "hold", changes={"score": 2.0})
            assert db.prune(TICKET_KIND, "purge") == 1
            assert get_ticket(db, "c1").state is TS.HELD
        seen: list[object] = []

        def read() -> None:
            try:
                seen.append(snapshot(db, "c1"))
                seen.append(db.get(TICKET_KIND, "old"))
            except BaseException as exc:
                seen.append(exc)

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        thread.join(JOIN_TIMEOUT)
        assert not thread.is_alive()
        assert seen == [snapshot(db, "c1"), None]
        row = get_ticket(db, "c1")
        assert (row.state, row.fence, row["score"]) == (TS.HELD, 1, 2.0)
        assert [r.event for r in db.history(TICKET_KIND, "c1")] == ["file", "hold"]

    def test_caught_failure_inside_block_keeps_other_writes(self, db: Store) -> None:
        """A refused transition caught inside an atomic() block does not undo the block's other
        writes."""
        file_ticket(db, "base")
        with db.atomic():
            file_ticket(db, "c1")
            move(db, "base", "touch")
            with pytest.raises(InvalidTransition):
                move(db, "c1", "resume")
            with pytest.raises(StaleState):
                move(db, "base", "hold", fence=0)
            with pytest.raises(StaleState):
                move(db, "c1", "hold", expect={"assignee": "nobody"})
            with pytest.raises(UnknownEntity):
                move(db, "ghost", "hold")
            file_ticket(db, "c2")
        assert get_ticket(db, "c1").state is TS.OPEN
        assert get_ticket(db, "c2").fence == 0
        assert get_ticket(db, "base").fence == 1
        assert len(db.history(TICKET_KIND, "c1")) == 1
        assert db.count(TICKET_KIND) == 3

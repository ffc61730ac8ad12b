"""The store contract: the guarded transition: one compare-and-set per move."""

from __future__ import annotations

from typing import Any

import pytest

from statecore.errors import InvalidTransition, StaleState, UnknownEntity
from statecore.store import (
    Store,
    ge,
    gt,
    le,
    lt,
    ne,
    one_of,
)
from stores.testing._base import KitFixtures
from stores.testing._kit import (
    TICKET_KIND,
    TS,
    file_ticket,
    get_ticket,
    move,
    snapshot,
)


class TransitionContract(KitFixtures):
    """The guarded transition: one compare-and-set per move."""

    def test_transition_moves_and_bumps_fence_by_one(self, db: Store) -> None:
        """A legal transition moves the entity, bumps its fence by exactly one and returns the
        written row."""
        file_ticket(db, "t1", assignee="alice")
        held = move(db, "t1", "hold", fence=0)
        assert held.state is TS.HELD
        assert held.fence == 1
        assert held.id == "t1"
        assert held["assignee"] == "alice"
        assert get_ticket(db, "t1") == held
        reopened = move(db, "t1", "resume")
        assert (reopened.state, reopened.fence) == (TS.OPEN, 2)
        done = move(db, "t1", "finish", fence=2)
        assert (done.state, done.fence) == (TS.DONE, 3)
        assert get_ticket(db, "t1") == done

    def test_multi_source_event_moves_from_each_source(self, db: Store) -> None:
        """An event with several source states applies from each of them."""
        file_ticket(db, "from-open")
        file_ticket(db, "from-held")
        move(db, "from-held", "hold")
        assert move(db, "from-open", "finish").state is TS.DONE
        assert move(db, "from-held", "finish").state is TS.DONE

    def test_event_with_a_target_per_source(self, db: Store) -> None:
        """An event declared with a different target per source moves each row to its own
        source's target."""
        file_ticket(db, "t1")
        file_ticket(db, "t2")
        move(db, "t2", "hold")
        assert move(db, "t1", "advance").state is TS.HELD
        assert move(db, "t2", "advance").state is TS.DONE
        assert move(db, "t1", "advance", fence=1).state is TS.DONE
        with pytest.raises(InvalidTransition):
            move(db, "t1", "advance")
        assert [(r.from_state, r.to_state) for r in db.history(TICKET_KIND, "t1")[1:]] == [
            (TS.OPEN, TS.HELD),
            (TS.HELD, TS.DONE),
        ]
        assert [(r.from_state, r.to_state) for r in db.history(TICKET_KIND, "t2")[1:]] == [
            (TS.OPEN, TS.HELD),
            (TS.HELD, TS.DONE),
        ]
        assert (get_ticket(db, "t1").fence, get_ticket(db, "t2").fence) == (2, 2)

    def test_transition_applies_changes(self, db: Store) -> None:
        """changes set mutable fields (None and int-to-float included) in the same write."""
        file_ticket(db, "t1", assignee="alice", score=1.0, due_at=5.0)
        row = move(
            db,
            "t1",
            "hold",
            changes={"assignee": None, "score": 3, "urgent": True, "priority": 7, "queue": "q2"},
        )
        expected = {
            "title": "t1",
            "assignee": None,
            "priority": 7,
            "score": 3.0,
            "urgent": True,
            "due_at": 5.0,
            "queue": "q2",
        }
        assert dict(row.values) == expected
        assert type(row["score"]) is float
        assert row["urgent"] is True
        stored = get_ticket(db, "t1")
        assert dict(stored.values) == expected
        assert type(stored["score"]) is float
        assert stored["urgent"] is True
        assert stored.fence == 1

    def test_forbidden_move_raises_invalid_transition_and_changes_nothing(self, db: Store) -> None:
        """A move the lifecycle forbids raises InvalidTransition and leaves state, fence,
        values and history unchanged."""
        file_ticket(db, "t1")
        file_ticket(db, "t2")
        move(db, "t2", "finish")
        before = (snapshot(db, "t1"), snapshot(db, "t2"))
        with pytest.raises(InvalidTransition):
            move(db, "t1", "resume", changes={"assignee": "x"})
        with pytest.raises(InvalidTransition):
            move(db, "t1", "resume", fence=0)
        with pytest.raises(InvalidTransition):
            move(db, "t1", "no_such_event")
        for event in ("touch", "hold", "resume", "finish", "drop"):
            with pytest.raises(InvalidTransition):
                move(db, "t2", event, changes={"score": 1.0})
        assert (snapshot(db, "t1"), snapshot(db, "t2")) == before

    def test_transition_of_unknown_id_raises_unknown_entity(self, db: Store) -> None:
        """A transition of an id that does not exist raises UnknownEntity, a LookupError."""
        file_ticket(db, "t1")
        with pytest.raises(UnknownEntity):
            move(db, "ghost", "hold")
        with pytest.raises(LookupError):
            move(db, "ghost", "hold", fence=0, expect={"assignee": None})
        assert db.get(TICKET_KIND, "ghost") is None
        assert db.history(TICKET_KIND, "ghost") == []

    def test_wrong_fence_raises_stale_state_and_changes_nothing(self, db: Store) -> None:
        """A transition with a fence other than the stored one raises StaleState and writes
        nothing."""
        file_ticket(db, "t1")
        move(db, "t1", "touch")
        before = snapshot(db, "t1")
        for fence in (0, 2, 99):
            with pytest.raises(StaleState):
                move(db, "t1", "hold", fence=fence, changes={"assignee": "x"})
        with pytest.raises(TypeError):
            move(db, "t1", "hold", fence=True)
        with pytest.raises(TypeError):
            move(db, "t1", "hold", fence="1")
        assert snapshot(db, "t1") == before
        assert move(db, "t1", "hold", fence=1).fence == 2

    def test_failed_expect_raises_stale_state_and_changes_nothing(self, db: Store) -> None:
        """A transition whose expect condition does not hold raises StaleState and writes
        nothing."""
        file_ticket(db, "t1", assignee="alice", priority=2)
        before = snapshot(db, "t1")
        for expect in (
            {"assignee": "bob"},
            {"assignee": None},
            {"priority": 3},
            {"assignee": "alice", "priority": 3},
            {"fence": 1},
            {"score": 1.0},
        ):
            with pytest.raises(StaleState):
                move(db, "t1", "hold", expect=expect, changes={"queue": "x"})
        assert snapshot(db, "t1") == before
        row = move(db, "t1", "hold", expect={"assignee": "alice", "priority": 2, "fence": 0})
        assert row.state is TS.HELD

    def test_expect_with_comparisons(self, db: Store) -> None:
        """expect accepts lt/le/gt/ge/ne/one_of with SQL semantics (NULL satisfies none but
        equality with None)."""
        file_ticket(db, "t1", assignee="alice", priority=2, score=1.5)
        passing: list[dict[str, object]] = [
            {"priority": lt(3)},
            {"priority": le(2), "score": ge(1.5)},
            {"score": gt(1)},
            {"assignee": ne(None)},
            {"assignee": ne("bob")},
            {"assignee": one_of("alice", "carol")},
            {"due_at": None},
            {"fence": ge(2), "ticket_id": "t1"},
        ]
        for fence, expect in enumerate(passing, start=1):
            row = move(db, "t1", "touch", expect=expect)
            assert row.fence == fence, expect
        failing: list[dict[str, object]] = [
            {"priority": lt(2)},
            {"priority": gt(2)},
            {"score": le(1.4)},
            {"assignee": ne("alice")},
            {"assignee": one_of("bob", "carol")},
            {"due_at": ne(None)},
            {"due_at": lt(1e18)},
            {"due_at": ge(0.0)},
            {"due_at": ne(1.0)},
            {"ticket_id": ne("t1")},
        ]
        before = snapshot(db, "t1")
        for expect in failing:
            with pytest.raises(StaleState):
                move(db, "t1", "touch", expect=expect)
        assert snapshot(db, "t1") == before

    def test_bad_expect_is_refused_before_any_write(self, db: Store) -> None:
        """expect over an unknown column raises KeyError and a wrong-typed value TypeError,
        writing nothing."""
        file_ticket(db, "t1")
        before = snapshot(db, "t1")
        with pytest.raises(KeyError):
            move(db, "t1", "hold", expect={"nope": 1})
        with pytest.raises(KeyError):
            move(db, "t1", "hold", expect={"state": "open"})
        with pytest.raises(TypeError):
            move(db, "t1", "hold", expect={"priority": "high"})
        with pytest.raises(TypeError):
            move(db, "t1", "hold", expect={"fence": "0"})
        assert snapshot(db, "t1") == before

    def test_changing_immutable_field_raises_value_error_before_any_write(self, db: Store) -> None:
        """changes to an immutable field raise ValueError before anything is read or written."""
        file_ticket(db, "t1")
        before = snapshot(db, "t1")
        with pytest.raises(ValueError, match="immutable"):
            move(db, "t1", "hold", changes={"title": "renamed"})
        with pytest.raises(ValueError, match="immutable"):
            move(db, "t1", "hold", fence=0, changes={"assignee": "a", "title": "renamed"})
        with pytest.raises(ValueError, match="immutable"):
            move(db, "ghost", "hold", changes={"title": "renamed"})
        assert snapshot(db, "t1") == before

    def test_changing_unknown_or_managed_field_raises_key_error(self, db: Store) -> None:
        """changes to an undeclared field, the fence, the state or the id raise KeyError and
        write nothing."""
        file_ticket(db, "t1")
        before = snapshot(db, "t1")
        for changes in ({"nope": 1}, {"fence": 5}, {"state": "done"}, {"ticket_id": "t9"}):
            with pytest.raises(KeyError):
                move(db, "t1", "hold", changes=changes)
        assert snapshot(db, "t1") == before

    def test_wrong_typed_change_is_refused_before_any_write(self, db: Store) -> None:
        """changes with a wrong-typed value or None for a non-nullable field are refused and
        write nothing."""
        file_ticket(db, "t1")
        before = snapshot(db, "t1")
        with pytest.raises(TypeError):
            move(db, "t1", "hold", changes={"priority": "high"})
        with pytest.raises(TypeError):
            move(db, "t1", "hold", changes={"priority": False})
        with pytest.raises(ValueError, match="None"):
            move(db, "t1", "hold", changes={"priority": None})
        assert snapshot(db, "t1") == before

    def test_a_shape_that_succeeded_still_checks_every_later_value(self, db: Store) -> None:
        """A store may plan a transition shape once and reuse it; every later call of that shape
        is still checked in full: wrong types, NaN and unencodable text are refused, values of a
        convertible type are converted, and a refused call writes nothing."""
        file_ticket(db, "t1")
        shape: dict[str, Any] = {"fence": 0, "expect": {"queue": "general"}}
        move(db, "t1", "touch", changes={"priority": 5, "assignee": "a", "score": 1.5}, **shape)
        before = snapshot(db, "t1")
        refused: list[tuple[dict[str, object], type[Exception]]] = [
            ({"priority": "high", "assignee": "a", "score": 1.5}, TypeError),
            ({"priority": True, "assignee": "a", "score": 1.5}, TypeError),
            ({"priority": None, "assignee": "a", "score": 1.5}, ValueError),
            ({"priority": 5, "assignee": 7, "score": 1.5}, TypeError),
            ({"priority": 5, "assignee": "\ud800", "score": 1.5}, ValueError),
            ({"priority": 5, "assignee": "a", "score": "1.5"}, TypeError),
            ({"priority": 5, "assignee": "a", "score": float("nan")}, ValueError),
        ]
        for changes, error in refused:
            with pytest.raises(error):
                move(db, "t1", "touch", fence=1, expect={"queue": "general"}, changes=changes)
        with pytest.raises(TypeError):
            move(
                db,
                "t1",
                "touch",
                fence=1,
                expect={"queue": 5},
                changes={"priority": 5, "assignee": "a", "score": 1.5},
            )
        assert snapshot(db, "t1") == before
        row = move(
            db,
            "t1",
            "touch",
            fence=1,
            expect={"queue": "general"},
            changes={"priority": 6, "assignee": "é", "score": 2},
        )
        assert (row["priority"], row["assignee"], row["score"]) == (6, "é", 2.0)
        assert type(row["score"]) is float
        assert get_ticket(db, "t1")["assignee"] == "é"

    def test_creation_and_removal_events_via_transition_raise_invalid_transition(
        self, db: Store
    ) -> None:
        """transition() through a creation or removal event raises InvalidTransition."""
        file_ticket(db, "t1")
        file_ticket(db, "t2")
        move(db, "t2", "finish")
        before = (snapshot(db, "t1"), snapshot(db, "t2"))
        for ticket_id, event in (("t1", "file"), ("t2", "purge"), ("t2", "archive")):
            with pytest.raises(InvalidTransition):
                move(db, ticket_id, event)
        with pytest.raises(InvalidTransition):
            move(db, "ghost", "file")
        assert (snapshot(db, "t1"), snapshot(db, "t2")) == before
        assert db.get(TICKET_KIND, "ghost") is None

    def test_self_loop_transition_bumps_fence(self, db: Store) -> None:
        """A self-loop keeps the state, bumps the fence and records an audit entry each time."""
        file_ticket(db, "t1")
        for fence in range(3):
            row = move(db, "t1", "touch", fence=fence, changes={"priority": fence})
            assert row.state is TS.OPEN
            assert row.fence == fence + 1
        assert get_ticket(db, "t1")["priority"] == 2
        assert [r.event for r in db.history(TICKET_KIND, "t1")] == ["file", *["touch"] * 3]

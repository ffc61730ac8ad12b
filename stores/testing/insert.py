"""The store contract: creating entities: checked values, idempotence, conflicts."""

from __future__ import annotations

from typing import Any

import pytest

from statecore.errors import InvalidTransition
from statecore.obligation import OBLIGATION_KIND
from statecore.store import (
    Audit,
    Store,
)
from stores.testing._base import KitFixtures
from stores.testing._kit import (
    AUDIT,
    TICKET_KIND,
    TS,
    file_ticket,
    get_ticket,
    move,
    snapshot,
)


class InsertContract(KitFixtures):
    """Creating entities: checked values, idempotence, conflicts."""

    def test_insert_creates_in_initial_state_with_fence_zero(self, db: Store) -> None:
        """insert() creates the entity in the initial state with fence 0 and returns (row, True)."""
        row, created = db.insert(TICKET_KIND, "t1", {"title": "first"}, event="file", audit=AUDIT)
        assert created is True
        assert row.id == "t1"
        assert row.state is TS.OPEN
        assert row.fence == 0
        assert get_ticket(db, "t1") == row
        assert db.count(TICKET_KIND) == 1

    def test_insert_echoes_values_with_defaults_and_float_coercion(self, db: Store) -> None:
        """Inserted values come back exactly, defaults filled and ints stored in float fields
        as floats."""
        row = file_ticket(db, "t1", title="T", assignee=None, score=2, due_at=7, priority=4)
        expected = {
            "title": "T",
            "assignee": None,
            "priority": 4,
            "score": 2.0,
            "urgent": False,
            "due_at": 7.0,
            "queue": "general",
        }
        for read in (row, get_ticket(db, "t1"), db.select(TICKET_KIND)[0]):
            assert dict(read.values) == expected
            assert type(read["score"]) is float
            assert type(read["due_at"]) is float
            assert type(read["priority"]) is int
            assert read["urgent"] is False
            assert read["title"] == "T"
        odd: dict[str, object] = {
            "title": "O'Brien; DROP TABLE x -- \u2713",
            "assignee": '\u00e9\u00e8 "q" \\ %_',
            "priority": -(2**62),
            "score": 0.1 + 0.2,
            "queue": "",
        }
        db.insert(TICKET_KIND, "odd", odd, event="file", audit=AUDIT)
        assert dict(get_ticket(db, "odd").values) == {**odd, "urgent": False, "due_at": None}
        other = file_ticket(db, "t2", urgent=True, queue="vip", score=0.25)
        assert get_ticket(db, "t2")["urgent"] is True
        assert other["queue"] == get_ticket(db, "t2")["queue"] == "vip"
        assert get_ticket(db, "t2")["score"] == 0.25
        assert get_ticket(db, "t2")["assignee"] is None

    def test_reinsert_returns_existing_row_and_changes_nothing(self, db: Store) -> None:
        """Inserting an existing id returns (existing row, False) and writes nothing, even with
        different values."""
        file_ticket(db, "t1", assignee="alice", priority=2)
        current = move(db, "t1", "hold")
        before = snapshot(db, "t1")
        row, created = db.insert(
            TICKET_KIND,
            "t1",
            {"title": "other", "assignee": "bob", "priority": 9},
            event="file",
            audit=Audit(at=5.0, owner="late"),
        )
        assert created is False
        assert row == current
        assert row.state is TS.HELD
        assert row.fence == 1
        assert row["assignee"] == "alice"
        assert snapshot(db, "t1") == before
        assert db.count(TICKET_KIND) == 1

    def test_insert_with_non_creation_event_raises_invalid_transition(self, db: Store) -> None:
        """insert() through a move, removal or undeclared event raises InvalidTransition and
        stores nothing."""
        for event in ("hold", "touch", "purge", "no_such_event"):
            with pytest.raises(InvalidTransition):
                db.insert(TICKET_KIND, "t1", {"title": "x"}, event=event, audit=AUDIT)
        assert db.get(TICKET_KIND, "t1") is None
        assert db.history(TICKET_KIND, "t1") == []
        assert db.count(TICKET_KIND) == 0

    @pytest.mark.parametrize(
        ("values", "error"),
        [
            ({"title": 5}, TypeError),
            ({"title": "t", "score": "high"}, TypeError),
            ({"title": "t", "priority": True}, TypeError),
            ({"title": "t", "priority": 1.5}, TypeError),
            ({"title": "t", "urgent": 1}, TypeError),
            ({"title": None}, ValueError),
            ({}, ValueError),
            ({"title": "t", "urgent": None}, ValueError),
            ({"title": "t", "score": float("nan")}, ValueError),
            ({"title": "t", "nope": 1}, KeyError),
            ({"title": "t", "fence": 3}, KeyError),
            ({"title": "t", "state": "done"}, KeyError),
        ],
        ids=[
            "str-field-int",
            "float-field-str",
            "int-field-bool",
            "int-field-float",
            "bool-field-int",
            "none-non-nullable",
            "missing-required",
            "none-non-nullable-default",
            "float-field-nan",
            "unknown-field",
            "managed-fence",
            "managed-state",
        ],
    )
    def test_insert_bad_values_are_refused_and_nothing_stored(
        self, db: Store, values: dict[str, object], error: type[Exception]
    ) -> None:
        """A value of the wrong type, None where not nullable, NaN (which one store would keep
        and another turn into NULL) or an unknown field is refused and nothing is stored."""
        file_ticket(db, "keep")
        with pytest.raises(error):
            db.insert(TICKET_KIND, "t1", values, event="file", audit=AUDIT)
        assert db.get(TICKET_KIND, "t1") is None
        assert db.history(TICKET_KIND, "t1") == []
        assert db.count(TICKET_KIND) == 1

    @pytest.mark.parametrize("bad_id", ["", 7, None, b"t1"])
    def test_insert_refuses_empty_or_non_str_id(self, db: Store, bad_id: Any) -> None:
        """An empty or non-str id is refused with TypeError or ValueError and nothing is
        stored."""
        with pytest.raises((TypeError, ValueError)):
            db.insert(TICKET_KIND, bad_id, {"title": "x"}, event="file", audit=AUDIT)
        assert db.count(TICKET_KIND) == 0

    def test_get_unknown_id_returns_none(self, db: Store) -> None:
        """get() of an id that was never inserted returns None."""
        assert db.get(TICKET_KIND, "ghost") is None
        file_ticket(db, "t1")
        assert db.get(TICKET_KIND, "ghost") is None
        assert db.get(OBLIGATION_KIND, "t1") is None

"""The store contract: selecting and counting by state, index and condition."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from statecore.errors import InvalidTransition
from statecore.obligation import OBLIGATION_KIND
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
    FILTERS,
    OS,
    SEED_IDS,
    TICKET_KIND,
    TS,
    TicketState,
    get_ticket,
    ids_of,
    move,
    seed,
    snapshot,
)


class SelectContract(KitFixtures):
    """Selecting and counting by state, index and condition."""

    def test_select_defaults_to_all_rows_ordered_by_id(self, db: Store) -> None:
        """select() without filters returns every row ordered by id, whatever the insert
        order."""
        assert db.select(TICKET_KIND) == []
        assert db.count(TICKET_KIND) == 0
        seed(db)
        rows = db.select(TICKET_KIND)
        assert ids_of(rows) == list(SEED_IDS)
        assert [(r.state, r.fence) for r in rows] == [
            (TS.OPEN, 0),
            (TS.HELD, 1),
            (TS.DONE, 1),
            (TS.OPEN, 0),
            (TS.DROPPED, 1),
            (TS.OPEN, 2),
        ]
        assert rows == [get_ticket(db, ticket_id) for ticket_id in SEED_IDS]
        assert db.count(TICKET_KIND) == 6

    def test_select_by_states(self, db: Store) -> None:
        """A states filter returns exactly the rows in those states (none for an empty one)."""
        seed(db)
        assert ids_of(db.select(TICKET_KIND, states=[TS.OPEN])) == ["a1", "a4", "a6"]
        assert ids_of(db.select(TICKET_KIND, states={TS.DONE, TS.DROPPED})) == ["a3", "a5"]
        assert ids_of(db.select(TICKET_KIND, states=(TS.HELD, TS.OPEN))) == [
            "a1",
            "a2",
            "a4",
            "a6",
        ]
        assert db.select(TICKET_KIND, states=[]) == []
        assert db.count(TICKET_KIND, states=[]) == 0
        assert ids_of(db.select(TICKET_KIND, states=iter([TS.HELD]))) == ["a2"]

    @pytest.mark.parametrize(
        ("where", "expected"),
        [
            ({"assignee": "alice"}, ["a1", "a5"]),
            ({"assignee": None}, ["a2", "a4"]),
            ({"score": None}, ["a2", "a5"]),
            ({"urgent": True}, ["a1", "a5"]),
            ({"urgent": False}, ["a2", "a3", "a4", "a6"]),
            ({"priority": 3}, ["a3", "a4"]),
            ({"score": 0.5}, ["a1", "a6"]),
            ({"queue": "general"}, list(SEED_IDS)),
            ({"assignee": "bob", "priority": 3}, ["a3"]),
            ({"assignee": "nobody"}, []),
        ],
    )
    def test_select_where_equality(
        self, db: Store, where: dict[str, object], expected: list[str]
    ) -> None:
        """A plain where value means equality, and None means IS NULL."""
        seed(db)
        assert ids_of(db.select(TICKET_KIND, where=where)) == expected
        assert db.count(TICKET_KIND, where=where) == len(expected)

    @pytest.mark.parametrize(
        ("where", "expected"),
        [
            ({"score": lt(1.0)}, ["a1", "a6"]),
            ({"score": le(1.5)}, ["a1", "a3", "a6"]),
            ({"score": gt(0.5)}, ["a3", "a4"]),
            ({"score": ge(0.5)}, ["a1", "a3", "a4", "a6"]),
            ({"score": ne(0.5)}, ["a3", "a4"]),
            ({"score": ne(None)}, ["a1", "a3", "a4", "a6"]),
            ({"assignee": ne("alice")}, ["a3", "a6"]),
            ({"assignee": lt("b")}, ["a1", "a5"]),
            ({"priority": one_of(2, 3)}, ["a2", "a3", "a4", "a6"]),
            ({"assignee": one_of("alice", "zed")}, ["a1", "a5"]),
            ({"due_at": lt(250)}, ["a1", "a2", "a6"]),
            ({"due_at": ge(150.0), "priority": le(2)}, ["a2", "a6"]),
            ({"due_at": gt(-1e300)}, ["a1", "a2", "a4", "a6"]),
            ({"priority": one_of()}, []),
        ],
    )
    def test_select_where_comparisons_never_match_null(
        self, db: Store, where: dict[str, object], expected: list[str]
    ) -> None:
        """Cmp helpers compare with SQL semantics: a NULL column satisfies no lt/le/gt/ge/ne/IN."""
        seed(db)
        assert ids_of(db.select(TICKET_KIND, where=where)) == expected
        assert db.count(TICKET_KIND, where=where) == len(expected)

    def test_select_by_id_field_and_fence(self, db: Store) -> None:
        """where may filter on the id field and on the fence, with equality or comparisons."""
        seed(db)

        def ids(where: Mapping[str, object]) -> list[str]:
            return ids_of(db.select(TICKET_KIND, where=where))

        assert ids({"ticket_id": "a3"}) == ["a3"]
        assert ids({"ticket_id": "zz"}) == []
        assert ids({"ticket_id": one_of("a1", "a4", "zz")}) == ["a1", "a4"]
        assert ids({"ticket_id": gt("a4")}) == ["a5", "a6"]
        assert ids({"fence": 0}) == ["a1", "a4"]
        assert ids({"fence": 1}) == ["a2", "a3", "a5"]
        assert ids({"fence": ge(1)}) == ["a2", "a3", "a5", "a6"]
        assert ids({"fence": one_of(0, 2)}) == ["a1", "a4", "a6"]
        assert db.count(TICKET_KIND, where={"fence": gt(1)}) == 1

    @pytest.mark.parametrize(
        ("order_by", "expected"),
        [
            ("score", ["a2", "a5", "a1", "a6", "a3", "a4"]),
            ("assignee", ["a2", "a4", "a1", "a5", "a3", "a6"]),
            ("priority", ["a1", "a2", "a6", "a3", "a4", "a5"]),
            ("urgent", ["a2", "a3", "a4", "a6", "a1", "a5"]),
            ("due_at", ["a3", "a5", "a1", "a6", "a2", "a4"]),
            ("fence", ["a1", "a4", "a2", "a3", "a5", "a6"]),
            ("ticket_id", list(SEED_IDS)),
            ("queue", list(SEED_IDS)),
        ],
    )
    def test_select_order_by_nulls_first_then_id(
        self, db: Store, order_by: str, expected: list[str]
    ) -> None:
        """order_by sorts ascending with NULLs first and ties broken by id."""
        seed(db)
        assert ids_of(db.select(TICKET_KIND, order_by=order_by)) == expected
        assert ids_of(db.select(TICKET_KIND, order_by=order_by, limit=3)) == expected[:3]

    def test_select_order_by_with_filters(self, db: Store) -> None:
        """order_by applies after the states and where filters."""
        seed(db)
        rows = db.select(
            TICKET_KIND, states=[TS.OPEN, TS.HELD], where={"due_at": ne(None)}, order_by="due_at"
        )
        assert ids_of(rows) == ["a1", "a6", "a2", "a4"]

    def test_select_limit(self, db: Store) -> None:
        """limit caps the rows returned (0 returns none, a limit above the count returns all)."""
        seed(db)
        assert db.select(TICKET_KIND, limit=0) == []
        assert ids_of(db.select(TICKET_KIND, limit=2)) == ["a1", "a2"]
        assert ids_of(db.select(TICKET_KIND, limit=6)) == list(SEED_IDS)
        assert ids_of(db.select(TICKET_KIND, limit=100)) == list(SEED_IDS)
        assert ids_of(db.select(TICKET_KIND, states=[TS.OPEN], order_by="score", limit=2)) == [
            "a1",
            "a6",
        ]

    def test_select_states_of_another_lifecycle_raise_invalid_transition(self, db: Store) -> None:
        """A states filter naming a state of another lifecycle (or a bare string) raises
        InvalidTransition."""
        seed(db)
        bad_filters: list[list[Any]] = [[OS.PENDING], [TS.OPEN, OS.DELIVERED], ["open"]]
        for states in bad_filters:
            with pytest.raises(InvalidTransition):
                db.select(TICKET_KIND, states=states)
            with pytest.raises(InvalidTransition):
                db.count(TICKET_KIND, states=states)
        foreign: list[Any] = [TS.OPEN]
        with pytest.raises(InvalidTransition):
            db.select(OBLIGATION_KIND, states=foreign)

    def test_select_unknown_column_raises_key_error(self, db: Store) -> None:
        """An undeclared where or order_by column raises KeyError."""
        seed(db)
        with pytest.raises(KeyError):
            db.select(TICKET_KIND, where={"nope": 1})
        with pytest.raises(KeyError):
            db.select(TICKET_KIND, where={"state": "open"})
        with pytest.raises(KeyError):
            db.select(TICKET_KIND, order_by="nope")
        with pytest.raises(KeyError):
            db.count(TICKET_KIND, where={"nope": lt(1)})

    @pytest.mark.parametrize(
        "where",
        [
            {"priority": "high"},
            {"priority": True},
            {"priority": lt("x")},
            {"score": "1.0"},
            {"urgent": 1},
            {"assignee": 5},
            {"ticket_id": 5},
            {"fence": "1"},
            {"fence": True},
            {"priority": one_of(1, "two")},
        ],
    )
    def test_select_wrong_typed_where_raises_type_error(
        self, db: Store, where: dict[str, object]
    ) -> None:
        """A where value of the wrong type for its column raises TypeError."""
        seed(db)
        with pytest.raises(TypeError):
            db.select(TICKET_KIND, where=where)
        with pytest.raises(TypeError):
            db.count(TICKET_KIND, where=where)

    def test_unencodable_text_in_a_condition_is_refused_alike(self, db: Store) -> None:
        """Text with an unpaired surrogate cannot be stored by every store, so no store compares
        with it either: select, count and an expect condition raise ValueError, unchanged."""
        seed(db)
        bad = {"assignee": "alice\udcff"}
        before = snapshot(db, "a1")
        with pytest.raises(ValueError, match="Unicode"):
            db.select(TICKET_KIND, where=bad)
        with pytest.raises(ValueError, match="Unicode"):
            db.count(TICKET_KIND, where=bad)
        with pytest.raises(ValueError, match="Unicode"):
            move(db, "a1", "touch", expect=bad)
        assert snapshot(db, "a1") == before

    def test_select_negative_limit_raises_value_error(self, db: Store) -> None:
        """A negative (or non-int) limit raises ValueError."""
        seed(db)
        with pytest.raises(ValueError, match="limit"):
            db.select(TICKET_KIND, limit=-1)
        with pytest.raises(ValueError, match="limit"):
            db.select(TICKET_KIND, limit=True)

    @pytest.mark.parametrize(("states", "where"), FILTERS)
    def test_count_matches_select(
        self, db: Store, states: list[TicketState] | None, where: dict[str, object] | None
    ) -> None:
        """count() equals len(select()) for the same states and where."""
        seed(db)
        rows = db.select(TICKET_KIND, states=states, where=where)
        assert db.count(TICKET_KIND, states=states, where=where) == len(rows)
        for row in rows:
            assert states is None or row.state in states

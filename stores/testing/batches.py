"""The store contract: the optional BatchStore capability: batches with one outcome per item."""

from __future__ import annotations

import random

import pytest

from statecore.batch import (
    BatchStore,
    Creation,
    Move,
    insert_each_sequentially,
    transition_each_sequentially,
)
from statecore.batching import has_batch
from statecore.errors import InvalidTransition
from statecore.store import (
    Audit,
    Row,
    Store,
    lt,
)
from stores.testing._base import KitFixtures
from stores.testing._kit import (
    AUDIT,
    TICKET_KIND,
    StoreOpener,
    abort_block,
    file_ticket,
    get_ticket,
    outcome_of,
    seed,
    snapshot,
)


class BatchContract(KitFixtures):
    """The optional BatchStore capability: batches with one outcome per item."""

    @pytest.fixture
    def batch_db(self, db: Store) -> BatchStore:
        """The store under test, when its class runs batches (the batch tests skip
        otherwise): the decision the ledger makes (``statecore.batching.has_batch``)."""
        if not (has_batch(db, "insert_each") and has_batch(db, "transition_each")):
            pytest.skip(f"{type(db).__name__} is not a BatchStore (optional capability)")
        assert isinstance(db, BatchStore)
        return db

    def test_insert_each_matches_insert_one_by_one(
        self, batch_db: BatchStore, new_store: StoreOpener
    ) -> None:
        """insert_each gives every creation the outcome insert() would give it in order:
        created rows, an existing id untouched (also one created earlier in the same batch),
        refusals in place (bad values, bad ids, a non-creation event) writing nothing."""
        k = TICKET_KIND
        batch_db.insert(k, "old", {"title": "old"}, event="file", audit=AUDIT)
        creations = [
            Creation("n1", {"title": "n1", "priority": 7}, "file", Audit(1.0, "w1", 0, "r1")),
            Creation("old", {"title": "changed"}, "file", AUDIT),
            Creation("n2", {"title": "n2", "priority": "high"}, "file", AUDIT),
            Creation("n3", {"title": "n3", "score": 2}, "file", Audit(2.0)),
            Creation("n1", {"title": "again"}, "file", AUDIT),
            Creation("", {"title": "no id"}, "file", AUDIT),
            Creation("n4", {"title": "n4"}, "hold", AUDIT),
            Creation("n5", {"nope": 1, "title": "n5"}, "file", AUDIT),
            Creation("n6", {"title": "é"}, "file", AUDIT),
        ]
        one_by_one = new_store()
        one_by_one.insert(k, "old", {"title": "old"}, event="file", audit=AUDIT)
        expected = insert_each_sequentially(one_by_one, k, creations)  # one insert() each
        outcomes = batch_db.insert_each(k, creations)
        assert [outcome_of(o) for o in outcomes] == [outcome_of(o) for o in expected]
        assert [type(o) for o in outcomes[5:8]] == [ValueError, InvalidTransition, KeyError]
        assert outcomes[4] == (outcomes[0][0], False)  # type: ignore[index]
        for ticket_id in ("old", "n1", "n3", "n6", "n2", "n4"):
            assert snapshot(batch_db, ticket_id) == snapshot(one_by_one, ticket_id)
        assert batch_db.history(k, "n1")[0].owner == "w1"

    def test_transition_each_matches_transition_one_by_one(
        self, batch_db: BatchStore, new_store: StoreOpener
    ) -> None:
        """transition_each gives every move the outcome transition() would give it in order:
        rows moved under their own fences and conditions, later moves of an entity seeing the
        earlier ones, refusals (stale fence, failed condition, forbidden or undeclared event,
        unknown id, bad values) in place and writing nothing."""
        k = TICKET_KIND
        one_by_one = new_store()
        for store in (batch_db, one_by_one):
            seed(store)
        moves = [
            Move("a1", "hold", Audit(1.0, "w", 1, "one"), fence=0, changes={"score": 9.5}),
            Move("a4", "hold", AUDIT, fence=0, changes={"score": None}),
            Move("a6", "hold", AUDIT, fence=0, changes={"score": 1.0}),  # stale: fence 2
            Move("a2", "resume", AUDIT, expect={"assignee": None}),  # IS NULL holds
            Move("a1", "resume", AUDIT, fence=1),  # sees the hold above
            Move("a3", "hold", AUDIT),  # done: forbidden
            Move("zz", "hold", AUDIT, fence=0, changes={"score": 1.0}),  # unknown
            Move("a6", "touch", AUDIT, expect={"assignee": "alice"}),  # condition fails
            Move("a6", "touch", AUDIT, expect={"priority": lt(3)}),  # not equality: alone
            Move("a4", "bogus", AUDIT),  # undeclared event
            Move("a4", "resume", AUDIT, changes={"priority": "high"}),  # bad value
            Move("a4", "resume", AUDIT, fence=1, expect={"queue": "general"}),
            Move("a6", "finish", AUDIT, fence=3, changes={"assignee": "carl"}),
            Move("a1", "touch", AUDIT, fence=2, changes={"urgent": False, "due_at": 5}),
        ]
        expected = transition_each_sequentially(one_by_one, k, moves)  # one transition() each
        outcomes = batch_db.transition_each(k, moves)
        assert [outcome_of(o) for o in outcomes] == [outcome_of(o) for o in expected]
        kinds = [type(o).__name__ for o in outcomes]
        assert kinds[2] == kinds[7] == "StaleState"
        assert kinds[5] == kinds[9] == "InvalidTransition"
        assert (kinds[6], kinds[10]) == ("UnknownEntity", "TypeError")
        for ticket_id in ("a1", "a2", "a3", "a4", "a5", "a6", "zz"):
            assert snapshot(batch_db, ticket_id) == snapshot(one_by_one, ticket_id)

    @pytest.mark.parametrize("rng_seed", [1, 2, 3])
    def test_transition_each_random_batches_match_one_by_one(
        self, batch_db: BatchStore, new_store: StoreOpener, rng_seed: int
    ) -> None:
        """Random batches of moves (fresh and stale fences, conditions, changes, repeated
        entities, forbidden events) leave the store exactly as the same moves one by one."""
        rng = random.Random(rng_seed)
        k = TICKET_KIND
        one_by_one = new_store()
        ids = [f"r{n}" for n in range(12)]
        assignees = {ticket_id: rng.choice([None, "ann"]) for ticket_id in ids}
        for store in (batch_db, one_by_one):
            for ticket_id in ids:
                file_ticket(store, ticket_id, assignee=assignees[ticket_id])
        events = ["touch", "hold", "resume", "finish", "advance", "drop", "bogus"]
        for batch in range(8):
            # Every other batch has one shape (event, fenced, compared and changed fields), as
            # group commit produces: only ids, fences and values vary.
            uniform = batch % 2 == 0
            event = rng.choice(events[:-1])
            moves = []
            for _ in range(rng.randint(1, 40)):
                ticket_id = rng.choice(ids)
                current = one_by_one.get(k, ticket_id)
                fresh = current.fence if current else 0
                if uniform:
                    fence: int | None = rng.choice([fresh, fresh, fresh - 1])
                    expect: dict[str, object] | None = {"assignee": rng.choice(["ann", None])}
                    changes: dict[str, object] | None = {"score": rng.random(), "priority": 4}
                else:
                    event = rng.choice(events)
                    fence = rng.choice([None, fresh, 0])
                    conditions: list[dict[str, object] | None] = [
                        None,
                        {"assignee": "ann"},
                        {"assignee": None},
                    ]
                    expect = rng.choice(conditions)
                    options: list[dict[str, object] | None] = [
                        None,
                        {"score": rng.random()},
                        {"priority": 4},
                    ]
                    changes = rng.choice(options)
                audit = Audit(float(rng.randint(0, 9)), "w", rng.randint(0, 3), None)
                moves.append(Move(ticket_id, event, audit, fence, expect, changes))
            expected = transition_each_sequentially(one_by_one, k, moves)
            outcomes = batch_db.transition_each(k, moves)
            assert [outcome_of(o) for o in outcomes] == [outcome_of(o) for o in expected]
        for ticket_id in ids:
            assert snapshot(batch_db, ticket_id) == snapshot(one_by_one, ticket_id)

    def test_a_batch_shape_that_succeeded_still_checks_every_later_value(
        self, batch_db: BatchStore
    ) -> None:
        """Moves of a shape a batch has already run are still checked in full: wrong types and
        unencodable text are refused in place, convertible values are converted."""
        k = TICKET_KIND
        for ticket_id in ("t1", "t2", "t3", "t4", "t5"):
            file_ticket(batch_db, ticket_id)

        def touch(ticket_id: str, priority: object, assignee: object, score: object) -> Move:
            return Move(
                ticket_id,
                "touch",
                AUDIT,
                fence=get_ticket(batch_db, ticket_id).fence,
                expect={"queue": "general"},
                changes={"priority": priority, "assignee": assignee, "score": score},
            )

        first = batch_db.transition_each(k, [touch(t, 5, "a", 1.5) for t in ("t1", "t2")])
        assert all(isinstance(row, Row) for row in first)
        later = batch_db.transition_each(
            k,
            [
                touch("t1", "high", "a", 1.5),
                touch("t2", True, "a", 1.5),
                touch("t3", 5, "\ud800", 1.5),
                touch("t4", 6, "é", 2),
                touch("t5", 7, "b", 2.5),
            ],
        )
        assert [type(o).__name__ for o in later[:3]] == ["TypeError", "TypeError", "ValueError"]
        t4, t5 = later[3], later[4]
        assert isinstance(t4, Row)
        assert isinstance(t5, Row)
        assert (t4["priority"], t4["assignee"], t4["score"]) == (6, "é", 2.0)
        assert type(t4["score"]) is float
        assert (t5["priority"], t5.fence) == (7, 1)
        assert get_ticket(batch_db, "t1").fence == 1
        assert get_ticket(batch_db, "t3").fence == 0

    def test_batches_inside_a_failed_block_are_undone(self, batch_db: BatchStore) -> None:
        """Batches in an atomic block that raises leave nothing behind."""
        k = TICKET_KIND
        file_ticket(batch_db, "t1")
        before = snapshot(batch_db, "t1")

        def both() -> None:
            batch_db.insert_each(k, [Creation("t2", {"title": "t2"}, "file", AUDIT)])
            batch_db.transition_each(k, [Move("t1", "hold", AUDIT, fence=0)])

        abort_block(batch_db, both)
        assert snapshot(batch_db, "t1") == before
        assert batch_db.get(k, "t2") is None
        assert batch_db.history(k, "t2") == []

"""The store contract: concurrent writers: exactly one wins each compare-and-set."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from statecore.errors import StaleState
from statecore.store import (
    Audit,
    Store,
)
from stores.testing._base import KitFixtures
from stores.testing._kit import (
    JOIN_TIMEOUT,
    TICKET_KIND,
    TS,
    file_ticket,
    get_ticket,
    move,
    snapshot,
)


class RaceContract(KitFixtures):
    """Concurrent writers: exactly one wins each compare-and-set."""

    def test_lost_race_exactly_one_claimer_wins(self, db: Store) -> None:
        """Two claimers that read the same fence race the same move: one wins, the other gets
        StaleState."""
        file_ticket(db, "t1")
        first, second = get_ticket(db, "t1"), get_ticket(db, "t1")
        assert first.fence == second.fence == 0
        won = move(db, "t1", "hold", fence=first.fence, changes={"assignee": "first"})
        with pytest.raises(StaleState):
            move(db, "t1", "hold", fence=second.fence, changes={"assignee": "second"})
        assert get_ticket(db, "t1") == won
        assert won["assignee"] == "first"
        assert len(db.history(TICKET_KIND, "t1")) == 2

    def test_expect_guarded_claim_has_one_winner(self, db: Store) -> None:
        """Two claimers guarding on the same expected value (not the fence): the second gets
        StaleState."""
        file_ticket(db, "t1")
        unowned = {"assignee": None}
        won = move(db, "t1", "touch", expect=unowned, changes={"assignee": "first"})
        with pytest.raises(StaleState):
            move(db, "t1", "touch", expect=unowned, changes={"assignee": "second"})
        assert get_ticket(db, "t1") == won
        assert (won.fence, won["assignee"]) == (1, "first")

    def test_thread_race_has_exactly_one_winner_per_row(self, db: Store) -> None:
        """Eight threads claiming the same 50 rows with the fence they read leave exactly one
        winner per row."""
        ids = [f"race-{n:02d}" for n in range(50)]
        for ticket_id in ids:
            file_ticket(db, ticket_id)
        workers = 8
        barrier = threading.Barrier(workers, timeout=JOIN_TIMEOUT)
        wins: list[tuple[str, str]] = []
        losses: list[tuple[str, str]] = []
        errors: list[BaseException] = []

        def claim(name: str) -> None:
            try:
                fences = {ticket_id: get_ticket(db, ticket_id).fence for ticket_id in ids}
                barrier.wait()
                for ticket_id in ids:
                    try:
                        # A self-loop: only the fence stands between two claimers.
                        move(
                            db,
                            ticket_id,
                            "touch",
                            Audit(at=1.0, owner=name),
                            fence=fences[ticket_id],
                            changes={"assignee": name},
                        )
                    except StaleState:
                        losses.append((ticket_id, name))
                    else:
                        wins.append((ticket_id, name))
            except BaseException as exc:
                errors.append(exc)
                barrier.abort()

        threads = [
            threading.Thread(target=claim, args=(f"worker-{n}",), daemon=True)
            for n in range(workers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(JOIN_TIMEOUT)
        assert not any(t.is_alive() for t in threads), "a racing thread did not finish"
        assert errors == []
        assert Counter(ticket_id for ticket_id, _ in wins) == dict.fromkeys(ids, 1)
        assert len(losses) == len(ids) * (workers - 1)
        for ticket_id, winner in wins:
            row = get_ticket(db, ticket_id)
            assert (row.state, row.fence, row["assignee"]) == (TS.OPEN, 1, winner)
            history = db.history(TICKET_KIND, ticket_id)
            assert [(r.event, r.owner) for r in history] == [("file", "kit"), ("touch", winner)]

    def test_zombie_writer_with_old_fence_cannot_write(self, db: Store) -> None:
        """A writer holding fence f cannot apply its late write once the row moved to f+1."""
        file_ticket(db, "t1", assignee="zombie")
        file_ticket(db, "t2", assignee="zombie")
        zombie_fence = get_ticket(db, "t1").fence
        move(db, "t1", "touch", fence=zombie_fence, changes={"assignee": "new-owner"})
        move(db, "t2", "finish", fence=zombie_fence, changes={"assignee": "new-owner"})
        before = (snapshot(db, "t1"), snapshot(db, "t2"))
        for ticket_id in ("t1", "t2"):
            for event in ("touch", "hold", "drop"):
                with pytest.raises(StaleState):
                    move(db, ticket_id, event, fence=zombie_fence, changes={"assignee": "zombie"})
        assert (snapshot(db, "t1"), snapshot(db, "t2")) == before
        assert get_ticket(db, "t1")["assignee"] == "new-owner"

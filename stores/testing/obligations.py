"""The store contract: the obligation kind under a real Ledger (time-based selection, ownership,
sweeps)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from statecore.clock import FakeClock
from statecore.errors import InvalidTransition, StaleState
from statecore.ledger import Ledger
from statecore.lifecycles import ObligationState
from statecore.obligation import OBLIGATION_KIND
from statecore.ownership import Incarnation
from statecore.store import (
    Audit,
    Store,
    le,
    lt,
)
from stores.testing._base import KitFixtures
from stores.testing._kit import (
    JOIN_TIMEOUT,
    OS,
    TICKET_KIND,
    ContractProbe,
    ids_of,
    record_obligation,
)


class ObligationContract(KitFixtures):
    """The obligation kind under a real Ledger: time-based selection, ownership, sweeps."""

    def test_obligation_kind_round_trip(self, db: Store) -> None:
        """OBLIGATION_KIND rows go record, attempt, fail, claim, deliver, prune with their values
        and audit."""
        row = record_obligation(db, "ob-1", 100.0, thread_id=None)
        assert (row.state, row.fence) == (OS.PENDING, 0)
        assert row["attempts"] == 0
        assert row["adapter_profile"] == "default"
        assert row["owner_pid"] is None
        owner = {"owner_host": "h", "owner_pid": 42, "owner_started_at": 7, "owner_token": "k"}
        k = OBLIGATION_KIND
        db.transition(
            k,
            "ob-1",
            "attempt",
            audit=Audit(101.0, "h:42"),
            fence=0,
            changes={**owner, "attempts": 1, "updated_at": 101, "lease_expires_at": 131.0},
        )
        failed = db.transition(
            k,
            "ob-1",
            "fail",
            audit=Audit(102.0, "h:42", 1, "timeout"),
            fence=1,
            changes={"last_error": "timeout", "error_kind": "transient", "updated_at": 102.0},
        )
        assert (failed.state, failed.fence, failed["owner_pid"]) == (OS.FAILED, 2, 42)
        with pytest.raises(ValueError, match="immutable"):
            db.transition(k, "ob-1", "claim", audit=Audit(103.0), changes={"content": "x"})
        db.transition(k, "ob-1", "claim", audit=Audit(103.0), expect={"owner_pid": 42})
        done = db.transition(
            k, "ob-1", "deliver", audit=Audit(104.0), fence=3, changes={"updated_at": 104.0}
        )
        assert (done.state, done.fence, done["last_error"]) == (OS.DELIVERED, 4, "timeout")
        assert type(done["updated_at"]) is float
        history = db.history(k, "ob-1")
        assert [(r.event, r.from_state, r.to_state) for r in history] == [
            ("record", None, OS.PENDING),
            ("attempt", OS.PENDING, OS.ATTEMPTING),
            ("fail", OS.ATTEMPTING, OS.FAILED),
            ("claim", OS.FAILED, OS.ATTEMPTING),
            ("deliver", OS.ATTEMPTING, OS.DELIVERED),
        ]
        assert (history[2].owner, history[2].attempts, history[2].reason) == ("h:42", 1, "timeout")
        record_obligation(db, "ob-2", 100.0)
        assert db.prune(k, "prune", where={"updated_at": lt(200.0)}) == 1
        assert db.get(k, "ob-1") is None
        assert db.history(k, "ob-1") == []
        assert ids_of(db.select(k)) == ["ob-2"]
        assert db.count(TICKET_KIND) == 0

    def test_stale_cutoff_selects_exactly_the_old_rows(self, db: Store) -> None:
        """With a fake clock, created_at < now - cutoff selects exactly the rows older than the
        cutoff."""
        clock = FakeClock()
        cutoff = 1800.0
        for n in range(3):
            record_obligation(db, f"old-{n}", clock.now())
            clock.advance(60)
        clock.advance(cutoff)
        edge = clock.now()
        record_obligation(db, "edge", edge)
        for n in range(2):
            clock.advance(60)
            record_obligation(db, f"new-{n}", clock.now())
        now = clock.now()
        k = OBLIGATION_KIND
        stale = db.select(k, where={"created_at": lt(now - cutoff)}, order_by="created_at")
        assert ids_of(stale) == ["old-0", "old-1", "old-2"]
        assert db.count(k, where={"created_at": lt(now - cutoff)}) == 3
        assert ids_of(db.select(k, where={"created_at": le(edge)})) == [
            "edge",
            "old-0",
            "old-1",
            "old-2",
        ]
        clock.advance(cutoff)
        # new-1 was written exactly `cutoff` ago: not strictly older, so not stale.
        later = db.select(k, states=[OS.PENDING], where={"created_at": lt(clock.now() - cutoff)})
        assert ids_of(later) == ["edge", "new-0", "old-0", "old-1", "old-2"]

    def test_expired_leases_select_only_expired(self, db: Store) -> None:
        """With a fake clock, lease_expires_at <= now selects only leases that have expired."""
        clock = FakeClock()
        k = OBLIGATION_KIND
        for name, lease in (("short", 30.0), ("long", 90.0), ("none", None)):
            record_obligation(db, name, clock.now())
            expires = None if lease is None else clock.now() + lease
            db.transition(
                k,
                name,
                "attempt",
                audit=Audit(clock.now()),
                fence=0,
                changes={"lease_expires_at": expires},
            )
        record_obligation(db, "pending", clock.now(), lease_expires_at=clock.now())

        def expired() -> list[str]:
            where = {"lease_expires_at": le(clock.now())}
            return ids_of(db.select(k, states=[OS.ATTEMPTING], where=where))

        assert expired() == []
        clock.advance(29)
        assert expired() == []
        clock.advance(1)
        assert expired() == ["short"]
        clock.advance(59.5)
        assert expired() == ["short"]
        clock.advance(0.5)
        assert expired() == ["long", "short"]
        clock.advance(1e6)
        assert expired() == ["long", "short"]
        assert ids_of(db.select(k, where={"lease_expires_at": le(clock.now())})) == [
            "long",
            "pending",
            "short",
        ]

    # ==========================================================================================
    # Ledger-level contract: the delivery ledger's guarantees hold on this store.
    # ==========================================================================================

    @staticmethod
    def _ledgers(db: Store, clock: FakeClock) -> tuple[Ledger, Ledger]:
        """A dead owner's ledger and a live one, on the same host, sharing ``clock``."""
        me = Incarnation.current()
        dead = Incarnation(me.host, 4_000_000, 1, "dead-owner")
        probe = ContractProbe(alive={me.pid})
        return (
            Ledger(db, clock=clock, incarnation=dead, probe=probe),
            Ledger(db, clock=clock, incarnation=me, probe=probe),
        )

    @staticmethod
    def _record(ledger: Ledger, oid: str, **fields: Any) -> str:
        values: dict[str, Any] = {
            "session_key": "agent:main:slack:channel:C1",
            "platform": "slack",
            "chat_id": "C1",
            "content": f"reply {oid}",
        }
        values.update(fields)
        return ledger.record(obligation_id=oid, **values).obligation_id

    def test_ledger_lifecycle_and_history(self, db: Store) -> None:
        """record -> attempting -> delivered through the ledger leaves a three-entry history."""
        clock = FakeClock()
        _, live = self._ledgers(db, clock)
        oid = self._record(live, "ob-1")
        live.mark_attempting(oid)
        clock.advance(1)
        done = live.mark_delivered(oid)
        assert done.state is ObligationState.DELIVERED
        assert done.updated_at == clock.now()
        assert [(h.event, h.from_state, h.to_state) for h in live.history(oid)] == [
            ("record", None, ObligationState.PENDING),
            ("attempt", ObligationState.PENDING, ObligationState.ATTEMPTING),
            ("deliver", ObligationState.ATTEMPTING, ObligationState.DELIVERED),
        ]

    def test_ledger_strict_lifecycle_changes_nothing(self, db: Store) -> None:
        """Settling a row that is not attempting raises InvalidTransition and changes nothing."""
        _, live = self._ledgers(db, FakeClock())
        oid = self._record(live, "ob-1")
        before = live.get(oid)
        with pytest.raises(InvalidTransition):
            live.mark_delivered(oid)
        with pytest.raises(InvalidTransition):
            live.mark_failed(oid, "boom")
        with pytest.raises(InvalidTransition):
            live.release(oid)
        assert live.get(oid) == before
        assert len(live.history(oid)) == 1

    def test_ledger_dead_owner_rows_claimed_once_and_zombie_refused(self, db: Store) -> None:
        """A dead owner's rows are claimed once; the owner's late write is refused (fence)."""
        clock = FakeClock()
        zombie, live = self._ledgers(db, clock)
        pending = self._record(zombie, "ob-pending")
        sent = self._record(zombie, "ob-sent")
        zombie.mark_attempting(sent)
        claims = {c.obligation_id: c for c in live.sweep_recoverable()}
        assert set(claims) == {pending, sent}
        assert (claims[pending].needs_marker, claims[pending].reason) == (False, None)
        assert (claims[sent].needs_marker, claims[sent].reason) == (True, "recovered")
        assert live.sweep_recoverable() == []
        with pytest.raises(StaleState):
            zombie.mark_delivered(sent)
        row = live.get(sent)
        assert row is not None
        assert row.state is ObligationState.ATTEMPTING
        assert row.owner.token == live.incarnation.token
        assert live.mark_delivered(sent).state is ObligationState.DELIVERED

    def test_ledger_concurrent_sweeps_claim_each_row_once(self, db: Store) -> None:
        """Two live sweepers racing over the same dead rows claim every row exactly once."""
        clock = FakeClock()
        zombie, live = self._ledgers(db, clock)
        ids = [self._record(zombie, f"ob-{i:03d}") for i in range(60)]
        me = live.incarnation
        other = Ledger(
            db,
            clock=clock,
            incarnation=Incarnation(me.host, me.pid, me.started_at, "second-sweeper"),
            probe=ContractProbe(alive={me.pid}),
        )
        results: dict[str, list[str]] = {}
        errors: list[BaseException] = []
        start = threading.Barrier(2, timeout=JOIN_TIMEOUT)

        def sweep(name: str, ledger: Ledger) -> None:
            try:
                start.wait()
                results[name] = [c.obligation_id for c in ledger.sweep_recoverable()]
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=sweep, args=(n, lg), daemon=True)
            for n, lg in (("a", live), ("b", other))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN_TIMEOUT)
        assert not any(t.is_alive() for t in threads), "a sweeper did not finish"
        assert not errors
        assert set(results) == {"a", "b"}
        claimed = Counter(results.get("a", []) + results.get("b", []))
        assert set(claimed) == set(ids)
        assert max(claimed.values()) == 1

    def test_ledger_fake_clock_abandons_stale_rows_and_prunes_only_settled(self, db: Store) -> None:
        """Stale owed rows are abandoned with a reason; pruning never deletes an owed row."""
        clock = FakeClock()
        zombie, live = self._ledgers(db, clock)
        stale = self._record(zombie, "ob-stale")
        clock.advance(live.policy.stale_after + 1)
        fresh = self._record(zombie, "ob-fresh")
        claims = live.sweep_recoverable()
        assert [c.obligation_id for c in claims] == [fresh]
        abandoned = live.get(stale)
        assert abandoned is not None
        assert abandoned.state is ObligationState.ABANDONED
        assert "stale" in (live.history(stale)[-1].reason or "")
        clock.advance(live.policy.retention + 1)
        assert live.prune() == 1
        assert live.get(stale) is None
        assert live.history(stale) == []
        owed = live.get(fresh)
        assert owed is not None
        assert owed.state is ObligationState.ATTEMPTING

"""The ledger's sweeps on PostgreSQL: sweepers never queue behind each other.

Each chunk of a sweep is re-read inside its transaction with ``FOR UPDATE SKIP LOCKED``
(``statecore.claims.candidates``): rows another sweeper holds are skipped, never waited for, and
rows that changed since the listing are dropped, so two sweepers running at once claim every
row exactly once, neither blocks and neither meets a stale write.  Every wait is bounded.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from statecore import OBLIGATION_KIND, FakeClock, Incarnation, Ledger, LedgerPolicy
from statecore.claims import ClaimingStore
from statecore.metrics import NullMetrics
from statecore.store import one_of
from stores.postgres import PostgresStore
from tests.statecore.ledger_helpers import DEAD, HOST, FakeProbe, record

ROWS = 500
CHUNK = 25
BOUND_S = 30.0
"""Real seconds a sweep may take before the test fails (each takes well under a second)."""

SWEEPER_A = Incarnation(HOST, 4101, 1_000, "sweeper-a-token")
SWEEPER_B = Incarnation(HOST, 4102, 2_000, "sweeper-b-token")
POLICY = LedgerPolicy(sweep_chunk=CHUNK)


class Outcomes(NullMetrics):
    """Metrics keeping the outcome of every transition the ledger reports (from any thread)."""

    def __init__(self) -> None:
        self.seen: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def transition(self, lifecycle: str, event: str, outcome: str, count: int = 1) -> None:
        with self._lock:
            self.seen[(event, outcome)] += count


@pytest.fixture
def pg(postgres_url: str) -> Iterator[PostgresStore]:
    """A fresh store in a schema of its own, with a pool for both sweepers and a lock holder."""
    store = PostgresStore(postgres_url, schema=f"s_{uuid.uuid4().hex[:16]}", pool_size=6)
    yield store
    store.close()


def _probe() -> FakeProbe:
    """Both sweepers live; the rows' owner (DEAD) does not."""
    return FakeProbe({SWEEPER_A.pid: SWEEPER_A.started_at, SWEEPER_B.pid: SWEEPER_B.started_at})


def _ledger(store: PostgresStore, clock: FakeClock, incarnation: Incarnation, **kw: Any) -> Ledger:
    return Ledger(store, clock=clock, probe=_probe(), incarnation=incarnation, policy=POLICY, **kw)


def _owe_dead(store: PostgresStore, clock: FakeClock, count: int) -> list[str]:
    """``count`` pending rows of the dead owner, recorded in one transaction."""
    dead = _ledger(store, clock, DEAD)
    with store.atomic():
        return [record(dead, f"ob-{i:04d}") for i in range(count)]


def _claim_events(store: PostgresStore, oids: list[str]) -> Counter[str]:
    return Counter(
        oid for oid in oids for e in store.history(OBLIGATION_KIND, oid) if e.event == "claim"
    )


def test_the_store_has_the_claiming_capability(pg: PostgresStore) -> None:
    """The sweeps below take the locked path (the in-memory and SQLite stores do not)."""
    assert isinstance(pg, ClaimingStore)


def test_two_sweepers_at_once_claim_every_row_exactly_once(pg: PostgresStore) -> None:
    """Two ledgers (distinct incarnations) sweep the same 500 dead-owner rows in two threads at
    once: every row is claimed exactly once, by one of them; both end within the bound, none
    raises, and no claim was lost to a stale fence (the locks divided the rows first)."""
    clock = FakeClock()
    oids = _owe_dead(pg, clock, ROWS)
    metrics = {SWEEPER_A.token: Outcomes(), SWEEPER_B.token: Outcomes()}
    ledgers = [
        _ledger(pg, clock, inc, metrics=metrics[inc.token]) for inc in (SWEEPER_A, SWEEPER_B)
    ]
    start = threading.Barrier(len(ledgers))
    claimed: dict[str, list[str]] = {}
    errors: list[BaseException] = []
    took: dict[str, float] = {}

    def sweep(ledger: Ledger) -> None:
        token = ledger.incarnation.token
        try:
            start.wait(BOUND_S)
            began = time.monotonic()
            claims = ledger.sweep_recoverable()
            took[token] = time.monotonic() - began
            claimed[token] = [c.obligation_id for c in claims]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sweep, args=(ledger,)) for ledger in ledgers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUND_S)
    assert not any(thread.is_alive() for thread in threads), "a sweeper is blocked"
    assert errors == []
    assert all(seconds < BOUND_S for seconds in took.values())
    everything = claimed[SWEEPER_A.token] + claimed[SWEEPER_B.token]
    assert sorted(everything) == oids  # each row once, across both sweepers
    assert _claim_events(pg, oids) == Counter(dict.fromkeys(oids, 1))
    for inc in (SWEEPER_A, SWEEPER_B):
        mine = set(claimed[inc.token])
        owners = {
            row.id: row["owner_token"]
            for row in pg.select(OBLIGATION_KIND, where={"owner_token": inc.token})
        }
        assert set(owners) == mine
        assert metrics[inc.token].seen == Counter({("claim", "ok"): len(mine)})


def test_a_sweep_skips_rows_another_transaction_holds_instead_of_waiting(
    pg: PostgresStore,
) -> None:
    """While another transaction holds some rows locked, a sweep returns at once with every
    other row claimed and the held ones untouched; once they are free, the next sweep takes
    them."""
    clock = FakeClock()
    oids = _owe_dead(pg, clock, 100)
    held_ids = oids[10:40]
    locked = threading.Event()
    release = threading.Event()
    failures: list[BaseException] = []

    def hold() -> None:
        try:
            with pg.atomic():
                rows = pg.claim_candidates(
                    OBLIGATION_KIND, where={OBLIGATION_KIND.id_field: one_of(*held_ids)}
                )
                assert len(rows) == len(held_ids)
                locked.set()
                release.wait(BOUND_S)
        except BaseException as exc:
            failures.append(exc)
            locked.set()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(BOUND_S)
        sweeper = _ledger(pg, clock, SWEEPER_A)
        began = time.monotonic()
        first = [c.obligation_id for c in sweeper.sweep_recoverable()]
        assert time.monotonic() - began < BOUND_S / 3  # not queued behind the holder
        assert sorted(first) == [oid for oid in oids if oid not in held_ids]
        for oid in held_ids:
            row = pg.get(OBLIGATION_KIND, oid)
            assert row is not None
            assert row["owner_token"] == DEAD.token
    finally:
        release.set()
        holder.join(BOUND_S)
    assert failures == []
    second = [c.obligation_id for c in _ledger(pg, clock, SWEEPER_B).sweep_recoverable()]
    assert sorted(second) == held_ids
    assert _claim_events(pg, oids) == Counter(dict.fromkeys(oids, 1))


def test_the_runtime_and_stuck_sweeps_skip_held_rows_too(pg: PostgresStore) -> None:
    """The two sweeps of a ledger's own rows take the same locked path: a row held elsewhere is
    left for the next round, the others are claimed."""
    clock = FakeClock()
    ledger = _ledger(pg, clock, SWEEPER_A)
    failed = [record(ledger, f"f-{i}") for i in range(4)]
    for oid in failed:
        ledger.mark_attempting(oid)
        ledger.mark_failed(oid, "send_path_degraded")
    stuck = [record(ledger, f"s-{i}") for i in range(4)]
    clock.advance(120)
    held_ids = [failed[0], stuck[0]]
    with pg.atomic():
        # This thread holds two rows; a second thread sweeps meanwhile.
        pg.claim_candidates(OBLIGATION_KIND, where={OBLIGATION_KIND.id_field: one_of(*held_ids)})
        out: dict[str, list[str]] = {}

        def sweep() -> None:
            out["runtime"] = [c.obligation_id for c in ledger.sweep_failed_for_runtime("slack")]
            out["stuck"] = [c.obligation_id for c in ledger.sweep_stuck_own(older_than_s=60.0)]

        thread = threading.Thread(target=sweep)
        thread.start()
        thread.join(BOUND_S)
        assert not thread.is_alive(), "a sweep waited for the held rows"
    assert {sweep: sorted(ids) for sweep, ids in out.items()} == {
        "runtime": failed[1:],
        "stuck": stuck[1:],
    }
    assert [c.obligation_id for c in ledger.sweep_failed_for_runtime("slack")] == failed[:1]
    assert [c.obligation_id for c in ledger.sweep_stuck_own(older_than_s=60.0)] == stuck[:1]

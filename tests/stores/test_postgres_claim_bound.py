"""A PostgreSQL claim never waits for a lock longer than ``claim_lock_timeout_s``: past it the
claim returns nothing (nothing claimed this round), the caller's block goes on and keeps what
it did, and the session's ``lock_timeout`` is as before.

The wait the bound is for -- a ``FOR UPDATE SKIP LOCKED`` claim waiting on another
transaction's id while following a row another claimer just moved (``stores._postgres_claim``,
reproduced under load by ``benchmarks/bench_pg_claims.py --pattern limit``) -- is a race inside
the server that no test can stage on demand; these tests stage a wait the claim meets the same
way: another session's open transaction holding a lock the claim's statement must queue for.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from statecore.store import Audit
from stores.postgres import PostgresStore
from stores.testing import TICKET_KIND
from stores.testing._kit import TS, file_ticket
from stores.testing.timers import ALARM_KIND, RING

BOUND = 0.3
"""The claims' lock bound in these tests, seconds."""
SLACK_S = 5.0
"""A claim that met its bound returns within BOUND + this (a loaded machine included)."""


@pytest.fixture
def pg(postgres_url: str) -> Iterator[PostgresStore]:
    """A fresh store with the tight claim bound, tickets t0..t4 filed."""
    store = PostgresStore(
        postgres_url, schema=f"k_{uuid.uuid4().hex[:12]}", claim_lock_timeout_s=BOUND
    )
    store.register(TICKET_KIND)
    for i in range(5):
        file_ticket(store, f"t{i}")
    yield store
    store.close()


def _holder(url: str, schema: str | None) -> psycopg.Connection[Any]:
    """Another session's open transaction that claimed rows and holds the tickets' table in a
    mode every claim must queue for (as a migration's ``ALTER TABLE`` would)."""
    conn = psycopg.connect(url, connect_timeout=5)
    conn.execute(f"SELECT * FROM {schema}.kit_tickets WHERE ticket_id = 't0' FOR UPDATE")
    conn.execute(f"LOCK TABLE {schema}.kit_tickets IN EXCLUSIVE MODE")
    return conn


def test_a_claim_waits_at_most_its_bound_then_claims_nothing(
    pg: PostgresStore, postgres_url: str
) -> None:
    """Behind another session's open transaction the claim returns [] after about its bound,
    not when that transaction ends; the block stays usable, keeps its earlier write, and its
    ``lock_timeout`` is the session's again."""
    holder = _holder(postgres_url, pg.schema)
    try:
        with pg.atomic():
            pg.notify("k_bound")  # earlier work of the block, kept through the claim's bound
            started = time.monotonic()
            rows = pg.claim_candidates(TICKET_KIND, states=[TS.OPEN])
            waited = time.monotonic() - started
            conn = pg.connection()
            assert conn.execute("SHOW lock_timeout").fetchone() == ("0",)
            assert conn.execute("SELECT 1").fetchone() == (1,)  # the block goes on
        assert rows == []
        assert BOUND <= waited < BOUND + SLACK_S
        assert holder.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    finally:
        holder.close()
    with pg.atomic():  # once the other transaction ended, the same claim gets the rows
        assert [r.id for r in pg.claim_candidates(TICKET_KIND, states=[TS.OPEN])] == [
            f"t{i}" for i in range(5)
        ]


def test_a_claim_that_returned_keeps_its_locks_until_the_block_ends(
    pg: PostgresStore, postgres_url: str
) -> None:
    """The bound's savepoint is released, not rolled back: rows a claim returned stay locked
    by its block (another claimer skips them) and can be moved under their fence."""
    other: list[list[str]] = []
    with pg.atomic():
        mine = pg.claim_candidates(TICKET_KIND, states=[TS.OPEN], limit=2)
        thread = threading.Thread(
            target=lambda: other.append(_claim_ids(pg)),
            daemon=True,
        )
        thread.start()
        thread.join(BOUND + SLACK_S)
        assert pg.connection().execute("SHOW lock_timeout").fetchone() == ("0",)
        for row in mine:
            pg.transition(TICKET_KIND, row.id, "hold", audit=Audit(2.0, "k"), fence=row.fence)
    assert not thread.is_alive()
    assert [r.id for r in mine] == ["t0", "t1"]
    assert other == [["t2", "t3", "t4"]]
    assert pg.count(TICKET_KIND, states=[TS.HELD]) == 2


def _claim_ids(store: PostgresStore) -> list[str]:
    with store.atomic():
        return [r.id for r in store.claim_candidates(TICKET_KIND, states=[TS.OPEN])]


def test_a_timer_claim_is_bounded_too(pg: PostgresStore, postgres_url: str) -> None:
    """``due_timers`` inside a block locks what it returns: the same bound, the same []; once
    the other transaction ended, the due row is returned."""
    pg.register(ALARM_KIND)
    pg.insert(ALARM_KIND, "a1", {}, event="arm", audit=Audit(1.0))
    holder = psycopg.connect(postgres_url, connect_timeout=5)
    try:
        holder.execute(f"LOCK TABLE {pg.schema}.kit_alarms IN EXCLUSIVE MODE")
        with pg.atomic():
            started = time.monotonic()
            assert pg.due_timers(ALARM_KIND, RING, now=100.0, limit=10) == []
            assert BOUND <= time.monotonic() - started < BOUND + SLACK_S
    finally:
        holder.close()
    with pg.atomic():
        assert [d.row.id for d in pg.due_timers(ALARM_KIND, RING, now=100.0, limit=10)] == ["a1"]

"""Claims/s of concurrent claimers on one PostgresStore schema, and the lock waits they meet.

Run: ``.venv/bin/python benchmarks/bench_pg_claims.py [--claimers 8] [--rows 4000]
[--rounds 3] [--settlers 2] [--pattern listed|limit] [--claim-lock-timeout SECONDS]``.  The
script starts its own throwaway PostgreSQL server (``stores.testing.postgres_server``, with
``fsync`` and ``synchronous_commit`` turned back on, ``log_lock_waits`` on and
``deadlock_timeout`` 2 ms so the server logs every lock wait past 2 ms) and stops it at exit.

Each round files ``--rows`` tickets into a fresh schema and runs ``--claimers`` threads:

* ``listed`` (the ledger's sweeps): list the open rows with a plain read (every claimer lists
  the same rows), then per chunk of 25, in one transaction, ``claim_candidates`` of the chunk's
  ids (``FOR UPDATE SKIP LOCKED``) and one guarded ``transition_many`` of what it locked;
* ``limit`` (the claims test): in one transaction, ``claim_candidates`` of the next 25 open
  rows by due time, each moved under its fence -- the pattern in which PostgreSQL makes a
  SKIP LOCKED claim wait on another transaction's id ("while locking updated version ... of
  tuple", see ``stores._postgres_claim``);

while ``--settlers`` threads move claimed rows on (held -> done, one guarded write each, as a
gateway settles a delivery).  A sampler polls ``pg_stat_activity`` every 5 ms for the store's
sessions waiting on a lock, by ``wait_event`` (``(claim)``: the waiting statement is a claim).
Printed per round: claims/s, settles, the sampled waits, the longest settle and the longest
claim statement (wall time: a loaded machine adds its own), double claims (must be 0); then
the waits the server logged.  ``--claim-lock-timeout`` sets the store's
``claim_lock_timeout_s`` (a store without that option: leave it out).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from statecore.batch import Creation
from statecore.batching import chunks
from statecore.errors import StaleState
from statecore.store import Audit, one_of
from stores.postgres import PostgresStore
from stores.testing import TICKET_KIND
from stores.testing._kit import TS
from stores.testing.postgres_server import start_server

CHUNK = 25


def _seed(store: PostgresStore, rows: int) -> None:
    ids = [f"t{i:06d}" for i in range(rows)]
    for start in range(0, rows, 500):
        store.insert_each(
            TICKET_KIND,
            [
                Creation(i, {"title": i, "due_at": float(n)}, "file", Audit(1.0, "seed"))
                for n, i in enumerate(ids[start : start + 500], start)
            ],
        )


def _claimer(
    store: PostgresStore,
    k: int,
    got: list[str],
    settle: list[str],
    *,
    pattern: str,
    slowest: list[float],
) -> None:
    audit = Audit(2.0, f"claimer-{k}")
    if pattern == "limit":  # as the claims test: the next 25 open rows, each moved in the block
        empty = 0
        while True:
            with store.atomic():
                started = time.perf_counter()
                rows = store.claim_candidates(
                    TICKET_KIND, states=[TS.OPEN], order_by="due_at", limit=CHUNK
                )
                slowest.append(time.perf_counter() - started)
                for row in rows:
                    store.transition(TICKET_KIND, row.id, "hold", audit=audit, fence=row.fence)
            if not rows:
                # Nothing claimed: none left, or a claim that met its lock bound (try again).
                empty += 1
                if empty > 3 and not store.count(TICKET_KIND, states=[TS.OPEN]):
                    return
                continue
            got.extend(row.id for row in rows)
            settle.extend(row.id for row in rows)
    while True:  # as the ledger's sweeps: a listing, then each chunk re-read under locks
        listed = store.select(TICKET_KIND, states=[TS.OPEN], order_by="due_at", limit=400)
        if not listed:
            return
        for chunk in chunks(listed, CHUNK):
            fences = {row.id: row.fence for row in chunk}
            with store.atomic():
                started = time.perf_counter()
                fresh = store.claim_candidates(
                    TICKET_KIND,
                    states=[TS.OPEN, TS.HELD],
                    where={TICKET_KIND.id_field: one_of(*fences)},
                )
                slowest.append(time.perf_counter() - started)
                mine = [row.id for row in fresh if fences.get(row.id) == row.fence]
                moved = store.transition_many(
                    TICKET_KIND, mine, "hold", audit=audit, expect={"assignee": None}
                )
            got.extend(row.id for row in moved)
            settle.extend(row.id for row in moved)


def _settler(
    store: PostgresStore, settle: list[str], stop: threading.Event, longest: list[float]
) -> int:
    done = 0
    while not stop.is_set() or settle:
        try:
            entity_id = settle.pop(0)
        except IndexError:
            time.sleep(0.001)
            continue
        started = time.perf_counter()
        with contextlib.suppress(StaleState):
            store.transition(TICKET_KIND, entity_id, "finish", audit=Audit(3.0, "settler"))
        longest.append(time.perf_counter() - started)
        done += 1
    return done


def _sampler(url: str, stop: threading.Event, waits: Counter[str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            for event, claim in conn.execute(
                "SELECT wait_event, query LIKE '%%SKIP LOCKED%%' FROM pg_stat_activity "
                "WHERE application_name = 'statecore' AND wait_event_type = 'Lock'"
            ).fetchall():
                waits[f"{event}{' (claim)' if claim else ''}"] += 1
            time.sleep(0.005)


def one_round(
    url: str, claimers: int, rows: int, settlers: int, *, pattern: str, bound: float | None
) -> dict[str, Any]:
    """One measured round on a fresh schema; returns its numbers."""
    options: dict[str, Any] = {} if bound is None else {"claim_lock_timeout_s": bound}
    schema = f"b_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(url, schema=schema, pool_size=claimers + 4, **options)
    slowest: list[float] = []
    try:
        store.register(TICKET_KIND)
        _seed(store, rows)
        got: list[list[str]] = [[] for _ in range(claimers)]
        settle: list[str] = []
        waits: Counter[str] = Counter()
        stop, settled = threading.Event(), threading.Event()
        longest: list[float] = []
        counts: list[int] = []
        sampler = threading.Thread(target=_sampler, args=(url, stop, waits), daemon=True)
        threads = [
            threading.Thread(
                target=_claimer,
                args=(store, k, got[k], settle),
                kwargs={"pattern": pattern, "slowest": slowest},
                daemon=True,
            )
            for k in range(claimers)
        ]
        movers = [
            threading.Thread(
                target=lambda: counts.append(_settler(store, settle, settled, longest)),
                daemon=True,
            )
            for _ in range(settlers)
        ]
        sampler.start()
        for thread in movers:
            thread.start()
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        elapsed = time.perf_counter() - started
        settled.set()
        for thread in movers:
            thread.join(300)
        stop.set()
        sampler.join(10)
        claimed = [i for ids in got for i in ids]
        return {
            "claims_per_s": round(len(claimed) / elapsed),
            "claimed": len(claimed),
            "double": len(claimed) - len(set(claimed)),
            "waits": dict(waits),
            "settled": sum(counts),
            "longest_settle_ms": round(1000 * max(longest, default=0.0), 1),
            "longest_claim_ms": round(1000 * max(slowest, default=0.0), 1),
        }
    finally:
        store.close()


def main() -> int:
    """Run the rounds and print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claimers", type=int, default=8)
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settlers", type=int, default=2)
    parser.add_argument("--pattern", choices=("listed", "limit"), default="listed")
    parser.add_argument(
        "--claim-lock-timeout", type=float, default=None, help="claim_lock_timeout_s (seconds)"
    )
    args = parser.parse_args()
    server = start_server()
    try:
        url = server.create_database("bench")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET log_lock_waits = on")
            conn.execute("ALTER SYSTEM SET deadlock_timeout = '2ms'")
            conn.execute("ALTER SYSTEM SET fsync = on")
            conn.execute("ALTER SYSTEM SET synchronous_commit = on")
            conn.execute("SELECT pg_reload_conf()")
        rates = []
        for n in range(args.rounds):
            result = one_round(
                url,
                args.claimers,
                args.rows,
                args.settlers,
                pattern=args.pattern,
                bound=args.claim_lock_timeout,
            )
            rates.append(result["claims_per_s"])
            print(f"round {n}: {result}", flush=True)
            if result["double"] or result["claimed"] != args.rows:
                print("FAILED: every row must be claimed exactly once", file=sys.stderr)
                return 1
        print(f"claims/s median {statistics.median(rates):.0f} ({args.claimers} claimers)")
        return 0
    finally:
        log = (server.root / "server.log").read_text(errors="replace")
        waits = [line for line in log.splitlines() if "still waiting" in line]
        print(f"lock waits logged by the server (past 2 ms): {len(waits)}")
        for line in waits[:10]:
            print("  ", line[:300])
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())

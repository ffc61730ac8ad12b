"""The ledger and its stores against raw baselines measured in the same run.

Run: ``.venv/bin/python benchmarks/bench_ledger.py`` (``--check`` exits 1 if a target is
missed; ``--only NAME`` runs one part; ``--quick`` shrinks every size for a smoke run).

Parts and targets:

* ``sequential``: record -> attempting -> delivered, each step committed, on SQLite WAL +
  synchronous NORMAL.  Ledger >= 0.7x raw ``sqlite3`` executing the store's own statements on
  one connection (``ledger_sql.RawLedger``: the same texts, the same file layout and triggers,
  so the audit entries too), and >= 20x a naive ledger that opens a connection per call.
* ``group``: AsyncLedger with 100 concurrent senders >= 3x the raw per-operation-commit rate at
  the same durability, at synchronous NORMAL and FULL.
* ``sweep``: startup sweep over 1,000,000 rows of which 10,000 belong to dead owners takes
  <= 2x the same sweep over 20,000 rows; the probe is called once per distinct owner.
* ``memory``: InMemoryStore heap per stored obligation of 100-byte content <= 1 KiB.

Rates printed are medians over interleaved rounds; the ratio checked is the median of the rounds'
own ratios.  Absolute numbers drift between runs, ratios hold.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sqlite3
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledger_sql import RawLedger, creation_values, execute

import stores._sqlite_sql as sql
from statecore import (
    OBLIGATION_KIND,
    AsyncLedger,
    Incarnation,
    Ledger,
    ObligationState,
)
from stores import InMemoryStore, SQLiteStore

S = ObligationState

RESULTS: list[tuple[str, float, str, bool]] = []


def report(name: str, value: float, target: str, ok: bool) -> None:
    """Record one ratio against its target and print it."""
    RESULTS.append((name, value, target, ok))
    print(f"  {name:<46} {value:10.2f}   target {target:<8} {'ok' if ok else 'MISSED'}")


def _paired(ours: list[float], raws: list[float]) -> float:
    """The median over rounds of ours / raw, each pair measured back to back in one round: a
    load change on the machine between rounds moves both sides of a round together."""
    return statistics.median(o / r for o, r in zip(ours, raws, strict=True))


# -- shared raw SQL (the same statements the SQLite store issues: see ledger_sql.py) -----------


def _connect(path: str, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    return conn


def _fresh_db(tmp: Path, name: str, synchronous: str = "NORMAL") -> tuple[str, SQLiteStore]:
    path = str(tmp / f"{name}.db")
    store = SQLiteStore(path, synchronous=synchronous)  # type: ignore[arg-type]
    store.register(OBLIGATION_KIND)
    return path, store


# -- sequential ---------------------------------------------------------------------------------


def bench_sequential(tmp: Path, n: int, rounds: int) -> None:
    """Ledger vs raw vs naive connection-per-call, sequential lifecycles, NORMAL."""
    print(f"sequential lifecycles (n={n}, {rounds} rounds, WAL, synchronous=NORMAL)")
    samples: dict[str, list[float]] = {"ledger": [], "raw": [], "naive": []}
    for r in range(rounds):
        _, store = _fresh_db(tmp, f"seq-ledger-{r}")
        ledger = Ledger(store)
        start = time.perf_counter()
        for i in range(n):
            ob = ledger.record(
                session_key="agent:main:slack:channel:C1",
                platform="slack",
                chat_id="C1",
                thread_id="171.001",
                content="x" * 100,
                obligation_id=f"ob-{i}",
            )
            ledger.mark_attempting(ob.obligation_id)
            ledger.mark_delivered(ob.obligation_id)
        samples["ledger"].append(n / (time.perf_counter() - start))
        store.close()

        raw = RawLedger(str(tmp / f"seq-raw-{r}.db"))
        start = time.perf_counter()
        raw.run(0, n)
        samples["raw"].append(n / (time.perf_counter() - start))
        raw.close()

        naive = RawLedger(str(tmp / f"seq-naive-{r}.db"))
        naive.close()
        naive_n = max(20, n // 20)
        start = time.perf_counter()
        for i in range(naive_n):
            oid = f"ob-{i}"
            for text, params, returns in naive.steps(oid, time.time()):
                # A naive ledger: open, write (committed on its own), close -- for every call.
                conn = naive.connect()
                execute(conn, text, params, returns, oid)
                conn.close()
        samples["naive"].append(naive_n / (time.perf_counter() - start))
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"  raw sqlite3, one connection           {med['raw']:10.0f} lifecycles/s (baseline)")
    print(f"  Ledger(SQLiteStore)                   {med['ledger']:10.0f} lifecycles/s")
    print(f"  naive, a connection per call          {med['naive']:10.0f} lifecycles/s")
    vs_raw = _paired(samples["ledger"], samples["raw"])
    vs_naive = _paired(samples["ledger"], samples["naive"])
    report("sequential: ledger / raw", vs_raw, ">= 0.7", vs_raw >= 0.7)
    report("sequential: ledger / naive", vs_naive, ">= 20", vs_naive >= 20)


# -- group commit -------------------------------------------------------------------------------


async def _async_senders(
    ledger: AsyncLedger, senders: int, per_sender: int, first: int = 0
) -> None:
    """Every sender runs ``per_sender`` lifecycles at once (a chat and session per sender), its
    obligation ids numbered from ``first`` on."""

    async def sender(s: int) -> None:
        for i in range(first, first + per_sender):
            ob = await ledger.record(
                session_key=f"agent:main:slack:channel:C{s}",
                platform="slack",
                chat_id=f"C{s}",
                content="x" * 100,
                obligation_id=f"ob-{s}-{i}",
            )
            await ledger.mark_attempting(ob.obligation_id)
            await ledger.mark_delivered(ob.obligation_id)

    await asyncio.gather(*(sender(s) for s in range(senders)))


def bench_group(tmp: Path, n: int, rounds: int) -> None:
    """AsyncLedger, 100 concurrent senders, vs raw per-operation commits, NORMAL and FULL."""
    senders = 100
    per_sender = max(1, n // senders)
    for sync in ("NORMAL", "FULL"):
        print(f"group commit ({senders} senders x {per_sender} lifecycles, synchronous={sync})")
        raw_n = max(50, n // (10 if sync == "FULL" else 2))
        ours: list[float] = []
        raws: list[float] = []
        for r in range(rounds):
            _, store = _fresh_db(tmp, f"group-{sync}-{r}", sync)
            ledger = AsyncLedger(store)
            start = time.perf_counter()
            asyncio.run(_async_senders(ledger, senders, per_sender))
            ours.append(senders * per_sender / (time.perf_counter() - start))
            batches, ops = ledger.batches, ledger.operations
            ledger.close()
            store.close()

            raw = RawLedger(str(tmp / f"group-raw-{sync}-{r}.db"), sync)
            start = time.perf_counter()
            raw.run(0, raw_n)
            raws.append(raw_n / (time.perf_counter() - start))
            raw.close()
        our, raw = statistics.median(ours), statistics.median(raws)
        print(f"  raw sqlite3, a commit per operation   {raw:10.0f} lifecycles/s (baseline)")
        per_commit = ops / max(1, batches)
        print(
            f"  AsyncLedger, group commit             {our:10.0f} lifecycles/s "
            f"({per_commit:.0f} ops per commit)"
        )
        ratio = _paired(ours, raws)
        report(f"group commit {sync}: async / raw", ratio, ">= 3", ratio >= 3)


# -- sweep scaling ------------------------------------------------------------------------------


class _CountingProbe:
    """Every owner is dead; counts the probes."""

    def __init__(self) -> None:
        self.calls = 0

    def pid_exists(self, pid: int) -> bool:
        return False

    def start_time(self, pid: int) -> int | None:
        self.calls += 1
        return None


def _populate(path: str, total: int, dead: int, owners: int, me: Incarnation) -> None:
    """total rows: `dead` owed rows of `owners` dead owners, the rest delivered."""
    conn = _connect(path, "OFF")
    now = time.time()
    dead_every = max(1, total // dead)
    conn.execute("BEGIN")
    batch: list[list[Any]] = []
    made_dead = 0
    insert = sql.insert_sql(OBLIGATION_KIND)  # the store's own: its trigger writes the audit
    column = {f.name: 3 + i for i, f in enumerate(OBLIGATION_KIND.fields)}
    for i in range(total):
        at = now - (total - i) * 0.001
        if i % dead_every == 0 and made_dead < dead:
            state = S.ATTEMPTING if i % 3 else S.PENDING
            values = creation_values(f"ob-{i:08d}", state, me, me.label, at)
            owner_index = made_dead % owners
            values[column["owner_pid"]] = 900_000 + owner_index
            values[column["owner_started_at"]] = 1
            values[column["owner_token"]] = f"dead{owner_index}"
            made_dead += 1
        else:
            values = creation_values(f"ob-{i:08d}", S.DELIVERED, me, me.label, at)
        batch.append(values)
        if len(batch) >= 10_000:
            conn.executemany(insert, batch)
            batch.clear()
    if batch:
        conn.executemany(insert, batch)
    conn.execute("COMMIT")
    conn.close()


def bench_sweep(tmp: Path, total: int, dead: int, rounds: int) -> None:
    """Startup sweep time depends on claimable rows, not table size."""
    small_total = 2 * dead
    owners = 10
    me = Incarnation.current()
    print(f"startup sweep ({dead} dead-owner rows of {owners} owners; {small_total} vs {total})")
    big_path = str(tmp / "sweep-big.db")
    SQLiteStore(big_path).register(OBLIGATION_KIND)
    start = time.perf_counter()
    _populate(big_path, total, dead, owners, me)
    print(f"  (populated {total} rows in {time.perf_counter() - start:.1f} s)")
    times: dict[str, list[float]] = {"small": [], "big": []}
    probes: list[int] = []
    for r in range(rounds):
        for label, n in (("small", small_total), ("big", total)):
            if label == "small":
                path = str(tmp / f"sweep-small-{r}.db")
                SQLiteStore(path).register(OBLIGATION_KIND)
                _populate(path, n, dead, owners, me)
            else:
                # Re-arm the big table instead of rebuilding it: hand the claimed rows back.
                path = big_path
                if r:
                    conn = _connect(path, "OFF")
                    # Dead rows sit every (total // dead) rows: spread them over the owners
                    # the way _populate did.
                    conn.execute(
                        "UPDATE delivery_obligations "
                        "SET owner_pid = 900000 + ((rowid - 1) / ?) % ?, owner_started_at = 1, "
                        "owner_token = 'dead', attempts = 0 "
                        "WHERE state IN ('pending', 'attempting', 'failed')",
                        (max(1, total // dead), owners),
                    )
                    conn.close()
            store = SQLiteStore(path)
            probe = _CountingProbe()
            ledger = Ledger(store, probe=probe)
            gc.collect()
            start = time.perf_counter()
            claims = ledger.sweep_recoverable()
            times[label].append(time.perf_counter() - start)
            assert len(claims) == dead, (label, len(claims))
            probes.append(probe.calls)
            store.close()
    small, big = statistics.median(times["small"]), statistics.median(times["big"])
    print(f"  sweep over {small_total:>9} rows          {small * 1000:10.1f} ms (baseline)")
    print(f"  sweep over {total:>9} rows          {big * 1000:10.1f} ms")
    print(f"  probes per sweep: {sorted(set(probes))} for {owners} distinct owners")
    report("sweep: big / small table", big / small, "<= 2", big / small <= 2)
    report("sweep: probes per distinct owner", max(probes) / owners, "== 1", max(probes) == owners)


# -- memory -------------------------------------------------------------------------------------


def bench_memory(n: int) -> None:
    """Heap per stored obligation in the in-memory store (tracemalloc)."""
    print(f"in-memory store heap ({n} obligations, 100-byte content)")
    store = InMemoryStore()
    ledger = Ledger(store)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    # Distinct 100-byte contents, allocated inside the measurement: they are stored.
    contents = [f"{i:08d}" + "x" * 92 for i in range(n)]
    for i in range(n):
        ledger.record(
            session_key=f"agent:main:slack:channel:C{i % 100}",
            platform="slack",
            chat_id=f"C{i % 100}",
            thread_id="171.001",
            content=contents[i],
            obligation_id=f"{i:024x}",
        )
    ledger.forget_fences()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    per = (after - before) / n
    print(f"  {per:.0f} bytes per obligation (content, row, indexes and audit entry)")
    report("memory: bytes per obligation", per, "<= 1024", per <= 1024)
    del contents, store


def main(argv: list[str] | None = None) -> int:
    """Run the selected parts; with ``--check`` return 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("sequential", "group", "sweep", "memory"))
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    quick = args.quick
    with tempfile.TemporaryDirectory(prefix="statecore-bench-") as tmpdir:
        tmp = Path(tmpdir)
        parts: dict[str, Callable[[], None]] = {
            "sequential": lambda: bench_sequential(tmp, 300 if quick else 2000, 3 if quick else 9),
            "group": lambda: bench_group(tmp, 1000 if quick else 5000, 3),
            "sweep": lambda: bench_sweep(
                tmp, 40_000 if quick else 1_000_000, 2_000 if quick else 10_000, 3
            ),
            "memory": lambda: bench_memory(20_000 if quick else 100_000),
        }
        for name, run in parts.items():
            if args.only in (None, name):
                run()
                print()
    missed = [r for r in RESULTS if not r[3]]
    print(f"{len(RESULTS) - len(missed)} of {len(RESULTS)} targets met")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())

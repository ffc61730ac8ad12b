"""A fleet of 8 gateway processes on one PostgreSQL ledger against procrastinate and pgqueuer,
each with 8 worker processes, on the same server in the same run.

Run: ``.venv/bin/python benchmarks/bench_fleet.py`` (``--check`` exits 1 if a target is missed;
``--quick`` runs small sizes as a smoke run; ``--only each|batched`` runs one shape;
``--profile FILE`` profiles one gateway process of the ``each`` shape with cProfile and prints
where its time goes).

The server is ``bench_postgres.py``'s throwaway PostgreSQL (``fsync = on``, ``synchronous_commit
= on``: every commit waits for its WAL flush), one database per contender.  Every process is a
child of this script (``fleet_worker.py``; the URL in ``$STATECORE_BENCH_PG_URL``):

* **statecore**: 8 gateway processes, each a ``Ledger`` (shape ``each``) or an ``AsyncLedger``
  (shape ``batched``) on one ``PostgresStore`` schema, doing the whole lifecycle of its share of
  the N obligations as a gateway does: ``record`` (pending, its owner this process),
  ``mark_attempting``, a no-op send, ``mark_delivered``.
* **procrastinate** and **pgqueuer**: one producer process enqueues the N jobs, 8 worker
  processes (each the library's own worker loop) fetch them, run a no-op and mark them done.

Every child gets ready first (connections open, listeners up), then the parent says go to all at
once and counts settled items in the database every few milliseconds; the rate is N over the
time from go to the poll that found all N settled, so enqueueing is inside the window for every
contender.  Shapes: ``each`` is one item per commit with one in flight per worker process (the
producer runs 8 one-job-per-commit enqueuers); ``batched`` is what a user would run for
throughput: ``AsyncLedger`` with 16 sends in flight per gateway (group commit), the peers'
batched enqueue (100 jobs a commit) and workers fetching 16 at a time (pgqueuer's
``batch_size``; procrastinate's ``concurrency``, since it fetches one job per query).

After every run the history is checked: statecore, N rows all ``delivered``, each with exactly
one ``record``, ``attempt`` and ``deliver`` audit entry; procrastinate, N jobs all
``succeeded``; pgqueuer, the queue empty and N distinct jobs logged ``successful`` once.  A
count that does not match stops the run (it would not be the same work).

Target: statecore >= 1.5x the better peer, in each shape (median of the rounds' own ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psycopg

from bench_postgres import (
    ThrowawayPostgres,
    _admin,
    _checkpoint,
    _create_database,
    _procrastinate_install,
)

HERE = Path(__file__).resolve().parent
WORKER = HERE / "fleet_worker.py"
GATEWAYS = 8
BATCHED_CONCURRENCY = 16
EACH_ENQUEUERS = 8
POLL_S = 0.01
TARGET = 1.5
CONTENDERS = ("statecore", "procrastinate", "pgqueuer")
RESULTS: list[tuple[str, float, bool]] = []


# -- children -----------------------------------------------------------------------------------


class Child:
    """One child process of ``fleet_worker.py`` with its pipes; killed and reaped by
    :meth:`stop` whatever happened."""

    def __init__(self, url: str, spec: dict[str, Any]) -> None:
        env = {**os.environ, "STATECORE_BENCH_PG_URL": url, "PYTHONPATH": str(HERE)}
        self.spec = spec
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, cwd=HERE.parent, text=True,
        )  # fmt: skip

    def wait_ready(self, deadline: float) -> None:
        """Block until the child printed ``ready`` (bounded by ``deadline``, monotonic)."""
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), True)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec['role']} exited early:\n{self._stderr()}")
            line = _readline(self.proc, deadline)
            if line is not None and line.strip() == "ready":
                return
        raise RuntimeError(f"{self.spec['role']} not ready in time")

    def go(self) -> None:
        assert self.proc.stdin is not None
        with suppress(BrokenPipeError):
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()

    def result(self, timeout: float) -> dict[str, Any]:
        """The child's JSON result line (it exits after it)."""
        out, err = self.proc.communicate(timeout=timeout)
        if self.proc.returncode != 0:
            raise RuntimeError(f"{self.spec['role']} failed ({self.proc.returncode}):\n{err}")
        return dict(json.loads(out.strip().splitlines()[-1]))

    def stop(self) -> None:
        """SIGTERM (a peer's worker stops its own way), then SIGKILL after 10 s; reaped."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with suppress(OSError):
                    pipe.close()

    def _stderr(self) -> str:
        assert self.proc.stderr is not None
        with suppress(OSError, ValueError):
            return self.proc.stderr.read()[-3000:]
        return ""


def _readline(proc: subprocess.Popen[str], deadline: float) -> str | None:
    """One line of ``proc``'s stdout, or None if none came before ``deadline``."""
    import selectors  # noqa: PLC0415

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
            return None
    return proc.stdout.readline()


@contextmanager
def _children(url: str, specs: list[dict[str, Any]]) -> Iterator[list[Child]]:
    children: list[Child] = []
    try:
        for spec in specs:
            children.append(Child(url, spec))
        deadline = time.monotonic() + 60
        for child in children:
            child.wait_ready(deadline)
        yield children
    finally:
        for child in children:
            child.stop()


# -- counting what is settled -------------------------------------------------------------------

_SETTLED = {
    "statecore": "SELECT count(*) FROM fleet.delivery_obligations WHERE state = 'delivered'",
    "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
    "pgqueuer": "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'",
}


def _wait_settled(url: str, contender: str, n: int, start: float, timeout: float) -> float:
    """Seconds from ``start`` (perf_counter) to the poll that counted ``n`` settled items."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        while True:
            row = conn.execute(_SETTLED[contender]).fetchone()
            now = time.perf_counter()
            if row is not None and int(row[0]) >= n:
                return now - start
            if now - start > timeout:
                raise RuntimeError(f"{contender}: {row} of {n} settled after {timeout:.0f} s")
            time.sleep(POLL_S)


def _check_history(url: str, contender: str, n: int) -> None:
    """Every item done exactly once, by the contender's own record of it (raises if not)."""
    checks: dict[str, list[tuple[str, int]]] = {
        "statecore": [
            ("SELECT count(*) FROM fleet.delivery_obligations", n),
            ("SELECT count(*) FROM fleet.delivery_obligations WHERE state = 'delivered'", n),
            *(
                (
                    "SELECT count(*) FROM (SELECT entity_id FROM fleet.statecore_audit "
                    f"WHERE kind = 'obligation' AND event = '{event}' GROUP BY entity_id "
                    "HAVING count(*) = 1) AS once",
                    n,
                )
                for event in ("record", "attempt", "deliver")
            ),
            ("SELECT count(*) FROM fleet.statecore_audit WHERE kind = 'obligation'", 3 * n),
        ],
        "procrastinate": [
            ("SELECT count(*) FROM procrastinate_jobs", n),
            ("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'", n),
        ],
        "pgqueuer": [
            ("SELECT count(*) FROM pgqueuer", 0),
            ("SELECT count(DISTINCT job_id) FROM pgqueuer_log WHERE status = 'successful'", n),
            ("SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'", n),
        ],
    }
    with _admin(url) as conn:
        for sql, want in checks[contender]:
            row = conn.execute(sql).fetchone()
            got = None if row is None else int(row[0])
            if got != want:
                raise RuntimeError(f"{contender}: {sql!r} gave {got}, expected {want}")


# -- one run of one contender -------------------------------------------------------------------


def _shares(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if k < n % parts else 0) for k in range(parts)]


def _specs(contender: str, shape: str, n: int, profile: str | None) -> list[dict[str, Any]]:
    conc = BATCHED_CONCURRENCY if shape == "batched" else 1
    if contender == "statecore":
        return [
            {"role": "statecore", "shape": shape, "index": k, "share": share,
             "concurrency": conc, "profile": profile if k == 0 else None}
            for k, share in enumerate(_shares(n, GATEWAYS))
        ]  # fmt: skip
    workers = [
        {"role": f"{contender}-worker", "shape": shape, "concurrency": conc}
        for _ in range(GATEWAYS)
    ]
    producer = {
        "role": f"{contender}-producer", "shape": shape, "index": 0, "share": n,
        "concurrency": EACH_ENQUEUERS if shape == "each" else 1,
    }  # fmt: skip
    return [*workers, producer]


def _reset(url: str, contender: str) -> None:
    with _admin(url) as conn:
        if contender == "statecore":
            for table in ("delivery_obligations", "statecore_audit", "statecore_owners"):
                with suppress(psycopg.errors.UndefinedTable):
                    conn.execute(f"TRUNCATE fleet.{table}")
        elif contender == "procrastinate":
            conn.execute("TRUNCATE procrastinate_jobs CASCADE")
            conn.execute("TRUNCATE procrastinate_workers CASCADE")
        else:
            conn.execute("TRUNCATE pgqueuer, pgqueuer_log")


def run_once(
    url: str, contender: str, shape: str, n: int, profile: str | None = None
) -> dict[str, Any]:
    """One timed run: N items through ``contender`` in ``shape``; its rate and children's
    reports.  Raises ``RuntimeError`` if a child fails or the history does not add up."""
    _reset(url, contender)
    _checkpoint(url)
    specs = _specs(contender, shape, n, profile)
    with _children(url, specs) as children:
        start = time.perf_counter()
        for child in children:
            child.go()
        elapsed = _wait_settled(url, contender, n, start, timeout=240)
        reports = [c.result(timeout=60) for c in children if "worker" not in c.spec["role"]]
    _check_history(url, contender, n)
    return {"rate": n / elapsed, "elapsed_s": elapsed, "reports": reports}


# -- setup --------------------------------------------------------------------------------------


def _install(server: ThrowawayPostgres) -> dict[str, str]:
    urls = {c: _create_database(server, f"fleet_{c}") for c in CONTENDERS}
    with _admin(urls["statecore"]) as conn:
        conn.execute("CREATE SCHEMA fleet")
    _procrastinate_install(urls["procrastinate"])
    subprocess.run(
        [sys.executable, "-c",
         "import asyncio, psycopg, sys\n"
         "from pgqueuer import PsycopgDriver, Queries\n"
         "async def main():\n"
         "    async with await psycopg.AsyncConnection.connect(sys.argv[1], autocommit=True) as c:\n"
         "        await Queries(PsycopgDriver(c)).install()\n"
         "asyncio.run(main())\n",
         urls["pgqueuer"]],
        check=True, timeout=60, capture_output=True,
    )  # fmt: skip
    return urls


def _shape_rounds(urls: dict[str, str], shape: str, n: int, rounds: int) -> None:
    """``rounds`` rounds of every contender (order rotating), then medians and paired ratios."""
    rates: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    extra: list[dict[str, Any]] = []
    for r in range(rounds):
        order = CONTENDERS[r % 3 :] + CONTENDERS[: r % 3]
        for contender in order:
            got = run_once(urls[contender], contender, shape, n)
            rates[contender].append(got["rate"])
            if contender == "statecore":
                extra.extend(got["reports"])
        line = ", ".join(f"{c} {rates[c][-1]:,.0f}/s" for c in CONTENDERS)
        print(f"  round {r + 1}: {line}", flush=True)
    med = {c: statistics.median(v) for c, v in rates.items()}
    for c in CONTENDERS:
        print(f"  {c:<14} {med[c]:10,.0f} items/s (median of {rounds})")
    if shape == "batched":
        batches = sum(x.get("batches", 0) for x in extra)
        ops = sum(x.get("operations", 0) for x in extra)
        print(f"  statecore group commit: {ops / max(1, batches):.1f} operations per transaction")
    better = max(("procrastinate", "pgqueuer"), key=lambda c: med[c])
    for peer in ("procrastinate", "pgqueuer"):
        ratio = statistics.median(
            s / p for s, p in zip(rates["statecore"], rates[peer], strict=True)
        )
        judged = peer == better
        ok = ratio >= TARGET
        mark = ("ok" if ok else "MISSED") if judged else "(not the better peer)"
        print(f"  statecore / {peer:<14} {ratio:5.2f}x   target >= {TARGET} vs the better: {mark}")
        if judged:
            RESULTS.append((f"{shape}: statecore / {peer}", ratio, ok))


def _profile(urls: dict[str, str], n: int, top: int = 25) -> None:
    """One ``each`` run of statecore with gateway 0 under cProfile; its top functions."""
    with tempfile.TemporaryDirectory(prefix="statecore-fleet-prof-") as tmp:
        path = str(Path(tmp) / "gateway0.prof")
        got = run_once(urls["statecore"], "statecore", "each", n, profile=path)
        print(f"  profiled run: {got['rate']:,.0f} obligations/s (gateway 0 under cProfile)")
        stats = pstats.Stats(path)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    """Run the shapes; with ``--check`` return 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("each", "batched"))
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--profile", action="store_true", help="profile one gateway, no rounds")
    parser.add_argument("-n", type=int, default=None, help="items per run")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    n = args.n or (800 if args.quick else 6000)
    rounds = args.rounds or (1 if args.quick else 3)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    server = ThrowawayPostgres()
    wall = time.perf_counter()
    try:
        server.start()
        with _admin(server.url()) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            durable = conn.execute(
                "SELECT current_setting('fsync'), current_setting('synchronous_commit')"
            ).fetchone()
        print(
            f"PostgreSQL {version[0] if version else '?'} (throwaway), fsync={durable and durable[0]}"
            f", synchronous_commit={durable and durable[1]}; {GATEWAYS} processes per contender, "
            f"n={n}, {rounds} round(s)"
        )
        urls = _install(server)
        if args.profile:
            _profile(urls, n)
            return 0
        shapes: dict[str, Callable[[], None]] = {
            "each": lambda: _shape_rounds(urls, "each", n, rounds),
            "batched": lambda: _shape_rounds(urls, "batched", n, rounds),
        }
        for name, run in shapes.items():
            if args.only in (None, name):
                print(f"\nshape {name}", flush=True)
                run()
    finally:
        server.stop()
    missed = [r for r in RESULTS if not r[2]]
    for name, value, ok in RESULTS:
        print(f"  {name:<40} {value:6.2f}x   target >= {TARGET}   {'ok' if ok else 'MISSED'}")
    print(
        f"{len(RESULTS) - len(missed)} of {len(RESULTS)} targets met "
        f"({time.perf_counter() - wall:.0f} s)"
    )
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())

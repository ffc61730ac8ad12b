"""A fleet of 8 gateway processes on one PostgreSQL ledger against procrastinate and pgqueuer,
each with 8 worker processes, on the same server in the same run.

Run: ``.venv/bin/python benchmarks/bench_fleet.py`` (``--check`` exits 1 if a target is missed;
``--quick`` runs small sizes as a smoke run; ``--only each|batched`` runs one shape; ``-n`` and
``--rounds`` change the sizes; ``--processes K`` changes the 8, ``--in-flight K`` the 16 of the
batched shape; ``--profile each|batched`` samples one gateway process of that shape with py-spy
and prints where its time goes).

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
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any, ClassVar

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
# Items in flight per worker or gateway in the batched shape (``--in-flight`` changes it).
IN_FLIGHT = {"batched": 16}
EACH_ENQUEUERS = 8
POLL_S = 0.01
# Items per round for each shape: a full run takes about 2.5 minutes on an idle 2-core machine.
SIZES = {"each": 1200, "batched": 3000}
QUICK_SIZES = {"each": 60, "batched": 120}
# A smoke run checks the machinery with 1 gateway / worker per contender: starting 26
# interpreters per shape is most of a full run's setup time on 2 cores.
QUICK_PROCESSES = 1
TARGET = 1.5
CONTENDERS = ("statecore", "procrastinate", "pgqueuer")
RESULTS: list[tuple[str, float, bool]] = []


# -- children -----------------------------------------------------------------------------------


class Child:
    """One child process of ``fleet_worker.py``: its stdin and stdout are pipes, its stderr a
    temporary file (a pipe nobody reads could fill and stop the child); stopped by
    :meth:`terminate` and :meth:`reap`, whatever happened."""

    def __init__(self, url: str, spec: dict[str, Any]) -> None:
        path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "STATECORE_BENCH_PG_URL": url, "PYTHONPATH": path}
        self.spec = spec
        self.errors = tempfile.TemporaryFile("w+")  # noqa: SIM115 -- closed in reap()
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
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

    @property
    def driven(self) -> bool:
        """A gateway or a producer: it works a round when told ``go`` (a worker waits for jobs)."""
        return "worker" not in self.spec["role"]

    def go(self, round_no: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"go {round_no}\n")
        self.proc.stdin.flush()

    def result(self, deadline: float) -> dict[str, Any]:
        """The JSON line the child prints when its round's share is done."""
        line = _readline(self.proc, deadline)
        if not line:
            raise RuntimeError(f"{self.spec['role']} gave no result:\n{self._stderr()}")
        return dict(json.loads(line))

    def terminate(self) -> None:
        """``stop`` (a gateway or producer ends) and SIGTERM (a peer's worker stops its own
        way), if still running."""
        if self.proc.poll() is None:
            with suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
            self.proc.send_signal(signal.SIGTERM)

    def reap(self, deadline: float) -> None:
        """Wait for the exit until ``deadline`` (monotonic), then SIGKILL; reaped either way."""
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout, self.errors):
            if pipe is not None:
                with suppress(OSError):
                    pipe.close()

    def _stderr(self) -> str:
        with suppress(OSError, ValueError):
            self.errors.seek(0)
            return self.errors.read()[-3000:]
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
        deadline = time.monotonic() + 120
        for child in children:
            child.wait_ready(deadline)
        yield children
    finally:
        # Every item is settled (or the run failed): the workers get 5 s together, then SIGKILL.
        for child in children:
            child.terminate()
        deadline = time.monotonic() + 5
        for child in children:
            child.reap(deadline)


# -- counting what is settled -------------------------------------------------------------------

_SETTLED = {
    "statecore": "SELECT count(*) FROM fleet.delivery_obligations WHERE state = 'delivered'",
    "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
    "pgqueuer": "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'",
}


def _wait_settled(
    url: str, contender: str, n: int, start: float, timeout: float
) -> tuple[float, int]:
    """Seconds from ``start`` (perf_counter) to the poll that counted ``n`` settled items, and
    the number of polls."""
    polls = 0
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        while True:
            row = conn.execute(_SETTLED[contender]).fetchone()
            polls += 1
            now = time.perf_counter()
            if row is not None and int(row[0]) >= n:
                return now - start, polls
            if now - start > timeout:
                raise RuntimeError(f"{contender}: {row} of {n} settled after {timeout:.0f} s")
            time.sleep(POLL_S)


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (a process gone is counted as 0)."""
    total = 0
    for pid in pids:
        with suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICK


def _server_pids(postmaster: int) -> list[int]:
    """The postmaster and its children (backends, WAL writer, checkpointer...)."""
    pids = [postmaster]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                pids.append(int(stat.parent.name))
    return pids


def _server_counters(url: str) -> tuple[int, int]:
    """(transactions committed in the database, WAL fsyncs on the server) so far."""
    with _admin(url) as conn:
        commits = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        fsyncs = conn.execute(
            "SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal'"
        ).fetchone()
    return int(commits[0]) if commits else 0, int(fsyncs[0]) if fsyncs else 0


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


def _specs(contender: str, shape: str, n: int, processes: int = GATEWAYS) -> list[dict[str, Any]]:
    conc = IN_FLIGHT["batched"] if shape == "batched" else 1
    if contender == "statecore":
        return [
            {"role": "statecore", "shape": shape, "index": k, "share": share,
             "concurrency": conc}
            for k, share in enumerate(_shares(n, processes))
        ]  # fmt: skip
    workers = [
        {"role": f"{contender}-worker", "shape": shape, "concurrency": conc}
        for _ in range(processes)
    ]
    producer = {
        "role": f"{contender}-producer", "shape": shape, "index": 0, "share": n,
        "concurrency": EACH_ENQUEUERS if shape == "each" else 1,
    }  # fmt: skip
    return [*workers, producer]


def _reset(url: str, contender: str) -> None:
    with _admin(url) as conn:
        if contender == "statecore":
            for table in ("delivery_obligations", "statecore_audit"):  # owners: the live ones
                with suppress(psycopg.errors.UndefinedTable):
                    conn.execute(f"TRUNCATE fleet.{table}")
        elif contender == "procrastinate":
            conn.execute("TRUNCATE procrastinate_jobs CASCADE")
        else:
            conn.execute("TRUNCATE pgqueuer, pgqueuer_log")


def run_once(
    url: str, contender: str, children: list[Child], n: int, *, round_no: int, postmaster: int
) -> dict[str, Any]:
    """One timed round: N items through ``contender``'s ready ``children``; its rate and the
    gateways' or producer's reports.  Raises ``RuntimeError`` if a child fails or the history
    does not add up."""
    _reset(url, contender)
    _checkpoint(url)
    driven = [c for c in children if c.driven]
    clients = [c.proc.pid for c in children]
    server = _server_pids(postmaster)
    commits, fsyncs = _server_counters(url)
    cpu_clients, cpu_server = _cpu_s(clients), _cpu_s(server)
    start = time.perf_counter()
    for child in driven:
        child.go(round_no)
    elapsed, polls = _wait_settled(url, contender, n, start, timeout=240)
    deadline = time.monotonic() + 60
    reports = [c.result(deadline) for c in driven]
    cpu_clients, cpu_server = _cpu_s(clients) - cpu_clients, _cpu_s(server) - cpu_server
    commits_after, fsyncs_after = _server_counters(url)
    _check_history(url, contender, n)
    return {
        "rate": n / elapsed,
        "elapsed_s": elapsed,
        "reports": reports,
        # Per item: the contender's processes' CPU, the server's, commits (less the polls' own
        # and the counter read's) and WAL fsyncs.
        "client_ms": 1000 * cpu_clients / n,
        "server_ms": 1000 * cpu_server / n,
        "commits": (commits_after - commits - polls - 1) / n,
        "fsyncs": (fsyncs_after - fsyncs) / n,
    }


class FleetPostgres(ThrowawayPostgres):
    """The benchmark's server with room for every contender's connections at once (about
    100 while a shape's three fleets are up); durability as shipped, as in ``bench_postgres``."""

    SETTINGS: ClassVar[dict[str, str]] = {**ThrowawayPostgres.SETTINGS, "max_connections": "300"}


# -- setup --------------------------------------------------------------------------------------


async def _pgqueuer_install(url: str) -> None:
    from pgqueuer import PsycopgDriver, Queries  # noqa: PLC0415 -- a heavy import, used once

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await Queries(PsycopgDriver(conn)).install()


def _install(server: ThrowawayPostgres) -> dict[str, str]:
    urls = {c: _create_database(server, f"fleet_{c}") for c in CONTENDERS}
    with _admin(urls["statecore"]) as conn:
        conn.execute("CREATE SCHEMA fleet")
    _procrastinate_install(urls["procrastinate"])
    asyncio.run(_pgqueuer_install(urls["pgqueuer"]))
    return urls


_COSTS = ("client_ms", "server_ms", "commits", "fsyncs")


def _shape_rounds(
    urls: dict[str, str], shape: str, n: int, *, rounds: int, postmaster: int, processes: int
) -> None:
    """``rounds`` rounds of every contender (order rotating), each contender's processes
    started once for the shape; then medians and paired ratios."""
    rates: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    costs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
    extra: list[dict[str, Any]] = []
    with ExitStack() as stack:
        started = time.perf_counter()
        fleets = {
            c: stack.enter_context(_children(urls[c], _specs(c, shape, n, processes)))
            for c in CONTENDERS
        }
        print(f"  {sum(map(len, fleets.values()))} processes ready in "
              f"{time.perf_counter() - started:.1f} s", flush=True)  # fmt: skip
        for r in range(rounds):
            order = CONTENDERS[r % 3 :] + CONTENDERS[: r % 3]
            for contender in order:
                got = run_once(
                    urls[contender],
                    contender,
                    fleets[contender],
                    n,
                    round_no=r,
                    postmaster=postmaster,
                )
                rates[contender].append(got["rate"])
                costs[contender].append(got)
                if contender == "statecore":
                    extra.extend(got["reports"])
            line = ", ".join(f"{c} {rates[c][-1]:,.0f}/s" for c in CONTENDERS)
            print(f"  round {r + 1}: {line}; history: {n} of {n} settled once each", flush=True)
    med = {c: statistics.median(v) for c, v in rates.items()}
    print("  contender        items/s   per item: client CPU  server CPU  commits  WAL fsyncs")
    for c in CONTENDERS:
        cost = {k: statistics.median(x[k] for x in costs[c]) for k in _COSTS}
        print(
            f"  {c:<14} {med[c]:9,.0f}   {cost['client_ms']:15.2f} ms {cost['server_ms']:8.2f} ms"
            f" {cost['commits']:8.2f} {cost['fsyncs']:10.2f}"
        )
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


def _profile(urls: dict[str, str], shape: str, n: int, postmaster: int, top: int = 40) -> None:
    """One round of statecore's fleet in ``shape`` with gateway 0 sampled by py-spy (every
    thread, idle time left out): the functions its CPU time was spent in, by own time and by
    time inclusive of callees.  py-spy: ``.venv/bin/pip install py-spy``."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        print("  py-spy is not installed: .venv/bin/pip install py-spy")
        return
    with tempfile.TemporaryDirectory(prefix="statecore-fleet-prof-") as tmp:
        out = Path(tmp) / "gateway0.txt"
        with _children(urls["statecore"], _specs("statecore", shape, n)) as fleet:
            sampler = subprocess.Popen(
                [spy, "record", "--format", "raw", "--rate", "250", "--output", str(out),
                 "--pid", str(fleet[0].proc.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            try:
                time.sleep(1.0)  # py-spy attaches
                got = run_once(
                    urls["statecore"], "statecore", fleet, n, round_no=0, postmaster=postmaster
                )
            finally:
                sampler.send_signal(signal.SIGINT)  # py-spy writes its samples and exits
                try:
                    sampler.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    sampler.kill()
                    sampler.wait(timeout=10)
        print(f"  profiled round: {got['rate']:,.0f} obligations/s ({shape})")
        _print_samples(out, top)


def _print_samples(path: Path, top: int) -> None:
    """py-spy's raw samples (``frame;frame;... count``, innermost last) as two tables."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines() if path.exists() else []:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f.split(" (", 1)[0] + " " + _where(f) for f in stack.split(";")[1:]]
        if not frames:
            continue
        total += int(count)
        own[frames[-1]] = own.get(frames[-1], 0) + int(count)
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + int(count)
    if not total:
        print("  no samples")
        return
    for title, table in (("own time", own), ("inclusive time", inclusive)):
        print(f"  gateway 0, {title} ({total} samples while not idle):")
        for frame, hits in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            print(f"    {100 * hits / total:5.1f}%  {frame}")


def _where(frame: str) -> str:
    """``(file.py)`` of a py-spy frame ``func (path/file.py:line)``."""
    inside = frame.rpartition("(")[2].rstrip(")")
    return "(" + Path(inside.rsplit(":", 1)[0]).name + ")"


def main(argv: list[str] | None = None) -> int:
    """Run the shapes; with ``--check`` return 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("each", "batched"))
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--check", action="store_true")
    parser.add_argument(
        "--profile", choices=("each", "batched"), help="sample one gateway with py-spy, no rounds"
    )
    parser.add_argument("-n", type=int, default=None, help="items per run")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--processes", type=int, default=None, help="gateways / workers each")
    parser.add_argument("--in-flight", type=int, default=None, help="batched: per process")
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    if args.in_flight:
        IN_FLIGHT["batched"] = args.in_flight
    rounds = args.rounds or (1 if args.quick else 3)
    processes = args.processes or (QUICK_PROCESSES if args.quick else GATEWAYS)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    server = FleetPostgres()
    wall = time.perf_counter()
    try:
        server.start()
        with _admin(server.url()) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            durable = conn.execute(
                "SELECT current_setting('fsync'), current_setting('synchronous_commit')"
            ).fetchone()
        print(
            f"PostgreSQL {version[0] if version else '?'} (throwaway), "
            f"fsync={durable and durable[0]}, synchronous_commit={durable and durable[1]}; "
            f"{processes} gateways / workers per contender, {rounds} round(s)"
        )
        urls = _install(server)
        assert server.proc is not None
        postmaster = server.proc.pid
        if args.profile:
            _profile(urls, args.profile, args.n or sizes[args.profile], postmaster)
            return 0
        for shape, size in sizes.items():
            if args.only in (None, shape):
                print(f"\nshape {shape}: n={args.n or size} per round", flush=True)
                _shape_rounds(
                    urls, shape, args.n or size, rounds=rounds, postmaster=postmaster,
                    processes=processes,
                )  # fmt: skip
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

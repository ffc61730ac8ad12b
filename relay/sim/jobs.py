"""A campaign's seeds in worker processes: ``python -m relay.sim --jobs N``.

Every seed decides its whole world, and replays exactly in any process
(:mod:`relay.sim.real` seeds the process's entropy per world), so a seed's outcome does not
depend on which worker ran it, nor on the seeds that worker ran before: :func:`outcomes`
yields the same outcomes, in seed order, for any number of workers.

The workers are started with the ``forkserver`` context where the platform has it (else
``spawn``): never ``fork``, which would copy the parent's threads and locks.  The parent hands
each idle worker the next seed over a pipe and keeps at most one seed per worker in flight.  A
worker that dies mid-seed (a crash of the interpreter, a signal) costs that seed alone: it is
reported as a failing outcome naming the exit code, a new worker takes the worker's place, and
the campaign goes on.  However the campaign ends -- finished, an exception, Ctrl-C -- every
worker is ended and reaped before :func:`outcomes` returns.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
from collections.abc import Callable, Generator
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from relay.sim.invariants import Verdict
from relay.sim.real import run_real_seed
from relay.sim.run import Outcome, run_seed, store_kind

__all__ = ["Runner", "jobs_wanted", "outcomes", "run_one"]

Runner = Callable[[int, bool], Outcome]
"""What a worker runs for one seed: ``runner(seed, real)`` (a module-level function, so that
a worker process can import it)."""

_END_S = 5.0
"""How long a worker asked to stop may take before it is killed."""


def run_one(seed: int, real: bool) -> Outcome:
    """Run ``seed`` as a campaign does (no trace; the real runtime when ``real``).  A run that
    raises becomes a failing outcome saying what it raised, so that the campaign reports the
    seed and goes on.  Raises nothing but ``BaseException`` s (Ctrl-C)."""
    try:
        return (run_real_seed if real else run_seed)(seed)
    except Exception as exc:  # a bug in the world or the runtime: that seed's failure
        return failed(seed, f"the run raised {exc!r}")


def failed(seed: int, violation: str) -> Outcome:
    """A failing outcome of ``seed`` that ran no world to its end (``violation`` says why)."""
    return Outcome(seed, store_kind(seed), (), Verdict([violation]), (), 0, 0.0)


def jobs_wanted(jobs: int) -> int:
    """The number of workers ``--jobs`` asks for: ``jobs``, or one per core for 0.  Raises
    ``ValueError`` for a negative number."""
    if jobs < 0:
        raise ValueError(f"--jobs must be 0 (one per core) or more, not {jobs}")
    return jobs or os.cpu_count() or 1


def _context() -> BaseContext:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # The server imports the worlds once; every worker forks from it with them loaded (a
    # no-op once the server runs).
    context.set_forkserver_preload(["relay.sim.jobs"])
    return context


def _serve(conn: Connection, real: bool, runner: Runner) -> None:
    """A worker: run each seed the parent sends, send back its outcome; None ends it."""
    # Ctrl-C reaches the whole process group: the parent decides, and ends the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The ledger logs each abandonment at WARNING: expected under faults, counted instead.
    logging.getLogger("statecore").setLevel(logging.ERROR)
    while True:
        try:
            seed = conn.recv()
        except EOFError:  # the parent is gone: nobody wants the rest
            return
        if seed is None:
            return
        conn.send(runner(seed, real))


class _Worker:
    """One worker process, its end of the pipe, and the seed it is running (None: idle)."""

    def __init__(self, context: BaseContext, real: bool, runner: Runner) -> None:
        ours, theirs = context.Pipe()
        self.conn: Connection = ours
        self.process: BaseProcess = context.Process(  # type: ignore[attr-defined]
            target=_serve, args=(theirs, real, runner), daemon=True
        )
        self.process.start()
        theirs.close()
        self.seed: int | None = None

    def give(self, seed: int) -> None:
        self.seed = seed
        self.conn.send(seed)

    def end(self) -> None:
        """Ask the worker to stop, kill it if it does not within :data:`_END_S`; reap it."""
        with contextlib.suppress(OSError):  # it is gone already
            self.conn.send(None)
        self.process.join(_END_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(_END_S)
        self.conn.close()


def outcomes(
    first: int, seeds: int, *, real: bool, jobs: int, runner: Runner = run_one
) -> Generator[Outcome, None, None]:
    """The outcome of each seed ``first`` .. ``first + seeds - 1``, in seed order, run in
    ``jobs`` worker processes (1: in this process, one after the other).  Close the iterator
    (or exhaust it) to end the workers; they are ended on any exception too.  Raises
    ``ValueError`` for ``jobs`` or ``seeds`` below 1."""
    if jobs < 1 or seeds < 1:
        raise ValueError(f"jobs and seeds must be at least 1, not {jobs} and {seeds}")
    if jobs == 1:
        for seed in range(first, first + seeds):
            yield runner(seed, real)
        return
    context = _context()
    todo = iter(range(first, first + seeds))
    done: dict[int, Outcome] = {}
    workers: list[_Worker] = []
    try:
        workers = [_Worker(context, real, runner) for _ in range(min(jobs, seeds))]
        for worker in workers:
            worker.give(next(todo))
        following = first
        while following < first + seeds:
            while following in done:  # yield every outcome whose predecessors are out
                yield done.pop(following)
                following += 1
            if following == first + seeds:
                break
            busy: dict[Any, _Worker] = {w.conn: w for w in workers if w.seed is not None}
            busy.update({w.process.sentinel: w for w in workers if w.seed is not None})
            for ready in wait(list(busy)):
                worker = busy[ready]
                if worker.seed is None:  # both its pipe and its sentinel were ready
                    continue
                seed = worker.seed
                try:
                    done[seed] = worker.conn.recv()
                except (EOFError, OSError):
                    worker.process.join(_END_S)
                    code = worker.process.exitcode
                    done[seed] = failed(seed, f"its worker process died (exit code {code})")
                    worker.end()
                    # The dead worker is marked idle before it is replaced: its pipe and its
                    # sentinel may both be in this ``ready`` list, and the second must be
                    # skipped, not read from a closed pipe.
                    worker.seed = None
                    workers[workers.index(worker)] = worker = _Worker(context, real, runner)
                worker.seed = None
                upcoming = next(todo, None)
                if upcoming is not None:
                    worker.give(upcoming)
    finally:
        for worker in workers:
            worker.end()

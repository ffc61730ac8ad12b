"""``python -m relay.sim``: run seeded worlds and report (``make sim SEEDS=10000``).

Without ``--real`` the worlds run the models of the gateway and connector around the real
ledger and buffer (:mod:`relay.sim.run`); with ``--real`` they run the real runtime --
``Connector``, ``Gateway``, the relay transport and ``websockets`` -- on the deterministic
loop (:mod:`relay.sim.real`; ``make sim-real SEEDS=1000``).

``--seeds N`` runs seeds ``--first`` .. ``--first + N - 1`` with a progress bar and ends with a
summary table: runs, faults injected by kind, invariant checks made, violations.  A failing
seed prints its fault schedule and its violations, the summary lists every failing seed for a
rerun, and the command exits 1.  ``--jobs N`` runs the seeds in N worker processes (0: one per
core; :mod:`relay.sim.jobs`): the same outcomes, output and exit status as one process, in
less time.  ``--seed S --trace`` runs one seed and prints every step.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import sys
import time
from collections.abc import Callable

from relay.sim.faults import KINDS, REAL_KINDS
from relay.sim.jobs import jobs_wanted, outcomes
from relay.sim.real import run_real_seed
from relay.sim.run import Outcome, run_seed, shrink


def report_failure(outcome: Outcome, *, real: bool = False) -> str:
    """What a failing run prints: its seed, store, fault schedule and violations."""
    lines = [f"seed {outcome.seed} FAILED ({outcome.store} stores); fault schedule:"]
    lines += [f"  {fault}" for fault in outcome.faults] or ["  (none)"]
    lines += [f"  violation: {v}" for v in outcome.verdict.violations]
    flag = " --real" if real else ""
    lines.append(f"replay it: python -m relay.sim{flag} --seed {outcome.seed} --trace")
    return "\n".join(lines)


def _runner(real: bool) -> Callable[..., Outcome]:
    return run_real_seed if real else run_seed


def one_seed(seed: int, *, trace: bool, shrinking: bool, real: bool = False) -> int:
    """Run one seed (printing its trace when asked, its shrunk schedule when it fails and
    ``shrinking``); 0 when it held."""
    outcome = _runner(real)(seed, trace=trace)
    if trace:
        print("\n".join(outcome.trace))
    print(report_failure(outcome, real=real) if not outcome.ok else f"seed {seed}: ok")
    if shrinking and not outcome.ok:
        print("a shorter schedule that still fails:")
        print("\n".join(f"  {fault}" for fault in shrink(seed, _runner(real))))
    return 0 if outcome.ok else 1


def campaign(first: int, seeds: int, *, real: bool = False, jobs: int = 1) -> int:
    """Run ``seeds`` seeds from ``first`` (in ``jobs`` worker processes) with a progress bar
    and the summary table; 0 when every run held every invariant."""
    faults: collections.Counter[str] = collections.Counter()
    stores: collections.Counter[str] = collections.Counter()
    totals: collections.Counter[str] = collections.Counter()
    failed: list[Outcome] = []
    began = time.monotonic()
    tty = sys.stdout.isatty()
    with contextlib.closing(outcomes(first, seeds, real=real, jobs=jobs)) as runs:
        for n, outcome in enumerate(runs, 1):
            _count(outcome, faults, stores, totals)
            if not outcome.ok:
                failed.append(outcome)
                print(("\n" if tty else "") + report_failure(outcome, real=real), flush=True)
            if tty or n % max(1, seeds // 20) == 0 or n == seeds:
                bar = "#" * (30 * n // seeds) + "." * (30 - 30 * n // seeds)
                line = f"[{bar}] {n}/{seeds} seeds, {len(failed)} failed"
                print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
    took = time.monotonic() - began
    print("\n" if tty else "", end="")
    print(
        f"\n{seeds} runs (seeds {first}..{first + seeds - 1}) in {took:.1f} s "
        f"({seeds / max(took, 1e-9):.2f} seeds/s); "
        f"stores: {dict(sorted(stores.items()))}; {totals['steps']} steps"
        + (" (turns of the event loop)" if real else "")
    )
    print(f"\n  {'fault injected':<22}{'count':>8}")
    for kind in REAL_KINDS if real else KINDS:
        print(f"  {kind:<22}{faults[kind]:>8}")
    print(f"  {'(all)':<22}{sum(faults.values()):>8}")
    print(f"\n  invariant checks made   {totals['checks']:>10}")
    print(
        f"  replies users saw       {totals['replies']:>10}  "
        f"({totals['labelled']} labelled as possible repeats)"
    )
    print(f"  replies abandoned       {totals['abandoned']:>10}  (each with its reason)")
    print(f"  runs with a violation   {len(failed):>10}")
    for outcome in failed[:10]:
        print(f"  seed {outcome.seed}: {outcome.verdict.violations[0]}")
    if failed:
        flag = " --real" if real else ""
        print(f"\nfailing seeds (rerun one: python -m relay.sim{flag} --seed N --trace):")
        print("  " + " ".join(str(o.seed) for o in failed))
    return 1 if failed else 0


def _count(
    outcome: Outcome,
    faults: collections.Counter[str],
    stores: collections.Counter[str],
    totals: collections.Counter[str],
) -> None:
    """Add one run to the campaign's tallies."""
    faults.update(f.kind for f in outcome.faults)
    stores[outcome.store] += 1
    verdict = outcome.verdict
    totals.update(
        checks=verdict.checks,
        replies=verdict.replies,
        labelled=verdict.labelled,
        abandoned=verdict.abandoned,
        steps=outcome.steps,
    )


def main(argv: list[str] | None = None) -> int:
    """Run one seed or a campaign (see the module docs)."""
    parser = argparse.ArgumentParser(
        prog="python -m relay.sim", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--seeds", type=int, default=300, help="how many seeds to run")
    parser.add_argument("--first", type=int, default=1, help="the first seed")
    parser.add_argument("--seed", type=int, help="run this one seed only")
    parser.add_argument("--trace", action="store_true", help="print every step (one seed)")
    parser.add_argument(
        "--shrink", action="store_true", help="reduce a failing seed's fault schedule (one seed)"
    )
    parser.add_argument(
        "--real", action="store_true", help="run the real runtime on the deterministic loop"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="worker processes for a campaign (0: one per core)"
    )
    args = parser.parse_args(argv)
    # The ledger logs each abandonment at WARNING: expected under faults, counted instead.
    logging.getLogger("statecore").setLevel(logging.ERROR)
    if args.seed is not None:
        return one_seed(args.seed, trace=args.trace, shrinking=args.shrink, real=args.real)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    try:
        jobs = jobs_wanted(args.jobs)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        return campaign(args.first, args.seeds, real=args.real, jobs=jobs)
    except KeyboardInterrupt:  # every worker is ended and reaped by then
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

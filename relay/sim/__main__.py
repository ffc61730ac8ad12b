"""``python -m relay.sim``: run seeded worlds and report (``make sim SEEDS=10000``).

``--seeds N`` runs seeds ``--first`` .. ``--first + N - 1`` with a progress bar and ends with a
summary table: runs, faults injected by kind, invariant checks made, violations.  A failing
seed prints its fault schedule and its violations, and the command exits 1.  ``--seed S
--trace`` runs one seed and prints every step.
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
import time

from relay.sim.faults import KINDS
from relay.sim.run import Outcome, run_seed


def report_failure(outcome: Outcome) -> str:
    """What a failing run prints: its seed, store, fault schedule and violations."""
    lines = [f"seed {outcome.seed} FAILED ({outcome.store} stores); fault schedule:"]
    lines += [f"  {fault}" for fault in outcome.faults] or ["  (none)"]
    lines += [f"  violation: {v}" for v in outcome.verdict.violations]
    lines.append(f"replay it: python -m relay.sim --seed {outcome.seed} --trace")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the campaign; 0 when every run held every invariant, 1 otherwise."""
    parser = argparse.ArgumentParser(prog="python -m relay.sim", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=300, help="how many seeds to run")
    parser.add_argument("--first", type=int, default=1, help="the first seed")
    parser.add_argument("--seed", type=int, help="run this one seed only")
    parser.add_argument("--trace", action="store_true", help="print every step (one seed)")
    args = parser.parse_args(argv)
    # The ledger logs each abandonment at WARNING: expected under faults, counted below.
    logging.getLogger("statecore").setLevel(logging.ERROR)
    if args.seed is not None:
        outcome = run_seed(args.seed, trace=args.trace)
        if args.trace:
            print("\n".join(outcome.trace))
        print(report_failure(outcome) if not outcome.ok else f"seed {args.seed}: ok")
        return 0 if outcome.ok else 1
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    faults: collections.Counter[str] = collections.Counter()
    stores: collections.Counter[str] = collections.Counter()
    checks = replies = labelled = abandoned = steps = 0
    failed: list[Outcome] = []
    began = time.monotonic()
    tty = sys.stdout.isatty()
    for n, seed in enumerate(range(args.first, args.first + args.seeds), 1):
        outcome = run_seed(seed)
        faults.update(f.kind for f in outcome.faults)
        stores[outcome.store] += 1
        verdict = outcome.verdict
        checks += verdict.checks
        replies += verdict.replies
        labelled += verdict.labelled
        abandoned += verdict.abandoned
        steps += outcome.steps
        if not outcome.ok:
            failed.append(outcome)
            print(("\n" if tty else "") + report_failure(outcome), flush=True)
        if tty or n % max(1, args.seeds // 20) == 0 or n == args.seeds:
            width = 30
            done = width * n // args.seeds
            bar = "#" * done + "." * (width - done)
            line = f"[{bar}] {n}/{args.seeds} seeds, {len(failed)} failed"
            print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
    took = time.monotonic() - began
    print("\n" if tty else "", end="")
    print(
        f"\n{args.seeds} runs (seeds {args.first}..{args.first + args.seeds - 1}) in "
        f"{took:.1f} s; stores: {dict(sorted(stores.items()))}; {steps} steps"
    )
    print(f"\n  {'fault injected':<22}{'count':>8}")
    for kind in KINDS:
        print(f"  {kind:<22}{faults[kind]:>8}")
    print(f"  {'(all)':<22}{sum(faults.values()):>8}")
    print(f"\n  invariant checks made   {checks:>10}")
    print(f"  replies users saw       {replies:>10}  ({labelled} labelled as possible repeats)")
    print(f"  replies abandoned       {abandoned:>10}  (each with its reason)")
    print(f"  runs with a violation   {len(failed):>10}")
    for outcome in failed[:10]:
        print(f"  seed {outcome.seed}: {outcome.verdict.violations[0]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

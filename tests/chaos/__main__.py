"""``python -m tests.chaos [--faults N] [--seed S] [--seconds T] [--results docs/chaos.md]
[--quiet]``: one chaos run (:mod:`tests.chaos.run`); prints the summary table, writes the
results document with ``--results``; exit status 1 on any violation or harness problem."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from tests.chaos.faults import KINDS
from tests.chaos.results import render_markdown, render_summary
from tests.chaos.run import Config, run


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run, report; returns the exit status.  SIGTERM, and SIGINT
    even where a shell started the run in the background with it ignored, interrupt the run:
    every child is killed and reaped and the server stopped (:func:`tests.chaos.run.run`)."""
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, _interrupted)
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--faults", type=int, default=20, help="faults to make (default 20)")
    parser.add_argument("--seed", type=int, default=28, help="the schedule's seed (default 28)")
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="the schedule's nominal length (default: 1.4 s a fault)",
    )
    parser.add_argument("--rate", type=float, default=10.0, help="user messages per second")
    parser.add_argument("--results", type=Path, default=None, help="write the markdown here")
    parser.add_argument("--quiet", action="store_true", help="no fault log on stdout")
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help="the fault kinds to draw from (comma-separated)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs of a passed run")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.faults < 1:
        parser.error("--faults must be at least 1")
    seconds = args.seconds if args.seconds is not None else 1.4 * args.faults
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    if not kinds or set(kinds) - set(KINDS):
        parser.error(f"--kinds must name some of: {', '.join(KINDS)}")
    config = Config(
        faults=args.faults,
        seed=args.seed,
        seconds=seconds,
        rate=args.rate,
        quiet_output=args.quiet,
        kinds=kinds,
        keep=args.keep,
    )
    command = " ".join(["python -m tests.chaos", *(sys.argv[1:] if argv is None else argv)])
    outcome, workdir = run(config)
    if outcome is None:
        print(f"no outcome; logs kept in {workdir}")
        return 1
    print(render_summary(outcome))
    if args.results is not None:
        existing = args.results.read_text(encoding="utf-8") if args.results.exists() else None
        args.results.write_text(render_markdown(outcome, command, existing), encoding="utf-8")
        print(f"results written to {args.results}")
    if not outcome.ok:
        print(f"FAILED; logs, fault log and transcript kept in {workdir}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Compiled-table lookups against a plain dict and against a ``transitions`` model.

Run: ``.venv/bin/python benchmarks/bench_lifecycle.py`` (``--check`` exits 1 if a target is
missed).  Every figure is measured in this run, the three measurements interleaved round by
round, and the median round is reported.

Targets: ``Lifecycle.target(state, event)`` within 2x of a plain dict lookup of the same
``(state, event)`` key, and at least 50x faster than firing the same transition through a
``transitions`` model.  The transition used is the obligation's ``claim`` from ``attempting``
(a self-loop, so every run fires the same move without resetting the model).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import timeit
from collections.abc import Callable

import transitions

from statecore import OBLIGATION, Lifecycle, ObligationState

STATE, EVENT = ObligationState.ATTEMPTING, "claim"


def _per_call(stmt: str, namespace: dict[str, object], number: int) -> float:
    """Seconds per execution of ``stmt`` (loop overhead included, as for every contender)."""
    return timeit.Timer(stmt, globals=namespace).timeit(number) / number


def _transitions_model() -> object:
    class Model:
        pass

    model = Model()
    transitions.Machine(
        model=model,
        states=ObligationState,
        transitions=[
            {"trigger": t.event, "source": list(t.sources), "dest": t.target}
            for t in OBLIGATION.transitions
            if t.sources and t.target is not None
        ],
        initial=STATE,
        auto_transitions=False,
    )
    return model


def measure(rounds: int, number: int) -> dict[str, float]:
    """Median seconds per call for each contender over ``rounds`` interleaved rounds."""
    plain = dict(OBLIGATION.table)
    model = _transitions_model()
    namespace: dict[str, object] = {
        "plain": plain,
        "target": OBLIGATION.target,
        "fire": model.trigger,  # type: ignore[attr-defined]
        "s": STATE,
        "e": EVENT,
    }
    contenders: dict[str, tuple[str, int]] = {
        "dict": ("plain[(s, e)]", number),
        "target": ("target(s, e)", number),
        "transitions": ("fire(e)", max(1, number // 50)),
    }
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, (stmt, n) in contenders.items():
            samples[name].append(_per_call(stmt, namespace, n))
    return {name: statistics.median(values) for name, values in samples.items()}


def declaration_cost(repeats: int = 200) -> tuple[float, int]:
    """Seconds per declaration of OBLIGATION, and the transitions models it created."""
    created = 0
    original: Callable[..., None] = transitions.Machine.add_model

    def counting(self: transitions.Machine, model: object, initial: object = None) -> None:
        nonlocal created
        created += 1
        original(self, model, initial)

    transitions.Machine.add_model = counting  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        for _ in range(repeats):
            Lifecycle(
                "obligation",
                ObligationState,
                initial=OBLIGATION.initial,
                terminal=OBLIGATION.terminal,
                transitions=OBLIGATION.transitions,
            )
        elapsed = (time.perf_counter() - start) / repeats
    finally:
        transitions.Machine.add_model = original  # type: ignore[method-assign]
    return elapsed, created


def main(argv: list[str] | None = None) -> int:
    """Print the measurements and ratios; with ``--check`` return 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)

    result = measure(args.rounds, args.number)
    per_decl, models = declaration_cost()
    vs_dict = result["target"] / result["dict"]
    vs_transitions = result["transitions"] / result["target"]
    print(f"lifecycle table lookups ({args.rounds} interleaved rounds, median)")
    print(f"  plain dict lookup           {result['dict'] * 1e9:9.1f} ns/op   (baseline)")
    print(f"  Lifecycle.target            {result['target'] * 1e9:9.1f} ns/op")
    print(f"  transitions model trigger   {result['transitions'] * 1e9:9.1f} ns/op")
    print(f"  declaring OBLIGATION        {per_decl * 1e6:9.1f} us, {models} transitions models")
    ok_dict = vs_dict <= 2.0
    ok_transitions = vs_transitions >= 50.0
    ok_models = models == 0
    print(f"  target / dict          = {vs_dict:6.2f}x  (target <= 2x)   {_mark(ok_dict)}")
    print(
        f"  transitions / target   = {vs_transitions:6.1f}x  (target >= 50x)  "
        f"{_mark(ok_transitions)}"
    )
    print(f"  models per declaration = {models}       (target 0)       {_mark(ok_models)}")
    if args.check and not (ok_dict and ok_transitions and ok_models):
        return 1
    return 0


def _mark(ok: bool) -> str:
    return "ok" if ok else "MISSED"


if __name__ == "__main__":
    sys.exit(main())

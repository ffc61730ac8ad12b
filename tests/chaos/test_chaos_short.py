"""A short chaos run in the test suite: the whole harness (its own PostgreSQL, 3 gateway and
2 connector node processes, the fault proxy, the chat platform) under a few seeded faults of
several kinds, then the history checker -- nothing lost, no unlabelled duplicate, no double
settle, no fenced write accepted, no bad walk, no reply in the wrong tenant, nothing owed.
The long run is ``python -m tests.chaos --faults 500`` (``docs/chaos.md``)."""

from __future__ import annotations

import os
import time

import pytest

from tests.chaos.results import render_summary
from tests.chaos.run import Config, run

pytestmark = pytest.mark.skipif(os.name != "posix", reason="SIGSTOP, SIGKILL of real processes")

SHORT = Config(
    faults=8,
    seed=2028,
    seconds=16.0,
    warmup_s=4.0,
    quiet_s=25.0,
    isolate_every=0,
    tail_s=2.0,
)


def test_a_short_chaos_run_keeps_every_promise() -> None:
    """Eight faults over about twenty seconds: the checker finds no violation and the harness
    no problem (every child started, none died on its own, everything settled)."""
    began = time.monotonic()
    outcome, workdir = run(SHORT, log=lambda line: print(f"{time.monotonic() - began:6.1f} {line}"))
    assert outcome is not None, f"the harness broke; logs kept in {workdir}"
    summary = render_summary(outcome)
    print(f"\n{summary}\n({time.monotonic() - began:.0f} s)")
    assert len(outcome.faults) == SHORT.faults, summary
    assert outcome.messages > 0.8 * SHORT.rate * SHORT.seconds, summary
    assert outcome.ok, f"{summary}\nlogs kept in {workdir}"

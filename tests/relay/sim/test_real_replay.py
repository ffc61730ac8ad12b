"""A seed of the real runtime replays byte for byte in another process: the same whole trace
(every log line with its virtual time and life, bufferIds included) and the same number of loop
turns, whatever the process's string hash seed -- everything a world does comes from its seed,
and the process gets its own entropy back afterwards."""

from __future__ import annotations

import os
import random
import secrets
import subprocess
import sys
import time
import uuid

from relay.sim.real import run_real_seed
from tests.cli_run import ROOT

SEEDS = (70008, 70041, 70000, 70010, 70014, 4, 9)
"""Seeds whose worlds once differed between processes (the connector's buffer drew a random
bufferId origin), plus two whose traces hold few bufferIds."""

_HASH_MARK = "hash of a string: "

_WORLDS = f"""
import sys
from relay.sim.real import run_real_seed
print("{_HASH_MARK}" + str(hash("statecore")))
for seed in map(int, sys.argv[1:]):
    outcome = run_real_seed(seed, trace=True)
    print(f"== seed {{seed}}: {{outcome.steps}} steps, ok {{outcome.ok}}")
    print("\\n".join(outcome.trace))
"""
"""What each process runs: the seeds named on its command line, each trace printed whole."""

BOUND_S = 120.0
"""Real seconds one process may take (about a second per seed here)."""


def _worlds(hash_seed: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", _WORLDS, *map(str, SEEDS)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> tuple[str, str]:
    """(the hash line, the traces) of a process that must exit 0 within the bound."""
    try:
        out, err = process.communicate(timeout=BOUND_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err[-3000:]
    hash_line, _, traces = out.partition("\n")
    assert hash_line.startswith(_HASH_MARK), out[:200]
    return hash_line, traces


def test_real_seeds_replay_byte_for_byte_in_processes_of_other_hash_seeds() -> None:
    """Each seed, run in two processes with different ``PYTHONHASHSEED``, prints the same
    whole trace and the same number of loop turns, byte for byte."""
    first, second = _worlds("0"), _worlds("4242")
    hash_a, traces_a = _finish(first)
    hash_b, traces_b = _finish(second)
    assert hash_a != hash_b  # the two processes really hashed strings differently
    for seed in SEEDS:
        assert f"== seed {seed}: " in traces_a
    assert "bufferId" in traces_a  # the ids that once differed are in the compared text
    if traces_a != traces_b:
        lines_a, lines_b = traces_a.splitlines(), traces_b.splitlines()
        diverged = next(
            (n for n, (a, b) in enumerate(zip(lines_a, lines_b, strict=False)) if a != b),
            min(len(lines_a), len(lines_b)),
        )
        seed_line = next(
            (line for line in reversed(lines_a[:diverged]) if line.startswith("== seed ")), "?"
        )
        shown_a = lines_a[diverged] if diverged < len(lines_a) else "(end)"
        shown_b = lines_b[diverged] if diverged < len(lines_b) else "(end)"
        raise AssertionError(
            f"the traces differ first at line {diverged} ({seed_line}):\n  {shown_a}\n  {shown_b}"
        )


def test_a_world_gives_the_process_its_entropy_back() -> None:
    """While a world runs its ids come from the seed; afterwards ``secrets``, ``uuid4``,
    ``time.time`` and the ``random`` module's generator are the process's own again."""
    before = (secrets.token_bytes, uuid.uuid4, time.time)
    random.seed(1234)
    expected = random.random()
    random.seed(1234)
    run_real_seed(4)
    assert (secrets.token_bytes, uuid.uuid4, time.time) == before
    assert random.random() == expected

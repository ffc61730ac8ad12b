"""A campaign in worker processes (relay.sim.jobs, ``python -m relay.sim --jobs N``): the same
outcome for every seed whatever the number of workers, in seed order; a worker that dies costs
its seed alone; the command's output and exit status are those of one process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from relay.sim import __main__ as sim_main
from relay.sim import jobs
from relay.sim.jobs import failed, jobs_wanted, outcomes, run_one
from relay.sim.run import Outcome
from tests.cli_run import ROOT, run_module


def test_real_and_model_seeds_give_the_same_outcomes_in_two_workers() -> None:
    """Every seed's outcome -- faults, verdict, steps, quiet time -- is the same run in this
    process one after the other and in two workers (which run the seeds in another order)."""
    for real, seeds in ((True, 3), (False, 6)):
        alone = list(outcomes(40, seeds, real=real, jobs=1))
        shared = list(outcomes(40, seeds, real=real, jobs=2))
        assert [o.seed for o in shared] == list(range(40, 40 + seeds))
        assert shared == alone
        assert all(o.ok and o.steps > 0 for o in shared)


def dies_on_seed_2(seed: int, real: bool) -> Outcome:
    """A runner whose worker dies outright on seed 2 (no cleanup, exit code 3)."""
    if seed == 2:
        os._exit(3)
    return failed(seed, f"ran {seed} real={real}") if seed == 4 else passing(seed)


def passing(seed: int) -> Outcome:
    outcome = failed(seed, "")
    outcome.verdict.violations.clear()
    return outcome


def test_a_worker_that_dies_costs_its_seed_alone() -> None:
    """Seed 2's worker dies; seed 2 fails naming the exit code, a new worker runs the rest,
    and the outcomes still come in seed order."""
    found = list(outcomes(1, 6, real=True, jobs=2, runner=dies_on_seed_2))
    assert [o.seed for o in found] == [1, 2, 3, 4, 5, 6]
    assert [o.ok for o in found] == [True, False, True, False, True, True]
    assert found[1].verdict.violations == ["its worker process died (exit code 3)"]
    assert found[3].verdict.violations == ["ran 4 real=True"]


def test_a_run_that_raises_is_that_seeds_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(seed: int) -> Outcome:
        raise RuntimeError(f"world {seed} broke")

    monkeypatch.setattr(jobs, "run_seed", broken)
    outcome = run_one(7, False)
    assert not outcome.ok
    assert outcome.verdict.violations == ["the run raised RuntimeError('world 7 broke')"]


def test_a_failing_campaign_lists_its_seeds_for_a_rerun(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def some_fail(first: int, seeds: int, *, real: bool, jobs: int) -> Iterator[Outcome]:
        assert (first, seeds, real, jobs) == (1, 4, True, 2)
        yield from (passing(1), failed(2, "lost m-1"), passing(3), failed(4, "lost m-9"))

    monkeypatch.setattr(sim_main, "outcomes", some_fail)
    assert sim_main.campaign(1, 4, real=True, jobs=2) == 1
    out = capsys.readouterr().out
    assert "seed 2 FAILED" in out
    assert "failing seeds (rerun one: python -m relay.sim --real --seed N --trace):\n  2 4" in out


def test_jobs_zero_is_one_per_core_and_a_negative_count_is_refused() -> None:
    assert jobs_wanted(0) == (os.cpu_count() or 1)
    assert jobs_wanted(3) == 3
    with pytest.raises(ValueError, match="--jobs"):
        jobs_wanted(-1)
    with pytest.raises(ValueError, match="at least 1"):
        next(outcomes(1, 1, real=False, jobs=0))
    refused = run_module("relay.sim", "--seeds", "2", "--jobs", "-1")
    assert refused.returncode == 2
    assert "--jobs must be 0" in refused.stderr


def _without_times(text: str) -> str:
    return re.sub(r" in [0-9.]+ s \([0-9.]+ seeds/s\)", "", text)


def test_the_command_prints_the_same_summary_with_two_jobs() -> None:
    one = run_module("relay.sim", "--seeds", "6", "--first", "20")
    two = run_module("relay.sim", "--seeds", "6", "--first", "20", "--jobs", "2")
    assert (one.returncode, two.returncode) == (0, 0), two.stdout + two.stderr
    assert "6 runs (seeds 20..25) in " in two.stdout
    assert _without_times(two.stdout) == _without_times(one.stdout)


def test_ctrl_c_ends_the_campaign_and_every_worker() -> None:
    """SIGINT to a campaign in two workers: exit status 130 within seconds, and none of its
    processes (the workers, the fork server) outlives it."""
    command = [sys.executable, "-m", "relay.sim", "--real", "--seeds", "40", "--jobs", "2"]
    campaign = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert campaign.stdout is not None
        first = campaign.stdout.readline()  # the first progress line (2 seeds): workers run
        assert "seeds, 0 failed" in first
        children = psutil.Process(campaign.pid).children(recursive=True)
        assert len(children) >= 3  # two workers and the fork server
        campaign.send_signal(signal.SIGINT)
        assert campaign.wait(timeout=30) == 130
        _, gone = psutil.wait_procs(children, timeout=10)
        assert gone == []
        assert "interrupted" in campaign.stderr.read()
    finally:
        if campaign.poll() is None:
            campaign.kill()
        campaign.wait(timeout=10)
        campaign.stdout.close()  # type: ignore[union-attr]
        campaign.stderr.close()  # type: ignore[union-attr]

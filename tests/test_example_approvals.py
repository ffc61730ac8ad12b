"""The approvals example: a lifecycle that is not a chat, with durable timers, run as a user
runs it (two timer workers, one SIGKILLed), and its generated lifecycle tests."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from stores import SQLiteStore
from stores.testing import StoreFactory
from stores.testing.lifecycle import lifecycle_tests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

from approvals import APPROVAL_KIND  # noqa: E402


@pytest.mark.skipif(sys.platform == "win32", reason="the example sends SIGKILL")
def test_the_example_fires_every_timer_once_across_a_sigkill() -> None:
    done = subprocess.run(
        [sys.executable, "examples/approvals.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "SIGKILLed worker" in out
    assert "final states: approved 3, expired 9" in out
    assert "0 problems" in out
    assert "PROBLEM" not in out
    # Each expired request was reminded first, each by one firing.
    assert out.count("remind_manager -> expire") == 6
    assert out.count("remind_finance -> expire") == 3


class TestApprovalLifecycle(lifecycle_tests(APPROVAL_KIND)):  # type: ignore[misc]
    """The generated tests of the example's own lifecycle, on SQLite files."""

    @pytest.fixture
    def store(self, tmp_path: Path) -> StoreFactory:
        """A fresh SQLite file per call."""
        paths = (tmp_path / f"approvals-{n}.sqlite3" for n in itertools.count())
        return lambda: SQLiteStore(next(paths))

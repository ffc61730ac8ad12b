"""The contract kit in a project of its own: ``stores.testing`` runs with pytest alone and leaves
no warning in that project's test run.

Each test writes a small project outside this repository (a ``pytest.ini`` of its own and one
test module subclassing :class:`stores.testing.StoreContract` for :class:`InMemoryStore`) and
runs pytest on it in a child process with ``-W error``, so any warning would fail the run.

What this proves, and what it does not: the child uses this checkout's interpreter, where the
development plugins are installed.  ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` keeps every installed
plugin out, so the kit is seen as a project with only ``statecore[testing]`` (pytest) would see
it; that it does not *import* pytest-asyncio or hypothesis is asserted from inside the child.
That the ``testing`` extra itself installs nothing more than pytest is pinned on the declaration
in tests/test_packaging.py; installing it into a fresh environment is not repeated here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TIMEOUT_S = 60.0

USER_TESTS = '''\
"""A project's own test of its store, with the statecore contract kit."""

import sys

import pytest

from stores import InMemoryStore
from stores.testing import StoreContract, StoreFactory


class TestMyStore(StoreContract):
    @pytest.fixture
    def store(self) -> StoreFactory:
        return InMemoryStore
'''

NO_PLUGIN_IMPORTED = """

def test_the_kit_imported_no_plugin() -> None:
    assert "pytest_asyncio" not in sys.modules
    assert "hypothesis" not in sys.modules
"""


def _run_user_project(folder: Path, *, autoload: bool, options: list[str]) -> str:
    """Write the project into ``folder``, run pytest on it with ``-W error``; its output."""
    (folder / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    tests = USER_TESTS
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    if not autoload:  # only then is "no plugin module was imported" the kit's doing
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        tests += NO_PLUGIN_IMPORTED
    (folder / "test_my_store.py").write_text(tests, encoding="utf-8")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-W",
            "error",
            "-p",
            "no:cacheprovider",
            "-c",
            str(folder / "pytest.ini"),
            "--rootdir",
            str(folder),
            *options,
            "test_my_store.py",
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def _passed(output: str) -> int:
    """The number of passed tests in pytest's summary line."""
    summary = output.strip().splitlines()[-1]
    return int(summary.split(" passed")[0].split()[-1])


def test_the_kit_runs_with_pytest_alone_and_no_warning(tmp_path: Path) -> None:
    """No plugin loaded at all: the whole contract passes, nothing warns, and importing the kit
    imported neither pytest-asyncio nor hypothesis."""
    output = _run_user_project(tmp_path, autoload=False, options=[])
    assert "warning" not in output.lower(), output
    assert _passed(output) > 100  # the whole contract ran, not an empty module


def test_the_kit_needs_nothing_from_pytest_asyncio(tmp_path: Path) -> None:
    """With the other installed plugins loaded and pytest-asyncio switched off, the kit still
    passes without a warning: no section is an async test, a fixture of that plugin, or one of
    its marks (each would fail or warn without it)."""
    output = _run_user_project(tmp_path, autoload=True, options=["-p", "no:asyncio"])
    assert "warning" not in output.lower(), output
    assert _passed(output) > 100

"""The one way the command-line tests run ``statecore``: the installed console script, in a
subprocess, against a real store; and a snapshot of a SQLite file to prove a refusal changed
nothing."""

from __future__ import annotations

import json
import os
import pty
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TIMEOUT_S = 60
SERVE_BOUND_S = 30.0
"""The bound on each wait for a long-running command (a line it prints, its exit)."""
ROOT = Path(__file__).resolve().parent.parent
STORE_URL_ENV = "STATECORE_STORE_URL"


def console_script() -> str:
    """The installed ``statecore`` script beside this interpreter (or on PATH)."""
    beside = Path(sys.executable).parent / "statecore"
    if beside.is_file():
        return str(beside)
    found = shutil.which("statecore")
    if found is None:
        pytest.fail("the 'statecore' console script is not installed (pip install -e .)")
    return found


def url(path: Path, **options: str) -> str:
    """The ``sqlite:///`` URL of ``path`` (absolute), with query options."""
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"sqlite:///{path}" + (f"?{query}" if query else "")


def run(
    *argv: str,
    store: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``statecore [--store store] argv...`` and return what it did (never raises on a
    non-zero exit).  The environment is this process's without ``STATECORE_STORE_URL``, plus
    ``env``."""
    environ = {k: v for k, v in os.environ.items() if k != STORE_URL_ENV}
    environ.update(env or {})
    prefix = ["--store", store] if store is not None else []
    return subprocess.run(
        [console_script(), *prefix, *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=environ,
        cwd=cwd,
        check=False,
    )


def run_module(
    module: str, *argv: str, timeout_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module argv...`` from the repository root (never raises on a non-zero
    exit)."""
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def run_json(*argv: str, store: str | None = None) -> Any:
    """Run with ``--json``, require exit 0 and an empty stderr, and parse stdout."""
    result = run(*argv, "--json", store=store)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return json.loads(result.stdout)


def run_on_terminal(*argv: str, store: str) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-terminal (stdout captured): (status, stdout, what the
    terminal received)."""
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(
            [console_script(), "--store", store, *argv],
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
        )
        out, _ = process.communicate(timeout=TIMEOUT_S)
    finally:
        os.close(follower)
    received = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal is closed once everything was read
            break
        if not chunk:
            break
        received += chunk
    os.close(leader)
    return process.returncode, out, received.decode("utf-8", "replace")


def snapshot(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the SQLite file (audit entries included), read through a
    read-only connection: equal snapshots mean nothing was changed."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name"
            )
        ]
        return {t: sorted(conn.execute(f'SELECT * FROM "{t}"'), key=repr) for t in tables}
    finally:
        conn.close()


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any ``STATECORE_*`` setting, with this checkout on
    ``PYTHONPATH`` and ``extra`` added: what a long-running command is started with."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATECORE_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def line_with(proc: subprocess.Popen[str], marker: str) -> str:
    """The first stdout line of ``proc`` containing ``marker`` (bounded; the process must not
    die first: the test fails with its standard error then)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + SERVE_BOUND_S
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if marker in line:
            return line.strip()
        if not line and proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            pytest.fail(f"exited {proc.returncode} before {marker!r}: {err[-2000:]}")
    pytest.fail(f"no {marker!r} line within {SERVE_BOUND_S} s")


def reap(started: list[subprocess.Popen[str]]) -> Iterator[list[subprocess.Popen[str]]]:
    """The body of a ``processes`` fixture: yields the list a test appends its processes to,
    then kills and reaps (bounded) any still running and closes their pipes."""
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=SERVE_BOUND_S)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()

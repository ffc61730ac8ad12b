"""Real processes racing the startup sweep over one SQLite file, and real SIGKILLed owners.

The children run ``sweeper_child.py`` (next to this module) with ``sys.executable``: each opens
the database with its own real incarnation and the real psutil probe.  Every wait is bounded (a
child that hangs fails the test) and every child is killed and reaped at teardown whatever
happens.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from statecore import Incarnation, Ledger, ObligationState
from stores.sqlite import SQLiteStore

pytestmark = pytest.mark.skipif(
    os.name != "posix", reason="uses SIGKILL and select() on pipes (POSIX only)"
)

S = ObligationState
CHILD_SCRIPT = Path(__file__).with_name("sweeper_child.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
RACE_TIMEOUT_S = 60.0
"""Real seconds the whole sweeper race may take before the test fails."""
CHILD_TIMEOUT_S = 20.0
"""Real seconds one child may take to start, answer, exit or be reaped."""
N_ROWS = 300
N_SWEEPERS = 4
SWEEP_ROUNDS = 3
HOST = Incarnation.current().host
DEAD_OWNER = Incarnation(HOST, 999_999, 1, "dead0wner")
"""A crashed gateway on this host: pid 999999 with a start time no live process has."""


class Child:
    """A running ``sweeper_child.py``: JSON lines are read from its stdout with a deadline."""

    def __init__(self, proc: subprocess.Popen[bytes], stderr_path: Path) -> None:
        self.proc = proc
        self.stderr_path = stderr_path
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read_json(self, deadline: float) -> Any:
        """The next JSON line the child prints; fails the test at ``deadline`` (monotonic)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"child {self.pid} printed no line in time; {self.diagnostics()}")
            ready, _, _ = select.select([fd], [], [], min(remaining, 0.5))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    self.proc.wait(timeout=CHILD_TIMEOUT_S)
                    pytest.fail(f"child {self.pid} exited early; {self.diagnostics()}")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def release(self) -> None:
        """Close the child's stdin: a sweeper then exits, a crash child would too."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def diagnostics(self) -> str:
        return f"returncode={self.proc.poll()}, stderr={self.stderr_path.read_text()[-2000:]!r}"


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Child]]:
    """Start ``sweeper_child.py`` with arguments; every child is killed and reaped at teardown."""
    children: list[Child] = []
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)

    def start(*args: str) -> Child:
        stderr_path = tmp_path / f"child-{len(children)}.stderr"
        with stderr_path.open("wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, str(CHILD_SCRIPT), *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=tmp_path,  # not the repo: imports must come from the installed project
                env=env,
            )
        child = Child(proc, stderr_path)
        children.append(child)
        return child

    try:
        yield start
    finally:
        for child in children:
            if child.proc.poll() is None:
                child.proc.kill()
        for child in children:
            child.proc.wait(timeout=CHILD_TIMEOUT_S)
            for pipe in (child.proc.stdin, child.proc.stdout):
                if pipe is not None:
                    pipe.close()


def _record_dead_owner_rows(db: Path, count: int) -> list[str]:
    """Record ``count`` pending obligations owned by DEAD_OWNER; return their ids."""
    store = SQLiteStore(db)
    try:
        ledger = Ledger(store, incarnation=DEAD_OWNER)
        with store.atomic():
            ids = [
                ledger.record(
                    session_key=f"agent:main:slack:channel:C{n}",
                    platform="slack",
                    chat_id=f"C{n}",
                    content=f"final reply {n}",
                    message_ref=n,
                ).obligation_id
                for n in range(count)
            ]
    finally:
        store.close()
    assert len(set(ids)) == count
    return ids


@pytest.mark.parametrize("chunk", [500, 1], ids=["one-transaction", "one-claim-per-transaction"])
def test_racing_sweepers_claim_every_dead_owner_row_exactly_once(
    tmp_path: Path, spawn: Callable[..., Child], chunk: int
) -> None:
    """Four real processes sweeping at once claim each dead owner's row exactly once."""
    db = tmp_path / "ledger.db"
    ids = _record_dead_owner_rows(db, N_ROWS)
    go_file = tmp_path / "go"
    deadline = time.monotonic() + RACE_TIMEOUT_S

    sweepers = [
        spawn("sweep", str(db), str(go_file), str(SWEEP_ROUNDS), str(chunk))
        for _ in range(N_SWEEPERS)
    ]
    for child in sweepers:
        assert child.read_json(deadline) == {"ready": child.pid}
    go_file.touch()  # release every sweeper at once
    results = [child.read_json(deadline) for child in sweepers]
    for child in sweepers:  # only now may they exit: every claim was made while all were alive
        child.release()
    for child in sweepers:
        assert child.proc.wait(timeout=max(0.1, deadline - time.monotonic())) == 0, (
            child.diagnostics()
        )

    claimant: dict[str, int] = {}
    counts: Counter[str] = Counter()
    for child, result in zip(sweepers, results, strict=True):
        assert result["pid"] == child.pid
        counts.update(result["claimed"])
        claimant.update(dict.fromkeys(result["claimed"], child.pid))
    assert [oid for oid, n in counts.items() if n > 1] == [], "rows claimed more than once"
    assert set(counts) == set(ids), "rows never claimed"
    assert sum(counts.values()) == N_ROWS

    store = SQLiteStore(db)
    try:
        ledger = Ledger(store)
        children = {child.pid for child in sweepers}
        for oid in ids:
            row = ledger.get(oid)
            assert row is not None
            assert row.state is S.ATTEMPTING
            assert row.attempts == 1
            assert row.owner.pid in children
            assert row.owner.pid == claimant[oid]
            events = [entry.event for entry in ledger.history(oid)]
            assert events == ["record", "claim"], f"{oid}: {events}"
    finally:
        store.close()


@pytest.mark.parametrize(
    ("state", "needs_marker", "reason"),
    [("attempting", True, "recovered"), ("pending", False, None)],
    ids=["killed-mid-send", "killed-before-send"],
)
def test_sigkilled_owner_row_is_claimed_by_the_next_sweep(
    tmp_path: Path,
    spawn: Callable[..., Child],
    state: str,
    needs_marker: bool,
    reason: str | None,
) -> None:
    """A row whose owner was SIGKILLed is claimed once, labelled only if a send had begun."""
    db = tmp_path / "ledger.db"
    oid = "0123456789abcdef01234567"
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    child = spawn("crash", str(db), oid, state)
    assert child.read_json(deadline) == {"pid": child.pid, "id": oid}

    store = SQLiteStore(db)
    try:
        ledger = Ledger(store)
        row = ledger.get(oid)
        assert row is not None
        assert row.state is S(state)
        assert row.owner.pid == child.pid
        assert ledger.sweep_recoverable() == [], "a live owner's row was claimed"

        os.kill(child.pid, signal.SIGKILL)
        assert child.proc.wait(timeout=CHILD_TIMEOUT_S) == -signal.SIGKILL

        claims = ledger.sweep_recoverable()
        assert [claim.obligation_id for claim in claims] == [oid]
        claim = claims[0]
        assert claim.needs_marker is needs_marker
        assert claim.reason == reason
        assert claim.attempts == 1
        assert claim.obligation.state is S.ATTEMPTING
        assert claim.obligation.owner.pid == os.getpid()
        assert claim.obligation.owner.token == ledger.incarnation.token
        assert ledger.sweep_recoverable() == [], "the claimed row was claimed again"

        expected = ["record", "attempt", "claim"] if state == "attempting" else ["record", "claim"]
        history = ledger.history(oid)
        assert [entry.event for entry in history] == expected
        assert history[-1].reason == (reason or "owner dead")
    finally:
        store.close()

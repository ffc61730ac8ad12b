"""SQLite faults for the tests (imported, never collected): the write lock held by a second
connection or by a child process, as another gateway or tool would hold it, and a ledger file
whose obligation pages are corrupt while its schema still reads.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType

BOUND_S = 10.0
"""Real seconds a lock holder may take to take or drop its lock."""

_CHILD = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
conn.close()
"""


class ConnectionLock:
    """SQLite's write lock on ``path``, taken by a second connection of this process with
    ``BEGIN IMMEDIATE`` (as a writer in another process holds it) and dropped by a rollback."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=BOUND_S)
        self.held = False

    def lock(self) -> None:
        """Take the write lock (waits, bounded, for a writer that holds it now)."""
        self.conn.execute("BEGIN IMMEDIATE")
        self.held = True

    def unlock(self) -> None:
        """Drop the write lock; a no-op when it is not held."""
        if self.held:
            self.conn.execute("ROLLBACK")
            self.held = False

    def close(self) -> None:
        """Drop the lock and close the connection."""
        self.unlock()
        self.conn.close()

    def __enter__(self) -> ConnectionLock:
        self.lock()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ChildProcessLock:
    """SQLite's write lock on ``path`` held by a child process until the context exits."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> ChildProcessLock:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, self.path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.proc = proc
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(BOUND_S)
        if line != ["locked\n"]:
            self._end()
            raise AssertionError(f"the child did not take the lock: {line!r}")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._end()

    def _end(self) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            proc.communicate("go\n", timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=BOUND_S)
        self.proc = None


def corrupt_obligation_pages(path: str | os.PathLike[str]) -> None:
    """Overwrite the pages of the obligation table and its indexes with garbage, leaving the
    file header and schema readable: the store still opens, any read of an obligation fails.
    Every connection to the file must be closed first."""
    conn = sqlite3.connect(path)
    try:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        roots = [
            root
            for (root,) in conn.execute(
                "SELECT rootpage FROM sqlite_master WHERE tbl_name = 'delivery_obligations' "
                "AND rootpage > 0"  # its triggers have no pages
            )
        ]
    finally:
        conn.close()
    assert roots, f"{path} has no obligation table"
    with Path(path).open("r+b") as fh:
        for root in roots:
            fh.seek((root - 1) * page_size)
            fh.write(b"\xa5" * page_size)

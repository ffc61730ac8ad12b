"""Several stores of one process on one SQLite file (the connector, the gateway and the
dashboard of one small deployment): opening one never drops the file locks of the others, so
another process that opens and closes the file (``statecore doctor``, a dashboard) never
deletes the WAL under them, and every commit stays visible to every process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from statecore import Ledger
from stores import SQLiteStore

_COUNT = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
print(conn.execute("SELECT count(*) FROM delivery_obligations").fetchone()[0])
conn.close()
"""


def _count_elsewhere(path: Path) -> int:
    """The obligations another process sees in ``path`` (its connection opened and closed)."""
    done = subprocess.run(
        [sys.executable, "-c", _COUNT, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(done.stdout)


def _record(ledger: Ledger, ref: str) -> None:
    ledger.record(session_key="k", platform="p", chat_id="c", content="x", message_ref=ref)


def test_a_second_store_on_the_file_keeps_the_first_ones_commits_visible(tmp_path: Path) -> None:
    """After a second store opened the same file, another process's connection closing does
    not delete the WAL the first store writes to: its later commits reach every process."""
    path = tmp_path / "shared.db"
    first = SQLiteStore(path)
    ledger = Ledger(first)
    _record(ledger, "1")
    second = SQLiteStore(path)
    try:
        assert _count_elsewhere(path) == 1
        assert (tmp_path / "shared.db-wal").exists()
        _record(ledger, "2")
        assert _count_elsewhere(path) == 2
        _record(ledger, "3")
        assert _count_elsewhere(path) == 3
    finally:
        second.close()
        first.close()

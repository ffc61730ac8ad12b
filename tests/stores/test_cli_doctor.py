"""``statecore doctor`` on real SQLite files, run as the real console script: the storage
checks of stores.cli (schema version, journal mode, integrity, size), stuck rows with their
owners' liveness, and the exit codes: 0 healthy, 1 problems found, 2 cannot examine."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from statecore import FakeClock, Incarnation, Ledger
from statecore.cli.output import Progress
from statecore.cli.plugin import CheckStatus, CliError
from statecore.errors import StoreError
from statecore.ownership import host_identity
from stores import SQLiteStore
from stores.cli import open_sqlite, sqlite_checks, sqlite_path
from stores.sqlite import SCHEMA_VERSION
from tests.cli_run import run, run_json, run_on_terminal, snapshot, url

HOUR = 3600.0
DEAD = Incarnation(host_identity(), os.getpid(), 1, "deadbeefdeadbeef")


def _ledger_file(path: Path, *, stuck: bool = False) -> dict[str, str]:
    """A ledger with one delivered row and, when ``stuck``, an hour-old attempting row of a
    dead owner and one of this (live) process."""
    store = SQLiteStore(path)
    clock = FakeClock(time.time() - HOUR)
    ids = {}
    for name, incarnation in (("dead", DEAD), ("alive", Incarnation.current())):
        ledger = Ledger(store, clock=clock, incarnation=incarnation)
        oid = ledger.record(session_key=name, platform="p", chat_id="c", content=name)
        ledger.mark_attempting(oid.obligation_id)
        if not stuck:
            ledger.mark_delivered(oid.obligation_id)
        ids[name] = oid.obligation_id
    store.close()
    return ids


def _damage(path: Path) -> None:
    """Overwrite the obligation table's root page with junk, past its page header."""
    conn = sqlite3.connect(path)
    root, page = conn.execute(
        "SELECT rootpage, (SELECT page_size FROM pragma_page_size()) FROM sqlite_schema "
        "WHERE name = 'delivery_obligations'"
    ).fetchone()
    conn.close()
    with path.open("r+b") as fh:
        fh.seek((root - 1) * page + 8)
        fh.write(b"\xff" * 200)


def test_a_healthy_file_passes_and_is_not_changed(tmp_path: Path) -> None:
    """Exit 0; schema, journal and integrity ok; size reported; the file unchanged."""
    path = tmp_path / "bot.db"
    _ledger_file(path)
    before = snapshot(path)
    result = run("doctor", store=url(path))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0] == f"statecore doctor: {url(path)}"
    assert lines[1].split()[:4] == ["ok", "schema", "version", str(SCHEMA_VERSION)]
    assert lines[2].split()[:4] == ["ok", "journal", "mode", "wal"]
    assert lines[3].split()[:4] == ["ok", "integrity", "ok", "(integrity_check)"]
    assert lines[4].split()[:3] == ["info", "file", "size"]
    assert lines[5].split()[:3] == ["ok", "stuck", "rows"]
    assert lines[-1] == "ok"
    assert snapshot(path) == before
    data = run_json("doctor", "--quick", store=url(path))
    assert (data["ok"], data["problems"]) == (True, 0)
    checks = {c["name"]: c for c in data["checks"]}
    assert list(checks) == [
        "schema version",
        "journal mode",
        "integrity",
        "file size",
        "stuck rows",
        "failing replies",
        "oldest owed",
    ]
    assert checks["integrity"]["details"] == {"check": "quick_check"}
    assert checks["file size"]["details"]["bytes"] == path.stat().st_size
    # A file the store created has its pages (an older file keeps its own: reported as is).
    assert checks["file size"]["details"]["page_size"] == 2048
    assert "2048-byte pages" in lines[4]


def test_stuck_rows_are_a_problem_with_their_owners_liveness(tmp_path: Path) -> None:
    """Hour-old attempting rows: exit 1, each listed with its owner dead or alive; a higher
    threshold finds none."""
    path = tmp_path / "bot.db"
    ids = _ledger_file(path, stuck=True)
    result = run("doctor", store=url(path))
    assert result.returncode == 1, result.stderr
    assert "PROBLEM  stuck rows" in result.stdout
    assert f"{ids['dead']}  attempting" in result.stdout
    assert "owner dead: the next gateway to start or recover claims it" in result.stdout
    assert "owner alive but not sending it" in result.stdout
    assert result.stdout.endswith("1 problem found\n")
    data = run("doctor", "--json", store=url(path))
    assert data.returncode == 1
    report = json.loads(data.stdout)
    [stuck] = [c for c in report["checks"] if c["name"] == "stuck rows"]
    assert {r["obligation_id"]: r["owner_status"] for r in stuck["details"]["rows"]} == {
        ids["dead"]: "dead",
        ids["alive"]: "alive",
    }
    assert stuck["details"]["owners"] == {"dead": 1, "alive": 1}
    assert run("doctor", "--stuck-after", "2h", store=url(path)).returncode == 0
    too_old = run("doctor", "--stuck-after", "2h", "--max-owed-age", "30m", store=url(path))
    assert too_old.returncode == 1
    assert "PROBLEM  oldest owed" in too_old.stdout


def test_owed_replies_that_keep_failing_are_a_problem(tmp_path: Path) -> None:
    """A reply refused for good ("message too long") and one that failed again after a retry
    make doctor exit 1, each listed with its error and what it waits for; a single transient
    failure with a retry due is shown, not a problem."""
    path = tmp_path / "bot.db"
    store = SQLiteStore(path)
    ledger = Ledger(store)
    ids = {}
    for name, error in (("refused", "message too long"), ("flaky", "upstream timeout")):
        oid = ledger.record(session_key=name, platform="p", chat_id="c", content=name)
        ledger.mark_attempting(oid.obligation_id)
        ledger.mark_failed(oid.obligation_id, error)
        ids[name] = oid.obligation_id
    store.close()
    result = run("doctor", store=url(path))
    assert result.returncode == 1, result.stdout
    assert "PROBLEM  failing replies  1 owed reply keeps failing" in result.stdout
    assert f"{ids['refused']}  permanent" in result.stdout
    assert "'message too long'" in result.stdout
    assert f"{ids['flaky']}  transient" in result.stdout
    assert "a retry by the running gateway (in " in result.stdout
    report = json.loads(run("doctor", "--json", store=url(path)).stdout)
    [failing] = [c for c in report["checks"] if c["name"] == "failing replies"]
    assert (failing["details"]["failed"], failing["details"]["keep_failing"]) == (2, 1)
    # Only a transient failure with a retry due: shown, not a problem.
    calm = tmp_path / "calm.db"
    store = SQLiteStore(calm)
    ledger = Ledger(store)
    oid = ledger.record(session_key="k", platform="p", chat_id="c", content="x")
    ledger.mark_attempting(oid.obligation_id)
    ledger.mark_failed(oid.obligation_id, "upstream timeout")
    store.close()
    result = run("doctor", store=url(calm))
    assert result.returncode == 0, result.stdout
    assert "info     failing replies  1 failed, each waiting for a retry" in result.stdout


def test_a_damaged_file_fails_its_integrity_check_unchanged(tmp_path: Path) -> None:
    """A damaged page: exit 1 with the integrity problem (full and quick check), the ledger
    left unread (opening a store may write), and the file's bytes as they were."""
    path = tmp_path / "bot.db"
    _ledger_file(path)
    _damage(path)
    damaged = path.read_bytes()
    for argv, pragma in ((("doctor",), "integrity_check"), (("doctor", "--quick"), "quick_check")):
        result = run(*argv, store=url(path))
        assert result.returncode == 1, result.stderr
        assert f"PROBLEM  integrity       {pragma} found damage:" in result.stdout
        assert "info     ledger          not read: the storage must be repaired first" in (
            result.stdout
        )
    assert path.read_bytes() == damaged


def test_a_journal_mode_other_than_wal_is_a_problem(tmp_path: Path) -> None:
    """A statecore file switched to another journal mode is reported."""
    path = tmp_path / "bot.db"
    _ledger_file(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    data = run("doctor", "--json", store=url(path))
    assert data.returncode == 1
    assert '"mode": "delete"' in data.stdout


def _user_version(path: Path, version: int | None = None) -> int:
    """The file's layout version, set to ``version`` first when given."""
    conn = sqlite3.connect(path)
    try:
        if version is not None:
            conn.execute(f"PRAGMA user_version = {version}")
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def test_a_newer_schema_is_a_problem_and_is_left_alone(tmp_path: Path) -> None:
    """A file of a newer layout: exit 1 saying to upgrade; its version is not touched."""
    path = tmp_path / "bot.db"
    _ledger_file(path)
    _user_version(path, 99)
    result = run("doctor", store=url(path))
    assert result.returncode == 1
    wanted = f"99 is newer than this statecore understands ({SCHEMA_VERSION}): upgrade statecore"
    assert wanted in result.stdout
    assert _user_version(path) == 99


def test_an_older_layout_is_reported_as_upgraded_when_opened(tmp_path: Path) -> None:
    """A file of an older layout version (here 3): exit 0, the version read before anything
    opened the file shown as one that opening it upgrades -- and the ledger checks that follow
    open it, so the file is at the current version afterwards."""
    path = tmp_path / "bot.db"
    _ledger_file(path)
    _user_version(path, 3)
    result = run("doctor", store=url(path))
    assert result.returncode == 0, result.stdout
    assert "3 (an older layout: opening it upgrades it)" in result.stdout
    assert _user_version(path) == SCHEMA_VERSION


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.db", None, "missing.db: no such database file"),
        ("garbage.db", b"\x00garbage" * 1000, "garbage.db: not a SQLite database"),
    ],
)
def test_what_cannot_be_examined_exits_2(
    tmp_path: Path, name: str, content: bytes | None, message: str
) -> None:
    """A missing file (not created) or one that is not a database: exit 2 naming it."""
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    result = run("doctor", store=url(path))
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == ""
    assert path.exists() is (content is not None)
    if content is not None:
        assert path.read_bytes() == content


def test_a_locked_file_exits_2(tmp_path: Path) -> None:
    """The ledger cannot be read while another connection holds the write lock: exit 2."""
    path = tmp_path / "bot.db"
    _ledger_file(path)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        result = run("doctor", store=url(path, busy_timeout_s="0.2"))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert result.returncode == 2
    assert "database locked for longer than the busy timeout" in result.stderr


def test_a_store_without_storage_checks_is_still_examined() -> None:
    """memory:// has no storage checks: said so, the ledger checks still run."""
    data = run_json("doctor", store="memory://")
    assert data["checks"][0]["summary"] == "no storage checks are installed for memory://"
    assert [c["name"] for c in data["checks"][1:]] == [
        "stuck rows",
        "failing replies",
        "oldest owed",
    ]


def test_the_integrity_check_draws_progress_on_a_terminal(tmp_path: Path) -> None:
    """With stderr on a terminal, the integrity check shows what it is checking."""
    path = tmp_path / "bot.db"
    _ledger_file(path)
    status, out, terminal = run_on_terminal("doctor", store=url(path))
    assert status == 0
    assert "integrity_check of bot.db (" in terminal
    assert terminal.endswith("\r\x1b[K")
    assert "\x1b" not in out


def test_sqlite_checks_in_process(tmp_path: Path) -> None:
    """The checks read a file without a store; the opener refuses to create one."""
    path = tmp_path / "bot.db"
    _ledger_file(path)
    labels: list[tuple[str, int | None]] = []

    def progress(label: str, total: int | None) -> Progress:
        labels.append((label, total))
        return Progress(label, total, io.StringIO(), enabled=False)

    checks = sqlite_checks(url(path), quick=True, progress=progress)
    assert [(c.name, c.status) for c in checks] == [
        ("schema version", CheckStatus.OK),
        ("journal mode", CheckStatus.OK),
        ("integrity", CheckStatus.OK),
        ("file size", CheckStatus.INFO),
    ]
    assert labels[0][0].startswith("quick_check of bot.db")
    assert sqlite_path("sqlite:///rel/x.db") == "rel/x.db"
    assert sqlite_path("sqlite:////abs/x.db") == "/abs/x.db"
    with pytest.raises(ValueError, match="not a sqlite"):
        sqlite_path("memory://")
    with pytest.raises(CliError, match="no such database file"):
        sqlite_checks(url(tmp_path / "none.db"), quick=False, progress=progress)
    with pytest.raises(StoreError, match="no such database file"):
        open_sqlite(url(tmp_path / "none.db"))
    assert not (tmp_path / "none.db").exists()

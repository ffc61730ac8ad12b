"""Tests for the SQLite specifics of stores.sqlite and stores.url, through the ledger.

The behaviour every store shares is pinned by the contract kit (test_store_contract.py); this
module covers what only a file on disk has: journal settings, schema versioning, in-place
migration of the older ledger layout, durability across reopen, lock timeouts, per-thread
connections and opening stores from URLs.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from statecore import (
    OBLIGATION_KIND,
    FakeClock,
    Ledger,
    ObligationState,
    PsutilProbe,
    StoreError,
)
from stores import InMemoryStore, SQLiteStore, open_store
from stores.sqlite import SCHEMA_VERSION

S = ObligationState
GUARD = 10.0
"""Real seconds a worker thread may take before the test fails instead of hanging."""

OLD_LAYOUT = """CREATE TABLE delivery_obligations (
    obligation_id TEXT PRIMARY KEY,
    session_key TEXT NOT NULL,
    platform TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    thread_id TEXT,
    content TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    owner_pid INTEGER,
    owner_started_at INTEGER,
    last_error TEXT
)"""
"""The 13-column ledger table written by the gateway before statecore (see ledger.md)."""


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Where the test's database lives."""
    return tmp_path / "ledger.db"


@pytest.fixture
def opened(db_path: Path) -> Iterator[Callable[..., SQLiteStore]]:
    """Open SQLite stores on db_path (or another path); all closed at teardown."""
    stores: list[SQLiteStore] = []

    def open_(path: Path | str | None = None, **kwargs: Any) -> SQLiteStore:
        store = SQLiteStore(db_path if path is None else path, **kwargs)
        stores.append(store)
        return store

    yield open_
    for store in stores:
        store.close()


def raw_connect(path: Path | str) -> contextlib.closing[sqlite3.Connection]:
    """A plain sqlite3 connection outside the store (autocommit), closed on exit."""
    return contextlib.closing(sqlite3.connect(path, isolation_level=None))


def ledger_on(store: Any, clock: FakeClock | None = None) -> Ledger:
    """A ledger acting as this process."""
    return Ledger(store, clock=clock or FakeClock())


def record(ledger: Ledger, oid: str, **overrides: Any) -> str:
    """Record one obligation and return its id."""
    values: dict[str, Any] = {
        "session_key": f"sk:{oid}",
        "platform": "slack",
        "chat_id": "C1",
        "content": f"answer {oid}",
    }
    values.update(overrides)
    return ledger.record(obligation_id=oid, **values).obligation_id


# -- settings and versioning -------------------------------------------------------------------


@pytest.mark.parametrize(("synchronous", "level"), [("NORMAL", 1), ("FULL", 2)])
def test_wal_and_synchronous_are_applied(
    opened: Callable[..., SQLiteStore], db_path: Path, synchronous: str, level: int
) -> None:
    """The file is in WAL mode and the store's connection uses the requested synchronous."""
    store = opened(synchronous=synchronous)
    with raw_connect(db_path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn = store._conn()
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == level
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.synchronous == synchronous


def test_user_version_is_the_schema_version(
    opened: Callable[..., SQLiteStore], db_path: Path
) -> None:
    """A new database is stamped with SCHEMA_VERSION."""
    ledger_on(opened())
    with raw_connect(db_path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_rejects_unknown_synchronous(db_path: Path) -> None:
    """An unsupported synchronous level is refused before any file is created."""
    with pytest.raises(ValueError, match="synchronous"):
        SQLiteStore(db_path, synchronous="OFF")  # type: ignore[arg-type]
    assert not db_path.exists()


def test_new_file_page_size_and_checkpoint_threshold(
    opened: Callable[..., SQLiteStore], db_path: Path, tmp_path: Path
) -> None:
    """A file the store creates has its page size (2048 by default) and each connection its
    checkpoint threshold (by default 4000 WAL pages at NORMAL, 1000 at FULL); both can be
    chosen."""
    ledger_on(opened())
    with raw_connect(db_path) as raw:
        assert raw.execute("PRAGMA page_size").fetchone()[0] == 2048
    assert opened()._conn().execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 4000
    full = opened(synchronous="FULL")._conn()
    assert full.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000
    chosen = opened(tmp_path / "chosen.db", page_size=8192, checkpoint_pages=250)
    ledger_on(chosen)
    conn = chosen._conn()
    assert conn.execute("PRAGMA page_size").fetchone()[0] == 8192
    assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 250


def test_existing_file_keeps_its_page_size_and_history(
    opened: Callable[..., SQLiteStore], db_path: Path
) -> None:
    """A file written with other pages (4096, as before the option existed) keeps them when a
    store with another page size opens it, and its rows and history stay readable."""
    clock = FakeClock()
    first = ledger_on(opened(page_size=4096), clock)
    oid = record(first, "ob-old")
    first.mark_attempting(oid)
    history = first.history(oid)
    first.store.close()
    again = ledger_on(opened(), clock)
    assert again.store._conn().execute("PRAGMA page_size").fetchone()[0] == 4096
    assert again.history(oid) == history
    assert again.mark_delivered(oid).state is S.DELIVERED
    with raw_connect(db_path) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"page_size": 1000}, ValueError),
        ({"page_size": 256}, ValueError),
        ({"page_size": 131072}, ValueError),
        ({"page_size": "2048"}, TypeError),
        ({"page_size": True}, TypeError),
        ({"checkpoint_pages": 0}, ValueError),
        ({"checkpoint_pages": -5}, ValueError),
        ({"checkpoint_pages": 1.5}, TypeError),
        ({"checkpoint_pages": False}, TypeError),
    ],
)
def test_rejects_bad_page_size_and_checkpoint_pages(
    db_path: Path, options: dict[str, Any], error: type[Exception]
) -> None:
    """A page size SQLite would ignore or a threshold that never checkpoints is refused, naming
    the option, before any file is created."""
    with pytest.raises(error, match=next(iter(options))):
        SQLiteStore(db_path, **options)
    assert not db_path.exists()


def test_data_survives_close_and_reopen(opened: Callable[..., SQLiteStore]) -> None:
    """Rows and history written before close() are all there after reopening the file."""
    clock = FakeClock()
    first = ledger_on(opened(), clock)
    a = record(first, "ob-a")
    first.mark_attempting(a)
    first.mark_failed(a, "connection reset")
    b = record(first, "ob-b", thread_id=99)
    rows = {oid: first.get(oid) for oid in (a, b)}
    history = first.history(a)
    first.store.close()
    second = ledger_on(opened(), clock)
    assert {oid: second.get(oid) for oid in (a, b)} == rows
    assert second.history(a) == history
    assert len(second.owed()) == 2


def test_not_a_database_raises_store_error_naming_the_path(db_path: Path) -> None:
    """Opening a file that is not SQLite raises StoreError naming the path."""
    db_path.write_bytes(b"hello world" * 10)
    with pytest.raises(StoreError, match=str(db_path)):
        SQLiteStore(db_path)
    assert db_path.read_bytes() == b"hello world" * 10


def test_newer_schema_version_raises_store_error_naming_the_path(db_path: Path) -> None:
    """A database written by a newer statecore is refused, naming the path."""
    with raw_connect(db_path) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match=str(db_path)):
        SQLiteStore(db_path)
    with raw_connect(db_path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1


def test_missing_directory_raises_store_error(tmp_path: Path) -> None:
    """A path in a directory that does not exist raises StoreError and creates nothing."""
    missing = tmp_path / "no" / "such" / "dir" / "ledger.db"
    with pytest.raises(StoreError, match="does not exist"):
        SQLiteStore(missing)
    assert not (tmp_path / "no").exists()


def test_closed_store_raises_store_error(opened: Callable[..., SQLiteStore]) -> None:
    """After close(), every call raises StoreError; closing again is harmless."""
    store = opened()
    ledger = ledger_on(store)
    oid = record(ledger, "ob-1")
    store.close()
    store.close()
    with pytest.raises(StoreError):
        ledger.get(oid)
    with pytest.raises(StoreError):
        record(ledger, "ob-2")
    with pytest.raises(StoreError):
        ledger.sweep_recoverable()
    with pytest.raises(StoreError):
        Ledger(store)


# -- migration of the older layout -------------------------------------------------------------


def _old_database(path: Path) -> None:
    """Write the 13-column layout with rows a crashed old gateway left behind."""
    with raw_connect(path) as raw:
        raw.execute(OLD_LAYOUT)
        raw.executemany(
            "INSERT INTO delivery_obligations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                ("ob-1", "agent:main:slack:channel:C1", "slack", "C1", "171.001",
                 "the final answer", "pending", 0, 1_700_000_000.0, 1_700_000_000.0,
                 999_999_999, 1, None),
                ("ob-2", "agent:main:telegram:dm:7", "telegram", "7", None,
                 "second answer", "failed", 1, 1_700_000_010.0, 1_700_000_020.0,
                 999_999_999, 1, "send_path_degraded"),
                ("ob-3", "agent:main:slack:channel:C3", "slack", "C3", None,
                 "done", "delivered", 0, 1_700_000_030.0, 1_700_000_040.0,
                 999_999_999, 1, None),
            ],
        )  # fmt: skip


def test_old_layout_gains_the_missing_columns_without_losing_data(
    opened: Callable[..., SQLiteStore], db_path: Path
) -> None:
    """Opening the 13-column table adds adapter_profile (and the rest) and keeps every row."""
    _old_database(db_path)
    ledger = Ledger(opened(), clock=FakeClock(1_700_000_100.0))
    with raw_connect(db_path) as raw:
        columns = {r[1] for r in raw.execute("PRAGMA table_info(delivery_obligations)")}
        assert raw.execute("SELECT COUNT(*) FROM delivery_obligations").fetchone()[0] == 3
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert "adapter_profile" in columns
    assert {f.name for f in OBLIGATION_KIND.fields} <= columns
    one = ledger.get("ob-1")
    assert one is not None
    assert (one.state, one.attempts, one.fence, one.adapter_profile) == (
        S.PENDING,
        0,
        0,
        "default",
    )
    assert (one.session_key, one.platform, one.chat_id, one.thread_id, one.content) == (
        "agent:main:slack:channel:C1",
        "slack",
        "C1",
        "171.001",
        "the final answer",
    )
    assert (one.owner.pid, one.owner.started_at, one.owner.host) == (999_999_999, 1, None)
    assert one.created_at == 1_700_000_000.0
    two = ledger.get("ob-2")
    assert two is not None
    assert (two.state, two.attempts, two.last_error) == (S.FAILED, 1, "send_path_degraded")
    three = ledger.get("ob-3")
    assert three is not None
    assert three.state is S.DELIVERED
    assert [o.obligation_id for o in ledger.owed()] == ["ob-1", "ob-2"]


def test_reopening_a_migrated_database_is_a_no_op(
    opened: Callable[..., SQLiteStore], db_path: Path
) -> None:
    """A second open of a migrated file changes neither its columns nor its rows."""
    _old_database(db_path)
    first = opened()
    Ledger(first)
    first.close()
    with raw_connect(db_path) as raw:
        columns = raw.execute("PRAGMA table_info(delivery_obligations)").fetchall()
        rows = raw.execute("SELECT * FROM delivery_obligations ORDER BY 1").fetchall()
    Ledger(opened())
    with raw_connect(db_path) as raw:
        assert raw.execute("PRAGMA table_info(delivery_obligations)").fetchall() == columns
        assert raw.execute("SELECT * FROM delivery_obligations ORDER BY 1").fetchall() == rows


def test_old_dead_owner_rows_are_claimable_after_migration(
    opened: Callable[..., SQLiteStore], db_path: Path
) -> None:
    """Rows a crashed old gateway left behind are claimed by the startup sweep after upgrade."""
    _old_database(db_path)
    ledger = Ledger(opened(), clock=FakeClock(1_700_000_100.0), probe=PsutilProbe())
    claims = {c.obligation_id: c for c in ledger.sweep_recoverable()}
    assert set(claims) == {"ob-1", "ob-2"}
    assert (claims["ob-1"].needs_marker, claims["ob-1"].attempts) == (False, 1)
    assert (claims["ob-2"].needs_marker, claims["ob-2"].attempts) == (True, 2)
    assert claims["ob-1"].profile == "default"
    assert ledger.mark_delivered("ob-1").state is S.DELIVERED


AUDIT_COLUMNS = ("audit_event", "audit_at", "audit_owner", "audit_attempts", "audit_reason")


def _names(raw: sqlite3.Connection, kind: str) -> set[str]:
    rows = raw.execute("SELECT name FROM sqlite_schema WHERE type = ?", (kind,))
    return {r[0] for r in rows}


OWED_V2 = "state IN ('attempting', 'failed', 'pending')"
V2_INDEXES = (
    f"CREATE INDEX delivery_obligations_state_owner_pid_attempting_failed_pending "
    f"ON delivery_obligations(state, owner_pid) WHERE {OWED_V2}",
    f"CREATE INDEX delivery_obligations_owner_pid_obligation_id_attempting_failed_pending "
    f"ON delivery_obligations(owner_pid, obligation_id) WHERE {OWED_V2}",
    "CREATE INDEX delivery_obligations_platform_adapter_profile_failed "
    "ON delivery_obligations(platform, adapter_profile) WHERE state IN ('failed')",
    "CREATE INDEX delivery_obligations_updated_at_abandoned_delivered "
    "ON delivery_obligations(updated_at) WHERE state IN ('abandoned', 'delivered')",
    "CREATE INDEX statecore_audit_entity ON statecore_audit(kind, entity_id, seq)",
)


def _v2_triggers(table: str, kind: str, id_field: str) -> tuple[str, str]:
    columns = "kind, entity_id, event, from_state, to_state, at, owner, attempts, reason"
    new = "NEW.audit_event, {}, NEW.state, NEW.audit_at, NEW.audit_owner, NEW.audit_attempts, "
    new += "NEW.audit_reason"
    return (
        f"CREATE TRIGGER {table}_audit_create AFTER INSERT ON {table} BEGIN INSERT INTO "
        f"statecore_audit ({columns}) VALUES ('{kind}', NEW.{id_field}, {new.format('NULL')}); "
        "END",
        f"CREATE TRIGGER {table}_audit_move AFTER UPDATE OF fence ON {table} BEGIN INSERT INTO "
        f"statecore_audit ({columns}) VALUES ('{kind}', NEW.{id_field}, "
        f"{new.format('OLD.state')}); END",
    )


def _as_version_two(path: Path) -> None:
    """Turn a file this code wrote into the layout of schema version 2: partial indexes over
    ``state``, an audit table indexed by kind and entity and not chained, no audit heads and no
    membership columns; the version 2 triggers."""
    with raw_connect(path) as raw:
        for name in _names(raw, "trigger"):
            raw.execute(f"DROP TRIGGER {name}")
        for name in _names(raw, "index"):
            if not name.startswith("sqlite_autoindex"):
                raw.execute(f"DROP INDEX {name}")
        for table in ("delivery_obligations", "statecore_owners"):
            columns = [r[1] for r in raw.execute(f"PRAGMA table_info({table})")]
            for column in columns:
                if column == "audit_head" or column.startswith("in_"):
                    raw.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        raw.execute("ALTER TABLE statecore_audit DROP COLUMN prev")
        for statement in (
            *V2_INDEXES,
            *_v2_triggers("delivery_obligations", "obligation", "obligation_id"),
            *_v2_triggers("statecore_owners", "owner", "record_id"),
            "CREATE INDEX statecore_owners_owner_token ON statecore_owners(owner_token)",
        ):
            raw.execute(statement)
        raw.execute("PRAGMA user_version = 2")


def _as_version_one(path: Path) -> None:
    """Turn a file this code wrote into the layout of schema version 1: version 2 without
    audit columns or audit triggers (the store wrote each audit entry with its own INSERT)."""
    _as_version_two(path)
    with raw_connect(path) as raw:
        for name in _names(raw, "trigger"):
            raw.execute(f"DROP TRIGGER {name}")
        for table in ("delivery_obligations", "statecore_owners"):
            for column in AUDIT_COLUMNS:
                raw.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        raw.execute("PRAGMA user_version = 1")


def test_a_version_two_file_keeps_its_history_and_chains_new_entries(
    opened: Callable[..., SQLiteStore], db_path: Path
) -> None:
    """A file of schema version 2 opens: its audit table is chained, its tables gain their
    audit heads and membership columns, the partial indexes over ``state`` are replaced, every
    history is kept, later writes extend it, and a prune deletes it."""
    clock = FakeClock(1_700_000_000.0)
    first = ledger_on(opened(), clock)
    kept = record(first, "ob-kept")
    first.mark_attempting(kept)
    first.mark_failed(kept, "connection reset")
    done = record(first, "ob-done")
    first.mark_attempting(done)
    first.mark_delivered(done)
    before = {oid: first.history(oid) for oid in (kept, done)}
    first.store.close()
    _as_version_two(db_path)
    with raw_connect(db_path) as raw:
        assert "statecore_audit_entity" in _names(raw, "index")
    second = ledger_on(opened(), clock)
    with raw_connect(db_path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        indexes = _names(raw, "index")
        heads = raw.execute("SELECT COUNT(*) FROM statecore_audit_heads").fetchone()[0]
        owed = raw.execute(
            "SELECT obligation_id FROM delivery_obligations "
            "WHERE in_attempting_failed_pending IS NOT NULL"
        ).fetchall()
    assert "statecore_audit_entity" not in indexes
    assert not {i for i in indexes if i.endswith("_attempting_failed_pending")} - {
        "delivery_obligations_owner_pid_obligation_id_in_attempting_failed_pending"
    }
    assert heads == 0  # every registered kind took its heads
    assert owed == [(kept,)]
    assert {oid: second.history(oid) for oid in (kept, done)} == before
    claims = second.sweep_failed_for_runtime("slack", now=clock.now() + 3600)
    assert [c.obligation_id for c in claims] == [kept]
    second.mark_delivered(kept)
    after = second.history(kept)
    assert after[: len(before[kept])] == before[kept]
    assert [e.event for e in after[len(before[kept]) :]] == ["claim", "deliver"]
    clock.advance(10 * 86_400)
    assert second.prune() == 2
    with raw_connect(db_path) as raw:
        entries = raw.execute(
            "SELECT COUNT(*) FROM statecore_audit WHERE kind = 'obligation'"
        ).fetchone()[0]
    assert entries == 0


def test_a_version_one_file_keeps_its_history_and_audits_each_write_once(
    opened: Callable[..., SQLiteStore], db_path: Path
) -> None:
    """A file of schema version 1 opens: its kinds gain the audit columns and triggers, every
    row and every history entry written before stays, and each later write adds exactly one
    audit entry (the trigger's), with its event, owner, attempts and reason."""
    clock = FakeClock(1_700_000_000.0)
    first = ledger_on(opened(), clock)
    old = record(first, "ob-old")
    first.mark_attempting(old)
    first.mark_failed(old, "connection reset")
    before = first.history(old)
    first.store.close()
    _as_version_one(db_path)
    second = ledger_on(opened(), clock)
    with raw_connect(db_path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        triggers = _names(raw, "trigger")
    assert {"delivery_obligations_audit_create", "delivery_obligations_audit_move"} <= triggers
    assert second.history(old) == before
    claims = second.sweep_failed_for_runtime("slack", now=clock.now() + 3600)
    assert [c.obligation_id for c in claims] == [old]
    second.mark_delivered(old)
    after = second.history(old)
    assert after[: len(before)] == before
    assert [(e.event, e.from_state, e.to_state) for e in after[len(before) :]] == [
        ("claim", S.FAILED, S.ATTEMPTING),
        ("deliver", S.ATTEMPTING, S.DELIVERED),
    ]
    assert after[-1].owner == second.incarnation.label


def test_each_write_outside_a_block_is_one_statement(opened: Callable[..., SQLiteStore]) -> None:
    """A creation and a transition each cost one statement into SQLite (no BEGIN, no COMMIT,
    no separate audit INSERT: the trigger writes it inside the same statement)."""
    ledger = ledger_on(opened(), FakeClock())
    oid = record(ledger, "ob-warm")  # the kinds' statements prepared
    ledger.mark_attempting(oid)
    statements: list[str] = []
    conn = ledger.store._conn()  # type: ignore[attr-defined]
    conn.set_trace_callback(statements.append)
    try:
        oid = record(ledger, "ob-counted")
        ledger.mark_attempting(oid)
        ledger.mark_delivered(oid)
    finally:
        conn.set_trace_callback(None)
    # The trace repeats a statement's text for each trigger step it runs: count each once.
    ours = [s for i, s in enumerate(statements) if i == 0 or s != statements[i - 1]]
    assert [s.split()[0] for s in ours] == ["INSERT", "UPDATE", "UPDATE"], ours
    assert not any(s.split()[0] in ("BEGIN", "COMMIT") for s in ours)
    assert [e.event for e in ledger.history(oid)] == ["record", "attempt", "deliver"]


# -- locking -----------------------------------------------------------------------------------


def _in_thread(fn: Callable[[], Any]) -> tuple[Any, BaseException | None, float]:
    """Run fn in a worker thread, bounded by GUARD: (result, error, seconds taken)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        start = time.monotonic()
        try:
            outcome["result"] = fn()
        except BaseException as exc:
            outcome["error"] = exc
        outcome["elapsed"] = time.monotonic() - start

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(GUARD)
    assert not worker.is_alive(), "the store call hung past the busy timeout"
    return outcome.get("result"), outcome.get("error"), outcome["elapsed"]


def test_locked_database_raises_store_error_within_the_busy_timeout(
    opened: Callable[..., SQLiteStore], db_path: Path
) -> None:
    """A write blocked by another connection's exclusive lock fails with StoreError, no hang;
    after the lock is gone writes work and nothing partial was written."""
    store = opened(busy_timeout_s=0.2)
    ledger = ledger_on(store)
    with raw_connect(db_path) as locker:
        locker.execute("BEGIN EXCLUSIVE")
        try:
            _, error, elapsed = _in_thread(lambda: record(ledger, "ob-1"))
            start = time.monotonic()
            with pytest.raises(StoreError, match="locked"):
                record(ledger, "ob-2")
            main_elapsed = time.monotonic() - start
        finally:
            locker.execute("ROLLBACK")
    assert isinstance(error, StoreError), error
    assert str(db_path) in str(error)
    assert 0.1 <= elapsed < 3.0
    assert main_elapsed < 3.0
    assert ledger.get("ob-1") is None
    assert ledger.history("ob-1") == []
    assert store.count(OBLIGATION_KIND) == 0
    assert ledger.get(record(ledger, "ob-1")) is not None
    assert [e.event for e in ledger.history("ob-1")] == ["record"]
    ledger.mark_attempting("ob-1")
    assert store.count(OBLIGATION_KIND) == 1


def test_one_connection_per_thread_reused_across_calls(
    opened: Callable[..., SQLiteStore],
) -> None:
    """Two threads using one store hold exactly two connections, each reused for every call."""
    store = opened()
    ledger = ledger_on(store)
    for n in range(5):
        record(ledger, f"main-{n}")
    assert len(store._db.opened) == 1
    mine = store._conn()

    def worker() -> sqlite3.Connection:
        for n in range(5):
            oid = record(ledger, f"worker-{n}")
            ledger.mark_attempting(oid)
            ledger.get(oid)
        return store._conn()

    theirs, error, _ = _in_thread(worker)
    assert error is None
    _, error, _ = _in_thread(lambda: None)  # a thread that never touches the store
    assert error is None
    for n in range(5):
        ledger.mark_attempting(f"main-{n}")
    assert len(store._db.opened) == 2
    assert store._db.opened.count(mine) == 1
    assert store._db.opened.count(theirs) == 1
    assert theirs is not mine
    assert store._conn() is mine
    assert store.count(OBLIGATION_KIND, states=[S.ATTEMPTING]) == 10


# -- open_store --------------------------------------------------------------------------------


def test_open_store_memory() -> None:
    """memory:// opens a new, empty in-memory store each time."""
    first, second = open_store("memory://"), open_store("memory://")
    try:
        assert isinstance(first, InMemoryStore)
        assert first is not second
        record(ledger_on(first), "ob-1")
        assert ledger_on(second).get("ob-1") is None
    finally:
        first.close()
        second.close()


def test_open_store_relative_sqlite_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sqlite:///relative.db opens that file relative to the working directory."""
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite:///sub.db")
    try:
        assert isinstance(store, SQLiteStore)
        assert Path(store.path) == Path("sub.db")
        record(ledger_on(store), "ob-1")
    finally:
        store.close()
    assert (tmp_path / "sub.db").is_file()


def test_open_store_absolute_sqlite_path_with_options(tmp_path: Path) -> None:
    """sqlite:////abs/path.db opens the absolute path; ?synchronous=FULL is applied."""
    path = tmp_path / "abs.db"
    url = "sqlite:///" + str(path) + "?synchronous=FULL&busy_timeout_s=2"
    assert url.startswith("sqlite:////")
    store = open_store(url)
    try:
        assert isinstance(store, SQLiteStore)
        assert Path(store.path) == path
        assert store.synchronous == "FULL"
        assert store._conn().execute("PRAGMA synchronous").fetchone()[0] == 2
        assert store._conn().execute("PRAGMA busy_timeout").fetchone()[0] == 2000
    finally:
        store.close()
    default = open_store("sqlite:///" + str(path))
    try:
        assert isinstance(default, SQLiteStore)
        assert default.synchronous == "NORMAL"
    finally:
        default.close()


def test_open_store_sqlite_page_size_and_checkpoint_pages(tmp_path: Path) -> None:
    """?page_size= sizes the pages of a new file; ?checkpoint_pages= the WAL's threshold."""
    path = tmp_path / "sized.db"
    store = open_store(f"sqlite:///{path}?page_size=4096&checkpoint_pages=100")
    try:
        assert isinstance(store, SQLiteStore)
        assert store._conn().execute("PRAGMA page_size").fetchone()[0] == 4096
        assert store._conn().execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 100
    finally:
        store.close()


@pytest.mark.parametrize(
    "url",
    [
        "mysql://localhost/db",
        "",
        "ledger.db",
        "memory://somewhere",
        "memory://?x=1",
        "sqlite://host/ledger.db",
        "sqlite:///",
        "sqlite://",
        "sqlite:///x.db?synchronous=OFF",
        "sqlite:///x.db?journal=delete",
        "sqlite:///x.db?busy_timeout_s=soon",
        "sqlite:///x.db?page_size=big",
        "sqlite:///x.db?page_size=1000",
        "sqlite:///x.db?checkpoint_pages=0",
        "sqlite:///x.db?checkpoint_pages=1.5",
    ],
)
def test_open_store_rejects_bad_urls(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unsupported schemes and malformed URLs raise ValueError and create no file."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"\S"):
        open_store(url)
    assert list(tmp_path.iterdir()) == []


def test_open_store_missing_directory_raises_store_error(tmp_path: Path) -> None:
    """A sqlite URL into a missing directory raises StoreError."""
    with pytest.raises(StoreError):
        open_store("sqlite:///" + str(tmp_path / "missing" / "x.db"))

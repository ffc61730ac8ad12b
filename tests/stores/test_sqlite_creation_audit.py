"""How the SQLite store audits a creation (layout version 4), and how an older file's creation
trigger is replaced.

A creation names its audit entry's seq in the row (``audit_head``) and sets its membership
columns itself, so its trigger only appends the entry; an INSERT that does neither (from outside
the store) is still audited and chained, by a second trigger.  A version 3 file, whose one
creation trigger wrote the row a second time, gets the current triggers when its kind is
registered, its histories kept.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import stores._sqlite_sql as sql
from statecore import OBLIGATION_KIND, Audit, FakeClock, Ledger, ObligationState
from statecore.batch import Creation
from stores import SQLiteStore
from stores.sqlite import SCHEMA_VERSION

S = ObligationState
TABLE = OBLIGATION_KIND.table


def _raw(path: Path) -> contextlib.closing[sqlite3.Connection]:
    return contextlib.closing(sqlite3.connect(path, isolation_level=None))


def _record(ledger: Ledger, oid: str) -> None:
    ledger.record(
        obligation_id=oid,
        session_key=f"sk:{oid}",
        platform="slack",
        chat_id="C1",
        content=f"answer {oid}",
    )


def _row(path: Path, oid: str) -> tuple[int, int | None, int | None, int | None]:
    """The row's audit head and membership columns (owed, failed, settled)."""
    with _raw(path) as raw:
        found = raw.execute(
            f"SELECT audit_head, in_attempting_failed_pending, in_failed, in_abandoned_delivered "
            f"FROM {TABLE} WHERE obligation_id = ?",
            (oid,),
        ).fetchone()
    assert found is not None
    head, owed, failed, settled = found
    return int(head), owed, failed, settled


def _last_seq(path: Path) -> int:
    with _raw(path) as raw:
        return int(raw.execute("SELECT MAX(seq) FROM statecore_audit").fetchone()[0])


def _triggers(path: Path) -> dict[str, str]:
    with _raw(path) as raw:
        return dict(
            raw.execute(
                "SELECT name, sql FROM sqlite_schema WHERE type = 'trigger' AND tbl_name = ?",
                (TABLE,),
            ).fetchall()
        )


def test_a_creation_names_its_entry_and_sets_its_membership_in_one_write(tmp_path: Path) -> None:
    """The created row's audit head is its creation entry, its owed column is set and the
    others are not; each later move chains to it; a batch of creations names distinct entries."""
    path = tmp_path / "ledger.db"
    with SQLiteStore(path) as store:
        ledger = Ledger(store, clock=FakeClock())
        _record(ledger, "ob-1")
        assert _row(path, "ob-1") == (_last_seq(path), 1, None, None)
        ledger.mark_attempting("ob-1")
        ledger.mark_delivered("ob-1")
        assert _row(path, "ob-1") == (_last_seq(path), None, None, 1)
        assert [(e.event, e.from_state, e.to_state) for e in ledger.history("ob-1")] == [
            ("record", None, S.PENDING),
            ("attempt", S.PENDING, S.ATTEMPTING),
            ("deliver", S.ATTEMPTING, S.DELIVERED),
        ]
        before = _last_seq(path)
        creations = [
            Creation(
                f"ob-b{i}",
                {
                    "session_key": "sk",
                    "platform": "slack",
                    "chat_id": "C1",
                    "content": f"answer {i}",
                    "created_at": 1.0,
                    "updated_at": 1.0,
                },
                "record",
                Audit(1.0, "test", 0, None),
            )
            for i in range(3)
        ]
        outcomes = store.insert_each(OBLIGATION_KIND, creations)
        assert all(isinstance(o, tuple) and o[1] for o in outcomes)
        heads = [_row(path, f"ob-b{i}")[0] for i in range(3)]
        assert len(set(heads)) == 3
        assert min(heads) > before
        for i in range(3):
            assert [e.event for e in ledger.history(f"ob-b{i}")] == ["record"]
            assert _row(path, f"ob-b{i}")[1:] == (1, None, None)


def test_an_insert_from_outside_the_store_is_still_audited_and_chained(tmp_path: Path) -> None:
    """An INSERT naming no audit entry (an operator's, say) gets its entry, its head and its
    membership columns from the second creation trigger, and the store moves it as any row."""
    path = tmp_path / "ledger.db"
    with SQLiteStore(path) as store:
        ledger = Ledger(store, clock=FakeClock())
        _record(ledger, "ob-1")
        with _raw(path) as raw:
            raw.execute(
                f"INSERT INTO {TABLE} (obligation_id, state, session_key, platform, chat_id, "
                "content, created_at, updated_at, owner_token, audit_event, audit_at) "
                "SELECT 'ob-2', 'pending', 'sk', 'slack', 'C1', 'hi', created_at, updated_at, "
                f"owner_token, 'record', audit_at FROM {TABLE} WHERE obligation_id = 'ob-1'"
            )
        assert _row(path, "ob-2") == (_last_seq(path), 1, None, None)
        ledger.mark_attempting("ob-2")
        assert [(e.event, e.to_state) for e in ledger.history("ob-2")] == [
            ("record", S.PENDING),
            ("attempt", S.ATTEMPTING),
        ]


def test_a_version_three_file_gets_the_current_triggers_and_keeps_its_history(
    tmp_path: Path,
) -> None:
    """A file whose creation trigger is version 3's (one trigger, writing the row twice) opens
    at this version: that trigger is replaced by the current ones, histories written before
    stay, and new creations are audited once and chained."""
    path = tmp_path / "ledger.db"
    current = dict(sql.audit_trigger_sql(OBLIGATION_KIND))
    with SQLiteStore(path) as store:
        ledger = Ledger(store, clock=FakeClock())
        _record(ledger, "ob-old")
        ledger.mark_attempting("ob-old")
        before = ledger.history("ob-old")
    members = ", ".join(
        f"{column} = CASE WHEN NEW.state IN ({sql.literals(states)}) THEN 1 END"
        for states, column in sql.member_columns(OBLIGATION_KIND).items()
    )
    with _raw(path) as raw:  # version 3's creation trigger
        raw.execute(f"DROP TRIGGER {TABLE}_audit_create")
        raw.execute(f"DROP TRIGGER {TABLE}_audit_create_bare")
        raw.execute(
            f"CREATE TRIGGER {TABLE}_audit_create AFTER INSERT ON {TABLE} BEGIN INSERT INTO "
            "statecore_audit (prev, kind, entity_id, event, from_state, to_state, at, owner, "
            "attempts, reason) VALUES (NULL, 'obligation', NEW.obligation_id, NEW.audit_event, "
            "NULL, NEW.state, NEW.audit_at, NEW.audit_owner, NEW.audit_attempts, "
            f"NEW.audit_reason); UPDATE {TABLE} SET audit_head = last_insert_rowid(), {members} "
            "WHERE rowid = NEW.rowid; END"
        )
        raw.execute("PRAGMA user_version = 3")
    assert _triggers(path) != current
    with SQLiteStore(path) as store:
        ledger = Ledger(store, clock=FakeClock())
        assert _triggers(path) == current
        with _raw(path) as raw:
            assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert ledger.history("ob-old") == before
        ledger.mark_delivered("ob-old")
        assert [e.event for e in ledger.history("ob-old")] == ["record", "attempt", "deliver"]
        entries = _last_seq(path)
        _record(ledger, "ob-new")
        assert _last_seq(path) == entries + 1  # exactly one entry for the creation
        assert _row(path, "ob-new") == (entries + 1, 1, None, None)
        assert [e.event for e in ledger.history("ob-new")] == ["record"]

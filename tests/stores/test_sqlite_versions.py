"""SQLiteStore's versioned lifecycles on real files.

* register() of a newer version moves the rows of old states (a rename, a merge and a removed
  state with a target) in its transaction: fences + 1, one ``migrate`` audit entry per moved
  row naming the versions and states, entered times kept (timers still due), older audit
  entries read through the lifecycle's migrations;
* a migration that leaves states unmapped is refused with ``MigrationError`` and changes
  nothing (rows, catalog, history, triggers -- read by a store opened afresh);
* a store object still on version 1 is refused by the file's triggers after version 2 was
  registered by another (``StaleVersion``: creating or moving into a removed state, reading a
  migrated row, registering version 1);
* registering version 2 again is a no-op; version-1 kinds get no version trigger.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest

import stores._sqlite_sql as sql
from statecore import Migration
from statecore.entity import EntityKind, Field, Index
from statecore.errors import MigrationError, StaleVersion
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit
from stores import SQLiteStore
from stores._versions import MIGRATE_EVENT, MIGRATION_OWNER


class V1(StrEnum):
    """Version 1 of the case lifecycle."""

    NEW = "new"
    PENDING = "pending"
    WAITING = "waiting"
    HELD = "held"
    REVIEW = "review"
    CLOSED = "closed"


class V2(StrEnum):
    """Version 2: pending renamed queued, waiting and held merged into blocked, review gone."""

    NEW = "new"
    QUEUED = "queued"
    BLOCKED = "blocked"
    CLOSED = "closed"


MAPPING = {"pending": V2.QUEUED, "waiting": V2.BLOCKED, "held": V2.BLOCKED, "review": V2.NEW}

LC1 = Lifecycle(
    "case",
    V1,
    initial=V1.REVIEW,
    terminal=(V1.CLOSED,),
    transitions=(
        Transition("file", None, V1.REVIEW),
        Transition("queue", V1.NEW, V1.PENDING),
        Transition("wait", V1.NEW, V1.WAITING),
        Transition("hold", V1.NEW, V1.HELD),
        Transition("accept", V1.REVIEW, V1.NEW),
        Transition("nudge", V1.PENDING, V1.CLOSED, after=60),
        Transition("close", (V1.NEW, V1.WAITING, V1.HELD), V1.CLOSED),
    ),
)


def lifecycle_v2(mapping: dict[str, V2]) -> Lifecycle[V2]:
    """Version 2 of the case lifecycle, migrating from version 1 by ``mapping``."""
    return Lifecycle(
        "case",
        V2,
        initial=V2.NEW,
        terminal=(V2.CLOSED,),
        transitions=(
            Transition("open", None, V2.NEW),
            Transition("queue", V2.NEW, V2.QUEUED),
            Transition("block", V2.NEW, V2.BLOCKED),
            Transition("nudge", V2.QUEUED, V2.CLOSED, after=60),
            Transition("close", (V2.NEW, V2.BLOCKED), V2.CLOSED),
        ),
        version=2,
        migrations=(Migration(1, mapping),),
    )


def case_kind(lifecycle: Lifecycle[Any]) -> EntityKind[Any]:
    """The case kind over ``lifecycle``."""
    return EntityKind(
        "case", lifecycle, table="cases", id_field="case_id", fields=(Field("note", str),)
    )


KIND1 = case_kind(LC1)
KIND2 = case_kind(lifecycle_v2(MAPPING))
NUDGE1 = KIND1.lifecycle.timers[0]
NUDGE2 = KIND2.lifecycle.timers[0]

SETUP = {
    "c-new": ["accept"],
    "c-pending": ["accept", "queue"],
    "c-waiting": ["accept", "wait"],
    "c-held": ["accept", "hold"],
    "c-review": [],
    "c-closed": ["accept", "close"],
    "c-pending2": ["accept", "queue"],
}
"""Each row: the moves after its creation (``file``, at 100), at 101, 102, ..."""

MOVED = {"c-pending": "queued", "c-pending2": "queued", "c-waiting": "blocked"}
MOVED |= {"c-held": "blocked", "c-review": "new"}
OLD = {"c-pending": "pending", "c-pending2": "pending", "c-waiting": "waiting"}
OLD |= {"c-held": "held", "c-review": "review"}


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "versions.db"


@pytest.fixture
def open_store(path: Path) -> Iterator[Any]:
    """Opens stores on ``path`` (closed at the end of the test)."""
    opened: list[SQLiteStore] = []

    def make() -> SQLiteStore:
        store = SQLiteStore(path)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def populate(store: SQLiteStore) -> None:
    """Version 1 rows in every state of :data:`SETUP`, created at 100, moved at 101, ..."""
    store.register(KIND1)
    for case_id, moves in SETUP.items():
        store.insert(KIND1, case_id, {"note": case_id}, event="file", audit=Audit(at=100.0))
        for i, event in enumerate(moves):
            store.transition(KIND1, case_id, event, audit=Audit(at=101.0 + i))


def raw_rows(path: Path) -> list[tuple[Any, ...]]:
    """The table, the audit table, the catalog and the schema, as read by the driver alone."""
    with sqlite3.connect(path) as conn:
        return [
            *conn.execute("SELECT * FROM cases ORDER BY case_id"),
            *conn.execute("SELECT * FROM statecore_audit ORDER BY seq"),
            *conn.execute("SELECT * FROM statecore_kinds ORDER BY name"),
            *conn.execute("SELECT type, name, sql FROM sqlite_schema ORDER BY name"),
        ]


def test_registering_version_2_migrates_every_row_of_an_old_state(open_store: Any) -> None:
    old = open_store()
    populate(old)
    before = {r.id: r for r in old.select(KIND1)}
    old.close()

    store = open_store()
    store.register(KIND2)
    rows = {r.id: r for r in store.select(KIND2)}
    assert {i: r.state.value for i, r in rows.items()} == {
        **MOVED,
        "c-new": "new",
        "c-closed": "closed",
    }
    for case_id, row in rows.items():
        assert row.fence == before[case_id].fence + (1 if case_id in MOVED else 0)
        assert row.values == {"note": case_id}
    for case_id, new in MOVED.items():
        history = store.history(KIND2, case_id)
        last = history[-1]
        assert last.event == MIGRATE_EVENT
        assert last.owner == MIGRATION_OWNER
        assert last.from_state is not None
        assert last.from_state.value == new  # the old value decodes through the migration
        assert last.to_state == V2(new)
        assert last.at > 1_000_000  # the registration's wall time, not the rows' FakeClock
        assert last.reason == f"lifecycle case version 1 -> 2: {OLD[case_id]!r} -> {new!r}"
        assert [r.event for r in history[:-1]] == ["file", *SETUP[case_id]]
        # Older entries are read through the lifecycle's migrations.
        assert history[-2].to_state == V2(new)
    for case_id in ("c-new", "c-closed"):
        assert MIGRATE_EVENT not in [r.event for r in store.history(KIND2, case_id)]
    [record] = store.catalog()
    assert (record.name, record.version) == ("case", 2)
    # Entered times kept: the queued rows entered at 102, so the 60 s timer is due at 162.
    assert store.due_timers(KIND2, NUDGE2, now=161.9, limit=10) == []
    due = store.due_timers(KIND2, NUDGE2, now=162.0, limit=10)
    assert [(d.row.id, d.entered_at, d.due_at) for d in due] == [
        ("c-pending", 102.0, 162.0),
        ("c-pending2", 102.0, 162.0),
    ]
    # Counts per state and moves from the new states work as on any row.
    assert store.count(KIND2, states=[V2.BLOCKED]) == 2
    moved = store.transition(KIND2, "c-held", "close", audit=Audit(at=200.0), fence=3)
    assert moved.state is V2.CLOSED


def test_an_unmapped_state_refuses_registration_and_changes_nothing(
    open_store: Any, path: Path
) -> None:
    old = open_store()
    populate(old)
    old.close()
    before = raw_rows(path)

    store = open_store()
    partial = case_kind(lifecycle_v2({"pending": V2.QUEUED, "waiting": V2.BLOCKED}))
    with pytest.raises(MigrationError) as refused:
        store.register(partial)
    assert refused.value.states == ("held", "review")
    assert "held" in str(refused.value)
    assert "review" in str(refused.value)
    store.close()

    assert raw_rows(path) == before
    again = open_store()
    [record] = again.catalog()
    assert record.version == 1
    again.register(KIND1)  # version 1 still works on the untouched file
    assert again.get(KIND1, "c-held") is not None
    assert [r.event for r in again.history(KIND1, "c-held")] == ["file", "accept", "hold"]


def test_a_version_1_store_is_refused_once_version_2_is_registered(open_store: Any) -> None:
    old = open_store()
    populate(old)
    new = open_store()
    new.register(KIND2)

    # Creating in, or moving into, a state version 2 removed: refused by the file.
    with pytest.raises(StaleVersion) as refused:
        old.insert(KIND1, "c-late", {"note": ""}, event="file", audit=Audit(at=300.0))
    assert (refused.value.lifecycle, refused.value.ours, refused.value.stored) == ("case", 1, 2)
    assert "declares version 1, the store holds version 2" in str(refused.value)
    for event in ("hold", "queue"):  # into removed states, from a kept one
        with pytest.raises(StaleVersion):
            old.transition(KIND1, "c-new", event, audit=Audit(at=301.0))
    assert new.get(KIND2, "c-late") is None
    row = new.get(KIND2, "c-new")
    assert row is not None
    assert (row.state, row.fence) == (V2.NEW, 1)
    # A move between states both versions declare is not refused.
    assert old.transition(KIND1, "c-new", "close", audit=Audit(at=302.0)).state is V1.CLOSED

    # Reading a migrated row names the versions, not a bare ValueError.
    with pytest.raises(StaleVersion, match="declares version 1, the store holds version 2"):
        old.get(KIND1, "c-held")

    # A fresh version-1 process cannot register any more.
    with pytest.raises(StaleVersion):
        open_store().register(KIND1)
    [record] = new.catalog()
    assert record.version == 2


def test_registering_version_2_again_is_a_no_op(open_store: Any, path: Path) -> None:
    first = open_store()
    populate(first)
    first.close()
    second = open_store()
    second.register(KIND2)
    second.close()
    before = raw_rows(path)
    third = open_store()
    third.register(KIND2)
    third.close()
    assert raw_rows(path) == before


def test_version_triggers_only_for_version_2(open_store: Any, path: Path) -> None:
    store = open_store()
    store.register(KIND1)
    with sqlite3.connect(path) as conn:
        names = {n for (n,) in conn.execute("SELECT name FROM sqlite_schema WHERE type='trigger'")}
    assert not any("_version_" in n for n in names)
    store.close()
    store = open_store()
    store.register(KIND2)
    with sqlite3.connect(path) as conn:
        names = {n for (n,) in conn.execute("SELECT name FROM sqlite_schema WHERE type='trigger'")}
    assert {"cases_version_insert", "cases_version_update"} <= names
    # The new version's own states pass the triggers.
    store.insert(KIND2, "n-1", {"note": ""}, event="open", audit=Audit(at=1.0))
    assert store.transition(KIND2, "n-1", "queue", audit=Audit(at=2.0)).state is V2.QUEUED


def test_a_migration_sets_the_new_versions_membership_columns(open_store: Any, path: Path) -> None:
    owed = frozenset({V2.QUEUED, V2.BLOCKED})
    indexed = EntityKind(
        "case",
        KIND2.lifecycle,
        table="cases",
        id_field="case_id",
        fields=(Field("note", str),),
        indexes=(Index(("note",), owed),),
    )
    [column] = sql.member_columns(indexed).values()
    old = open_store()
    populate(old)
    old.close()
    store = open_store()
    store.register(indexed)
    with sqlite3.connect(path) as conn:
        members = dict(conn.execute(f"SELECT state, {column} FROM cases"))
    assert members == {"new": None, "queued": 1, "blocked": 1, "closed": None}
    # A select over the partial index's states finds exactly the moved rows.
    found = store.select(indexed, states=owed, where={"note": "c-held"})
    assert [r.id for r in found] == ["c-held"]
    assert store.count(indexed, states=owed) == 4


class V3(StrEnum):
    """Version 3: blocked renamed stuck."""

    NEW = "new"
    QUEUED = "queued"
    STUCK = "stuck"
    CLOSED = "closed"


V1_TO_V3 = {"pending": V3.QUEUED, "waiting": V3.STUCK, "held": V3.STUCK, "review": V3.NEW}
"""Version 3 maps every state version 1 had and it lacks (its audit entries decode by it)."""

KIND3 = case_kind(
    Lifecycle(
        "case",
        V3,
        initial=V3.NEW,
        terminal=(V3.CLOSED,),
        transitions=(
            Transition("open", None, V3.NEW),
            Transition("queue", V3.NEW, V3.QUEUED),
            Transition("block", V3.NEW, V3.STUCK),
            Transition("close", (V3.NEW, V3.QUEUED, V3.STUCK), V3.CLOSED),
        ),
        version=3,
        migrations=(
            Migration(1, V1_TO_V3),
            Migration(2, {"blocked": V3.STUCK}),
        ),
    )
)


def test_version_3_migrates_past_version_2s_triggers(open_store: Any) -> None:
    store = open_store()
    populate(store)
    store.close()
    second = open_store()
    second.register(KIND2)
    second.close()
    third = open_store()
    third.register(KIND3)  # version 2's triggers, which refuse "stuck", are replaced first
    row = third.get(KIND3, "c-waiting")
    assert row is not None
    assert (row.state, row.fence) == (V3.STUCK, 4)
    history = third.history(KIND3, "c-waiting")
    assert [r.event for r in history] == ["file", "accept", "wait", MIGRATE_EVENT, MIGRATE_EVENT]
    # Values of versions 1 and 2 both decode through the migrations.
    assert [r.to_state for r in history[2:]] == [V3.STUCK, V3.STUCK, V3.STUCK]
    assert history[-1].reason == "lifecycle case version 2 -> 3: 'blocked' -> 'stuck'"
    with pytest.raises(StaleVersion):  # a version 2 process is refused in turn
        open_store().register(KIND2)

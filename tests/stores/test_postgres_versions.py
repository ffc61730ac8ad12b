"""PostgresStore's versioned lifecycles on a real server.

* register() of a newer version moves the rows of old states (a rename, a merge and a removed
  state with a target) in its transaction: fences + 1, one ``migrate`` audit entry per moved
  row naming the versions and states, entered times kept (timers still due), older audit
  entries read through the lifecycle's migrations;
* a migration that leaves states unmapped is refused with ``MigrationError`` and changes
  nothing (rows, catalog, history, constraints -- read by a store opened afresh);
* a store object still on version 1 is refused by the server after version 2 was registered by
  another (``StaleVersion``: creating or moving into a removed state, reading a migrated row,
  registering version 1);
* registering version 2 again is a no-op; version-1 kinds get no constraint.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import psycopg
import pytest

from statecore import Migration
from statecore.entity import EntityKind, Field
from statecore.errors import MigrationError, StaleVersion
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit
from stores._postgres_versions import CONSTRAINT
from stores._versions import MIGRATE_EVENT, MIGRATION_OWNER
from stores.postgres import PostgresStore


class V1(StrEnum):
    """Version 1 of the case lifecycle."""

    DRAFT = "draft"
    PENDING = "pending"
    WAITING = "waiting"
    HELD = "held"
    REVIEW = "review"
    CLOSED = "closed"


class V2(StrEnum):
    """Version 2: draft renamed new, pending renamed queued, waiting and held merged into
    blocked, review removed (its rows go to new)."""

    NEW = "new"
    QUEUED = "queued"
    BLOCKED = "blocked"
    CLOSED = "closed"


MAPPING = {
    "draft": V2.NEW,
    "pending": V2.QUEUED,
    "waiting": V2.BLOCKED,
    "held": V2.BLOCKED,
    "review": V2.NEW,
}

LC1 = Lifecycle(
    "vc_case",
    V1,
    initial=V1.DRAFT,
    terminal=(V1.CLOSED,),
    transitions=(
        Transition("open", None, V1.DRAFT),
        Transition("queue", V1.DRAFT, V1.PENDING),
        Transition("wait", V1.DRAFT, V1.WAITING),
        Transition("hold", V1.DRAFT, V1.HELD),
        Transition("file", V1.DRAFT, V1.REVIEW),
        Transition("nudge", V1.PENDING, V1.CLOSED, after=60),
        Transition("close", (V1.DRAFT, V1.WAITING, V1.HELD, V1.REVIEW), V1.CLOSED),
    ),
)


def lifecycle_v2(mapping: dict[str, V2]) -> Lifecycle[V2]:
    """Version 2 of the case lifecycle, migrating from version 1 by ``mapping``."""
    return Lifecycle(
        "vc_case",
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
        "vc_case", lifecycle, table="vc_cases", id_field="case_id", fields=(Field("note", str),)
    )


KIND1 = case_kind(LC1)
KIND2 = case_kind(lifecycle_v2(MAPPING))
NUDGE2 = KIND2.lifecycle.timers[0]
NUDGE1 = KIND1.lifecycle.timers[0]

SETUP = {
    "c-new": ("open", []),
    "c-pending": ("open", ["queue"]),
    "c-waiting": ("open", ["wait"]),
    "c-held": ("open", ["hold"]),
    "c-review": ("open", ["file"]),
    "c-closed": ("open", ["close"]),
    "c-pending2": ("open", ["queue"]),
}
"""Each row: its creation event and the moves after it (at 100, 101, ...)."""


@pytest.fixture
def schema() -> str:
    """A schema no other test uses."""
    return f"vc_{uuid.uuid4().hex[:16]}"


@pytest.fixture
def open_store(postgres_url: str, schema: str) -> Iterator[Any]:
    """Opens stores on ``schema`` (closed at the end of the test)."""
    opened: list[PostgresStore] = []

    def make() -> PostgresStore:
        store = PostgresStore(postgres_url, schema=schema, pool_size=3)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def admin(postgres_url: str, schema: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection of its own on ``schema``."""
    with psycopg.connect(
        postgres_url, autocommit=True, connect_timeout=5, options=f"-c search_path={schema}"
    ) as conn:
        yield conn


@pytest.fixture
def v1(open_store: Any) -> PostgresStore:
    """A store with version 1 registered and the rows of :data:`SETUP` written."""
    store: PostgresStore = open_store()
    store.register(KIND1)
    for case_id, (creation, moves) in SETUP.items():
        store.insert(KIND1, case_id, {}, event=creation, audit=Audit(100.0))
        for i, event in enumerate(moves):
            store.transition(KIND1, case_id, event, audit=Audit(101.0 + i, owner="w"))
    return store


def snapshot(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    """Rows, audit, catalog and constraints of the schema, as the server holds them."""
    rows = conn.execute(
        "SELECT case_id, state, fence, entered_at FROM vc_cases ORDER BY case_id"
    ).fetchall()
    audit = conn.execute("SELECT * FROM statecore_audit ORDER BY seq").fetchall()
    kinds = conn.execute("SELECT * FROM statecore_kinds ORDER BY name").fetchall()
    return rows, audit, kinds, constraints(conn)


def constraints(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    """The CHECK constraints of the cases table: name and definition."""
    return conn.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = 'vc_cases'::regclass AND contype = 'c' ORDER BY conname"
    ).fetchall()


def test_registering_v2_migrates_every_row_in_one_transaction(
    v1: PostgresStore, open_store: Any, admin: psycopg.Connection[Any]
) -> None:
    """Rows of old states moved (rename, merge, removed state), fences + 1, one migrate entry
    each with the reason; unmoved rows untouched; history reads old values; timers due."""
    before = {r.id: r for r in v1.select(KIND1)}
    entered_before = dict(admin.execute("SELECT case_id, entered_at FROM vc_cases").fetchall())
    assert constraints(admin) == []  # version 1: no constraint
    new = open_store()
    start = time.time()
    new.register(KIND2)
    end = time.time()
    after = {r.id: r for r in new.select(KIND2)}
    assert {i: r.state for i, r in after.items()} == {
        "c-new": V2.NEW,
        "c-pending": V2.QUEUED,
        "c-pending2": V2.QUEUED,
        "c-waiting": V2.BLOCKED,
        "c-held": V2.BLOCKED,
        "c-review": V2.NEW,
        "c-closed": V2.CLOSED,
    }
    moved = {"c-new", "c-pending", "c-pending2", "c-waiting", "c-held", "c-review"}
    for case_id, row in after.items():
        assert row.fence == before[case_id].fence + (1 if case_id in moved else 0), case_id
    entered_after = dict(admin.execute("SELECT case_id, entered_at FROM vc_cases").fetchall())
    assert entered_after == entered_before  # entered times kept
    migrations = admin.execute(
        "SELECT entity_id, from_state, to_state, at, owner, attempts, reason "
        "FROM statecore_audit WHERE event = %s ORDER BY seq",
        (MIGRATE_EVENT,),
    ).fetchall()
    assert [m[:3] for m in migrations] == [
        ("c-held", "held", "blocked"),
        ("c-new", "draft", "new"),
        ("c-pending", "pending", "queued"),
        ("c-pending2", "pending", "queued"),
        ("c-review", "review", "new"),
        ("c-waiting", "waiting", "blocked"),
    ]
    for _, old, new_value, at, owner, attempts, reason in migrations:
        assert start <= at <= end
        assert (owner, attempts) == (MIGRATION_OWNER, None)
        assert reason == f"lifecycle vc_case version 1 -> 2: {old!r} -> {new_value!r}"
    history = new.history(KIND2, "c-pending")
    assert [(h.event, h.from_state, h.to_state) for h in history] == [
        ("open", None, V2.NEW),  # written as "draft", read through the migration
        ("queue", V2.NEW, V2.QUEUED),  # "draft" -> "pending"
        (MIGRATE_EVENT, V2.QUEUED, V2.QUEUED),
    ]
    assert [(h.at, h.owner) for h in history[:2]] == [(100.0, None), (101.0, "w")]
    review = new.history(KIND2, "c-review")
    assert [(h.event, h.from_state, h.to_state) for h in review] == [
        ("open", None, V2.NEW),
        ("file", V2.NEW, V2.NEW),  # "draft" -> "review"
        (MIGRATE_EVENT, V2.NEW, V2.NEW),
    ]
    due = new.due_timers(KIND2, NUDGE2, now=161.0, limit=10)
    assert [(d.row.id, d.entered_at, d.due_at) for d in due] == [
        ("c-pending", 101.0, 161.0),
        ("c-pending2", 101.0, 161.0),
    ]
    assert new.due_timers(KIND2, NUDGE2, now=160.5, limit=10) == []
    (record,) = [r for r in new.catalog() if r.name == "vc_case"]
    assert record.version == 2
    assert constraints(admin) == [
        (
            f"{CONSTRAINT}2",
            "CHECK ((state = ANY (ARRAY['blocked'::text, 'closed'::text, 'new'::text, "
            "'queued'::text])))",
        )
    ]
    fired = new.transition(KIND2, "c-pending", "nudge", fence=after["c-pending"].fence,
                           audit=Audit(161.0))  # fmt: skip
    assert fired.state is V2.CLOSED


def test_an_unmapped_migration_is_refused_and_changes_nothing(
    v1: PostgresStore, open_store: Any, admin: psycopg.Connection[Any]
) -> None:
    """MigrationError names every state nothing maps; rows, audit, catalog and constraints
    are as before, seen by a store opened afterwards too."""
    before = snapshot(admin)
    partial = case_kind(lifecycle_v2({"pending": V2.QUEUED}))
    with pytest.raises(MigrationError) as caught:
        open_store().register(partial)
    assert caught.value.states == ("draft", "held", "review", "waiting")
    assert (caught.value.from_version, caught.value.to_version) == (1, 2)
    assert "'draft', 'held', 'review', 'waiting'" in str(caught.value)
    assert snapshot(admin) == before
    reopened = open_store()
    reopened.register(KIND1)
    assert [r.version for r in reopened.catalog() if r.name == "vc_case"] == [1]
    assert {r.id: r.state for r in reopened.select(KIND1)}["c-review"] is V1.REVIEW
    assert len(reopened.history(KIND1, "c-pending")) == 2
    assert snapshot(admin) == before


def test_a_v1_store_is_refused_after_v2_was_registered(
    v1: PostgresStore, open_store: Any, admin: psycopg.Connection[Any]
) -> None:
    """The server refuses the old process's writes of removed states (StaleVersion naming the
    lifecycle and both versions) and writes nothing; reading a migrated row, moving one and
    registering version 1 raise StaleVersion too."""
    open_store().register(KIND2)
    before = snapshot(admin)
    with pytest.raises(StaleVersion) as caught:
        v1.insert(KIND1, "c-late", {}, event="open", audit=Audit(200.0))  # "draft"
    assert (caught.value.lifecycle, caught.value.ours, caught.value.stored) == ("vc_case", 1, 2)
    assert "declares version 1, the store holds version 2" in str(caught.value)
    with pytest.raises(StaleVersion), v1.atomic():
        v1.insert(KIND1, "c-late2", {}, event="open", audit=Audit(200.0))
    with pytest.raises(StaleVersion):
        v1.transition(KIND1, "c-new", "wait", audit=Audit(200.0))  # "c-new" is in "new"
    assert snapshot(admin) == before
    with pytest.raises(StaleVersion) as read:
        v1.get(KIND1, "c-pending")  # now "queued": not a state of version 1
    assert "'queued'" in str(read.value)
    with pytest.raises(StaleVersion) as registering:
        open_store().register(KIND1)
    assert (registering.value.ours, registering.value.stored) == (1, 2)
    assert snapshot(admin) == before


def test_registering_v2_again_is_a_no_op(
    v1: PostgresStore, open_store: Any, admin: psycopg.Connection[Any]
) -> None:
    """A second registration of version 2 (another store object) moves nothing, writes no
    audit entry and keeps the catalog record and the constraint."""
    open_store().register(KIND2)
    before = snapshot(admin)
    again = open_store()
    again.register(KIND2)
    assert snapshot(admin) == before
    assert again.get(KIND2, "c-waiting") is not None


def test_a_version_1_kind_gets_no_constraint_and_keeps_its_states(
    open_store: Any, admin: psycopg.Connection[Any]
) -> None:
    """Registering version 1 (twice) places no constraint and moves nothing."""
    store = open_store()
    store.register(KIND1)
    store.insert(KIND1, "a", {}, event="open", audit=Audit(1.0))
    store.transition(KIND1, "a", "file", audit=Audit(2.0))
    open_store().register(KIND1)
    assert constraints(admin) == []
    assert store.due_timers(KIND1, NUDGE1, now=None, limit=5) == []
    assert [h.event for h in store.history(KIND1, "a")] == ["open", "file"]
    assert store.get(KIND1, "a") is not None

"""InMemoryStore's versioned lifecycles: a newer version registered on the same store object
migrates its rows as the SQL stores do (fence + 1, one ``migrate`` entry per moved row,
entered times kept, older entries read in the new states); an unmapped state or an older
version is refused with nothing changed."""

from __future__ import annotations

from enum import StrEnum

import pytest

from statecore import Audit, EntityKind, Field, Lifecycle, Migration, Transition
from statecore.errors import MigrationError, StaleVersion
from stores import InMemoryStore
from stores._versions import MIGRATE_EVENT, MIGRATION_OWNER


class V1(StrEnum):
    NEW = "new"
    PENDING = "pending"
    WAITING = "waiting"
    CLOSED = "closed"


class V2(StrEnum):
    NEW = "new"
    QUEUED = "queued"
    CLOSED = "closed"


def kind_v1() -> EntityKind[V1]:
    lc = Lifecycle(
        "case",
        V1,
        initial=V1.NEW,
        terminal=(V1.CLOSED,),
        transitions=(
            Transition("file", None, V1.NEW),
            Transition("queue", V1.NEW, V1.PENDING),
            Transition("wait", V1.NEW, V1.WAITING),
            Transition("close", (V1.PENDING, V1.WAITING), V1.CLOSED, after=60),
        ),
    )
    return EntityKind("case", lc, table="cases", id_field="case_id", fields=(Field("n", int),))


def kind_v2(mapping: dict[str, V2]) -> EntityKind[V2]:
    lc = Lifecycle(
        "case",
        V2,
        initial=V2.NEW,
        terminal=(V2.CLOSED,),
        version=2,
        migrations=[Migration(1, mapping)],
        transitions=(
            Transition("file", None, V2.NEW),
            Transition("queue", V2.NEW, V2.QUEUED),
            Transition("close", V2.QUEUED, V2.CLOSED, after=60),
        ),
    )
    return EntityKind(
        "case",
        lc,
        table="cases",
        id_field="case_id",
        fields=(Field("n", int), Field("note", str, default="-")),
    )


V1_KIND = kind_v1()


def _filled() -> InMemoryStore:
    store = InMemoryStore()
    v1 = V1_KIND
    store.register(v1)
    for n, event in enumerate(("queue", "wait", None)):
        store.insert(v1, f"c{n}", {"n": n}, event="file", audit=Audit(at=100.0))
        if event:
            store.transition(v1, f"c{n}", event, audit=Audit(at=200.0))
    return store


def test_a_newer_version_migrates_the_rows_in_place() -> None:
    store = _filled()
    v2 = kind_v2({"pending": V2.QUEUED, "waiting": V2.QUEUED})
    store.register(v2)
    rows = {r.id: r for r in store.select(v2)}
    assert {i: (r.state, r.fence, r["note"]) for i, r in rows.items()} == {
        "c0": (V2.QUEUED, 2, "-"),
        "c1": (V2.QUEUED, 2, "-"),
        "c2": (V2.NEW, 0, "-"),
    }
    history = store.history(v2, "c1")
    assert [(h.event, h.from_state, h.to_state) for h in history] == [
        ("file", None, V2.NEW),
        ("wait", V2.NEW, V2.QUEUED),
        (MIGRATE_EVENT, V2.QUEUED, V2.QUEUED),
    ]
    assert history[-1].owner == MIGRATION_OWNER
    assert history[-1].reason == "lifecycle case version 1 -> 2: 'waiting' -> 'queued'"
    # Entered times are kept: the timer counts from the move into the old state.
    due = store.due_timers(v2, v2.lifecycle.timers[0], now=260.0, limit=10)
    assert [(d.row.id, d.entered_at) for d in due] == [("c0", 200.0), ("c1", 200.0)]
    assert store.catalog()[0].version == 2
    store.register(v2)  # again: a no-op
    assert store.get(v2, "c0").fence == 2  # type: ignore[union-attr]


def test_an_unmapped_state_or_an_older_version_is_refused_changing_nothing() -> None:
    store = _filled()
    v1 = V1_KIND
    before = [(r.id, r.state, r.fence) for r in store.select(v1)]
    with pytest.raises(MigrationError, match="'waiting'") as caught:
        store.register(kind_v2({"pending": V2.QUEUED}))
    assert caught.value.states == ("waiting",)
    assert [(r.id, r.state, r.fence) for r in store.select(v1)] == before
    assert store.catalog()[0].version == 1
    store.register(kind_v2({"pending": V2.QUEUED, "waiting": V2.QUEUED}))
    with pytest.raises(StaleVersion, match="declares version 1, the store holds version 2"):
        store.register(v1)

"""The SQLite store's timers, kind catalog and caller's connection.

* ``due_timers``: a row's entered time is the ``at`` of the write that last set its state; a
  timer's rows are found by a range scan of its partial index (checked with ``EXPLAIN QUERY
  PLAN`` and by counting the statement's steps over many rows not yet due).
* ``catalog``: every kind registered with the file, its declaration rebuilt by
  :func:`statecore.catalog.kind_from_declaration`, kept across reopening.
* ``connection``: the thread's connection inside ``atomic()`` only, so that a table of the
  caller's own commits or rolls back with the store's writes.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path

import pytest

import stores._sqlite_sql as sql
from statecore import Audit, Creation, FakeClock, Ledger, Move, StoreError
from statecore.catalog import declaration_json, kind_from_declaration
from statecore.entity import EntityKind, Field
from statecore.lifecycle import Lifecycle, Timer, Transition
from statecore.obligation import OBLIGATION_KIND
from statecore.store import Due, KindCatalog, TimerStore
from stores import SQLiteStore


class Job(StrEnum):
    """The states of the test job."""

    QUEUED = "queued"
    RUNNING = "running"
    EXPIRED = "expired"
    DONE = "done"


JOB_LIFECYCLE: Lifecycle[Job] = Lifecycle(
    "job",
    Job,
    initial=Job.QUEUED,
    terminal=[Job.EXPIRED, Job.DONE],
    transitions=[
        Transition("create", None, Job.QUEUED),
        Transition("bump", Job.QUEUED, Job.QUEUED),
        Transition("start", Job.QUEUED, Job.RUNNING),
        Transition("expire", Job.QUEUED, Job.EXPIRED, after=30),
        Transition("time_out", Job.RUNNING, Job.EXPIRED, after="deadline_s"),
        Transition("finish", Job.RUNNING, Job.DONE),
    ],
)
JOB = EntityKind(
    "job",
    JOB_LIFECYCLE,
    table="jobs",
    id_field="id",
    fields=[Field("deadline_s", float), Field("note", str, default="")],
)
EXPIRE, TIME_OUT = JOB_LIFECYCLE.timers
PLAIN = EntityKind(
    "plain_job",
    Lifecycle(
        "plain",
        Job,
        initial=Job.QUEUED,
        terminal=[Job.EXPIRED, Job.DONE],
        transitions=[
            Transition("create", None, Job.QUEUED),
            Transition("start", Job.QUEUED, Job.RUNNING),
            Transition("finish", Job.RUNNING, Job.DONE),
            Transition("expire", Job.QUEUED, Job.EXPIRED),
        ],
    ),
    table="plain_jobs",
    id_field="id",
    fields=[Field("deadline_s", float)],
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(tmp_path / "timers.db") as s:
        s.register(JOB)
        yield s


def create(store: SQLiteStore, jid: str, at: float, deadline: float | None = None) -> None:
    store.insert(JOB, jid, {"deadline_s": deadline}, event="create", audit=Audit(at))


def move(store: SQLiteStore, jid: str, event: str, at: float) -> None:
    store.transition(JOB, jid, event, audit=Audit(at))


def due(store: SQLiteStore, timer: Timer[Job], now: float | None, limit: int = 100) -> list[str]:
    return [d.row.id for d in store.due_timers(JOB, timer, now=now, limit=limit)]


# -- fixed durations ------------------------------------------------------------------------


def test_a_fixed_timer_is_due_its_duration_after_the_row_entered_its_source(
    store: SQLiteStore,
) -> None:
    create(store, "j1", 100.0)
    assert due(store, EXPIRE, 129.5) == []
    [found] = store.due_timers(JOB, EXPIRE, now=130.0, limit=10)
    row = store.get(JOB, "j1")
    assert row is not None
    assert found == Due(row, 100.0, 130.0)
    assert isinstance(found.row.state, Job)
    move(store, "j1", "start", 131.0)  # left the source state: no longer due
    assert due(store, EXPIRE, 1e12) == []


def test_due_rows_come_soonest_first_then_by_id_up_to_the_limit(store: SQLiteStore) -> None:
    for jid, at in (("c", 10.0), ("b", 20.0), ("a", 20.0), ("d", 5.0), ("late", 90.0)):
        create(store, jid, at)
    assert due(store, EXPIRE, 60.0) == ["d", "c", "a", "b"]
    assert due(store, EXPIRE, 60.0, limit=2) == ["d", "c"]
    assert due(store, EXPIRE, 60.0, limit=0) == []
    assert due(store, EXPIRE, None) == ["d", "c", "a", "b", "late"]
    assert [(d.entered_at, d.due_at) for d in store.due_timers(JOB, EXPIRE, now=35, limit=9)] == [
        (5.0, 35.0)
    ]


def test_moving_back_into_the_same_state_restarts_the_clock(store: SQLiteStore) -> None:
    create(store, "j1", 0.0)
    create(store, "j2", 0.0)
    move(store, "j1", "bump", 100.0)
    assert due(store, EXPIRE, 40.0) == ["j2"]
    assert due(store, EXPIRE, 129.0) == ["j2"]
    [d1, d2] = store.due_timers(JOB, EXPIRE, now=130.0, limit=10)
    assert (d1.row.id, d1.entered_at, d1.due_at) == ("j2", 0.0, 30.0)
    assert (d2.row.id, d2.entered_at, d2.due_at) == ("j1", 100.0, 130.0)


def test_every_kind_of_write_sets_the_entered_time(store: SQLiteStore) -> None:
    """Batch creations, batch moves and bulk moves start the clock as single writes do."""
    created = store.insert_each(
        JOB, [Creation(f"b{i}", {"deadline_s": None}, "create", Audit(10.0 + i)) for i in range(3)]
    )
    assert all(isinstance(c, tuple) and c[1] for c in created)
    store.transition_each(JOB, [Move("b0", "bump", Audit(50.0))])
    store.transition_many(JOB, ["b1"], "bump", audit=Audit(60.0))
    found = store.due_timers(JOB, EXPIRE, now=None, limit=10)
    assert [(d.row.id, d.entered_at) for d in found] == [("b2", 12.0), ("b0", 50.0), ("b1", 60.0)]


# -- durations held by a field -----------------------------------------------------------------


def test_a_field_timer_is_due_the_rows_own_duration_after_entering(store: SQLiteStore) -> None:
    for jid, deadline in (("slow", 50.0), ("quick", 5.0), ("never", None), ("mid", 20.0)):
        create(store, jid, 0.0, deadline)
        move(store, jid, "start", 100.0)
    create(store, "queued", 0.0, 1.0)  # not in the timer's source state
    assert due(store, TIME_OUT, 104.0) == []
    assert due(store, TIME_OUT, 120.0) == ["quick", "mid"]
    assert due(store, TIME_OUT, 120.0, limit=1) == ["quick"]
    assert due(store, TIME_OUT, None) == ["quick", "mid", "slow"]  # a NULL field: no timer
    [d] = store.due_timers(JOB, TIME_OUT, now=105.0, limit=5)
    assert (d.row.id, d.entered_at, d.due_at) == ("quick", 100.0, 105.0)
    assert d.row.values["deadline_s"] == 5.0


def test_a_field_changed_by_a_move_counts_from_the_move(store: SQLiteStore) -> None:
    create(store, "j", 0.0, None)
    store.transition(JOB, "j", "start", audit=Audit(10.0), changes={"deadline_s": 3.0})
    assert due(store, TIME_OUT, 12.9) == []
    assert due(store, TIME_OUT, 13.0) == ["j"]


# -- the indexes --------------------------------------------------------------------------------


def _plan(store: SQLiteStore, timer: Timer[Job], *, bounded: bool) -> str:
    text = sql.due_timers_sql(JOB, timer, bounded=bounded)
    params: list[object] = [3]  # the limit
    if bounded:
        params[:0] = [1.0] if timer.field is not None else [1.0, 2.0]  # the bounds
    with store.atomic():
        rows = store.connection().execute("EXPLAIN QUERY PLAN " + text, params).fetchall()
    return " | ".join(str(r[-1]) for r in rows)


@pytest.mark.parametrize("bounded", [True, False])
def test_the_due_query_is_a_range_scan_of_the_timers_index(
    store: SQLiteStore, bounded: bool
) -> None:
    for i in range(50):
        create(store, f"j{i:03}", float(i), 5.0)
    fixed = _plan(store, EXPIRE, bounded=bounded)
    assert "USING INDEX jobs_timer_queued " in fixed + " ", fixed
    field = _plan(store, TIME_OUT, bounded=bounded)
    assert "USING INDEX jobs_timer_running_deadline_s " in field + " ", field
    for plan in (fixed, field):
        assert "TEMP B-TREE" not in plan, plan  # the index gives the order: no sort
        if bounded:
            assert "<?" in plan.replace(" ", ""), plan  # a range, not a walk of the index


def _steps(store: SQLiteStore, timer: Timer[Job], now: float) -> int:
    """How many SQLite VM steps the due query of ``timer`` at ``now`` takes."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    with store.atomic():
        conn = store.connection()
        conn.set_progress_handler(count, 1)
        try:
            found = store.due_timers(JOB, timer, now=now, limit=1000)
        finally:
            conn.set_progress_handler(None, 1)
    assert len(found) == 100
    return steps


def test_a_sweep_does_not_grow_with_the_rows_not_yet_due(tmp_path: Path) -> None:
    """100 due rows among 1,000 and among 20,000 rows not yet due: the same work."""
    costs = []
    for pending in (1_000, 20_000):
        with SQLiteStore(tmp_path / f"sweep{pending}.db") as s:
            s.register(JOB)
            creations = [
                Creation(f"d{i:05}", {"deadline_s": 1.0}, "create", Audit(float(i)))
                for i in range(100)
            ]
            creations += [
                Creation(f"p{i:05}", {"deadline_s": 1e9}, "create", Audit(1e6 + i))
                for i in range(pending)
            ]
            s.insert_each(JOB, creations)
            ids = [c.entity_id for c in creations]
            s.transition_many(JOB, ids[:100], "start", audit=Audit(0.0))
            s.transition_many(JOB, ids[100:], "start", audit=Audit(1e6))
            costs.append(_steps(s, TIME_OUT, 500.0))
    small, large = costs
    assert large <= small * 1.2, costs


def test_only_kinds_with_timers_get_timer_indexes(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "k.db") as s:
        s.register(JOB)
        s.register(PLAIN)
        with s.atomic():
            names = {
                r[0]
                for r in s.connection().execute(
                    "SELECT name FROM sqlite_schema WHERE type = 'index' AND name LIKE '%timer%'"
                )
            }
    assert names == {"jobs_timer_queued", "jobs_timer_running_deadline_s"}


# -- refusals -------------------------------------------------------------------------------------


def test_bad_arguments_are_refused_before_any_query(store: SQLiteStore) -> None:
    other = Timer("expire", Job.QUEUED, Job.EXPIRED, 31)
    with pytest.raises(ValueError, match="limit"):
        store.due_timers(JOB, EXPIRE, now=1.0, limit=-1)
    with pytest.raises(TypeError, match="limit"):
        store.due_timers(JOB, EXPIRE, now=1.0, limit=True)
    with pytest.raises(TypeError, match="limit"):
        store.due_timers(JOB, EXPIRE, now=1.0, limit=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a timer of entity kind 'job'"):
        store.due_timers(JOB, other, now=1.0, limit=1)
    with pytest.raises(TypeError, match="Timer"):
        store.due_timers(JOB, "expire", now=1.0, limit=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="now"):
        store.due_timers(JOB, EXPIRE, now="1", limit=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NaN"):
        store.due_timers(JOB, EXPIRE, now=float("nan"), limit=1)
    with pytest.raises(StoreError, match="not registered"):
        store.due_timers(PLAIN, EXPIRE, now=1.0, limit=1)


# -- the catalog --------------------------------------------------------------------------------


def test_the_catalog_records_every_registered_kind_by_name(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    with SQLiteStore(path) as s:
        assert s.catalog() == []
        s.register(PLAIN)
        s.register(JOB)
        records = s.catalog()
    assert [(r.name, r.lifecycle, r.version) for r in records] == [
        ("job", "job", 1),
        ("plain_job", "plain", 1),
    ]
    for record, kind in zip(records, (JOB, PLAIN), strict=True):
        assert record.declaration == declaration_json(kind)
        rebuilt = kind_from_declaration(record.declaration)
        assert declaration_json(rebuilt) == declaration_json(kind)
        assert [t.describe() for t in rebuilt.lifecycle.timers] == [
            t.describe() for t in kind.lifecycle.timers
        ]
    with SQLiteStore(path) as again:  # another process, which never registered them
        assert again.catalog() == records
        rebuilt = kind_from_declaration(again.catalog()[0].declaration)
        again.register(rebuilt)  # the same table, read through the rebuilt kind
        assert again.catalog() == records  # the same declaration: its record untouched


def test_a_changed_declaration_replaces_its_record(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    with SQLiteStore(path) as s:
        s.register(PLAIN)
        [before] = s.catalog()
    wider = EntityKind(
        "plain_job",
        PLAIN.lifecycle,
        table="plain_jobs",
        id_field="id",
        fields=[*PLAIN.fields, Field("note", str, default="")],
    )
    with SQLiteStore(path) as s:
        s.register(wider)
        [after] = s.catalog()
    assert after.declaration == declaration_json(wider) != before.declaration
    assert after.registered_at >= before.registered_at


def test_the_catalog_is_written_in_the_registering_transaction(tmp_path: Path) -> None:
    def abandon(s: SQLiteStore) -> None:
        with s.atomic():
            s.register(JOB)
            assert [r.name for r in s.catalog()] == ["job"]
            raise RuntimeError("abandon")

    with SQLiteStore(tmp_path / "c.db") as s, pytest.raises(RuntimeError, match="abandon"):
        abandon(s)
    with SQLiteStore(tmp_path / "c.db") as fresh:
        assert fresh.catalog() == []  # rolled back with the table it records
        with fresh.atomic():
            tables = fresh.connection().execute(
                "SELECT name FROM sqlite_schema WHERE name = 'jobs'"
            )
            assert tables.fetchall() == []


# -- the caller's connection ------------------------------------------------------------------


def test_connection_is_refused_outside_atomic(store: SQLiteStore) -> None:
    with pytest.raises(StoreError, match=r"only valid inside a store\.atomic\(\) block"):
        store.connection()
    with store.atomic():
        conn = store.connection()
        assert isinstance(conn, sqlite3.Connection)
        assert conn.in_transaction
    with pytest.raises(StoreError, match="atomic"):
        store.connection()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.connection()


def _app_table(store: SQLiteStore) -> list[tuple[str, str]]:
    with store.atomic():
        conn = store.connection()
        conn.execute("CREATE TABLE IF NOT EXISTS notes (oid TEXT PRIMARY KEY, body TEXT)")
        return [(str(a), str(b)) for a, b in conn.execute("SELECT oid, body FROM notes")]


def _record(ledger: Ledger, content: str) -> str:
    return ledger.record(
        session_key="agent:main:slack:channel:C1",
        platform="slack",
        chat_id="C1",
        content=content,
        obligation_id=f"ob-{content}",
    ).obligation_id


def test_a_callers_table_commits_with_the_ledgers_write(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with SQLiteStore(path) as s:
        ledger = Ledger(s, clock=FakeClock())
        assert _app_table(s) == []
        with s.atomic():
            oid = _record(ledger, "kept")
            s.connection().execute("INSERT INTO notes VALUES (?, ?)", (oid, "kept"))

        def abandon() -> None:
            with s.atomic():
                lost = _record(ledger, "lost")
                s.connection().execute("INSERT INTO notes VALUES (?, ?)", (lost, "lost"))
                assert _app_table(s) == [("ob-kept", "kept"), ("ob-lost", "lost")]
                raise RuntimeError("abandon")

        with pytest.raises(RuntimeError, match="abandon"):
            abandon()
        assert _app_table(s) == [("ob-kept", "kept")]
        assert s.get(OBLIGATION_KIND, "ob-lost") is None
    with SQLiteStore(path) as again:  # what is on disk, read afresh
        again.register(OBLIGATION_KIND)
        assert _app_table(again) == [("ob-kept", "kept")]
        assert again.get(OBLIGATION_KIND, "ob-kept") is not None
        assert again.get(OBLIGATION_KIND, "ob-lost") is None


def test_rows_of_a_table_older_than_the_audit_columns_count_from_their_last_entry(
    tmp_path: Path,
) -> None:
    """A table written before rows kept their audit columns gains ``audit_at`` when its kind
    is registered, each row's taken from its latest audit entry: its timers run from there."""
    path = tmp_path / "old.db"
    with SQLiteStore(path) as s:
        s.register(JOB)
        create(s, "j1", 5.0)
        create(s, "j2", 0.0)
        move(s, "j2", "bump", 50.0)
    raw = sqlite3.connect(path)
    try:
        schema = raw.execute("SELECT type, name FROM sqlite_schema WHERE tbl_name = 'jobs'")
        for kind, name in schema.fetchall():
            if kind in ("index", "trigger") and not name.startswith("sqlite_autoindex"):
                raw.execute(f"DROP {kind.upper()} {name}")
        raw.execute("ALTER TABLE jobs DROP COLUMN audit_at")
        raw.commit()
    finally:
        raw.close()
    with SQLiteStore(path) as s:
        s.register(JOB)
        found = s.due_timers(JOB, EXPIRE, now=None, limit=10)
        assert [(d.row.id, d.entered_at, d.due_at) for d in found] == [
            ("j1", 5.0, 35.0),
            ("j2", 50.0, 80.0),
        ]
        assert "USING INDEX jobs_timer_queued" in _plan(s, EXPIRE, bounded=True)


def test_infinite_bounds_find_everything_or_nothing(store: SQLiteStore) -> None:
    create(store, "j1", 5.0)
    create(store, "j2", 1e300)
    assert due(store, EXPIRE, float("inf")) == ["j1", "j2"]
    assert due(store, EXPIRE, float("-inf")) == []


def test_a_due_time_exactly_at_now_is_due_despite_float_rounding(store: SQLiteStore) -> None:
    """``entered + duration <= now`` decides, exactly as computed in floating point, however
    ``now - duration`` rounds."""
    entered = 0.1 + 0.2  # 0.30000000000000004
    create(store, "j", entered)
    now = entered + 30.0
    assert due(store, EXPIRE, now) == ["j"]
    assert due(store, EXPIRE, math.nextafter(now, 0.0)) == []


def test_the_store_is_a_timer_store_and_a_kind_catalog(store: SQLiteStore) -> None:
    assert isinstance(store, TimerStore)
    assert isinstance(store, KindCatalog)

"""PostgresStore's timers, catalog and caller's connection on a real server.

* ``entered_at``: every write that sets a state (insert, transition, transition_many and the
  batch paths) stores its audit time; a table written by the previous layout gains the column
  when its kind is registered, filled from each row's latest audit entry (the upgrade's time
  for a row without one), and the schema records the new layout version.
* ``due_timers``: the store contract's timer section, plus what only a server shows -- the
  per-timer partial indexes, a sweep that reads due rows only, a duration held by an int field,
  and ``FOR UPDATE SKIP LOCKED`` inside ``atomic()`` sharing due rows between two sweepers.
* ``catalog``: the ``statecore_kinds`` table, its round trip through
  :func:`statecore.catalog.kind_from_declaration`, updates when a declaration changes.
* ``connection()``: refused outside ``atomic()``; inside, an application table written
  through it commits or rolls back with a ``Ledger.record``.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import psycopg
import pytest

from statecore import FakeClock, Incarnation, Ledger
from statecore.batch import Creation, Move
from statecore.catalog import declaration_json, kind_from_declaration
from statecore.entity import EntityKind, Field
from statecore.errors import StaleVersion, StoreError
from statecore.lifecycle import Lifecycle, Timer, Transition
from statecore.obligation import OBLIGATION_KIND
from statecore.store import Audit, Due
from statecore.timers import Timers
from stores import _postgres_sql as sql
from stores.postgres import SCHEMA_VERSION, PostgresStore
from stores.testing import TICKET_KIND, StoreFactory
from stores.testing.timers import ALARM_KIND, RING, WAKE, AlarmState, TimerContract

AS = AlarmState
JOIN_S = 30.0
"""Real seconds a helper thread may take before the test fails."""


def fresh_schema() -> str:
    """A schema name no other store of the session uses."""
    return f"tm_{uuid.uuid4().hex[:16]}"


class TestPostgresTimerContract(TimerContract):
    """The store contract's timer and catalog section, each store in a schema of its own."""

    @pytest.fixture
    def store(self, postgres_url: str) -> StoreFactory:
        """A fresh PostgresStore in a new schema of the session's database per call."""
        names = (f"{fresh_schema()}_{n}" for n in itertools.count())
        return lambda: PostgresStore(postgres_url, schema=next(names), pool_size=6)


# -- fixtures and helpers -------------------------------------------------------------------------


class Job(StrEnum):
    """A second timed lifecycle: its duration in an int field."""

    QUEUED = "queued"
    DONE = "done"


JOB = Lifecycle(
    "tm_job",
    Job,
    initial=Job.QUEUED,
    terminal=(Job.DONE,),
    transitions=(
        Transition("queue", None, Job.QUEUED),
        Transition("expire", Job.QUEUED, Job.DONE, after="ttl_s"),
    ),
)
JOB_KIND = EntityKind(
    "tm_job", JOB, table="tm_jobs", id_field="job_id", fields=(Field("ttl_s", int),)
)
EXPIRE: Timer[Job] = JOB.timers[0]


@pytest.fixture
def schema() -> str:
    """The schema of this test's store."""
    return fresh_schema()


@pytest.fixture
def pg(postgres_url: str, schema: str) -> Iterator[PostgresStore]:
    """A fresh store in ``schema`` with the alarm and ticket kinds registered."""
    store = PostgresStore(postgres_url, schema=schema, pool_size=6)
    store.register(ALARM_KIND)
    store.register(TICKET_KIND)
    yield store
    store.close()


@pytest.fixture
def admin(postgres_url: str, schema: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection of its own whose search path is ``schema``."""
    with psycopg.connect(
        postgres_url, autocommit=True, connect_timeout=5, options=f"-c search_path={schema}"
    ) as conn:
        yield conn


def arm(store: PostgresStore, alarm_id: str, at: float, **values: object) -> None:
    """Create an alarm (state ``set``) at ``at``."""
    store.insert(ALARM_KIND, alarm_id, values, event="arm", audit=Audit(at))


def entered(conn: psycopg.Connection[Any], table: str = "kit_alarms") -> dict[str, float]:
    """Every row's stored ``entered_at``, by id."""
    return dict(conn.execute(f"SELECT {_key(table)}, entered_at FROM {table}").fetchall())


def _key(table: str) -> str:
    return {"kit_alarms": "alarm_id", "kit_tickets": "ticket_id", "tm_jobs": "job_id"}[table]


def indexes(conn: psycopg.Connection[Any], table: str) -> dict[str, str]:
    """The indexes of ``table`` in the search path's schema: name -> definition."""
    return dict(
        conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes "
            "WHERE schemaname = current_schema() AND tablename = %s",
            (table,),
        ).fetchall()
    )


def explain(conn: psycopg.Connection[Any], text: str, params: list[Any]) -> dict[str, Any]:
    """The executed plan (EXPLAIN ANALYZE, JSON) of ``text`` with ``params``: its top node."""
    with psycopg.ClientCursor(conn) as cur:
        query = cur.mogrify(text, params)
        found = cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}").fetchone()
    assert found is not None
    plan = found[0]
    return dict((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"])


def scans(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The scan nodes of a plan, depth first."""
    found = [node] if "Scan" in node["Node Type"] else []
    for child in node.get("Plans", ()):
        found.extend(scans(child))
    return found


# -- entered_at -----------------------------------------------------------------------------------


def test_every_write_that_sets_a_state_stores_its_audit_time(
    pg: PostgresStore, admin: psycopg.Connection[Any]
) -> None:
    """insert, transition (into the same state too), transition_many, insert_each and
    transition_each each set entered_at to their audit's ``at``; a refused move leaves it."""
    arm(pg, "a1", 100.0)
    arm(pg, "a2", 101.0)
    pg.insert_each(
        ALARM_KIND,
        [Creation(f"b{n}", {}, "arm", Audit(200.0 + n)) for n in range(3)],
    )
    assert entered(admin) == {"a1": 100.0, "a2": 101.0, "b0": 200.0, "b1": 201.0, "b2": 202.0}
    pg.transition(ALARM_KIND, "a1", "snooze", audit=Audit(110.0))
    pg.transition(ALARM_KIND, "a1", "touch", audit=Audit(115.5))  # the same state again
    pg.transition_many(ALARM_KIND, ["a2", "b0", "nope"], "snooze", audit=Audit(300.0))
    outcomes = pg.transition_each(
        ALARM_KIND,
        [
            Move("b1", "cancel", Audit(400.0)),
            Move("b2", "touch", Audit(401.0)),  # refused: b2 is set, not snoozed
        ],
    )
    assert isinstance(outcomes[1], Exception)
    assert entered(admin) == {"a1": 115.5, "a2": 300.0, "b0": 300.0, "b1": 400.0, "b2": 202.0}
    for alarm_id, at in entered(admin).items():
        assert pg.history(ALARM_KIND, alarm_id)[-1].at == at


def test_a_table_of_the_previous_layout_is_upgraded_in_place(
    postgres_url: str, schema: str, admin: psycopg.Connection[Any]
) -> None:
    """A schema of layout 1 (tables without entered_at, no catalog): opening records the new
    layout version; registering a kind adds entered_at, filled from each row's latest audit
    entry, or the upgrade's time for a row without one, and its timer indexes -- then its
    timers run from those times."""
    with PostgresStore(postgres_url, schema=schema) as store:
        store.register(ALARM_KIND)
        arm(store, "a1", 1_000.0, nap=5.0)
        arm(store, "a2", 1_002.0)
        store.transition(ALARM_KIND, "a1", "snooze", audit=Audit(1_010.0))
    # Take the schema back to what the previous layout wrote, with one row it never audited.
    for name in indexes(admin, "kit_alarms"):
        if "_timer_" in name:
            admin.execute(f'DROP INDEX "{name}"')
    admin.execute("ALTER TABLE kit_alarms DROP COLUMN entered_at")
    admin.execute("INSERT INTO kit_alarms (alarm_id, state, label) VALUES ('raw', 'set', 'x')")
    admin.execute(f"DROP TABLE {sql.KINDS_TABLE}")
    admin.execute(f"UPDATE {sql.VERSION_TABLE} SET version = 1")

    before = time.time()
    with PostgresStore(postgres_url, schema=schema) as store:
        assert admin.execute(f"SELECT version FROM {sql.VERSION_TABLE}").fetchall() == [
            (SCHEMA_VERSION,)
        ]
        assert SCHEMA_VERSION == 2
        assert store.catalog() == []
        store.register(ALARM_KIND)
        after = time.time()
        stored = entered(admin)
        assert {k: v for k, v in stored.items() if k != "raw"} == {"a1": 1_010.0, "a2": 1_002.0}
        assert before - 5 <= stored["raw"] <= after + 5  # the server's clock: same host
        assert {n for n in indexes(admin, "kit_alarms") if "_timer_" in n} == {
            "kit_alarms_timer_set",
            "kit_alarms_timer_snoozed_nap",
        }
        assert [r.name for r in store.catalog()] == ["kit_alarm"]
        assert [(d.row.id, d.entered_at, d.due_at) for d in _due(store, WAKE, None)] == [
            ("a1", 1_010.0, 1_015.0)
        ]
        assert [d.row.id for d in _due(store, RING, 1_032.0)] == ["a2"]
        store.transition(ALARM_KIND, "raw", "cancel", audit=Audit(2_000.0))
        assert entered(admin)["raw"] == 2_000.0
    column = admin.execute(
        "SELECT is_nullable FROM information_schema.columns WHERE table_schema = "
        "current_schema() AND table_name = 'kit_alarms' AND column_name = 'entered_at'"
    ).fetchone()
    assert column == ("NO",)


def test_a_field_named_like_the_stores_column_is_refused(pg: PostgresStore) -> None:
    """A kind declaring ``entered_at`` would overwrite the store's own column: refused (by
    the declaration, or else by register()), and nothing is created."""

    def declare_and_register() -> None:
        pg.register(
            EntityKind(
                "clash",
                TICKET_KIND.lifecycle,
                table="clashes",
                id_field="clash_id",
                fields=(Field("entered_at", float),),
            )
        )

    with pytest.raises((StoreError, ValueError), match="entered_at"):
        declare_and_register()
    assert [r.name for r in pg.catalog()] == ["kit_alarm", "ticket"]


# -- due_timers -----------------------------------------------------------------------------------


def _due(
    store: PostgresStore, timer: Timer[Any], now: float | None, limit: int = 100
) -> list[Due[Any]]:
    kind: EntityKind[Any] = JOB_KIND if timer is EXPIRE else ALARM_KIND
    return store.due_timers(kind, timer, now=now, limit=limit)


def test_each_timer_has_a_partial_index_and_a_kind_without_timers_none(
    pg: PostgresStore, admin: psycopg.Connection[Any]
) -> None:
    """register() creates one partial index per timer: over (entered_at, id) in the source
    state for a fixed duration, over (entered_at + field, id) for a field's; the ticket kind
    (no timers) gets only its declared indexes."""
    timer_indexes = {n: d for n, d in indexes(admin, "kit_alarms").items() if "_timer_" in n}
    assert set(timer_indexes) == {"kit_alarms_timer_set", "kit_alarms_timer_snoozed_nap"}
    fixed, field = (
        timer_indexes["kit_alarms_timer_set"],
        timer_indexes["kit_alarms_timer_snoozed_nap"],
    )
    assert "(entered_at, alarm_id)" in fixed
    assert "WHERE (state = 'set'::text)" in fixed
    assert "(((entered_at + nap)), alarm_id)" in field
    assert "WHERE (state = 'snoozed'::text)" in field
    assert not [n for n in indexes(admin, "kit_tickets") if "_timer_" in n]


@pytest.mark.parametrize("timer", [RING, WAKE], ids=["fixed", "field"])
def test_a_sweep_reads_the_due_rows_only(
    pg: PostgresStore, admin: psycopg.Connection[Any], timer: Timer[AlarmState]
) -> None:
    """With 3,000 rows pending and 5 due, the due query is one scan of the timer's index that
    returns the due rows and reads no pending one (its cost does not grow with them)."""
    snooze = timer is WAKE
    creations = [
        Creation(f"p{n:05}", {"nap": 1_000.0}, "arm", Audit(10_000.0 + n)) for n in range(3_000)
    ]
    creations += [Creation(f"d{n}", {"nap": 5.0}, "arm", Audit(100.0 + n)) for n in range(5)]
    pg.insert_each(ALARM_KIND, creations)
    if snooze:
        pending = [c.entity_id for c in creations[:-5]]
        pg.transition_many(ALARM_KIND, pending, "snooze", audit=Audit(10_000.0))
        due = [c.entity_id for c in creations[-5:]]
        pg.transition_many(ALARM_KIND, due, "snooze", audit=Audit(100.0))
    admin.execute("ANALYZE kit_alarms")
    text, params = sql.due_sql(ALARM_KIND, timer, 1_000.0, 100, lock=False)
    plan = explain(admin, text, params)
    (scan,) = scans(plan)
    name = "kit_alarms_timer_snoozed_nap" if snooze else "kit_alarms_timer_set"
    assert scan["Node Type"] in ("Index Scan", "Index Only Scan")
    assert scan["Index Name"] == name
    assert scan["Actual Rows"] == 5
    assert scan.get("Rows Removed by Filter", 0) == 0
    assert [d.row.id for d in _due(pg, timer, 1_000.0)] == [f"d{n}" for n in range(5)]


def test_a_duration_in_an_int_field(pg: PostgresStore) -> None:
    """An int field holds the duration: due at entered + the field; a NULL field never."""
    pg.register(JOB_KIND)
    for job_id, ttl in (("j10", 10), ("j3", 3), ("none", None)):
        pg.insert(JOB_KIND, job_id, {"ttl_s": ttl}, event="queue", audit=Audit(50.0))
    assert [(d.row.id, d.due_at) for d in _due(pg, EXPIRE, 55.0)] == [("j3", 53.0)]
    assert [(d.row.id, d.due_at) for d in _due(pg, EXPIRE, None)] == [("j3", 53.0), ("j10", 60.0)]
    assert all(isinstance(d.due_at, float) for d in _due(pg, EXPIRE, None))


def test_float_rounding_never_drops_a_due_row(pg: PostgresStore) -> None:
    """Due exactly when entered + seconds <= now in floating point, though now - seconds
    rounds below the entered time."""
    at = 0.13436424411240122
    arm(pg, "edge", at)
    now = at + 30.0  # the float sum itself: due at now exactly
    assert now - 30.0 < at  # the naive index bound would stop before the row
    assert [(d.row.id, d.due_at) for d in _due(pg, RING, now)] == [("edge", now)]
    assert _due(pg, RING, now - 1e-9) == []


def test_bad_now_is_refused_before_any_query(pg: PostgresStore) -> None:
    """A NaN or non-number ``now`` raises before anything is read."""
    with pytest.raises(ValueError, match="NaN"):
        pg.due_timers(ALARM_KIND, RING, now=float("nan"), limit=1)
    bad: Any = "1000"
    with pytest.raises(TypeError, match="now"):
        pg.due_timers(ALARM_KIND, RING, now=bad, limit=1)


def test_two_sweepers_inside_atomic_get_disjoint_rows(pg: PostgresStore) -> None:
    """Inside atomic() the due rows are locked and rows another transaction holds skipped:
    a second sweeper, while the first holds its batch, gets the others at once (it does not
    wait), outside a block a read sees them all, and once the first commits its firings the
    rows it fired are gone."""
    for n in range(8):
        arm(pg, f"a{n}", 1_000.0 + n)
    held = threading.Event()
    release = threading.Event()
    first: list[str] = []
    errors: list[BaseException] = []

    def sweeper() -> None:
        try:
            with pg.atomic():
                due = _due(pg, RING, 2_000.0, limit=3)
                first.extend(d.row.id for d in due)
                held.set()
                assert release.wait(JOIN_S)
                for d in due:
                    pg.transition(ALARM_KIND, d.row.id, "ring", audit=Audit(2_000.0),
                                  fence=d.row.fence)  # fmt: skip
        except BaseException as exc:
            errors.append(exc)
            held.set()

    thread = threading.Thread(target=sweeper, daemon=True)
    thread.start()
    try:
        assert held.wait(JOIN_S)
        assert first == ["a0", "a1", "a2"]
        started = time.monotonic()
        with pg.atomic():
            second = [d.row.id for d in _due(pg, RING, 2_000.0)]
        assert time.monotonic() - started < JOIN_S / 2
        assert second == ["a3", "a4", "a5", "a6", "a7"]
        assert [d.row.id for d in _due(pg, RING, 2_000.0)] == [f"a{n}" for n in range(8)]
    finally:
        release.set()
        thread.join(JOIN_S)
    assert not thread.is_alive()
    assert errors == []
    assert [d.row.id for d in _due(pg, RING, 2_000.0)] == ["a3", "a4", "a5", "a6", "a7"]
    assert [r.id for r in pg.select(ALARM_KIND, states=[AS.RUNG])] == ["a0", "a1", "a2"]


def test_a_row_locked_by_a_firing_is_skipped_not_waited_for(pg: PostgresStore) -> None:
    """A row another transaction is moving (locked, not yet committed) is skipped inside a
    block; once that transaction commits the row's new entered time counts."""
    arm(pg, "a1", 1_000.0)
    arm(pg, "a2", 1_001.0)
    held = threading.Event()
    release = threading.Event()
    errors: list[BaseException] = []

    def mover() -> None:
        try:
            with pg.atomic():
                pg.transition(ALARM_KIND, "a1", "snooze", audit=Audit(1_500.0))
                held.set()
                assert release.wait(JOIN_S)
        except BaseException as exc:
            errors.append(exc)
            held.set()

    thread = threading.Thread(target=mover, daemon=True)
    thread.start()
    try:
        assert held.wait(JOIN_S)
        with pg.atomic():
            assert [d.row.id for d in _due(pg, RING, 2_000.0)] == ["a2"]
    finally:
        release.set()
        thread.join(JOIN_S)
    assert not thread.is_alive()
    assert errors == []
    assert [d.row.id for d in _due(pg, RING, 2_000.0)] == ["a2"]  # a1 left the state


def test_two_timer_services_on_one_schema_fire_each_row_once(
    postgres_url: str, pg: PostgresStore
) -> None:
    """Two Timers, each on a store of its own over the schema (two processes), running at once
    in small batches: every due row is fired exactly once, by one of them, and neither loses a
    race (a row the other holds is skipped, never written stale)."""
    for n in range(40):
        arm(pg, f"a{n:02}", 1_000.0 + n)
    arm(pg, "later", 5_000.0)
    barrier = threading.Barrier(2, timeout=JOIN_S)
    results: dict[str, list[str]] = {}
    lost: dict[str, int] = {}
    errors: list[BaseException] = []

    def service(name: str) -> None:
        try:
            with PostgresStore(postgres_url, schema=pg.schema, pool_size=2) as store:
                timers = Timers(store, [ALARM_KIND], clock=FakeClock(2_000.0), batch=3)
                barrier.wait()
                results[name] = [f.entity_id for f in timers.run_due(now=2_000.0)]
                lost[name] = timers.lost_races
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=service, args=(n,), daemon=True) for n in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    fired = results["a"] + results["b"]
    assert sorted(fired) == [f"a{n:02}" for n in range(40)]
    assert lost == {"a": 0, "b": 0}
    assert [r.id for r in pg.select(ALARM_KIND, states=[AS.SET])] == ["later"]
    (entry,) = pg.history(ALARM_KIND, "a00")[-1:]
    assert (entry.event, entry.at, entry.reason) == ("ring", 2_000.0, RING.describe())


# -- catalog --------------------------------------------------------------------------------------


def test_the_catalog_is_the_schemas_and_rebuilds_its_kinds(
    postgres_url: str, pg: PostgresStore, admin: psycopg.Connection[Any]
) -> None:
    """Another store on the schema, which registered nothing, reads every kind from the
    statecore_kinds table, rebuilds each with kind_from_declaration, and reads the rows of
    the rebuilt kind -- timers included."""
    arm(pg, "a1", 1_000.0)
    rows = admin.execute(
        f"SELECT name, lifecycle, version, declaration FROM {sql.KINDS_TABLE} ORDER BY name"
    ).fetchall()
    assert [(n, lc, v) for n, lc, v, _ in rows] == [
        ("kit_alarm", "kit_alarm", 1),
        ("ticket", "ticket", 1),
    ]
    assert json.loads(rows[0][3]) == declaration_json(ALARM_KIND)
    with PostgresStore(postgres_url, schema=pg.schema) as other:
        (record,) = [r for r in other.catalog() if r.name == "kit_alarm"]
        rebuilt = kind_from_declaration(record.declaration)
        other.register(rebuilt)
        (ring,) = rebuilt.lifecycle.timers_from(rebuilt.lifecycle.initial)
        (due,) = other.due_timers(rebuilt, ring, now=None, limit=10)
        assert (due.row.id, due.row.state.value, due.entered_at, due.due_at) == (
            "a1", "set", 1_000.0, 1_030.0,
        )  # fmt: skip
        assert other.catalog() == pg.catalog()


def test_a_changed_declaration_replaces_its_record_an_older_version_does_not(
    postgres_url: str, pg: PostgresStore
) -> None:
    """A kind registered again with a changed declaration (a new field) replaces its record;
    a declaration of an older lifecycle version than the one recorded is refused
    (StaleVersion) and leaves it."""
    (before,) = [r for r in pg.catalog() if r.name == "kit_alarm"]
    grown = EntityKind(
        "kit_alarm", ALARM_KIND.lifecycle, table="kit_alarms", id_field="alarm_id",
        fields=(*ALARM_KIND.fields, Field("room", str)),
    )  # fmt: skip
    with PostgresStore(postgres_url, schema=pg.schema) as other:
        other.register(grown)
    (after,) = [r for r in pg.catalog() if r.name == "kit_alarm"]
    assert dict(after.declaration) == declaration_json(grown)
    assert after.registered_at >= before.registered_at
    v2 = _alarm_version(2)
    with PostgresStore(postgres_url, schema=pg.schema) as other:
        other.register(v2)
    with PostgresStore(postgres_url, schema=pg.schema) as other:
        with pytest.raises(StaleVersion):
            other.register(ALARM_KIND)  # version 1 again
        assert other.catalog() == pg.catalog()
    (latest,) = [r for r in pg.catalog() if r.name == "kit_alarm"]
    assert latest.version == 2
    assert dict(latest.declaration) == declaration_json(v2)


def _alarm_version(version: int) -> EntityKind[AlarmState]:
    lc = ALARM_KIND.lifecycle
    lifecycle = Lifecycle(
        lc.name, AlarmState, initial=lc.initial, terminal=lc.terminal,
        transitions=lc.transitions, description=lc.description, version=version,
    )  # fmt: skip
    return EntityKind(
        ALARM_KIND.name, lifecycle, table=ALARM_KIND.table, id_field=ALARM_KIND.id_field,
        fields=ALARM_KIND.fields,
    )  # fmt: skip


# -- connection() ---------------------------------------------------------------------------------


def test_connection_is_refused_outside_atomic(pg: PostgresStore) -> None:
    """Outside atomic() (before, after a block) and on a closed store: StoreError."""
    with pytest.raises(StoreError, match=r"only valid inside a store\.atomic\(\) block"):
        pg.connection()
    with pg.atomic():
        conn = pg.connection()
        assert conn.execute("SELECT 1").fetchone() == (1,)
        with pg.atomic():
            assert pg.connection() is conn  # a nested block: the same connection
    with pytest.raises(StoreError, match="only valid inside"):
        pg.connection()
    pg.close()
    with pytest.raises(StoreError, match="closed"):
        pg.connection()


class _Abort(Exception):
    """Raised to abort an atomic() block."""


def test_an_application_table_commits_and_rolls_back_with_a_ledger_record(
    pg: PostgresStore, admin: psycopg.Connection[Any]
) -> None:
    """An application table written through connection() and Ledger(store).record in one
    atomic() block: both are there after it commits, neither after an exception escapes."""
    admin.execute("CREATE TABLE app_orders (order_id TEXT PRIMARY KEY, obligation_id TEXT)")
    ledger = Ledger(
        pg,
        clock=FakeClock(),
        incarnation=Incarnation(Incarnation.current().host, 4321, 1_000, "conn-token"),
    )

    def order(order_id: str) -> str:
        obligation = ledger.record(
            session_key=f"s-{order_id}", platform="test", chat_id="c1", content=order_id
        )
        pg.connection().execute(
            "INSERT INTO app_orders VALUES (%s, %s)", (order_id, obligation.obligation_id)
        )
        return obligation.obligation_id

    with pg.atomic():
        kept = order("o1")
    undone: list[str] = []

    def aborted() -> None:
        with pg.atomic():
            undone.append(order("o2"))
            raise _Abort

    with pytest.raises(_Abort):
        aborted()
    assert admin.execute("SELECT order_id, obligation_id FROM app_orders").fetchall() == [
        ("o1", kept)
    ]
    assert pg.get(OBLIGATION_KIND, kept) is not None
    assert pg.get(OBLIGATION_KIND, undone[0]) is None

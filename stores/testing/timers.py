"""The store contract: due timers (``due_timers``) and the kind catalog (``catalog``).

Both are optional protocols (:class:`~statecore.store.TimerStore`,
:class:`~statecore.store.KindCatalog`; every shipped store has them): a test of one a store
does not implement is skipped, saying so.

Time is the ``at`` of each write's audit entry: a row's timer runs from the write that last
set its state, so every test here passes explicit ``at`` values and never sleeps.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import pytest

from statecore.catalog import declaration_json, kind_from_declaration
from statecore.entity import EntityKind, Field
from statecore.errors import InvalidTransition, StaleState
from statecore.lifecycle import Lifecycle, Timer, Transition
from statecore.obligation import OBLIGATION_KIND
from statecore.store import Audit, Due, KindCatalog, Row, Store, TimerStore
from stores.testing._base import KitFixtures
from stores.testing._kit import TICKET_KIND, StoreOpener

__all__ = ["ALARM", "ALARM_KIND", "AlarmState", "TimerContract"]


class AlarmState(StrEnum):
    """The states of the timer section's test entity."""

    SET = "set"
    SNOOZED = "snoozed"
    RUNG = "rung"
    OFF = "off"


AS = AlarmState

ALARM: Lifecycle[AlarmState] = Lifecycle(
    "kit_alarm",
    AlarmState,
    initial=AS.SET,
    terminal=(AS.RUNG, AS.OFF),
    description="The store contract kit's timed test lifecycle.",
    transitions=(
        Transition("arm", None, AS.SET),
        Transition("ring", AS.SET, AS.RUNG, after=30),  # a fixed timer
        Transition("snooze", AS.SET, AS.SNOOZED),
        Transition("touch", AS.SNOOZED, AS.SNOOZED),  # a self-loop: re-enters its state
        Transition("wake", AS.SNOOZED, AS.SET, after="nap"),  # a field timer
        Transition("cancel", (AS.SET, AS.SNOOZED), AS.OFF),
        Transition("clear", (AS.RUNG, AS.OFF), None),
    ),
)
"""The timer section's lifecycle: a fixed timer (``ring``, 30 s in ``set``) and a field timer
(``wake``, ``nap`` seconds in ``snoozed``)."""

ALARM_KIND: EntityKind[AlarmState] = EntityKind(
    "kit_alarm",
    ALARM,
    table="kit_alarms",
    id_field="alarm_id",
    fields=(
        Field("label", str, nullable=False, default="alarm"),
        Field("nap", float),
    ),
)
"""The timer section's entity kind; ``nap`` (nullable) holds the ``wake`` timer's duration."""

RING: Timer[AlarmState] = ALARM.timers_from(AS.SET)[0]
WAKE: Timer[AlarmState] = ALARM.timers_from(AS.SNOOZED)[0]


def _timers(db: Store) -> TimerStore:
    """``db`` as a TimerStore; the test is skipped for a store without ``due_timers`` (it is
    optional: :class:`~statecore.timers.Timers` reads such a store through select and
    history)."""
    if not isinstance(db, TimerStore):
        pytest.skip(f"{type(db).__name__} has no due_timers() (optional capability)")
    return db


def _catalog(db: Store) -> KindCatalog:
    """``db`` as a KindCatalog; the test is skipped for a store without ``catalog()``."""
    if not isinstance(db, KindCatalog):
        pytest.skip(f"{type(db).__name__} has no catalog() (optional capability)")
    return db


def _arm(db: Store, alarm_id: str, at: float, **values: object) -> Row[AlarmState]:
    row, created = db.insert(ALARM_KIND, alarm_id, values, event="arm", audit=Audit(at))
    assert created, f"{alarm_id} already existed"
    return row


def _move(db: Store, alarm_id: str, event: str, at: float, **kwargs: Any) -> Row[AlarmState]:
    return db.transition(ALARM_KIND, alarm_id, event, audit=Audit(at), **kwargs)


def _due(
    db: Store, timer: Timer[AlarmState], now: float | None, limit: int = 100
) -> list[Due[AlarmState]]:
    return _timers(db).due_timers(ALARM_KIND, timer, now=now, limit=limit)


def _ids(due: list[Due[AlarmState]]) -> list[str]:
    return [d.row.id for d in due]


def _times(due: list[Due[AlarmState]]) -> list[tuple[str, float, float]]:
    return [(d.row.id, d.entered_at, d.due_at) for d in due]


class TimerContract(KitFixtures):
    """``due_timers`` (fixed and field timers, ordering, limit, NULL durations, re-entry) and
    ``catalog`` (every registered kind, round-tripping through its declaration)."""

    @pytest.fixture
    def alarms(self, new_store: StoreOpener) -> Store:
        """A fresh store with the kit's kinds and :data:`ALARM_KIND` registered (the test is
        skipped for a store that implements neither due_timers nor catalog)."""
        db = new_store()
        if not isinstance(db, TimerStore | KindCatalog):
            name = type(db).__name__
            pytest.skip(f"{name} has neither due_timers() nor catalog() (optional capabilities)")
        db.register(ALARM_KIND)
        return db

    # -- due_timers -------------------------------------------------------------------------

    def test_a_fixed_timer_falls_due_once_its_duration_has_passed(self, alarms: Store) -> None:
        """Due from entered + seconds on (inclusive), not a moment before; the row as stored."""
        row = _arm(alarms, "a1", 1_000.0)
        assert _due(alarms, RING, 1_029.5) == []
        assert _due(alarms, RING, 1_030.0) == [Due(row, 1_000.0, 1_030.0)]
        assert _ids(_due(alarms, RING, 5_000.0)) == ["a1"]

    def test_due_rows_come_soonest_first_then_by_id(self, alarms: Store) -> None:
        """Ordered by due time, ties by id, whatever the order of their writes."""
        _arm(alarms, "b", 1_005.0)
        _arm(alarms, "a", 1_010.0)
        _arm(alarms, "c", 1_005.0)
        _arm(alarms, "d", 1_000.0)
        assert _times(_due(alarms, RING, 2_000.0)) == [
            ("d", 1_000.0, 1_030.0),
            ("b", 1_005.0, 1_035.0),
            ("c", 1_005.0, 1_035.0),
            ("a", 1_010.0, 1_040.0),
        ]
        assert _ids(_due(alarms, RING, 1_035.0)) == ["d", "b", "c"]

    def test_the_limit_keeps_the_soonest(self, alarms: Store) -> None:
        """At most ``limit`` rows, the soonest due; a limit of 0 returns nothing."""
        for n, at in enumerate((1_004.0, 1_001.0, 1_003.0, 1_002.0)):
            _arm(alarms, f"a{n}", at)
        assert _ids(_due(alarms, RING, 2_000.0, limit=2)) == ["a1", "a3"]
        assert _ids(_due(alarms, RING, None, limit=3)) == ["a1", "a3", "a2"]
        assert _due(alarms, RING, 2_000.0, limit=0) == []
        assert len(_due(alarms, RING, 2_000.0, limit=10)) == 4

    def test_now_none_lists_every_row_with_a_timer(self, alarms: Store) -> None:
        """``now=None``: every row in the source state, due or not, soonest first."""
        _arm(alarms, "late", 9_000.0)
        _arm(alarms, "early", 1_000.0)
        assert _times(_due(alarms, RING, None)) == [
            ("early", 1_000.0, 1_030.0),
            ("late", 9_000.0, 9_030.0),
        ]

    def test_a_field_timer_reads_each_rows_duration(self, alarms: Store) -> None:
        """entered + the row's field; a row whose field is NULL has no timer at all."""
        for alarm_id, nap in (("n5", 5.0), ("n20", 20.0), ("none", None), ("n2", 2.5)):
            _arm(alarms, alarm_id, 1_000.0, nap=nap)
            _move(alarms, alarm_id, "snooze", 1_010.0)
        assert _due(alarms, WAKE, 1_012.0) == []
        assert _times(_due(alarms, WAKE, 1_015.0)) == [
            ("n2", 1_010.0, 1_012.5),
            ("n5", 1_010.0, 1_015.0),
        ]
        assert _ids(_due(alarms, WAKE, None)) == ["n2", "n5", "n20"]
        assert _ids(_due(alarms, WAKE, 1e12)) == ["n2", "n5", "n20"]

    def test_a_field_timer_follows_the_fields_current_value(self, alarms: Store) -> None:
        """A change of the field moves the due time; setting it to NULL stops the timer."""
        _arm(alarms, "a1", 1_000.0)
        _move(alarms, "a1", "snooze", 1_010.0, changes={"nap": 7.0})
        assert _times(_due(alarms, WAKE, None)) == [("a1", 1_010.0, 1_017.0)]
        _move(alarms, "a1", "touch", 1_012.0, changes={"nap": None})
        assert _due(alarms, WAKE, None) == []

    def test_only_rows_in_the_timers_source_state_are_due(self, alarms: Store) -> None:
        """Rows in other states, and rows of other kinds, are never listed."""
        _arm(alarms, "set", 1_000.0, nap=1.0)
        _arm(alarms, "snoozed", 1_000.0, nap=1.0)
        _move(alarms, "snoozed", "snooze", 1_000.0)
        _arm(alarms, "off", 1_000.0, nap=1.0)
        _move(alarms, "off", "cancel", 1_000.0)
        alarms.insert(TICKET_KIND, "t1", {"title": "t"}, event="file", audit=Audit(1_000.0))
        assert _ids(_due(alarms, RING, None)) == ["set"]
        assert _ids(_due(alarms, WAKE, None)) == ["snoozed"]

    def test_reentering_the_source_state_restarts_the_clock(self, alarms: Store) -> None:
        """The clock runs from the write that last set the state: leaving and coming back, a
        move into the same state, and a bulk move all restart it."""
        _arm(alarms, "a1", 1_000.0, nap=10.0)
        _move(alarms, "a1", "snooze", 1_010.0)
        assert _due(alarms, RING, None) == []
        assert _times(_due(alarms, WAKE, None)) == [("a1", 1_010.0, 1_020.0)]
        _move(alarms, "a1", "touch", 1_018.0)
        assert _times(_due(alarms, WAKE, None)) == [("a1", 1_018.0, 1_028.0)]
        alarms.transition_many(ALARM_KIND, ["a1"], "touch", audit=Audit(1_025.0))
        assert _times(_due(alarms, WAKE, None)) == [("a1", 1_025.0, 1_035.0)]
        _move(alarms, "a1", "wake", 1_030.0)
        assert _due(alarms, WAKE, None) == []
        assert _times(_due(alarms, RING, None)) == [("a1", 1_030.0, 1_060.0)]

    def test_a_refused_write_leaves_the_clock_running(self, alarms: Store) -> None:
        """A refused or stale move writes nothing, so the entered time stays."""
        _arm(alarms, "a1", 1_000.0)
        with pytest.raises(InvalidTransition):
            _move(alarms, "a1", "touch", 1_020.0)
        with pytest.raises(StaleState):
            _move(alarms, "a1", "snooze", 1_020.0, fence=7)
        assert _times(_due(alarms, RING, None)) == [("a1", 1_000.0, 1_030.0)]

    def test_a_due_rows_fence_guards_its_firing(self, alarms: Store) -> None:
        """The row returned is current: firing with its fence succeeds, and a second firing
        with the same fence is stale."""
        _arm(alarms, "a1", 1_000.0)
        (due,) = _due(alarms, RING, 1_030.0)
        assert due.row.fence == 0
        fired = _move(alarms, "a1", "ring", 1_031.0, fence=due.row.fence)
        assert fired.state is AS.RUNG
        with pytest.raises(StaleState):
            _move(alarms, "a1", "ring", 1_032.0, fence=due.row.fence)
        assert _due(alarms, RING, None) == []

    def test_due_timers_inside_an_atomic_block(self, alarms: Store) -> None:
        """Inside ``atomic()`` the same rows are found and may be fired in the same block."""
        for n in range(3):
            _arm(alarms, f"a{n}", 1_000.0 + n)
        with alarms.atomic():
            due = _due(alarms, RING, 1_031.0)
            assert _ids(due) == ["a0", "a1"]
            for d in due:
                _move(alarms, d.row.id, RING.event, 1_031.0, fence=d.row.fence)
        assert [r.id for r in alarms.select(ALARM_KIND, states=[AS.RUNG])] == ["a0", "a1"]
        assert _ids(_due(alarms, RING, None)) == ["a2"]

    def test_pruned_rows_have_no_timer(self, alarms: Store) -> None:
        """A row gone is never due, and an empty kind has nothing due."""
        assert _due(alarms, RING, None) == []
        _arm(alarms, "a1", 1_000.0)
        _move(alarms, "a1", "cancel", 1_001.0)
        assert alarms.prune(ALARM_KIND, "clear") == 1
        assert _due(alarms, RING, None) == []

    @pytest.mark.parametrize("limit", [-1, True, 2.5, "3", None])
    def test_a_bad_limit_is_refused(self, alarms: Store, limit: Any) -> None:
        """A limit that is not a non-negative int raises ValueError or TypeError."""
        _arm(alarms, "a1", 1_000.0)
        with pytest.raises((ValueError, TypeError)):
            _timers(alarms).due_timers(ALARM_KIND, RING, now=2_000.0, limit=limit)

    @pytest.mark.parametrize("now", [float("nan"), "2000", True])
    def test_a_bad_now_is_refused(self, alarms: Store, now: Any) -> None:
        """A ``now`` that is not a number (or is NaN) raises ValueError or TypeError."""
        _arm(alarms, "a1", 1_000.0)
        with pytest.raises((ValueError, TypeError)):
            _timers(alarms).due_timers(ALARM_KIND, RING, now=now, limit=10)

    def test_an_infinite_now_finds_every_row_with_a_timer(self, alarms: Store) -> None:
        """``now=inf`` is every row with a timer, as ``now=None``."""
        _arm(alarms, "a2", 1_001.0)
        _arm(alarms, "a1", 1_000.0)
        assert _due(alarms, RING, float("inf")) == _due(alarms, RING, None)
        assert _ids(_due(alarms, RING, float("inf"))) == ["a1", "a2"]

    def test_a_timer_of_another_lifecycle_is_refused(self, alarms: Store) -> None:
        """A timer the kind's lifecycle does not declare raises ValueError or TypeError."""
        undeclared = Timer("snooze", AS.SET, AS.SNOOZED, 5.0)
        other_duration = Timer("ring", AS.SET, AS.RUNG, 31.0)
        refused: tuple[Any, ...] = (undeclared, other_duration, "ring")
        for timer in refused:
            with pytest.raises((ValueError, TypeError)):
                _timers(alarms).due_timers(ALARM_KIND, timer, now=None, limit=10)
        ticket_kind: Any = TICKET_KIND
        with pytest.raises((ValueError, TypeError)):
            _timers(alarms).due_timers(ticket_kind, RING, now=None, limit=10)

    # -- catalog ----------------------------------------------------------------------------

    def test_the_catalog_lists_every_registered_kind_by_name(self, new_store: StoreOpener) -> None:
        """Nothing before registration; then one record per kind, sorted by name, with its
        lifecycle's name and version and its declaration as declaration_json writes it."""
        db = new_store(register=False)
        assert _catalog(db).catalog() == []
        for kind in (TICKET_KIND, ALARM_KIND, OBLIGATION_KIND):
            db.register(kind)
        records = _catalog(db).catalog()
        assert [r.name for r in records] == ["kit_alarm", "obligation", "ticket"]
        by_name = {k.name: k for k in (TICKET_KIND, ALARM_KIND, OBLIGATION_KIND)}
        for record in records:
            kind = by_name[record.name]
            assert record.lifecycle == kind.lifecycle.name
            assert record.version == kind.lifecycle.version
            assert dict(record.declaration) == declaration_json(kind)
            assert isinstance(record.registered_at, float)

    def test_registering_again_keeps_one_record(self, alarms: Store) -> None:
        """Registering a kind already registered changes nothing in the catalog."""
        before = _catalog(alarms).catalog()
        alarms.register(ALARM_KIND)
        alarms.register(TICKET_KIND)
        assert _catalog(alarms).catalog() == before
        assert [r.name for r in before].count("kit_alarm") == 1

    def test_a_catalog_record_rebuilds_its_kind(self, alarms: Store) -> None:
        """kind_from_declaration of each record gives a kind with the same declaration: the
        same states, transitions, timers and fields."""
        for record in _catalog(alarms).catalog():
            rebuilt = kind_from_declaration(record.declaration)
            assert declaration_json(rebuilt) == dict(record.declaration)
            assert rebuilt.name == record.name
            assert rebuilt.lifecycle.version == record.version
        (alarm,) = [r for r in _catalog(alarms).catalog() if r.name == "kit_alarm"]
        timers = kind_from_declaration(alarm.declaration).lifecycle.timers
        assert [(t.event, t.source.value, t.target.value, t.after) for t in timers] == [
            ("ring", "set", "rung", 30),
            ("wake", "snoozed", "set", "nap"),
        ]

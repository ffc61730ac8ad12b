"""Durable timers: their declaration, their checks, and the Timers service on real stores."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterator
from enum import StrEnum
from pathlib import Path

import pytest

from statecore import (
    AsyncTimers,
    Audit,
    DeclarationError,
    EntityKind,
    FakeClock,
    Field,
    Fired,
    Lifecycle,
    Store,
    Timers,
    Transition,
)
from statecore.catalog import declaration_json, kind_from_declaration
from statecore.errors import UnknownKind
from statecore.kinds import kind_named, known_kinds
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore


class Step(StrEnum):
    WAITING = "waiting"
    NUDGED = "nudged"
    DONE = "done"
    EXPIRED = "expired"


STEP = Lifecycle(
    "step",
    Step,
    initial=Step.WAITING,
    terminal=(Step.DONE, Step.EXPIRED),
    transitions=(
        Transition("open", None, Step.WAITING),
        Transition("nudge", Step.WAITING, Step.NUDGED, after=60),
        Transition("renudge", Step.NUDGED, Step.NUDGED),
        Transition("finish", (Step.WAITING, Step.NUDGED), Step.DONE),
        Transition("expire", Step.NUDGED, Step.EXPIRED, after="ttl_s"),
        Transition("drop", (Step.DONE, Step.EXPIRED), None),
    ),
)

STEP_KIND = EntityKind(
    "step",
    STEP,
    table="steps",
    id_field="step_id",
    fields=(Field("ttl_s", float), Field("note", str)),
)


def _stores(tmp_path: Path) -> Iterator[Callable[[], Store]]:
    paths = (tmp_path / f"t{n}.sqlite3" for n in itertools.count())
    yield InMemoryStore
    yield lambda: SQLiteStore(next(paths))


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened: Store = InMemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "t.db")
    opened.register(STEP_KIND)
    yield opened
    opened.close()


def _open(store: Store, entity_id: str, at: float, ttl: float | None = 100.0) -> None:
    store.insert(
        STEP_KIND, entity_id, {"ttl_s": ttl}, event="open", audit=Audit(at=at, owner="test")
    )


# -- declaration --------------------------------------------------------------------------


def test_timers_are_derived_from_the_declaration() -> None:
    assert [(t.event, t.source, t.target, t.after) for t in STEP.timers] == [
        ("nudge", Step.WAITING, Step.NUDGED, 60),
        ("expire", Step.NUDGED, Step.EXPIRED, "ttl_s"),
    ]
    assert [t.event for t in STEP.timers_from(Step.NUDGED)] == ["expire"]
    assert STEP.timers_from(Step.DONE) == ()
    assert STEP.timers[0].describe() == "fired by timer after 60 s"
    assert STEP.timers[1].describe(45.0) == "fired by timer after 45 s (ttl_s)"


@pytest.mark.parametrize(
    ("after", "problem"),
    [
        (0, "positive number"),
        (-1.5, "positive number"),
        (float("nan"), "positive number"),
        (float("inf"), "positive number"),
        (True, "positive number"),
        ("not a name", "not a field name"),
        ([30], "positive number"),
    ],
)
def test_a_bad_duration_is_refused_naming_the_lifecycle(after: object, problem: str) -> None:
    with pytest.raises(DeclarationError, match=problem) as caught:
        Lifecycle(
            "bad",
            Step,
            initial=Step.WAITING,
            terminal=(Step.DONE, Step.EXPIRED),
            transitions=(
                Transition("nudge", Step.WAITING, Step.NUDGED, after=after),  # type: ignore[arg-type]
                Transition("finish", Step.NUDGED, Step.DONE),
                Transition("expire", Step.NUDGED, Step.EXPIRED),
            ),
        )
    assert caught.value.lifecycle == "bad"
    assert "timer 'nudge'" in str(caught.value)


def test_a_timer_on_a_terminal_state_or_a_creation_is_refused() -> None:
    with pytest.raises(DeclarationError, match="timer 'reopen' on terminal state 'done'"):
        Lifecycle(
            "bad",
            Step,
            initial=Step.WAITING,
            terminal=(Step.DONE, Step.EXPIRED),
            transitions=(
                Transition("nudge", Step.WAITING, Step.NUDGED),
                Transition("finish", Step.NUDGED, Step.DONE),
                Transition("expire", Step.NUDGED, Step.EXPIRED),
                Transition("reopen", Step.DONE, Step.WAITING, after=5),
            ),
        )
    with pytest.raises(DeclarationError, match="a timer must be a move"):
        Lifecycle(
            "bad",
            Step,
            initial=Step.WAITING,
            terminal=(Step.DONE, Step.EXPIRED),
            transitions=(
                Transition("open", None, Step.WAITING, after=5),
                Transition("nudge", Step.WAITING, Step.NUDGED),
                Transition("finish", Step.NUDGED, Step.DONE),
                Transition("expire", Step.NUDGED, Step.EXPIRED),
            ),
        )


@pytest.mark.parametrize("fields", [(), (Field("ttl_s", str),)])
def test_a_timer_field_must_be_a_declared_number(fields: tuple[Field, ...]) -> None:
    with pytest.raises(DeclarationError, match="'ttl_s', which is not a declared int or float"):
        EntityKind("step", STEP, table="steps", id_field="step_id", fields=fields)


def test_the_kinds_declaration_round_trips_through_its_json() -> None:
    data = declaration_json(STEP_KIND)
    rebuilt = kind_from_declaration(data)
    assert declaration_json(rebuilt) == data
    assert [t.after for t in rebuilt.lifecycle.timers] == [60, "ttl_s"]
    for kind in known_kinds():
        assert declaration_json(kind_from_declaration(declaration_json(kind))) == (
            declaration_json(kind)
        )
    with pytest.raises(DeclarationError, match="unknown format"):
        kind_from_declaration({**data, "format": 99})
    with pytest.raises(DeclarationError, match="malformed"):
        kind_from_declaration({"format": 1, "name": "x"})


def test_every_shipped_kind_is_known_and_an_unknown_name_is_a_typed_error() -> None:
    names = [k.name for k in known_kinds()]
    assert names[:4] == ["obligation", "owner", "session", "delegation"]
    assert {"buffer_entry", "inbound_seen", "held_inbound", "driver_note"} <= set(names)
    assert kind_named("obligation").table
    with pytest.raises(UnknownKind, match="no entity kind named 'nope'") as caught:
        kind_named("nope")
    assert "obligation" in caught.value.known


# -- the service --------------------------------------------------------------------------


def test_a_timer_fires_once_when_due_and_is_audited(store: Store) -> None:
    clock = FakeClock(start=1_000.0)
    _open(store, "s1", at=1_000.0)
    timers = Timers(store, [STEP_KIND], clock=clock, owner="timers-test")
    clock.advance(59.9)
    assert timers.run_due() == []
    assert timers.next_due() == pytest.approx(1_060.0)
    clock.advance(0.2)
    fired = timers.run_due()
    assert [(f.entity_id, f.event, f.from_state, f.to_state) for f in fired] == [
        ("s1", "nudge", Step.WAITING, Step.NUDGED)
    ]
    assert fired[0].due_at == pytest.approx(1_060.0)
    assert fired[0].late_s == pytest.approx(0.1)
    assert timers.run_due() == []  # fired once
    last = store.history(STEP_KIND, "s1")[-1]
    assert (last.event, last.owner, last.reason) == (
        "nudge",
        "timers-test",
        "fired by timer after 60 s",
    )
    # The next timer (from nudged, read from the row's field) counts from the firing.
    assert timers.next_due() == pytest.approx(1_060.1 + 100.0)


def test_a_field_duration_is_read_per_row_and_none_means_no_timer(store: Store) -> None:
    clock = FakeClock(start=0.0)
    timers = Timers(store, [STEP_KIND], clock=clock)
    for entity_id, ttl in (("short", 10.0), ("long", 500.0), ("never", None)):
        _open(store, entity_id, at=0.0, ttl=ttl)
        store.transition(STEP_KIND, entity_id, "nudge", audit=Audit(at=0.0))
    clock.advance(11)
    assert [f.entity_id for f in timers.run_due()] == ["short"]
    assert store.history(STEP_KIND, "short")[-1].reason == "fired by timer after 10 s (ttl_s)"
    clock.advance(10_000)
    assert [f.entity_id for f in timers.run_due()] == ["long"]
    row = store.get(STEP_KIND, "never")
    assert row is not None
    assert row.state is Step.NUDGED


def test_reentering_the_source_state_restarts_the_clock(store: Store) -> None:
    clock = FakeClock(start=0.0)
    timers = Timers(store, [STEP_KIND], clock=clock)
    _open(store, "s", at=0.0, ttl=100.0)
    store.transition(STEP_KIND, "s", "nudge", audit=Audit(at=0.0))
    store.transition(STEP_KIND, "s", "renudge", audit=Audit(at=90.0))
    clock.advance(150)
    assert timers.run_due() == []
    clock.advance(41)
    assert [f.event for f in timers.run_due()] == ["expire"]


def test_a_timer_fires_late_rather_than_never(store: Store) -> None:
    """Every process down for a day: the next one to run fires what fell due meanwhile."""
    clock = FakeClock(start=0.0)
    for n in range(5):
        _open(store, f"s{n}", at=float(n))
    clock.advance(86_400)
    fired = Timers(store, [STEP_KIND], clock=clock).run_due()
    assert sorted(f.entity_id for f in fired) == [f"s{n}" for n in range(5)]
    assert all(f.late_s > 86_000 for f in fired)


def test_moved_by_the_application_first_means_the_timer_does_not_fire(store: Store) -> None:
    clock = FakeClock(start=0.0)
    _open(store, "s", at=0.0)
    store.transition(STEP_KIND, "s", "finish", audit=Audit(at=5.0))
    clock.advance(1_000)
    assert Timers(store, [STEP_KIND], clock=clock).run_due() == []


def test_batches_fire_everything_due(store: Store) -> None:
    clock = FakeClock(start=0.0)
    for n in range(23):
        _open(store, f"s{n:02}", at=float(n))
    clock.advance(200)
    timers = Timers(store, [STEP_KIND], clock=clock, batch=5)
    fired = timers.run_due()
    assert [f.entity_id for f in fired] == [f"s{n:02}" for n in range(23)]  # oldest due first
    assert timers.fired == 23


def test_on_fire_commits_with_the_firing_or_undoes_it(store: Store) -> None:
    clock = FakeClock(start=0.0)
    _open(store, "ok", at=0.0)
    _open(store, "bad", at=0.0)
    seen: list[str] = []

    def on_fire(fired: Fired) -> None:
        if fired.entity_id == "bad":
            raise RuntimeError("the reminder could not be written")
        seen.append(fired.entity_id)
        store.transition(STEP_KIND, fired.entity_id, "renudge", audit=Audit(at=fired.fired_at))

    timers = Timers(store, [STEP_KIND], clock=clock, on_fire=on_fire)
    clock.advance(61)
    assert [f.entity_id for f in timers.run_due()] == ["ok"]
    assert seen == ["ok"]
    assert [h.event for h in store.history(STEP_KIND, "ok")] == ["open", "nudge", "renudge"]
    bad = store.get(STEP_KIND, "bad")
    assert bad is not None
    assert bad.state is Step.WAITING
    assert bad.fence == 0
    assert [h.event for h in store.history(STEP_KIND, "bad")] == ["open"]
    assert timers.failed == 1
    assert timers.next_due() == pytest.approx(60.0)  # still due: the next run tries again


def test_threads_racing_fire_each_timer_once(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "race.db")
    store.register(STEP_KIND)
    for n in range(200):
        _open(store, f"s{n:03}", at=0.0)
    clock = FakeClock(start=1_000.0)
    services = [Timers(store, [STEP_KIND], clock=clock, batch=7) for _ in range(4)]
    results: list[list[Fired]] = [[] for _ in services]

    def run(i: int) -> None:
        results[i] = services[i].run_due()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(services))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    fired = sorted(f.entity_id for r in results for f in r)
    assert fired == [f"s{n:03}" for n in range(200)]
    for n in range(200):
        events = [h.event for h in store.history(STEP_KIND, f"s{n:03}")]
        assert events == ["open", "nudge"]
    store.close()


def test_bad_arguments_are_refused(store: Store) -> None:
    other = EntityKind(
        "untimed",
        Lifecycle(
            "untimed",
            Step,
            initial=Step.WAITING,
            terminal=(Step.DONE, Step.EXPIRED),
            transitions=(
                Transition("nudge", Step.WAITING, Step.NUDGED),
                Transition("finish", Step.NUDGED, Step.DONE),
                Transition("expire", Step.NUDGED, Step.EXPIRED),
            ),
        ),
        table="untimed",
        id_field="untimed_id",
        fields=(),
    )
    with pytest.raises(ValueError, match="declares no timer"):
        Timers(store, [other])
    with pytest.raises(ValueError, match="at least one"):
        Timers(store, [])
    with pytest.raises(ValueError, match="batch"):
        Timers(store, [STEP_KIND], batch=0)
    with pytest.raises(TypeError):
        Timers(store, ["step"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="poll_s"):
        AsyncTimers(store, [STEP_KIND], poll_s=0)


@pytest.mark.asyncio
async def test_async_timers_run_on_the_fake_clock(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "async.db")
    clock = FakeClock(start=0.0)
    fired: list[str] = []
    service = AsyncTimers(
        store, [STEP_KIND], clock=clock, poll_s=5.0, on_fire=lambda f: fired.append(f.event)
    )
    _open(store, "a", at=0.0, ttl=30.0)
    task = asyncio.create_task(service.run())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30.0  # a real-time bound on a busy machine; fake time drives it
    while len(fired) < 2 and loop.time() < deadline:
        await asyncio.sleep(0.002)
        clock.advance(1.0)
    assert fired == ["nudge", "expire"]
    service.stop()
    clock.advance(10)
    await asyncio.wait_for(task, timeout=10)
    row = store.get(STEP_KIND, "a")
    assert row is not None
    assert row.state is Step.EXPIRED
    store.close()

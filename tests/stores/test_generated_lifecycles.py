"""The generated lifecycle tests (stores.testing.lifecycle_tests) for every shipped entity kind
on each store -- in memory, SQLite files, PostgreSQL -- plus a timed kind declared here (a fixed
and a field timer), and the error for a kind nobody declares."""

from __future__ import annotations

import itertools
import sys
import uuid
from contextlib import ExitStack
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest

if "stores.testing" not in sys.modules:  # detailed assertion messages from the kit's asserts
    pytest.register_assert_rewrite("stores.testing")

from statecore.entity import EntityKind, Field
from statecore.errors import UnknownKind
from statecore.kinds import known_kinds
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit
from stores.memory import InMemoryStore
from stores.postgres import PostgresStore
from stores.sqlite import SQLiteStore
from stores.testing import StoreFactory
from stores.testing.lifecycle import LifecycleStores, lifecycle_tests
from stores.testing.lifecycle_machine import lifecycle_machine


class Parcel(StrEnum):
    WAITING = "waiting"
    OUT = "out"
    HELD = "held"
    DELIVERED = "delivered"
    RETURNED = "returned"


PARCEL = Lifecycle(
    "parcel",
    Parcel,
    initial=Parcel.WAITING,
    terminal=(Parcel.DELIVERED, Parcel.RETURNED),
    transitions=(
        Transition("accept", None, Parcel.WAITING),
        Transition("dispatch", Parcel.WAITING, Parcel.OUT, after=45),
        Transition("hold", Parcel.OUT, Parcel.HELD),
        Transition("retry", Parcel.HELD, Parcel.OUT),
        Transition("deliver", (Parcel.OUT, Parcel.HELD), Parcel.DELIVERED),
        Transition("give_up", Parcel.HELD, Parcel.RETURNED, after="hold_s"),
        Transition("forget", (Parcel.DELIVERED, Parcel.RETURNED), None),
    ),
)

PARCEL_KIND = EntityKind(
    "parcel",
    PARCEL,
    table="parcels",
    id_field="parcel_id",
    fields=(
        Field("address", str, nullable=False, immutable=True),
        Field("hold_s", int),
        Field("weight", float, nullable=False, default=1.0),
    ),
)
"""A timed kind: 45 s waiting dispatches it, ``hold_s`` seconds held returns it."""

KINDS: tuple[EntityKind[Any], ...] = (*known_kinds(), PARCEL_KIND)


class _Memory:
    @pytest.fixture
    def store(self) -> StoreFactory:
        """A fresh InMemoryStore per call."""
        return InMemoryStore


class _SQLite:
    @pytest.fixture
    def store(self, tmp_path: Path) -> StoreFactory:
        """A fresh SQLiteStore on a new file under tmp_path per call."""
        paths = (tmp_path / f"store-{n}.sqlite3" for n in itertools.count())
        return lambda: SQLiteStore(next(paths), synchronous="NORMAL")


class _Postgres:
    @pytest.fixture
    def store(self, postgres_url: str) -> StoreFactory:
        """A fresh PostgresStore in a new schema of the session's database per call."""
        names = (f"t_{uuid.uuid4().hex[:16]}_{n}" for n in itertools.count())
        return lambda: PostgresStore(postgres_url, schema=next(names), pool_size=2)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


for _kind in KINDS:
    _base = lifecycle_tests(_kind)
    for _label, _factory in (("Memory", _Memory), ("SQLite", _SQLite), ("Postgres", _Postgres)):
        _name = f"Test{_camel(_kind.name)}On{_label}"
        globals()[_name] = type(_name, (_factory, _base), {"__module__": __name__})


def _obligation(n: int) -> dict[str, object]:
    """Creation values of the caller's own for the obligation kind."""
    return {
        "session_key": f"s{n}",
        "platform": "telegram",
        "chat_id": f"c{n % 2}",
        "content": "hello",
        "created_at": 5.0,
        "updated_at": 5.0,
    }


# A kind found by its name, with creation values of the caller's own.
TestObligationByName = type(
    "TestObligationByName",
    (_Memory, lifecycle_tests("obligation", values=_obligation)),
    {"__module__": __name__},
)


def test_every_shipped_kind_is_tested() -> None:
    """The kernel's kinds and those the installed packages declare each got their tests."""
    names = {k.name for k in KINDS}
    assert {"obligation", "owner", "parcel"} <= names
    # the statecore.kinds entry points of this package: the chat runtime's and the relay's
    assert {"session", "delegation", "buffer_entry", "driver_note"} <= names
    for kind in KINDS:
        assert f"Test{_camel(kind.name)}OnPostgres" in globals()


def test_an_unknown_kind_name_is_refused_when_the_tests_are_built() -> None:
    """A name no installed package declares raises UnknownKind naming the known ones."""
    with pytest.raises(UnknownKind, match="no_such_kind") as caught:
        lifecycle_tests("no_such_kind")
    assert "obligation" in caught.value.known


def test_a_kind_without_a_creation_is_refused() -> None:
    """No store can hold the entities of a lifecycle without a creation event."""
    lifecycle = Lifecycle(
        "uncreated",
        Parcel,
        initial=Parcel.WAITING,
        terminal=(Parcel.DELIVERED, Parcel.RETURNED),
        transitions=(
            Transition("dispatch", Parcel.WAITING, Parcel.OUT),
            Transition("hold", Parcel.OUT, Parcel.HELD),
            Transition("deliver", (Parcel.OUT, Parcel.HELD), Parcel.DELIVERED),
            Transition("give_up", Parcel.HELD, Parcel.RETURNED),
        ),
    )
    kind = EntityKind("uncreated", lifecycle, table="uncreated", id_field="id", fields=())
    with pytest.raises(ValueError, match="no creation"):
        lifecycle_tests(kind)


# -- the generated tests catch a store that is wrong ----------------------------------------------


class _LateAudit(InMemoryStore):
    """Writes every move's audit entry a second late: its rows agree, its histories do not."""

    def transition(self, kind: EntityKind[Any], entity_id: str, event: str, **kw: Any) -> Any:
        audit = kw.pop("audit")
        return super().transition(
            kind, entity_id, event, audit=Audit(audit.at + 1, audit.owner), **kw
        )


class _NoTimers(InMemoryStore):
    """Never finds a due timer."""

    def due_timers(self, kind: Any, timer: Any, *, now: float | None, limit: int) -> list[Any]:
        return []


def test_the_comparison_catches_a_store_that_differs() -> None:
    """A walk against a store whose audit entries differ fails, naming the histories."""
    tests = lifecycle_tests(PARCEL_KIND)()
    with ExitStack() as stack:
        ours = LifecycleStores(InMemoryStore, PARCEL_KIND, stack)
        with pytest.raises(AssertionError, match="histories"):
            tests.test_compare_stores(ours, _LateAudit)


def test_the_timer_tests_catch_a_store_that_never_fires() -> None:
    """A store whose due_timers finds nothing fails every timer test."""
    tests = lifecycle_tests(PARCEL_KIND)()
    for timer in PARCEL.timers:
        with ExitStack() as stack:
            db = LifecycleStores(_NoTimers, PARCEL_KIND, stack)()
            with pytest.raises(AssertionError):
                tests.test_timer(db, timer)


def test_every_declared_transition_is_a_test_of_its_own() -> None:
    """One test id per move (source-event), creation, removal (state-event) and timer; no
    test for what a lifecycle does not declare (the parcel's removals and timers, none for a
    kind without timers)."""

    def ids(cls: type, method: str) -> list[str]:
        (mark,) = getattr(cls, method).pytestmark
        return list(mark.kwargs["ids"]) if "ids" in mark.kwargs else list(mark.args[1])

    parcel = lifecycle_tests(PARCEL_KIND)
    assert ids(parcel, "test_move") == [
        "waiting-dispatch",
        "out-hold",
        "held-retry",
        "out-deliver",
        "held-deliver",
        "held-give_up",
    ]
    assert ids(parcel, "test_creation") == ["accept"]
    assert ids(parcel, "test_removal") == ["delivered-forget", "returned-forget"]
    assert ids(parcel, "test_timer") == ["waiting-dispatch", "held-give_up"]
    assert not hasattr(lifecycle_tests("owner"), "test_timer")


def test_the_hypothesis_machine_finds_the_stores_agreeing(tmp_path: Path) -> None:
    """lifecycle_machine: the timed kind on SQLite against memory, Hypothesis choosing the
    steps (a few short examples), agrees; against a store whose histories differ it fails."""
    from hypothesis import HealthCheck, Phase, settings  # noqa: PLC0415
    from hypothesis.stateful import run_state_machine_as_test  # noqa: PLC0415

    paths = (tmp_path / f"machine-{n}.sqlite3" for n in itertools.count())
    quick = settings(
        max_examples=6,
        stateful_step_count=12,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        phases=(Phase.explicit, Phase.generate),  # a failure is not shrunk: the test is short
    )
    machine = lifecycle_machine(PARCEL_KIND, lambda: SQLiteStore(next(paths)))
    run_state_machine_as_test(machine, settings=quick)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(lifecycle_machine(PARCEL_KIND, _LateAudit), settings=quick)

"""The in-memory store's due timers and kind catalog: the timer section of the contract kit,
and what only this store promises (its catalog lives and dies with it)."""

from __future__ import annotations

import sys

import pytest

if "stores.testing" not in sys.modules:  # detailed assertion messages from the kit's asserts
    pytest.register_assert_rewrite("stores.testing")

from statecore.errors import StoreError
from statecore.store import Audit, KindCatalog, TimerStore
from stores.memory import InMemoryStore
from stores.testing import StoreFactory
from stores.testing.timers import ALARM_KIND, RING, WAKE, TimerContract


class TestInMemoryTimers(TimerContract):
    """The in-memory store passes the timer section of the contract."""

    @pytest.fixture
    def store(self) -> StoreFactory:
        """A fresh InMemoryStore per call."""
        return InMemoryStore


def test_the_in_memory_store_is_a_timer_store_and_a_catalog() -> None:
    """Both protocols are satisfied (the timer runner and the tools check them at run time)."""
    with InMemoryStore() as db:
        assert isinstance(db, TimerStore)
        assert isinstance(db, KindCatalog)


def test_a_closed_store_has_no_catalog_and_no_timers() -> None:
    """After close() both raise StoreError."""
    db = InMemoryStore()
    db.register(ALARM_KIND)
    db.close()
    with pytest.raises(StoreError):
        db.catalog()
    with pytest.raises(StoreError):
        db.due_timers(ALARM_KIND, RING, now=None, limit=10)


def test_an_unregistered_kind_has_no_timers() -> None:
    """due_timers on a kind the store never registered raises StoreError."""
    with InMemoryStore() as db, pytest.raises(StoreError):
        db.due_timers(ALARM_KIND, RING, now=None, limit=10)


def test_bad_input_is_refused_before_the_store_is_read() -> None:
    """A bad limit or a bad ``now`` is refused even for an unregistered kind."""
    with InMemoryStore() as db:
        with pytest.raises(ValueError, match="limit"):
            db.due_timers(ALARM_KIND, RING, now=None, limit=-1)
        with pytest.raises(TypeError, match="now"):
            db.due_timers(ALARM_KIND, RING, now="soon", limit=1)  # type: ignore[arg-type]


def test_an_undone_block_restores_the_entered_time() -> None:
    """A move undone with its atomic() block leaves the timer as it was."""
    with InMemoryStore() as db:
        db.register(ALARM_KIND)
        db.insert(ALARM_KIND, "a1", {"nap": 4.0}, event="arm", audit=Audit(1_000.0))
        db.transition(ALARM_KIND, "a1", "snooze", audit=Audit(1_001.0))

        def touch_then_fail() -> None:
            with db.atomic():
                db.transition(ALARM_KIND, "a1", "touch", audit=Audit(1_050.0))
                raise RuntimeError

        with pytest.raises(RuntimeError):
            touch_then_fail()
        (due,) = db.due_timers(ALARM_KIND, WAKE, now=None, limit=10)
        assert (due.entered_at, due.due_at) == (1_001.0, 1_005.0)

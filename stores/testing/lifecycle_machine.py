"""The generated lifecycle tests' comparison of two stores as a Hypothesis state machine.

:func:`lifecycle_machine` builds, for one entity kind, a ``RuleBasedStateMachine`` applying
the steps Hypothesis chooses -- creations, moves with and without a (stale) fence, bulk moves,
removals, timer rounds on a shared :class:`~statecore.FakeClock` -- to two stores side by
side, comparing every result, error, row and history (:mod:`stores.testing.lifecycle` does
the same with seeded random walks).  Hypothesis is imported only when the function is called.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from typing import Any

from statecore.clock import FakeClock
from statecore.entity import EntityKind
from statecore.kinds import kind_named
from statecore.store import Store
from stores.memory import InMemoryStore
from stores.testing._kit import StoreFactory
from stores.testing.lifecycle import START, LifecycleStores, Values, _audit, _outcome, _Plan

__all__ = ["lifecycle_machine"]


def lifecycle_machine(
    kind: EntityKind[Any] | str,
    first: StoreFactory,
    second: StoreFactory | None = None,
    *,
    values: Values | None = None,
) -> type:
    """A Hypothesis ``RuleBasedStateMachine`` class driving ``kind`` on a store from
    ``first`` and one from ``second`` (default: an :class:`~stores.memory.InMemoryStore`)
    side by side: creations, moves with and without a (stale) fence, bulk moves, removals
    and timer rounds on a shared fake clock, every result, error, row and history compared.
    Run it with ``Machine.TestCase`` (a unittest case) or
    ``hypothesis.stateful.run_state_machine_as_test(Machine)``.

    Imports Hypothesis (only when called); raises as :func:`lifecycle_tests`, and
    ``ImportError`` when Hypothesis is not installed.
    """
    from hypothesis import strategies as st  # noqa: PLC0415 - optional, only when asked
    from hypothesis.stateful import RuleBasedStateMachine, precondition, rule  # noqa: PLC0415

    from statecore.timers import Timers  # noqa: PLC0415 - the kit needs no timers

    resolved: EntityKind[Any] = kind_named(kind) if isinstance(kind, str) else kind
    plan = _Plan(resolved, values)
    other: StoreFactory = second or InMemoryStore
    events = list(plan.lifecycle.events)
    entities = st.integers(min_value=0, max_value=7)

    class LifecycleMachine(RuleBasedStateMachine):
        """Two stores, one random walk: they must agree after every step."""

        def __init__(self) -> None:
            super().__init__()
            self.stack = ExitStack()
            self.pair = (
                LifecycleStores(first, resolved, self.stack)(),
                LifecycleStores(other, resolved, self.stack)(),
            )
            self.clock = FakeClock(START)
            self.timers = (
                [Timers(db, [resolved], clock=self.clock) for db in self.pair]
                if plan.timers
                else []
            )
            self.ids: set[str] = set()

        def agree(self, call: Callable[[Store], object]) -> None:
            results = [_outcome(partial(call, db)) for db in self.pair]
            assert results[0] == results[1], results
            one, two = self.pair
            assert one.select(resolved) == two.select(resolved)
            for entity_id in sorted(self.ids):
                assert one.history(resolved, entity_id) == two.history(resolved, entity_id)

        @rule(n=entities, creation=st.sampled_from(plan.creations))
        def create(self, n: int, creation: str) -> None:
            entity_id = f"e{n}"
            self.ids.add(entity_id)
            audit = _audit(self.clock.now(), 0)
            self.agree(
                lambda db: db.insert(
                    resolved, entity_id, plan.values(n), event=creation, audit=audit
                )
            )

        @rule(n=entities, event=st.sampled_from(events), fence_of=st.sampled_from((0, 1, None)))
        def move(self, n: int, event: str, fence_of: int | None) -> None:
            entity_id = f"e{n}"
            current = self.pair[0].get(resolved, entity_id)
            fence = None if current is None or fence_of is None else current.fence + fence_of
            audit = _audit(self.clock.now(), 1)
            self.agree(
                lambda db: db.transition(resolved, entity_id, event, audit=audit, fence=fence)
            )

        @rule(ns=st.lists(entities, max_size=3), event=st.sampled_from(events))
        def move_many(self, ns: list[int], event: str) -> None:
            audit = _audit(self.clock.now(), 2)
            ids = [f"e{n}" for n in ns]
            self.agree(lambda db: db.transition_many(resolved, ids, event, audit=audit))

        @precondition(lambda self: bool(plan.removal_events))
        @rule(data=st.data())
        def prune(self, data: st.DataObject) -> None:
            event = data.draw(st.sampled_from(plan.removal_events))
            self.agree(lambda db: db.prune(resolved, event))

        @rule(seconds=st.floats(min_value=0.0, max_value=200.0, allow_nan=False))
        def advance(self, seconds: float) -> None:
            self.clock.advance(seconds)
            fired = [t.run_due() for t in self.timers]
            assert not fired or fired[0] == fired[1], fired
            self.agree(lambda db: None)

        def teardown(self) -> None:
            self.stack.close()

    name = "".join(part.capitalize() for part in resolved.name.split("_"))
    LifecycleMachine.__name__ = LifecycleMachine.__qualname__ = f"{name}LifecycleMachine"
    machine: type = LifecycleMachine
    return machine

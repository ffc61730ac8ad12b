"""Generated lifecycle tests: every creation, move, refusal, removal and timer a declared
entity kind allows, checked against a store.

:func:`lifecycle_tests` builds, from an :class:`~statecore.entity.EntityKind` (or the name of
one an installed package declares, see :mod:`statecore.kinds`), a pytest base class that a
store's tests subclass with a ``store`` factory fixture, exactly as for
:class:`~stores.testing.StoreContract`::

    from stores.testing.lifecycle import lifecycle_tests

    class TestApprovalsOnMyStore(lifecycle_tests("approval")):
        @pytest.fixture
        def store(self, tmp_path: Path) -> StoreFactory:
            paths = (tmp_path / f"store-{n}.db" for n in itertools.count())
            return lambda: MyStore(next(paths))

Every declared transition is a test of its own: each creation (``test_creation[record]``),
each move from each of its sources (``test_move[held-resume]``: the entity is created, walked
to the source by a shortest path of declared moves, and the move fired -- first with a stale
fence, refused with nothing changed, then with the current one: the target, fence + 1, one
audit entry), each removal from each terminal state (``test_removal[done-purge]``) and each
timer (``test_timer[held-expire]``, fired by :class:`~statecore.timers.Timers` on a
:class:`~statecore.FakeClock`: not due a moment before, fired a moment after).  One test per
kind each checks every refused (state, event) pair (``test_refused``: InvalidTransition,
nothing changed), every removal's refusal outside its states (``test_removal_refused``), the
audit history of seeded walks (``test_audit``) and, in ``test_compare_stores``, seeded random
walks of creations, moves, refusals, bulk moves, removals and timer rounds applied to the store
and to a second one (the ``other_store`` factory fixture, an
:class:`~stores.memory.InMemoryStore` unless overridden), comparing results, errors, rows and
histories after every step.  With Hypothesis installed,
:func:`stores.testing.lifecycle_machine.lifecycle_machine` offers the same comparison as a
``RuleBasedStateMachine`` (Hypothesis is imported only when it is called).

Creation values come from ``values(n)`` (``n`` counts the entities of a test from 0) when
given, else they are generated from the fields: defaults, None for nullable fields, a value of
the field's type for required ones, a positive duration for a timer's field.  Like the rest of
the kit this module is synchronous and imports no pytest plugin.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from enum import Enum
from functools import partial
from typing import Any, TypeGuard

import pytest

from statecore.clock import FakeClock
from statecore.entity import EntityKind, Field
from statecore.errors import InvalidTransition, StaleState
from statecore.kinds import kind_named
from statecore.lifecycle import Lifecycle, Timer
from statecore.store import Audit, Row, Store, TransitionRecord, one_of
from stores.memory import InMemoryStore
from stores.testing._kit import StoreFactory

__all__ = ["LifecycleStores", "lifecycle_tests"]

Values = Callable[[int], Mapping[str, object]]

START = 1_000_000.0
"""The time of every generated test's first write (and of its fake clock's start)."""
OWNER = "lifecycle-tests"
EPSILON = 0.01
"""How far before and after a timer's due time the timer tests look."""
SEEDS = (1, 2, 3)
WALK_STEPS = 25

Move = tuple[str, Enum, Enum]
"""(event, from state, to state)."""


class LifecycleStores:
    """Opens stores from a factory with one kind registered, and closes them all at the end."""

    def __init__(self, factory: StoreFactory, kind: EntityKind[Any], stack: ExitStack) -> None:
        self._factory = factory
        self._kind = kind
        self._stack = stack

    def __call__(self) -> Store:
        """A fresh store with the kind registered."""
        store = self._factory()
        self._stack.callback(store.close)
        store.register(self._kind)
        return store


def lifecycle_tests(kind: EntityKind[Any] | str, *, values: Values | None = None) -> type:
    """A pytest base class testing every transition ``kind`` declares against a store.

    ``kind`` is an entity kind, or the name of one :func:`statecore.kinds.kind_named` finds.
    Subclass the result (with a ``Test`` prefix) and give it a ``store`` fixture returning a
    factory of fresh, empty stores; override ``other_store`` to compare against another store
    than an :class:`~stores.memory.InMemoryStore`.  ``values(n)`` gives the creation values
    of the test's ``n``-th entity (default: generated from the fields).

    Raises :class:`~statecore.errors.UnknownKind` for a name no installed package declares,
    ``TypeError`` for something that is not a kind, ``ValueError`` for a kind whose lifecycle
    declares no creation (no store can hold its entities).
    """
    resolved: EntityKind[Any] = kind_named(kind) if isinstance(kind, str) else kind
    if not isinstance(resolved, EntityKind):
        raise TypeError(f"lifecycle_tests needs an EntityKind or its name, not {kind!r}")
    plan = _Plan(resolved, values)
    base: type = _lifecycle_class(plan)
    return base


# -- what the declaration implies -----------------------------------------------------------------


class _Plan:
    """Everything the generated tests derive from the declaration, computed once."""

    def __init__(self, kind: EntityKind[Any], values: Values | None) -> None:
        lifecycle: Lifecycle[Any] = kind.lifecycle
        self.kind = kind
        self.lifecycle = lifecycle
        self.creations = [e for e in lifecycle.events if lifecycle.creates(e)]
        if not self.creations:
            raise ValueError(
                f"entity kind {kind.name!r}: lifecycle {lifecycle.name!r} declares no creation "
                "event, so no store can hold its entities"
            )
        self.user_values = values
        self.moves: list[Move] = [
            (t.event, source, t.target)
            for t in lifecycle.transitions
            if t.target is not None
            for source in t.sources
        ]
        self.paths = _shortest_paths(lifecycle, self.moves)
        self.removals: list[tuple[str, Enum]] = [
            (t.event, source)
            for t in lifecycle.transitions
            if t.removes
            for source in t.sources
            if source in lifecycle.terminal
        ]
        self.removal_events = [e for e in lifecycle.events if lifecycle.removes(e)]
        self.timers: list[Timer[Any]] = list(lifecycle.timers)
        self.timer_fields = {t.field for t in self.timers if t.field is not None}

    # -- values ------------------------------------------------------------------------------

    def values(self, n: int, *, shortest: Timer[Any] | None = None) -> dict[str, object]:
        """The creation values of entity ``n``; without ``values(n)``, generated, with the
        duration of ``shortest`` (a field timer) below every other timer of its source state."""
        if self.user_values is not None:
            return dict(self.user_values(n))
        out: dict[str, object] = {}
        for i, field in enumerate(self.kind.fields):
            if field.name in self.timer_fields:
                out[field.name] = _duration(field, 60.0 + 10.0 * i)
            elif field.default is not None:
                out[field.name] = field.default
            elif field.nullable:
                out[field.name] = None
            else:
                out[field.name] = _required(field, n)
        if shortest is not None:
            others = [t for t in self.lifecycle.timers_from(shortest.source) if t != shortest]
            bound = min(
                [t.seconds for t in others if t.seconds is not None]
                + [float(v) for t in others if t.field for v in [out[t.field]] if _number(v)]
                + [60.0]
            )
            if shortest.field is not None:
                out[shortest.field] = _duration(self.kind.field(shortest.field), bound / 2)
            else:
                for t in others:
                    if t.field is not None and t.field != shortest.field:
                        seconds = shortest.seconds or 0.0
                        out[t.field] = _duration(self.kind.field(t.field), 2 * seconds + 1)
        return out

    # -- walking -----------------------------------------------------------------------------

    def create(self, db: Store, entity_id: str, n: int, at: float, **kw: Any) -> Row[Any]:
        """Create entity ``entity_id`` (values of entity ``n``) through the first creation."""
        values = kw.pop("values", None)
        row, created = db.insert(
            self.kind,
            entity_id,
            self.values(n) if values is None else values,
            event=self.creations[0],
            audit=_audit(at, 0),
        )
        assert created, f"{entity_id} already existed"
        return row

    def reach(
        self, db: Store, state: Enum, entity_id: str, n: int, at: float, **kw: Any
    ) -> tuple[Row[Any], list[TransitionRecord]]:
        """Create an entity and walk it to ``state`` by a shortest path of declared moves;
        return its row and the audit entries the walk must have written."""
        row = self.create(db, entity_id, n, at, **kw)
        walked = [self.record(entity_id, self.creations[0], None, row.state, _audit(at, 0))]
        for step, (event, source, target) in enumerate(self.paths[state], start=1):
            assert row.state is source
            row = db.transition(
                self.kind, entity_id, event, audit=_audit(at, step), fence=row.fence
            )
            assert row.state is target, f"{event} from {source.value} reached {row.state}"
            walked.append(self.record(entity_id, event, source, target, _audit(at, step)))
        assert row.state is state
        return row, walked

    @staticmethod
    def record(
        entity_id: str, event: str, source: Enum | None, target: Enum, audit: Audit
    ) -> TransitionRecord:
        """The audit entry a write with ``audit`` writes."""
        return TransitionRecord(
            entity_id, event, source, target, audit.at, audit.owner, audit.attempts, audit.reason
        )

    def snapshot(self, db: Store, entity_id: str) -> tuple[object, ...]:
        """Everything stored about one entity: its row and its history."""
        return (db.get(self.kind, entity_id), db.history(self.kind, entity_id))


def _audit(at: float, step: int) -> Audit:
    return Audit(at=at, owner=OWNER, attempts=step, reason=f"step {step}")


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _required(field: Field, n: int) -> object:
    if field.type is str:
        return f"{field.name}-{n}"
    if field.type is bool:
        return n % 2 == 1
    if field.type is int:
        return n + 1
    return float(n) + 0.5


def _duration(field: Field, seconds: float) -> object:
    return max(1, round(seconds)) if field.type is int else float(seconds)


def _shortest_paths(lifecycle: Lifecycle[Any], moves: list[Move]) -> dict[Enum, list[Move]]:
    """For every state, a shortest list of declared moves reaching it from the initial state
    (declaration order breaks ties)."""
    paths: dict[Enum, list[Move]] = {lifecycle.initial: []}
    todo = deque([lifecycle.initial])
    while todo:
        state = todo.popleft()
        for move in moves:
            if move[1] is state and move[2] not in paths:
                paths[move[2]] = [*paths[state], move]
                todo.append(move[2])
    return paths


def _id(state: Enum, event: str) -> str:
    return f"{state.value}-{event}"


def _outcome(call: Callable[[], object]) -> object:
    """What a call returned, or its error by type and message (comparable across stores)."""
    try:
        return call()
    except (InvalidTransition, StaleState, LookupError, ValueError, TypeError) as exc:
        return (type(exc).__name__, str(exc))


# -- the generated class --------------------------------------------------------------------------


def _lifecycle_class(plan: _Plan) -> type:
    kind, lifecycle = plan.kind, plan.lifecycle
    states = list(lifecycle.states)
    refusable = {
        state: [e for e in lifecycle.events if (state, e) not in lifecycle.table]
        for state in states
    }
    refused_states = [s for s in states if refusable[s]]

    class LifecycleTests:
        """Generated tests of one entity kind's lifecycle against a store."""

        lifecycle_plan = plan

        @pytest.fixture
        def other_store(self) -> StoreFactory:
            """The store ``test_compare_stores`` compares against (override to change)."""
            return InMemoryStore

        @pytest.fixture
        def lifecycle_stores(self, store: StoreFactory) -> Iterator[LifecycleStores]:
            """Fresh stores from ``store`` with the kind registered, closed at teardown."""
            with ExitStack() as stack:
                yield LifecycleStores(store, kind, stack)

        @pytest.fixture
        def db(self, lifecycle_stores: LifecycleStores) -> Store:
            """One fresh store with the kind registered."""
            return lifecycle_stores()

        @pytest.mark.parametrize("event", plan.creations)
        def test_creation(self, db: Store, event: str) -> None:
            """A creation starts the entity in the initial state, fence 0, with its checked
            values and one audit entry; creating it again changes nothing."""
            values = plan.values(0)
            row, created = db.insert(kind, "e0", values, event=event, audit=_audit(START, 0))
            assert created
            assert (row.id, row.state, row.fence) == ("e0", lifecycle.initial, 0)
            assert dict(row.values) == kind.new_values(values)
            assert db.get(kind, "e0") == row
            expected = [plan.record("e0", event, None, lifecycle.initial, _audit(START, 0))]
            assert db.history(kind, "e0") == expected
            again, created = db.insert(kind, "e0", values, event=event, audit=_audit(START, 9))
            assert (again, created) == (row, False)
            assert db.history(kind, "e0") == expected

        @pytest.mark.parametrize(
            ("event", "source", "target"), plan.moves, ids=[_id(m[1], m[0]) for m in plan.moves]
        )
        def test_move(self, db: Store, event: str, source: Enum, target: Enum) -> None:
            """From ``source`` (reached by a shortest path) the move reaches ``target`` with
            fence + 1 and its audit entry; a stale fence first is refused, changing nothing."""
            row, walked = plan.reach(db, source, "e0", 0, START)
            before = plan.snapshot(db, "e0")
            for stale in {row.fence + 1, row.fence - 1} - {-1}:
                with pytest.raises(StaleState):
                    db.transition(kind, "e0", event, audit=_audit(START, 99), fence=stale)
                assert plan.snapshot(db, "e0") == before
            step = len(walked)
            moved = db.transition(kind, "e0", event, audit=_audit(START + 1, step), fence=row.fence)
            assert (moved.state, moved.fence) == (target, row.fence + 1)
            assert dict(moved.values) == dict(row.values)
            assert db.get(kind, "e0") == moved
            last = plan.record("e0", event, source, target, _audit(START + 1, step))
            assert db.history(kind, "e0") == [*walked, last]

        def test_refused(self, db: Store) -> None:
            """From every state, every event not declared from it (moves from elsewhere,
            creations, removals) raises InvalidTransition, with or without the current fence,
            and changes nothing."""
            reached = {
                state: plan.reach(db, state, f"e{n}", n, START)[0]
                for n, state in enumerate(refused_states)
            }
            before = {row.id: plan.snapshot(db, row.id) for row in reached.values()}
            for state, row in reached.items():
                for event in refusable[state]:
                    for fence in (None, row.fence):
                        with pytest.raises(InvalidTransition):
                            db.transition(kind, row.id, event, audit=_audit(START, 99), fence=fence)
                        assert plan.snapshot(db, row.id) == before[row.id], (
                            f"{event} from {state.value} changed the entity"
                        )
            assert {i: plan.snapshot(db, i) for i in before} == before

        @pytest.mark.parametrize(
            ("event", "state"), plan.removals, ids=[_id(s, e) for e, s in plan.removals]
        )
        def test_removal(self, db: Store, event: str, state: Enum) -> None:
            """A removal deletes an entity in a terminal state it names, history and all."""
            plan.reach(db, state, "e0", 0, START)
            assert db.prune(kind, event) == 1
            assert db.get(kind, "e0") is None
            assert db.history(kind, "e0") == []
            assert db.count(kind) == 0

        def test_removal_refused(self, db: Store) -> None:
            """A removal leaves every entity in a state it does not name (every non-terminal
            state among them) as it was."""
            n = 0
            for event in plan.removal_events:
                kept = [s for s in states if s not in lifecycle.sources(event)]
                assert any(s not in lifecycle.terminal for s in kept)
                ids = []
                for state in kept:
                    ids.append(plan.reach(db, state, f"{event}-{n}", n, START)[0].id)
                    n += 1
                before = [plan.snapshot(db, i) for i in ids]
                assert db.prune(kind, event, where={kind.id_field: one_of(*ids)}) == 0
                assert [plan.snapshot(db, i) for i in ids] == before, f"{event} removed one"

        def test_audit(self, db: Store) -> None:
            """The history of a walk to a terminal state (a few seeded random walks) is
            exactly the walk taken: the creation (from None) first, each move from the state
            the one before reached."""
            for seed in SEEDS:
                rng = random.Random(seed)
                entity_id = f"walk-{seed}"
                row = plan.create(db, entity_id, seed, START)
                first = _audit(START, 0)
                walked = [plan.record(entity_id, plan.creations[0], None, row.state, first)]
                for step in range(1, 30):
                    options = [m for m in plan.moves if m[1] is row.state]
                    if not options:
                        break
                    event, source, target = rng.choice(options)
                    at = START + step * 0.25
                    row = db.transition(kind, entity_id, event, audit=_audit(at, step))
                    walked.append(plan.record(entity_id, event, source, target, _audit(at, step)))
                history = db.history(kind, entity_id)
                assert history == walked
                assert history[0].from_state is None
                assert all(a.to_state is b.from_state for a, b in itertools.pairwise(history))
                assert row.fence == len(walked) - 1

        @pytest.mark.parametrize(
            "timer", plan.timers, ids=[_id(t.source, t.event) for t in plan.timers]
        )
        def test_timer(self, db: Store, timer: Timer[Any]) -> None:
            """The timer is not due a moment before entered + its duration, fires a moment
            after (one audited move, fence + 1, ``fired by timer after ...``)."""
            from statecore.timers import Timers  # noqa: PLC0415 - the kit needs no timers

            clock = FakeClock(START)
            values = plan.values(0, shortest=timer)
            row, _ = plan.reach(db, timer.source, "e0", 0, clock.now(), values=values)
            timers = Timers(db, [kind], clock=clock)
            dues = {t: _due_at(t, row, clock.now()) for t in lifecycle.timers_from(timer.source)}
            live = {t: d for t, d in dues.items() if d is not None}
            before = plan.snapshot(db, "e0")
            if not live:  # every duration of this row is None: nothing ever fires
                clock.advance(1e9)
                assert timers.run_due() == []
                assert plan.snapshot(db, "e0") == before
                return
            first = min(live.values())
            clock.advance(first - clock.now() - EPSILON)
            assert timers.run_due() == []
            assert plan.snapshot(db, "e0") == before
            clock.advance(2 * EPSILON)
            fired = timers.run_due()
            assert len(fired) == 1, fired
            (one,) = fired
            soonest = {t.event: t.target for t, d in live.items() if d == first}
            if dues[timer] == first:
                assert timer.event in soonest
            assert (one.kind, one.entity_id, one.from_state) == (kind.name, "e0", timer.source)
            assert one.event in soonest
            assert one.to_state is soonest[one.event]
            assert one.due_at == pytest.approx(first)
            assert one.fired_at == clock.now()
            after = db.get(kind, "e0")
            assert after is not None
            assert (after.state, after.fence) == (one.to_state, row.fence + 1)
            last = db.history(kind, "e0")[-1]
            assert (last.event, last.from_state, last.to_state) == (
                one.event,
                timer.source,
                one.to_state,
            )
            assert last.at == clock.now()
            assert last.reason is not None
            assert last.reason.startswith("fired by timer after")

        def test_compare_stores(
            self, lifecycle_stores: LifecycleStores, other_store: StoreFactory
        ) -> None:
            """Seeded random walks of creations, moves (current, stale and no fence),
            refusals, bulk moves, removals and timers applied to this store and to
            ``other_store``: the same results, errors, rows and histories after every step."""
            with ExitStack() as stack:
                one, two = lifecycle_stores(), LifecycleStores(other_store, kind, stack)()
                clock = FakeClock(START)
                for seed in SEEDS:
                    _compare(plan, (one, two), random.Random(seed), clock, f"s{seed}-")

    # Nothing to parametrize: no test at all rather than one skipped.
    for method, items in (
        ("test_refused", refused_states),
        ("test_removal", plan.removals),
        ("test_removal_refused", plan.removal_events),
        ("test_timer", plan.timers),
    ):
        if not items:
            delattr(LifecycleTests, method)
    name = "".join(part.capitalize() for part in kind.name.split("_"))
    LifecycleTests.__name__ = LifecycleTests.__qualname__ = f"{name}Lifecycle"
    LifecycleTests.__doc__ = f"Generated tests of the {kind.name!r} kind's lifecycle."
    return LifecycleTests


def _due_at(timer: Timer[Any], row: Row[Any], entered: float) -> float | None:
    if timer.field is None:
        assert timer.seconds is not None
        return entered + timer.seconds
    value = row.values[timer.field]
    return None if value is None else entered + float(value)


def _compare(
    plan: _Plan, pair: tuple[Store, Store], rng: random.Random, clock: FakeClock, prefix: str
) -> None:
    """Apply the same random walk to both stores (entities named ``prefix`` + ``e<n>``);
    assert they agree after every step: the step's result or error, every row, and the
    history of every entity of the walk (those the step touched after a creation or a move;
    all after a removal, a timer round and the last step)."""
    from statecore.timers import Timers  # noqa: PLC0415 - the kit needs no timers

    kind = plan.kind
    one, two = pair
    timers = [Timers(db, [kind], clock=clock) for db in pair] if plan.timers else []
    ids: list[str] = []
    durations = sorted(
        {t.seconds for t in plan.timers if t.seconds is not None} | {1.0, 30.0, 60.0, 90.0}
    )
    for step in range(WALK_STEPS):
        action = rng.choice(("create", "create", "move", "move", "move", "many", "prune", "time"))
        touched: list[str] | None = None
        results: list[object]
        if action == "time":
            clock.advance(rng.choice(durations) + rng.choice((-EPSILON, EPSILON, 0.5)))
            results = [t.run_due() for t in timers] if timers else [None, None]
        else:
            audit = _audit(clock.now(), step)
            call, touched = _random_call(
                plan, rng, action=action, ids=ids, prefix=prefix, one=one, audit=audit
            )
            results = [_outcome(partial(call, db)) for db in pair]
        assert results[0] == results[1], f"step {step} ({action}): {results}"
        assert one.select(kind) == two.select(kind), f"step {step} ({action}): the rows differ"
        for entity_id in ids if touched is None or step == WALK_STEPS - 1 else touched:
            assert one.history(kind, entity_id) == two.history(kind, entity_id), (
                f"step {step} ({action}): the histories of {entity_id} differ"
            )


def _random_call(
    plan: _Plan,
    rng: random.Random,
    *,
    action: str,
    ids: list[str],
    prefix: str,
    one: Store,
    audit: Audit,
) -> tuple[Callable[[Store], object], list[str] | None]:
    """One random write for both stores, and the entities it may change (None: any)."""
    kind, events = plan.kind, list(plan.lifecycle.events)
    if action == "create" or not ids:
        n = len(ids) if not ids or rng.random() < 0.8 else rng.randrange(len(ids))
        entity_id = f"{prefix}e{n}"
        if entity_id not in ids:
            ids.append(entity_id)
        event = rng.choice(plan.creations if rng.random() < 0.9 else events)
        values = plan.values(n)
        return (
            lambda db: db.insert(kind, entity_id, values, event=event, audit=audit),
            [entity_id],
        )
    event = rng.choice(events)
    if action == "prune":
        removal = rng.choice(plan.removal_events or events)
        return (lambda db: db.prune(kind, removal)), None
    if action == "many":
        picked = rng.sample([*ids, f"{prefix}ghost"], k=min(len(ids), rng.randint(1, 3)))
        return (lambda db: db.transition_many(kind, picked, event, audit=audit)), picked
    chosen = rng.choice([*ids, f"{prefix}ghost"])
    current = one.get(kind, chosen)
    fence_of = rng.choice(("none", "current", "stale"))
    fence = (
        None
        if current is None or fence_of == "none"
        else current.fence + (1 if fence_of == "stale" else 0)
    )
    return (lambda db: db.transition(kind, chosen, event, audit=audit, fence=fence)), [chosen]

"""The store contract kit: the behaviour every :class:`~statecore.store.Store` must show.

:class:`StoreContract` is a pytest base class holding the whole contract as test methods.  A
store implementation passes the contract by subclassing it and providing a ``store`` fixture
that is a *factory*: a callable returning a fresh, empty, unregistered store on every call.  The
kit registers its own entity kinds (:data:`TICKET_KIND`, ``OBLIGATION_KIND``) and closes every
store it opened when the test ends; a test may open several stores::

    import itertools
    from pathlib import Path

    import pytest

    from stores.testing import StoreContract, StoreFactory
    from mystore import MyStore

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store(self, tmp_path: Path) -> StoreFactory:
            paths = (tmp_path / f"store-{n}.db" for n in itertools.count())
            return lambda: MyStore(next(paths))

The class has no ``Test`` prefix, so pytest collects it only through such subclasses.  Inside
the kit, ``new_store`` is the kit-owned wrapper of the user's factory and ``db`` one fresh
store with the kit's kinds registered.  The tests use no sleeps: time comes from
:class:`~statecore.FakeClock`, and the thread race is bounded by join timeouts.

This module imports pytest: it is test-support code, installed with the package but used only
where the dev dependencies are installed.  For pytest's detailed assertion messages from the
kit's own asserts, call ``pytest.register_assert_rewrite("stores.testing")`` (in a
``conftest.py``, or before the first import of this module).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import ExitStack, suppress
from enum import StrEnum
from typing import Any

import pytest

from statecore.batch import (
    BatchStore,
    Creation,
    Move,
    insert_each_sequentially,
    transition_each_sequentially,
)
from statecore.clock import FakeClock
from statecore.entity import EntityKind, Field, Index
from statecore.errors import InvalidTransition, StaleState, StoreError, UnknownEntity
from statecore.ledger import Ledger
from statecore.lifecycle import Lifecycle, Transition
from statecore.lifecycles import ObligationState
from statecore.obligation import OBLIGATION_KIND
from statecore.ownership import Incarnation
from statecore.store import (
    Audit,
    Row,
    Store,
    TransitionRecord,
    ge,
    gt,
    le,
    lt,
    ne,
    one_of,
)

__all__ = [
    "TICKET",
    "TICKET_KIND",
    "StoreContract",
    "StoreFactory",
    "StoreOpener",
    "TicketState",
]

StoreFactory = Callable[[], Store]
"""What a subclass's ``store`` fixture returns: a callable making a fresh, empty store."""


# -- the kit's own test lifecycle and entity kind -------------------------------------------------


class TicketState(StrEnum):
    """The states of the kit's test entity."""

    OPEN = "open"
    HELD = "held"
    DONE = "done"
    DROPPED = "dropped"


_T = TicketState

TICKET: Lifecycle[TicketState] = Lifecycle(
    "ticket",
    TicketState,
    initial=_T.OPEN,
    terminal=(_T.DONE, _T.DROPPED),
    description="The store contract kit's test lifecycle.",
    transitions=(
        Transition("file", None, _T.OPEN),  # creation
        Transition("touch", _T.OPEN, _T.OPEN),  # a self-loop
        Transition("hold", _T.OPEN, _T.HELD),
        Transition("resume", _T.HELD, _T.OPEN),
        Transition("finish", (_T.OPEN, _T.HELD), _T.DONE),  # multi-source
        # One event, a different target per source.
        Transition("advance", _T.OPEN, _T.HELD),
        Transition("advance", _T.HELD, _T.DONE),
        Transition("drop", (_T.OPEN, _T.HELD), _T.DROPPED),  # multi-source
        Transition("purge", (_T.DONE, _T.DROPPED), None),  # removal from every terminal state
        Transition("archive", _T.DONE, None),  # removal from one terminal state only
    ),
)
"""The kit's test lifecycle: open/held/done/dropped."""

TICKET_KIND: EntityKind[TicketState] = EntityKind(
    "ticket",
    TICKET,
    table="kit_tickets",
    id_field="ticket_id",
    fields=(
        Field("title", str, nullable=False, immutable=True),
        Field("assignee", str),
        Field("priority", int, nullable=False, default=3),
        Field("score", float),
        Field("urgent", bool, nullable=False, default=False),
        Field("due_at", float),
        Field("queue", str, nullable=False, default="general"),
    ),
    indexes=(
        Index(("assignee", "priority"), states=frozenset({_T.OPEN, _T.HELD})),
        Index(("due_at",)),
    ),
)
"""The kit's test entity kind: every field type, nullable and not, an immutable field,
defaults, and a partial index."""

_O = ObligationState
_AUDIT = Audit(at=1_000.0, owner="kit")
_JOIN_TIMEOUT = 60.0
_SEED_IDS = ("a1", "a2", "a3", "a4", "a5", "a6")


class _Boom(Exception):
    """Raised by tests to abort an ``atomic()`` block."""


class StoreOpener:
    """The kit-owned wrapper of a ``store`` factory: opens stores, registers the kit's kinds
    and closes everything it opened at teardown."""

    def __init__(self, factory: StoreFactory, stack: ExitStack) -> None:
        self._factory = factory
        self._stack = stack

    def __call__(self, *, register: bool = True) -> Store:
        """A fresh store (with the kit's kinds registered unless ``register`` is False)."""
        store = self._factory()
        self._stack.callback(store.close)
        if register:
            store.register(TICKET_KIND)
            store.register(OBLIGATION_KIND)
        return store


# -- helpers --------------------------------------------------------------------------------------


def _file(db: Store, ticket_id: str, audit: Audit = _AUDIT, **values: object) -> Row[TicketState]:
    """Insert a new ticket (title defaults to its id); fail if it already existed."""
    row, created = db.insert(
        TICKET_KIND, ticket_id, {"title": ticket_id, **values}, event="file", audit=audit
    )
    assert created, f"{ticket_id} already existed"
    return row


def _move(
    db: Store, ticket_id: str, event: str, audit: Audit = _AUDIT, **kwargs: Any
) -> Row[TicketState]:
    return db.transition(TICKET_KIND, ticket_id, event, audit=audit, **kwargs)


def _get(db: Store, ticket_id: str) -> Row[TicketState]:
    row = db.get(TICKET_KIND, ticket_id)
    assert row is not None, f"{ticket_id} is missing"
    return row


def _snapshot(db: Store, ticket_id: str) -> tuple[object, ...]:
    """Everything stored about a ticket: state, fence, values and history."""
    row = db.get(TICKET_KIND, ticket_id)
    values = None if row is None else (row.state, row.fence, dict(row.values))
    return (values, db.history(TICKET_KIND, ticket_id))


def _outcome(outcome: object) -> object:
    """A batch item's outcome in comparable form: rows as they are, errors by type and text."""
    if isinstance(outcome, Exception):
        return (type(outcome).__name__, str(outcome))
    return outcome


def _ids(rows: list[Row[Any]]) -> list[str]:
    return [row.id for row in rows]


def _seed(db: Store) -> None:
    """Six tickets covering every state, NULLs and ties (inserted out of id order).

    ====  =======  ========  ========  =====  ======  ======  =====
    id    state    assignee  priority  score  urgent  due_at  fence
    ====  =======  ========  ========  =====  ======  ======  =====
    a1    open     alice     1         0.5    True    100.0   0
    a2    held     --        2         --     False   200.0   1
    a3    done     bob       3         1.5    False   --      1
    a4    open     --        3         2.5    False   300.0   0
    a5    dropped  alice     5         --     True    --      1
    a6    open     bob       2         0.5    False   150.0   2
    ====  =======  ========  ========  =====  ======  ======  =====
    """
    _file(db, "a4", score=2.5, due_at=300.0)
    _file(db, "a1", assignee="alice", priority=1, score=0.5, urgent=True, due_at=100.0)
    _file(db, "a6", assignee="bob", priority=2, score=0.5, due_at=150.0)
    _file(db, "a3", assignee="bob", score=1.5)
    _file(db, "a5", assignee="alice", priority=5, urgent=True)
    _file(db, "a2", priority=2, due_at=200.0)
    _move(db, "a2", "hold")
    _move(db, "a3", "finish")
    _move(db, "a5", "drop")
    _move(db, "a6", "touch")
    _move(db, "a6", "touch")


def _obligation(at: float, **extra: object) -> dict[str, object]:
    """Creation values of an obligation recorded at ``at``."""
    return {
        "session_key": "session",
        "platform": "telegram",
        "chat_id": "chat-1",
        "content": "hello",
        "created_at": at,
        "updated_at": at,
        **extra,
    }


def _record(db: Store, obligation_id: str, at: float, **extra: object) -> Row[ObligationState]:
    row, created = db.insert(
        OBLIGATION_KIND, obligation_id, _obligation(at, **extra), event="record", audit=Audit(at)
    )
    assert created
    return row


def _abort_block(db: Store, body: Callable[[], object]) -> None:
    """Run ``body`` in an ``atomic()`` block, then raise :class:`_Boom` inside it."""

    def run() -> None:
        with db.atomic():
            body()
            raise _Boom

    with pytest.raises(_Boom):
        run()


# (states, where) filters whose select and count must agree, over the seeded tickets.
_FILTERS: list[tuple[list[TicketState] | None, dict[str, object] | None]] = [
    (None, None),
    ([_T.OPEN], None),
    ([_T.DONE, _T.DROPPED], None),
    ([], None),
    (None, {"assignee": None}),
    (None, {"score": lt(1.0)}),
    (None, {"score": ne(None), "priority": ge(2)}),
    ([_T.OPEN, _T.HELD], {"due_at": gt(120)}),
    (None, {"ticket_id": one_of("a1", "a5", "zz")}),
    (None, {"fence": 1}),
    ([_T.HELD], {"assignee": "alice"}),
]


class StoreContract:
    """The Store contract as pytest tests; subclass it and provide a ``store`` factory fixture.

    See the module docstring for an example.
    """

    # -- kit fixtures ---------------------------------------------------------------------------

    @pytest.fixture
    def new_store(self, store: StoreFactory) -> Iterator[StoreOpener]:
        """Wraps the subclass's factory; closes every store it opened at teardown."""
        with ExitStack() as stack:
            yield StoreOpener(store, stack)

    @pytest.fixture
    def db(self, new_store: StoreOpener) -> Store:
        """One fresh store with the kit's kinds registered."""
        return new_store()

    # -- registration and closing ---------------------------------------------------------------

    def test_factory_returns_fresh_empty_stores(self, new_store: StoreOpener) -> None:
        """Each call of the factory gives an independent, empty store."""
        first, second = new_store(), new_store()
        _file(first, "t1")
        assert second.get(TICKET_KIND, "t1") is None
        assert second.count(TICKET_KIND) == 0
        assert first.count(TICKET_KIND) == 1
        assert second.count(OBLIGATION_KIND) == 0

    def test_register_is_idempotent(self, db: Store) -> None:
        """Registering an already registered kind again changes nothing and keeps its rows."""
        _file(db, "t1")
        db.register(TICKET_KIND)
        db.register(TICKET_KIND)
        db.register(OBLIGATION_KIND)
        assert _get(db, "t1").state is _T.OPEN
        assert db.count(TICKET_KIND) == 1
        assert len(db.history(TICKET_KIND, "t1")) == 1

    def test_unregistered_kind_raises_store_error(self, new_store: StoreOpener) -> None:
        """Every operation on a kind the store never registered raises StoreError."""
        db = new_store(register=False)
        db.register(OBLIGATION_KIND)
        k = TICKET_KIND
        with pytest.raises(StoreError):
            db.insert(k, "t1", {"title": "x"}, event="file", audit=_AUDIT)
        with pytest.raises(StoreError):
            db.get(k, "t1")
        with pytest.raises(StoreError):
            db.transition(k, "t1", "hold", audit=_AUDIT)
        with pytest.raises(StoreError):
            db.select(k)
        with pytest.raises(StoreError):
            db.count(k)
        with pytest.raises(StoreError):
            db.prune(k, "purge")
        with pytest.raises(StoreError):
            db.history(k, "t1")

    def test_operations_after_close_raise_store_error(self, db: Store) -> None:
        """After close() every operation, atomic() included, raises StoreError."""
        _file(db, "t1")
        db.close()
        k = TICKET_KIND
        with pytest.raises(StoreError):
            db.insert(k, "t2", {"title": "x"}, event="file", audit=_AUDIT)
        with pytest.raises(StoreError):
            db.get(k, "t1")
        with pytest.raises(StoreError):
            db.transition(k, "t1", "hold", audit=_AUDIT)
        with pytest.raises(StoreError):
            db.select(k)
        with pytest.raises(StoreError):
            db.count(k)
        with pytest.raises(StoreError):
            db.prune(k, "purge")
        with pytest.raises(StoreError):
            db.history(k, "t1")
        with pytest.raises(StoreError), db.atomic():
            pass

    def test_register_after_close_raises_store_error(self, db: Store) -> None:
        """After close() register() raises StoreError, for a kind registered before or not."""
        db.close()
        with pytest.raises(StoreError):
            db.register(TICKET_KIND)
        with pytest.raises(StoreError):
            db.register(OBLIGATION_KIND)

    def test_close_is_idempotent(self, db: Store) -> None:
        """Closing a store twice is fine and it stays closed."""
        db.close()
        db.close()
        with pytest.raises(StoreError):
            db.count(TICKET_KIND)

    # -- insert ---------------------------------------------------------------------------------

    def test_insert_creates_in_initial_state_with_fence_zero(self, db: Store) -> None:
        """insert() creates the entity in the initial state with fence 0 and returns (row, True)."""
        row, created = db.insert(TICKET_KIND, "t1", {"title": "first"}, event="file", audit=_AUDIT)
        assert created is True
        assert row.id == "t1"
        assert row.state is _T.OPEN
        assert row.fence == 0
        assert _get(db, "t1") == row
        assert db.count(TICKET_KIND) == 1

    def test_insert_echoes_values_with_defaults_and_float_coercion(self, db: Store) -> None:
        """Inserted values come back exactly, defaults filled and ints stored in float fields
        as floats."""
        row = _file(db, "t1", title="T", assignee=None, score=2, due_at=7, priority=4)
        expected = {
            "title": "T",
            "assignee": None,
            "priority": 4,
            "score": 2.0,
            "urgent": False,
            "due_at": 7.0,
            "queue": "general",
        }
        for read in (row, _get(db, "t1"), db.select(TICKET_KIND)[0]):
            assert dict(read.values) == expected
            assert type(read["score"]) is float
            assert type(read["due_at"]) is float
            assert type(read["priority"]) is int
            assert read["urgent"] is False
            assert read["title"] == "T"
        odd: dict[str, object] = {
            "title": "O'Brien; DROP TABLE x -- \u2713",
            "assignee": '\u00e9\u00e8 "q" \\ %_',
            "priority": -(2**62),
            "score": 0.1 + 0.2,
            "queue": "",
        }
        db.insert(TICKET_KIND, "odd", odd, event="file", audit=_AUDIT)
        assert dict(_get(db, "odd").values) == {**odd, "urgent": False, "due_at": None}
        other = _file(db, "t2", urgent=True, queue="vip", score=0.25)
        assert _get(db, "t2")["urgent"] is True
        assert other["queue"] == _get(db, "t2")["queue"] == "vip"
        assert _get(db, "t2")["score"] == 0.25
        assert _get(db, "t2")["assignee"] is None

    def test_reinsert_returns_existing_row_and_changes_nothing(self, db: Store) -> None:
        """Inserting an existing id returns (existing row, False) and writes nothing, even with
        different values."""
        _file(db, "t1", assignee="alice", priority=2)
        current = _move(db, "t1", "hold")
        before = _snapshot(db, "t1")
        row, created = db.insert(
            TICKET_KIND,
            "t1",
            {"title": "other", "assignee": "bob", "priority": 9},
            event="file",
            audit=Audit(at=5.0, owner="late"),
        )
        assert created is False
        assert row == current
        assert row.state is _T.HELD
        assert row.fence == 1
        assert row["assignee"] == "alice"
        assert _snapshot(db, "t1") == before
        assert db.count(TICKET_KIND) == 1

    def test_insert_with_non_creation_event_raises_invalid_transition(self, db: Store) -> None:
        """insert() through a move, removal or undeclared event raises InvalidTransition and
        stores nothing."""
        for event in ("hold", "touch", "purge", "no_such_event"):
            with pytest.raises(InvalidTransition):
                db.insert(TICKET_KIND, "t1", {"title": "x"}, event=event, audit=_AUDIT)
        assert db.get(TICKET_KIND, "t1") is None
        assert db.history(TICKET_KIND, "t1") == []
        assert db.count(TICKET_KIND) == 0

    @pytest.mark.parametrize(
        ("values", "error"),
        [
            ({"title": 5}, TypeError),
            ({"title": "t", "score": "high"}, TypeError),
            ({"title": "t", "priority": True}, TypeError),
            ({"title": "t", "priority": 1.5}, TypeError),
            ({"title": "t", "urgent": 1}, TypeError),
            ({"title": None}, ValueError),
            ({}, ValueError),
            ({"title": "t", "urgent": None}, ValueError),
            ({"title": "t", "nope": 1}, KeyError),
            ({"title": "t", "fence": 3}, KeyError),
            ({"title": "t", "state": "done"}, KeyError),
        ],
        ids=[
            "str-field-int",
            "float-field-str",
            "int-field-bool",
            "int-field-float",
            "bool-field-int",
            "none-non-nullable",
            "missing-required",
            "none-non-nullable-default",
            "unknown-field",
            "managed-fence",
            "managed-state",
        ],
    )
    def test_insert_bad_values_are_refused_and_nothing_stored(
        self, db: Store, values: dict[str, object], error: type[Exception]
    ) -> None:
        """A value of the wrong type, None where not nullable or an unknown field is refused
        and nothing is stored."""
        _file(db, "keep")
        with pytest.raises(error):
            db.insert(TICKET_KIND, "t1", values, event="file", audit=_AUDIT)
        assert db.get(TICKET_KIND, "t1") is None
        assert db.history(TICKET_KIND, "t1") == []
        assert db.count(TICKET_KIND) == 1

    @pytest.mark.parametrize("bad_id", ["", 7, None, b"t1"])
    def test_insert_refuses_empty_or_non_str_id(self, db: Store, bad_id: Any) -> None:
        """An empty or non-str id is refused with TypeError or ValueError and nothing is
        stored."""
        with pytest.raises((TypeError, ValueError)):
            db.insert(TICKET_KIND, bad_id, {"title": "x"}, event="file", audit=_AUDIT)
        assert db.count(TICKET_KIND) == 0

    def test_get_unknown_id_returns_none(self, db: Store) -> None:
        """get() of an id that was never inserted returns None."""
        assert db.get(TICKET_KIND, "ghost") is None
        _file(db, "t1")
        assert db.get(TICKET_KIND, "ghost") is None
        assert db.get(OBLIGATION_KIND, "t1") is None

    # -- transition -----------------------------------------------------------------------------

    def test_transition_moves_and_bumps_fence_by_one(self, db: Store) -> None:
        """A legal transition moves the entity, bumps its fence by exactly one and returns the
        written row."""
        _file(db, "t1", assignee="alice")
        held = _move(db, "t1", "hold", fence=0)
        assert held.state is _T.HELD
        assert held.fence == 1
        assert held.id == "t1"
        assert held["assignee"] == "alice"
        assert _get(db, "t1") == held
        reopened = _move(db, "t1", "resume")
        assert (reopened.state, reopened.fence) == (_T.OPEN, 2)
        done = _move(db, "t1", "finish", fence=2)
        assert (done.state, done.fence) == (_T.DONE, 3)
        assert _get(db, "t1") == done

    def test_multi_source_event_moves_from_each_source(self, db: Store) -> None:
        """An event with several source states applies from each of them."""
        _file(db, "from-open")
        _file(db, "from-held")
        _move(db, "from-held", "hold")
        assert _move(db, "from-open", "finish").state is _T.DONE
        assert _move(db, "from-held", "finish").state is _T.DONE

    def test_event_with_a_target_per_source(self, db: Store) -> None:
        """An event declared with a different target per source moves each row to its own
        source's target."""
        _file(db, "t1")
        _file(db, "t2")
        _move(db, "t2", "hold")
        assert _move(db, "t1", "advance").state is _T.HELD
        assert _move(db, "t2", "advance").state is _T.DONE
        assert _move(db, "t1", "advance", fence=1).state is _T.DONE
        with pytest.raises(InvalidTransition):
            _move(db, "t1", "advance")
        assert [(r.from_state, r.to_state) for r in db.history(TICKET_KIND, "t1")[1:]] == [
            (_T.OPEN, _T.HELD),
            (_T.HELD, _T.DONE),
        ]
        assert [(r.from_state, r.to_state) for r in db.history(TICKET_KIND, "t2")[1:]] == [
            (_T.OPEN, _T.HELD),
            (_T.HELD, _T.DONE),
        ]
        assert (_get(db, "t1").fence, _get(db, "t2").fence) == (2, 2)

    def test_transition_applies_changes(self, db: Store) -> None:
        """changes set mutable fields (None and int-to-float included) in the same write."""
        _file(db, "t1", assignee="alice", score=1.0, due_at=5.0)
        row = _move(
            db,
            "t1",
            "hold",
            changes={"assignee": None, "score": 3, "urgent": True, "priority": 7, "queue": "q2"},
        )
        expected = {
            "title": "t1",
            "assignee": None,
            "priority": 7,
            "score": 3.0,
            "urgent": True,
            "due_at": 5.0,
            "queue": "q2",
        }
        assert dict(row.values) == expected
        assert type(row["score"]) is float
        assert row["urgent"] is True
        stored = _get(db, "t1")
        assert dict(stored.values) == expected
        assert type(stored["score"]) is float
        assert stored["urgent"] is True
        assert stored.fence == 1

    def test_forbidden_move_raises_invalid_transition_and_changes_nothing(self, db: Store) -> None:
        """A move the lifecycle forbids raises InvalidTransition and leaves state, fence,
        values and history unchanged."""
        _file(db, "t1")
        _file(db, "t2")
        _move(db, "t2", "finish")
        before = (_snapshot(db, "t1"), _snapshot(db, "t2"))
        with pytest.raises(InvalidTransition):
            _move(db, "t1", "resume", changes={"assignee": "x"})
        with pytest.raises(InvalidTransition):
            _move(db, "t1", "resume", fence=0)
        with pytest.raises(InvalidTransition):
            _move(db, "t1", "no_such_event")
        for event in ("touch", "hold", "resume", "finish", "drop"):
            with pytest.raises(InvalidTransition):
                _move(db, "t2", event, changes={"score": 1.0})
        assert (_snapshot(db, "t1"), _snapshot(db, "t2")) == before

    def test_transition_of_unknown_id_raises_unknown_entity(self, db: Store) -> None:
        """A transition of an id that does not exist raises UnknownEntity, a LookupError."""
        _file(db, "t1")
        with pytest.raises(UnknownEntity):
            _move(db, "ghost", "hold")
        with pytest.raises(LookupError):
            _move(db, "ghost", "hold", fence=0, expect={"assignee": None})
        assert db.get(TICKET_KIND, "ghost") is None
        assert db.history(TICKET_KIND, "ghost") == []

    def test_wrong_fence_raises_stale_state_and_changes_nothing(self, db: Store) -> None:
        """A transition with a fence other than the stored one raises StaleState and writes
        nothing."""
        _file(db, "t1")
        _move(db, "t1", "touch")
        before = _snapshot(db, "t1")
        for fence in (0, 2, 99):
            with pytest.raises(StaleState):
                _move(db, "t1", "hold", fence=fence, changes={"assignee": "x"})
        with pytest.raises(TypeError):
            _move(db, "t1", "hold", fence=True)
        with pytest.raises(TypeError):
            _move(db, "t1", "hold", fence="1")
        assert _snapshot(db, "t1") == before
        assert _move(db, "t1", "hold", fence=1).fence == 2

    def test_failed_expect_raises_stale_state_and_changes_nothing(self, db: Store) -> None:
        """A transition whose expect condition does not hold raises StaleState and writes
        nothing."""
        _file(db, "t1", assignee="alice", priority=2)
        before = _snapshot(db, "t1")
        for expect in (
            {"assignee": "bob"},
            {"assignee": None},
            {"priority": 3},
            {"assignee": "alice", "priority": 3},
            {"fence": 1},
            {"score": 1.0},
        ):
            with pytest.raises(StaleState):
                _move(db, "t1", "hold", expect=expect, changes={"queue": "x"})
        assert _snapshot(db, "t1") == before
        row = _move(db, "t1", "hold", expect={"assignee": "alice", "priority": 2, "fence": 0})
        assert row.state is _T.HELD

    def test_expect_with_comparisons(self, db: Store) -> None:
        """expect accepts lt/le/gt/ge/ne/one_of with SQL semantics (NULL satisfies none but
        equality with None)."""
        _file(db, "t1", assignee="alice", priority=2, score=1.5)
        passing: list[dict[str, object]] = [
            {"priority": lt(3)},
            {"priority": le(2), "score": ge(1.5)},
            {"score": gt(1)},
            {"assignee": ne(None)},
            {"assignee": ne("bob")},
            {"assignee": one_of("alice", "carol")},
            {"due_at": None},
            {"fence": ge(2), "ticket_id": "t1"},
        ]
        for fence, expect in enumerate(passing, start=1):
            row = _move(db, "t1", "touch", expect=expect)
            assert row.fence == fence, expect
        failing: list[dict[str, object]] = [
            {"priority": lt(2)},
            {"priority": gt(2)},
            {"score": le(1.4)},
            {"assignee": ne("alice")},
            {"assignee": one_of("bob", "carol")},
            {"due_at": ne(None)},
            {"due_at": lt(1e18)},
            {"due_at": ge(0.0)},
            {"due_at": ne(1.0)},
            {"ticket_id": ne("t1")},
        ]
        before = _snapshot(db, "t1")
        for expect in failing:
            with pytest.raises(StaleState):
                _move(db, "t1", "touch", expect=expect)
        assert _snapshot(db, "t1") == before

    def test_bad_expect_is_refused_before_any_write(self, db: Store) -> None:
        """expect over an unknown column raises KeyError and a wrong-typed value TypeError,
        writing nothing."""
        _file(db, "t1")
        before = _snapshot(db, "t1")
        with pytest.raises(KeyError):
            _move(db, "t1", "hold", expect={"nope": 1})
        with pytest.raises(KeyError):
            _move(db, "t1", "hold", expect={"state": "open"})
        with pytest.raises(TypeError):
            _move(db, "t1", "hold", expect={"priority": "high"})
        with pytest.raises(TypeError):
            _move(db, "t1", "hold", expect={"fence": "0"})
        assert _snapshot(db, "t1") == before

    def test_changing_immutable_field_raises_value_error_before_any_write(self, db: Store) -> None:
        """changes to an immutable field raise ValueError before anything is read or written."""
        _file(db, "t1")
        before = _snapshot(db, "t1")
        with pytest.raises(ValueError, match="immutable"):
            _move(db, "t1", "hold", changes={"title": "renamed"})
        with pytest.raises(ValueError, match="immutable"):
            _move(db, "t1", "hold", fence=0, changes={"assignee": "a", "title": "renamed"})
        with pytest.raises(ValueError, match="immutable"):
            _move(db, "ghost", "hold", changes={"title": "renamed"})
        assert _snapshot(db, "t1") == before

    def test_changing_unknown_or_managed_field_raises_key_error(self, db: Store) -> None:
        """changes to an undeclared field, the fence, the state or the id raise KeyError and
        write nothing."""
        _file(db, "t1")
        before = _snapshot(db, "t1")
        for changes in ({"nope": 1}, {"fence": 5}, {"state": "done"}, {"ticket_id": "t9"}):
            with pytest.raises(KeyError):
                _move(db, "t1", "hold", changes=changes)
        assert _snapshot(db, "t1") == before

    def test_wrong_typed_change_is_refused_before_any_write(self, db: Store) -> None:
        """changes with a wrong-typed value or None for a non-nullable field are refused and
        write nothing."""
        _file(db, "t1")
        before = _snapshot(db, "t1")
        with pytest.raises(TypeError):
            _move(db, "t1", "hold", changes={"priority": "high"})
        with pytest.raises(TypeError):
            _move(db, "t1", "hold", changes={"priority": False})
        with pytest.raises(ValueError, match="None"):
            _move(db, "t1", "hold", changes={"priority": None})
        assert _snapshot(db, "t1") == before

    def test_a_shape_that_succeeded_still_checks_every_later_value(self, db: Store) -> None:
        """A store may plan a transition shape once and reuse it; every later call of that shape
        is still checked in full: wrong types and unencodable text are refused, values of a
        convertible type are converted, and a refused call writes nothing."""
        _file(db, "t1")
        shape: dict[str, Any] = {"fence": 0, "expect": {"queue": "general"}}
        _move(db, "t1", "touch", changes={"priority": 5, "assignee": "a", "score": 1.5}, **shape)
        before = _snapshot(db, "t1")
        refused: list[tuple[dict[str, object], type[Exception]]] = [
            ({"priority": "high", "assignee": "a", "score": 1.5}, TypeError),
            ({"priority": True, "assignee": "a", "score": 1.5}, TypeError),
            ({"priority": None, "assignee": "a", "score": 1.5}, ValueError),
            ({"priority": 5, "assignee": 7, "score": 1.5}, TypeError),
            ({"priority": 5, "assignee": "\ud800", "score": 1.5}, ValueError),
            ({"priority": 5, "assignee": "a", "score": "1.5"}, TypeError),
        ]
        for changes, error in refused:
            with pytest.raises(error):
                _move(db, "t1", "touch", fence=1, expect={"queue": "general"}, changes=changes)
        with pytest.raises(TypeError):
            _move(
                db,
                "t1",
                "touch",
                fence=1,
                expect={"queue": 5},
                changes={"priority": 5, "assignee": "a", "score": 1.5},
            )
        assert _snapshot(db, "t1") == before
        row = _move(
            db,
            "t1",
            "touch",
            fence=1,
            expect={"queue": "general"},
            changes={"priority": 6, "assignee": "é", "score": 2},
        )
        assert (row["priority"], row["assignee"], row["score"]) == (6, "é", 2.0)
        assert type(row["score"]) is float
        assert _get(db, "t1")["assignee"] == "é"

    def test_creation_and_removal_events_via_transition_raise_invalid_transition(
        self, db: Store
    ) -> None:
        """transition() through a creation or removal event raises InvalidTransition."""
        _file(db, "t1")
        _file(db, "t2")
        _move(db, "t2", "finish")
        before = (_snapshot(db, "t1"), _snapshot(db, "t2"))
        for ticket_id, event in (("t1", "file"), ("t2", "purge"), ("t2", "archive")):
            with pytest.raises(InvalidTransition):
                _move(db, ticket_id, event)
        with pytest.raises(InvalidTransition):
            _move(db, "ghost", "file")
        assert (_snapshot(db, "t1"), _snapshot(db, "t2")) == before
        assert db.get(TICKET_KIND, "ghost") is None

    def test_self_loop_transition_bumps_fence(self, db: Store) -> None:
        """A self-loop keeps the state, bumps the fence and records an audit entry each time."""
        _file(db, "t1")
        for fence in range(3):
            row = _move(db, "t1", "touch", fence=fence, changes={"priority": fence})
            assert row.state is _T.OPEN
            assert row.fence == fence + 1
        assert _get(db, "t1")["priority"] == 2
        assert [r.event for r in db.history(TICKET_KIND, "t1")] == ["file", *["touch"] * 3]

    # -- bulk transitions ------------------------------------------------------------------------

    def test_transition_many_moves_admitted_rows_and_skips_the_rest(self, db: Store) -> None:
        """transition_many applies the guard row by row: admitted rows move (fence + 1, one
        audit entry each, in the order asked); unknown, wrong-state or failing rows are skipped."""
        k = TICKET_KIND
        for ticket_id in ("t1", "t2", "t3", "t4"):
            db.insert(
                k, ticket_id, {"title": ticket_id, "assignee": "ann"}, event="file", audit=_AUDIT
            )
        db.transition(k, "t2", "hold", audit=_AUDIT)
        db.transition(k, "t4", "drop", audit=_AUDIT)
        moved = db.transition_many(
            k, ["t3", "t2", "missing", "t4", "t1"], "hold", audit=_AUDIT, changes={"score": 1.5}
        )
        assert [(r.id, r.state, r.fence, r["score"]) for r in moved] == [
            ("t3", _T.HELD, 1, 1.5),
            ("t1", _T.HELD, 1, 1.5),
        ]
        state = {r.id: (r.state, r.fence) for r in db.select(k)}
        assert state["t2"] == (_T.HELD, 1)
        assert state["t4"] == (_T.DROPPED, 1)
        assert [h.event for h in db.history(k, "t3")] == ["file", "hold"]
        assert [h.event for h in db.history(k, "t2")] == ["file", "hold"]

    def test_transition_many_respects_expect_and_increments(self, db: Store) -> None:
        """Rows failing ``expect`` are skipped; ``increments`` add to int fields."""
        k = TICKET_KIND
        db.insert(k, "mine", {"title": "m", "assignee": "ann"}, event="file", audit=_AUDIT)
        db.insert(k, "theirs", {"title": "t", "assignee": "bob"}, event="file", audit=_AUDIT)
        moved = db.transition_many(
            k,
            ["mine", "theirs"],
            "touch",
            audit=_AUDIT,
            expect={"assignee": "ann"},
            increments={"priority": 2},
        )
        assert [(r.id, r["priority"], r.fence) for r in moved] == [("mine", 5, 1)]
        theirs = db.get(k, "theirs")
        assert theirs is not None
        assert (theirs["priority"], theirs.fence) == (3, 0)

    def test_transition_many_refuses_bad_input_before_writing(self, db: Store) -> None:
        """Bad events, changes or increments raise before any row is written."""
        k = TICKET_KIND
        db.insert(k, "t1", {"title": "x"}, event="file", audit=_AUDIT)
        with pytest.raises(InvalidTransition):
            db.transition_many(k, ["t1"], "purge", audit=_AUDIT)
        with pytest.raises(ValueError, match="immutable"):
            db.transition_many(k, ["t1"], "touch", audit=_AUDIT, changes={"title": "y"})
        with pytest.raises(ValueError, match="cannot be incremented"):
            db.transition_many(k, ["t1"], "touch", audit=_AUDIT, increments={"score": 1})
        with pytest.raises(TypeError):
            db.transition_many(k, "t1", "touch", audit=_AUDIT)
        with pytest.raises(ValueError, match="both changed and incremented"):
            db.transition_many(
                k,
                ["t1"],
                "touch",
                audit=_AUDIT,
                changes={"priority": 10},
                increments={"priority": 2},
            )
        row = db.get(k, "t1")
        assert row is not None
        assert (row.state, row.fence, row["title"], row["priority"]) == (_T.OPEN, 0, "x", 3)

    def test_transition_many_inside_a_failed_block_is_undone(self, db: Store) -> None:
        """A bulk transition in an atomic block that raises leaves nothing behind."""
        k = TICKET_KIND
        db.insert(k, "t1", {"title": "x"}, event="file", audit=_AUDIT)
        _abort_block(db, lambda: db.transition_many(k, ["t1"], "hold", audit=_AUDIT))
        row = db.get(k, "t1")
        assert row is not None
        assert (row.state, row.fence) == (_T.OPEN, 0)
        assert [h.event for h in db.history(k, "t1")] == ["file"]

    # -- batches (an optional capability: statecore.batch.BatchStore) ---------------------------

    @pytest.fixture
    def batch_db(self, db: Store) -> BatchStore:
        """The store under test, when it runs batches (the batch tests skip otherwise)."""
        if not isinstance(db, BatchStore):
            pytest.skip(f"{type(db).__name__} is not a BatchStore (optional capability)")
        return db

    def test_insert_each_matches_insert_one_by_one(
        self, batch_db: BatchStore, new_store: StoreOpener
    ) -> None:
        """insert_each gives every creation the outcome insert() would give it in order:
        created rows, an existing id untouched (also one created earlier in the same batch),
        refusals in place (bad values, bad ids, a non-creation event) writing nothing."""
        k = TICKET_KIND
        batch_db.insert(k, "old", {"title": "old"}, event="file", audit=_AUDIT)
        creations = [
            Creation("n1", {"title": "n1", "priority": 7}, "file", Audit(1.0, "w1", 0, "r1")),
            Creation("old", {"title": "changed"}, "file", _AUDIT),
            Creation("n2", {"title": "n2", "priority": "high"}, "file", _AUDIT),
            Creation("n3", {"title": "n3", "score": 2}, "file", Audit(2.0)),
            Creation("n1", {"title": "again"}, "file", _AUDIT),
            Creation("", {"title": "no id"}, "file", _AUDIT),
            Creation("n4", {"title": "n4"}, "hold", _AUDIT),
            Creation("n5", {"nope": 1, "title": "n5"}, "file", _AUDIT),
            Creation("n6", {"title": "é"}, "file", _AUDIT),
        ]
        one_by_one = new_store()
        one_by_one.insert(k, "old", {"title": "old"}, event="file", audit=_AUDIT)
        expected = insert_each_sequentially(one_by_one, k, creations)  # one insert() each
        outcomes = batch_db.insert_each(k, creations)
        assert [_outcome(o) for o in outcomes] == [_outcome(o) for o in expected]
        assert [type(o) for o in outcomes[5:8]] == [ValueError, InvalidTransition, KeyError]
        assert outcomes[4] == (outcomes[0][0], False)  # type: ignore[index]
        for ticket_id in ("old", "n1", "n3", "n6", "n2", "n4"):
            assert _snapshot(batch_db, ticket_id) == _snapshot(one_by_one, ticket_id)
        assert batch_db.history(k, "n1")[0].owner == "w1"

    def test_transition_each_matches_transition_one_by_one(
        self, batch_db: BatchStore, new_store: StoreOpener
    ) -> None:
        """transition_each gives every move the outcome transition() would give it in order:
        rows moved under their own fences and conditions, later moves of an entity seeing the
        earlier ones, refusals (stale fence, failed condition, forbidden or undeclared event,
        unknown id, bad values) in place and writing nothing."""
        k = TICKET_KIND
        one_by_one = new_store()
        for store in (batch_db, one_by_one):
            _seed(store)
        moves = [
            Move("a1", "hold", Audit(1.0, "w", 1, "one"), fence=0, changes={"score": 9.5}),
            Move("a4", "hold", _AUDIT, fence=0, changes={"score": None}),
            Move("a6", "hold", _AUDIT, fence=0, changes={"score": 1.0}),  # stale: fence 2
            Move("a2", "resume", _AUDIT, expect={"assignee": None}),  # IS NULL holds
            Move("a1", "resume", _AUDIT, fence=1),  # sees the hold above
            Move("a3", "hold", _AUDIT),  # done: forbidden
            Move("zz", "hold", _AUDIT, fence=0, changes={"score": 1.0}),  # unknown
            Move("a6", "touch", _AUDIT, expect={"assignee": "alice"}),  # condition fails
            Move("a6", "touch", _AUDIT, expect={"priority": lt(3)}),  # not equality: alone
            Move("a4", "bogus", _AUDIT),  # undeclared event
            Move("a4", "resume", _AUDIT, changes={"priority": "high"}),  # bad value
            Move("a4", "resume", _AUDIT, fence=1, expect={"queue": "general"}),
            Move("a6", "finish", _AUDIT, fence=3, changes={"assignee": "carl"}),
            Move("a1", "touch", _AUDIT, fence=2, changes={"urgent": False, "due_at": 5}),
        ]
        expected = transition_each_sequentially(one_by_one, k, moves)  # one transition() each
        outcomes = batch_db.transition_each(k, moves)
        assert [_outcome(o) for o in outcomes] == [_outcome(o) for o in expected]
        kinds = [type(o).__name__ for o in outcomes]
        assert kinds[2] == kinds[7] == "StaleState"
        assert kinds[5] == kinds[9] == "InvalidTransition"
        assert (kinds[6], kinds[10]) == ("UnknownEntity", "TypeError")
        for ticket_id in ("a1", "a2", "a3", "a4", "a5", "a6", "zz"):
            assert _snapshot(batch_db, ticket_id) == _snapshot(one_by_one, ticket_id)

    @pytest.mark.parametrize("seed", [1, 2, 3])
    def test_transition_each_random_batches_match_one_by_one(
        self, batch_db: BatchStore, new_store: StoreOpener, seed: int
    ) -> None:
        """Random batches of moves (fresh and stale fences, conditions, changes, repeated
        entities, forbidden events) leave the store exactly as the same moves one by one."""
        rng = random.Random(seed)
        k = TICKET_KIND
        one_by_one = new_store()
        ids = [f"r{n}" for n in range(12)]
        assignees = {ticket_id: rng.choice([None, "ann"]) for ticket_id in ids}
        for store in (batch_db, one_by_one):
            for ticket_id in ids:
                _file(store, ticket_id, assignee=assignees[ticket_id])
        events = ["touch", "hold", "resume", "finish", "advance", "drop", "bogus"]
        for batch in range(8):
            # Every other batch has one shape (event, fenced, compared and changed fields), as
            # group commit produces: only ids, fences and values vary.
            uniform = batch % 2 == 0
            event = rng.choice(events[:-1])
            moves = []
            for _ in range(rng.randint(1, 40)):
                ticket_id = rng.choice(ids)
                current = one_by_one.get(k, ticket_id)
                fresh = current.fence if current else 0
                if uniform:
                    fence: int | None = rng.choice([fresh, fresh, fresh - 1])
                    expect: dict[str, object] | None = {"assignee": rng.choice(["ann", None])}
                    changes: dict[str, object] | None = {"score": rng.random(), "priority": 4}
                else:
                    event = rng.choice(events)
                    fence = rng.choice([None, fresh, 0])
                    conditions: list[dict[str, object] | None] = [
                        None,
                        {"assignee": "ann"},
                        {"assignee": None},
                    ]
                    expect = rng.choice(conditions)
                    options: list[dict[str, object] | None] = [
                        None,
                        {"score": rng.random()},
                        {"priority": 4},
                    ]
                    changes = rng.choice(options)
                audit = Audit(float(rng.randint(0, 9)), "w", rng.randint(0, 3), None)
                moves.append(Move(ticket_id, event, audit, fence, expect, changes))
            expected = transition_each_sequentially(one_by_one, k, moves)
            outcomes = batch_db.transition_each(k, moves)
            assert [_outcome(o) for o in outcomes] == [_outcome(o) for o in expected]
        for ticket_id in ids:
            assert _snapshot(batch_db, ticket_id) == _snapshot(one_by_one, ticket_id)

    def test_a_batch_shape_that_succeeded_still_checks_every_later_value(
        self, batch_db: BatchStore
    ) -> None:
        """Moves of a shape a batch has already run are still checked in full: wrong types and
        unencodable text are refused in place, convertible values are converted."""
        k = TICKET_KIND
        for ticket_id in ("t1", "t2", "t3", "t4", "t5"):
            _file(batch_db, ticket_id)

        def touch(ticket_id: str, priority: object, assignee: object, score: object) -> Move:
            return Move(
                ticket_id,
                "touch",
                _AUDIT,
                fence=_get(batch_db, ticket_id).fence,
                expect={"queue": "general"},
                changes={"priority": priority, "assignee": assignee, "score": score},
            )

        first = batch_db.transition_each(k, [touch(t, 5, "a", 1.5) for t in ("t1", "t2")])
        assert all(isinstance(row, Row) for row in first)
        later = batch_db.transition_each(
            k,
            [
                touch("t1", "high", "a", 1.5),
                touch("t2", True, "a", 1.5),
                touch("t3", 5, "\ud800", 1.5),
                touch("t4", 6, "é", 2),
                touch("t5", 7, "b", 2.5),
            ],
        )
        assert [type(o).__name__ for o in later[:3]] == ["TypeError", "TypeError", "ValueError"]
        t4, t5 = later[3], later[4]
        assert isinstance(t4, Row)
        assert isinstance(t5, Row)
        assert (t4["priority"], t4["assignee"], t4["score"]) == (6, "é", 2.0)
        assert type(t4["score"]) is float
        assert (t5["priority"], t5.fence) == (7, 1)
        assert _get(batch_db, "t1").fence == 1
        assert _get(batch_db, "t3").fence == 0

    def test_batches_inside_a_failed_block_are_undone(self, batch_db: BatchStore) -> None:
        """Batches in an atomic block that raises leave nothing behind."""
        k = TICKET_KIND
        _file(batch_db, "t1")
        before = _snapshot(batch_db, "t1")

        def both() -> None:
            batch_db.insert_each(k, [Creation("t2", {"title": "t2"}, "file", _AUDIT)])
            batch_db.transition_each(k, [Move("t1", "hold", _AUDIT, fence=0)])

        _abort_block(batch_db, both)
        assert _snapshot(batch_db, "t1") == before
        assert batch_db.get(k, "t2") is None
        assert batch_db.history(k, "t2") == []

    # -- races ----------------------------------------------------------------------------------

    def test_lost_race_exactly_one_claimer_wins(self, db: Store) -> None:
        """Two claimers that read the same fence race the same move: one wins, the other gets
        StaleState."""
        _file(db, "t1")
        first, second = _get(db, "t1"), _get(db, "t1")
        assert first.fence == second.fence == 0
        won = _move(db, "t1", "hold", fence=first.fence, changes={"assignee": "first"})
        with pytest.raises(StaleState):
            _move(db, "t1", "hold", fence=second.fence, changes={"assignee": "second"})
        assert _get(db, "t1") == won
        assert won["assignee"] == "first"
        assert len(db.history(TICKET_KIND, "t1")) == 2

    def test_expect_guarded_claim_has_one_winner(self, db: Store) -> None:
        """Two claimers guarding on the same expected value (not the fence): the second gets
        StaleState."""
        _file(db, "t1")
        unowned = {"assignee": None}
        won = _move(db, "t1", "touch", expect=unowned, changes={"assignee": "first"})
        with pytest.raises(StaleState):
            _move(db, "t1", "touch", expect=unowned, changes={"assignee": "second"})
        assert _get(db, "t1") == won
        assert (won.fence, won["assignee"]) == (1, "first")

    def test_thread_race_has_exactly_one_winner_per_row(self, db: Store) -> None:
        """Eight threads claiming the same 50 rows with the fence they read leave exactly one
        winner per row."""
        ids = [f"race-{n:02d}" for n in range(50)]
        for ticket_id in ids:
            _file(db, ticket_id)
        workers = 8
        barrier = threading.Barrier(workers, timeout=_JOIN_TIMEOUT)
        wins: list[tuple[str, str]] = []
        losses: list[tuple[str, str]] = []
        errors: list[BaseException] = []

        def claim(name: str) -> None:
            try:
                fences = {ticket_id: _get(db, ticket_id).fence for ticket_id in ids}
                barrier.wait()
                for ticket_id in ids:
                    try:
                        # A self-loop: only the fence stands between two claimers.
                        _move(
                            db,
                            ticket_id,
                            "touch",
                            Audit(at=1.0, owner=name),
                            fence=fences[ticket_id],
                            changes={"assignee": name},
                        )
                    except StaleState:
                        losses.append((ticket_id, name))
                    else:
                        wins.append((ticket_id, name))
            except BaseException as exc:
                errors.append(exc)
                barrier.abort()

        threads = [
            threading.Thread(target=claim, args=(f"worker-{n}",), daemon=True)
            for n in range(workers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(_JOIN_TIMEOUT)
        assert not any(t.is_alive() for t in threads), "a racing thread did not finish"
        assert errors == []
        assert Counter(ticket_id for ticket_id, _ in wins) == dict.fromkeys(ids, 1)
        assert len(losses) == len(ids) * (workers - 1)
        for ticket_id, winner in wins:
            row = _get(db, ticket_id)
            assert (row.state, row.fence, row["assignee"]) == (_T.OPEN, 1, winner)
            history = db.history(TICKET_KIND, ticket_id)
            assert [(r.event, r.owner) for r in history] == [("file", "kit"), ("touch", winner)]

    def test_zombie_writer_with_old_fence_cannot_write(self, db: Store) -> None:
        """A writer holding fence f cannot apply its late write once the row moved to f+1."""
        _file(db, "t1", assignee="zombie")
        _file(db, "t2", assignee="zombie")
        zombie_fence = _get(db, "t1").fence
        _move(db, "t1", "touch", fence=zombie_fence, changes={"assignee": "new-owner"})
        _move(db, "t2", "finish", fence=zombie_fence, changes={"assignee": "new-owner"})
        before = (_snapshot(db, "t1"), _snapshot(db, "t2"))
        for ticket_id in ("t1", "t2"):
            for event in ("touch", "hold", "drop"):
                with pytest.raises(StaleState):
                    _move(db, ticket_id, event, fence=zombie_fence, changes={"assignee": "zombie"})
        assert (_snapshot(db, "t1"), _snapshot(db, "t2")) == before
        assert _get(db, "t1")["assignee"] == "new-owner"

    # -- audit ----------------------------------------------------------------------------------

    def test_audit_records_every_write_as_given(self, db: Store) -> None:
        """Each insert and transition appends one TransitionRecord carrying the Audit's fields,
        oldest first."""
        _file(db, "t1", Audit(at=10.0, owner="alice", reason="filed"))
        _move(db, "t1", "hold", Audit(at=20.5, attempts=2))
        _move(db, "t1", "resume", Audit(at=30.25, owner="bob", attempts=3, reason="back"))
        _move(db, "t1", "touch", Audit(at=30.25))
        _move(db, "t1", "finish", Audit(at=40.0, owner="carol", attempts=0, reason=""))
        history = db.history(TICKET_KIND, "t1")
        assert history == [
            TransitionRecord("t1", "file", None, _T.OPEN, 10.0, "alice", None, "filed"),
            TransitionRecord("t1", "hold", _T.OPEN, _T.HELD, 20.5, None, 2, None),
            TransitionRecord("t1", "resume", _T.HELD, _T.OPEN, 30.25, "bob", 3, "back"),
            TransitionRecord("t1", "touch", _T.OPEN, _T.OPEN, 30.25, None, None, None),
            TransitionRecord("t1", "finish", _T.OPEN, _T.DONE, 40.0, "carol", 0, ""),
        ]
        for record in history:
            assert record.from_state is None or isinstance(record.from_state, TicketState)
            assert isinstance(record.to_state, TicketState)
            assert type(record.at) is float

    def test_history_is_per_entity(self, db: Store) -> None:
        """history() returns only the asked entity's entries, in the order they were written."""
        _file(db, "t1", Audit(at=1.0))
        _file(db, "t2", Audit(at=2.0))
        _move(db, "t2", "hold", Audit(at=3.0))
        _move(db, "t1", "drop", Audit(at=4.0))
        _move(db, "t2", "resume", Audit(at=5.0))
        assert [(r.entity_id, r.event, r.at) for r in db.history(TICKET_KIND, "t1")] == [
            ("t1", "file", 1.0),
            ("t1", "drop", 4.0),
        ]
        assert [(r.entity_id, r.event, r.at) for r in db.history(TICKET_KIND, "t2")] == [
            ("t2", "file", 2.0),
            ("t2", "hold", 3.0),
            ("t2", "resume", 5.0),
        ]

    def test_failed_operations_append_no_history(self, db: Store) -> None:
        """Refused inserts and transitions leave the audit history untouched."""
        _file(db, "t1")
        _move(db, "t1", "hold")
        before = db.history(TICKET_KIND, "t1")
        attempts: list[Callable[[], object]] = [
            lambda: db.insert(TICKET_KIND, "t1", {"title": "x"}, event="file", audit=_AUDIT),
            lambda: _move(db, "t1", "touch"),
            lambda: _move(db, "t1", "resume", fence=0),
            lambda: _move(db, "t1", "resume", expect={"assignee": "nobody"}),
            lambda: _move(db, "t1", "resume", changes={"title": "x"}),
            lambda: _move(db, "t1", "resume", changes={"nope": 1}),
            lambda: _move(db, "t1", "purge"),
        ]
        for attempt in attempts:
            with suppress(InvalidTransition, StaleState, ValueError, KeyError):
                attempt()
        assert db.history(TICKET_KIND, "t1") == before
        assert len(before) == 2

    def test_kinds_with_the_same_id_are_independent(self, db: Store) -> None:
        """Entities of different kinds sharing an id keep separate rows, histories and prunes."""
        _file(db, "same")
        _move(db, "same", "finish")
        _record(db, "same", 5.0)
        assert _get(db, "same").state is _T.DONE
        obligation = db.get(OBLIGATION_KIND, "same")
        assert obligation is not None
        assert obligation.state is _O.PENDING
        assert [r.event for r in db.history(TICKET_KIND, "same")] == ["file", "finish"]
        assert [r.event for r in db.history(OBLIGATION_KIND, "same")] == ["record"]
        assert db.prune(TICKET_KIND, "purge") == 1
        assert db.get(OBLIGATION_KIND, "same") == obligation
        assert [r.event for r in db.history(OBLIGATION_KIND, "same")] == ["record"]
        assert (db.count(TICKET_KIND), db.count(OBLIGATION_KIND)) == (0, 1)

    def test_history_of_unknown_id_is_empty(self, db: Store) -> None:
        """history() of an id that never existed is an empty list."""
        assert db.history(TICKET_KIND, "ghost") == []
        _file(db, "t1")
        assert db.history(TICKET_KIND, "ghost") == []
        assert db.history(OBLIGATION_KIND, "t1") == []

    # -- select and count -----------------------------------------------------------------------

    def test_select_defaults_to_all_rows_ordered_by_id(self, db: Store) -> None:
        """select() without filters returns every row ordered by id, whatever the insert
        order."""
        assert db.select(TICKET_KIND) == []
        assert db.count(TICKET_KIND) == 0
        _seed(db)
        rows = db.select(TICKET_KIND)
        assert _ids(rows) == list(_SEED_IDS)
        assert [(r.state, r.fence) for r in rows] == [
            (_T.OPEN, 0),
            (_T.HELD, 1),
            (_T.DONE, 1),
            (_T.OPEN, 0),
            (_T.DROPPED, 1),
            (_T.OPEN, 2),
        ]
        assert rows == [_get(db, ticket_id) for ticket_id in _SEED_IDS]
        assert db.count(TICKET_KIND) == 6

    def test_select_by_states(self, db: Store) -> None:
        """A states filter returns exactly the rows in those states (none for an empty one)."""
        _seed(db)
        assert _ids(db.select(TICKET_KIND, states=[_T.OPEN])) == ["a1", "a4", "a6"]
        assert _ids(db.select(TICKET_KIND, states={_T.DONE, _T.DROPPED})) == ["a3", "a5"]
        assert _ids(db.select(TICKET_KIND, states=(_T.HELD, _T.OPEN))) == [
            "a1",
            "a2",
            "a4",
            "a6",
        ]
        assert db.select(TICKET_KIND, states=[]) == []
        assert db.count(TICKET_KIND, states=[]) == 0
        assert _ids(db.select(TICKET_KIND, states=iter([_T.HELD]))) == ["a2"]

    @pytest.mark.parametrize(
        ("where", "expected"),
        [
            ({"assignee": "alice"}, ["a1", "a5"]),
            ({"assignee": None}, ["a2", "a4"]),
            ({"score": None}, ["a2", "a5"]),
            ({"urgent": True}, ["a1", "a5"]),
            ({"urgent": False}, ["a2", "a3", "a4", "a6"]),
            ({"priority": 3}, ["a3", "a4"]),
            ({"score": 0.5}, ["a1", "a6"]),
            ({"queue": "general"}, list(_SEED_IDS)),
            ({"assignee": "bob", "priority": 3}, ["a3"]),
            ({"assignee": "nobody"}, []),
        ],
    )
    def test_select_where_equality(
        self, db: Store, where: dict[str, object], expected: list[str]
    ) -> None:
        """A plain where value means equality, and None means IS NULL."""
        _seed(db)
        assert _ids(db.select(TICKET_KIND, where=where)) == expected
        assert db.count(TICKET_KIND, where=where) == len(expected)

    @pytest.mark.parametrize(
        ("where", "expected"),
        [
            ({"score": lt(1.0)}, ["a1", "a6"]),
            ({"score": le(1.5)}, ["a1", "a3", "a6"]),
            ({"score": gt(0.5)}, ["a3", "a4"]),
            ({"score": ge(0.5)}, ["a1", "a3", "a4", "a6"]),
            ({"score": ne(0.5)}, ["a3", "a4"]),
            ({"score": ne(None)}, ["a1", "a3", "a4", "a6"]),
            ({"assignee": ne("alice")}, ["a3", "a6"]),
            ({"assignee": lt("b")}, ["a1", "a5"]),
            ({"priority": one_of(2, 3)}, ["a2", "a3", "a4", "a6"]),
            ({"assignee": one_of("alice", "zed")}, ["a1", "a5"]),
            ({"due_at": lt(250)}, ["a1", "a2", "a6"]),
            ({"due_at": ge(150.0), "priority": le(2)}, ["a2", "a6"]),
            ({"due_at": gt(-1e300)}, ["a1", "a2", "a4", "a6"]),
            ({"priority": one_of()}, []),
        ],
    )
    def test_select_where_comparisons_never_match_null(
        self, db: Store, where: dict[str, object], expected: list[str]
    ) -> None:
        """Cmp helpers compare with SQL semantics: a NULL column satisfies no lt/le/gt/ge/ne/IN."""
        _seed(db)
        assert _ids(db.select(TICKET_KIND, where=where)) == expected
        assert db.count(TICKET_KIND, where=where) == len(expected)

    def test_select_by_id_field_and_fence(self, db: Store) -> None:
        """where may filter on the id field and on the fence, with equality or comparisons."""
        _seed(db)

        def ids(where: Mapping[str, object]) -> list[str]:
            return _ids(db.select(TICKET_KIND, where=where))

        assert ids({"ticket_id": "a3"}) == ["a3"]
        assert ids({"ticket_id": "zz"}) == []
        assert ids({"ticket_id": one_of("a1", "a4", "zz")}) == ["a1", "a4"]
        assert ids({"ticket_id": gt("a4")}) == ["a5", "a6"]
        assert ids({"fence": 0}) == ["a1", "a4"]
        assert ids({"fence": 1}) == ["a2", "a3", "a5"]
        assert ids({"fence": ge(1)}) == ["a2", "a3", "a5", "a6"]
        assert ids({"fence": one_of(0, 2)}) == ["a1", "a4", "a6"]
        assert db.count(TICKET_KIND, where={"fence": gt(1)}) == 1

    @pytest.mark.parametrize(
        ("order_by", "expected"),
        [
            ("score", ["a2", "a5", "a1", "a6", "a3", "a4"]),
            ("assignee", ["a2", "a4", "a1", "a5", "a3", "a6"]),
            ("priority", ["a1", "a2", "a6", "a3", "a4", "a5"]),
            ("urgent", ["a2", "a3", "a4", "a6", "a1", "a5"]),
            ("due_at", ["a3", "a5", "a1", "a6", "a2", "a4"]),
            ("fence", ["a1", "a4", "a2", "a3", "a5", "a6"]),
            ("ticket_id", list(_SEED_IDS)),
            ("queue", list(_SEED_IDS)),
        ],
    )
    def test_select_order_by_nulls_first_then_id(
        self, db: Store, order_by: str, expected: list[str]
    ) -> None:
        """order_by sorts ascending with NULLs first and ties broken by id."""
        _seed(db)
        assert _ids(db.select(TICKET_KIND, order_by=order_by)) == expected
        assert _ids(db.select(TICKET_KIND, order_by=order_by, limit=3)) == expected[:3]

    def test_select_order_by_with_filters(self, db: Store) -> None:
        """order_by applies after the states and where filters."""
        _seed(db)
        rows = db.select(
            TICKET_KIND, states=[_T.OPEN, _T.HELD], where={"due_at": ne(None)}, order_by="due_at"
        )
        assert _ids(rows) == ["a1", "a6", "a2", "a4"]

    def test_select_limit(self, db: Store) -> None:
        """limit caps the rows returned (0 returns none, a limit above the count returns all)."""
        _seed(db)
        assert db.select(TICKET_KIND, limit=0) == []
        assert _ids(db.select(TICKET_KIND, limit=2)) == ["a1", "a2"]
        assert _ids(db.select(TICKET_KIND, limit=6)) == list(_SEED_IDS)
        assert _ids(db.select(TICKET_KIND, limit=100)) == list(_SEED_IDS)
        assert _ids(db.select(TICKET_KIND, states=[_T.OPEN], order_by="score", limit=2)) == [
            "a1",
            "a6",
        ]

    def test_select_states_of_another_lifecycle_raise_invalid_transition(self, db: Store) -> None:
        """A states filter naming a state of another lifecycle (or a bare string) raises
        InvalidTransition."""
        _seed(db)
        bad_filters: list[list[Any]] = [[_O.PENDING], [_T.OPEN, _O.DELIVERED], ["open"]]
        for states in bad_filters:
            with pytest.raises(InvalidTransition):
                db.select(TICKET_KIND, states=states)
            with pytest.raises(InvalidTransition):
                db.count(TICKET_KIND, states=states)
        foreign: list[Any] = [_T.OPEN]
        with pytest.raises(InvalidTransition):
            db.select(OBLIGATION_KIND, states=foreign)

    def test_select_unknown_column_raises_key_error(self, db: Store) -> None:
        """An undeclared where or order_by column raises KeyError."""
        _seed(db)
        with pytest.raises(KeyError):
            db.select(TICKET_KIND, where={"nope": 1})
        with pytest.raises(KeyError):
            db.select(TICKET_KIND, where={"state": "open"})
        with pytest.raises(KeyError):
            db.select(TICKET_KIND, order_by="nope")
        with pytest.raises(KeyError):
            db.count(TICKET_KIND, where={"nope": lt(1)})

    @pytest.mark.parametrize(
        "where",
        [
            {"priority": "high"},
            {"priority": True},
            {"priority": lt("x")},
            {"score": "1.0"},
            {"urgent": 1},
            {"assignee": 5},
            {"ticket_id": 5},
            {"fence": "1"},
            {"fence": True},
            {"priority": one_of(1, "two")},
        ],
    )
    def test_select_wrong_typed_where_raises_type_error(
        self, db: Store, where: dict[str, object]
    ) -> None:
        """A where value of the wrong type for its column raises TypeError."""
        _seed(db)
        with pytest.raises(TypeError):
            db.select(TICKET_KIND, where=where)
        with pytest.raises(TypeError):
            db.count(TICKET_KIND, where=where)

    def test_unencodable_text_in_a_condition_is_refused_alike(self, db: Store) -> None:
        """Text with an unpaired surrogate cannot be stored by every store, so no store compares
        with it either: select, count and an expect condition raise ValueError, unchanged."""
        _seed(db)
        bad = {"assignee": "alice\udcff"}
        before = _snapshot(db, "a1")
        with pytest.raises(ValueError, match="Unicode"):
            db.select(TICKET_KIND, where=bad)
        with pytest.raises(ValueError, match="Unicode"):
            db.count(TICKET_KIND, where=bad)
        with pytest.raises(ValueError, match="Unicode"):
            _move(db, "a1", "touch", expect=bad)
        assert _snapshot(db, "a1") == before

    def test_select_negative_limit_raises_value_error(self, db: Store) -> None:
        """A negative (or non-int) limit raises ValueError."""
        _seed(db)
        with pytest.raises(ValueError, match="limit"):
            db.select(TICKET_KIND, limit=-1)
        with pytest.raises(ValueError, match="limit"):
            db.select(TICKET_KIND, limit=True)

    @pytest.mark.parametrize(("states", "where"), _FILTERS)
    def test_count_matches_select(
        self, db: Store, states: list[TicketState] | None, where: dict[str, object] | None
    ) -> None:
        """count() equals len(select()) for the same states and where."""
        _seed(db)
        rows = db.select(TICKET_KIND, states=states, where=where)
        assert db.count(TICKET_KIND, states=states, where=where) == len(rows)
        for row in rows:
            assert states is None or row.state in states

    # -- prune ----------------------------------------------------------------------------------

    def _prune_fixture(self, db: Store) -> None:
        """p1 done@10, p2 dropped@20, p3 done@40, p4 open@5, p5 held@5, p6 done@NULL."""
        _file(db, "p1", due_at=10.0)
        _file(db, "p2", due_at=20.0)
        _file(db, "p3", due_at=40.0)
        _file(db, "p4", due_at=5.0)
        _file(db, "p5", due_at=5.0)
        _file(db, "p6")
        _move(db, "p1", "finish")
        _move(db, "p2", "drop")
        _move(db, "p3", "finish")
        _move(db, "p5", "hold")
        _move(db, "p6", "finish")

    def test_prune_deletes_only_terminal_rows_matching_where(self, db: Store) -> None:
        """prune() deletes the terminal rows matching where, with their history, and never a
        non-terminal row."""
        self._prune_fixture(db)
        survivors = {i: _snapshot(db, i) for i in ("p3", "p4", "p5", "p6")}
        assert db.prune(TICKET_KIND, "purge", where={"due_at": lt(30.0)}) == 2
        for gone in ("p1", "p2"):
            assert db.get(TICKET_KIND, gone) is None
            assert db.history(TICKET_KIND, gone) == []
        assert {i: _snapshot(db, i) for i in survivors} == survivors
        assert db.count(TICKET_KIND) == 4
        assert db.prune(TICKET_KIND, "purge", where={"due_at": lt(30.0)}) == 0
        assert db.prune(TICKET_KIND, "purge", where={"due_at": le(5.0)}) == 0
        assert db.prune(TICKET_KIND, "purge") == 2
        assert _ids(db.select(TICKET_KIND)) == ["p4", "p5"]
        assert len(db.history(TICKET_KIND, "p5")) == 2

    def test_prune_only_removes_states_the_event_allows(self, db: Store) -> None:
        """A removal event deletes only rows in its own source states."""
        self._prune_fixture(db)
        assert db.prune(TICKET_KIND, "archive") == 3
        assert _ids(db.select(TICKET_KIND)) == ["p2", "p4", "p5"]
        assert _get(db, "p2").state is _T.DROPPED

    def test_prune_respects_limit(self, db: Store) -> None:
        """prune() deletes at most limit rows and returns how many it deleted."""
        for n in range(5):
            _file(db, f"d{n}")
            _move(db, f"d{n}", "finish")
        _file(db, "live")
        assert db.prune(TICKET_KIND, "purge", limit=0) == 0
        assert db.count(TICKET_KIND) == 6
        assert db.prune(TICKET_KIND, "purge", limit=2) == 2
        assert db.count(TICKET_KIND, states=[_T.DONE]) == 3
        assert db.prune(TICKET_KIND, "purge", limit=10) == 3
        assert db.count(TICKET_KIND, states=[_T.DONE]) == 0
        assert _ids(db.select(TICKET_KIND)) == ["live"]
        with pytest.raises(ValueError, match="limit"):
            db.prune(TICKET_KIND, "purge", limit=-1)

    def test_prune_with_non_removal_event_raises_invalid_transition(self, db: Store) -> None:
        """prune() through a move, creation or undeclared event raises InvalidTransition and
        deletes nothing."""
        self._prune_fixture(db)
        for event in ("finish", "touch", "file", "no_such_event"):
            with pytest.raises(InvalidTransition):
                db.prune(TICKET_KIND, event)
        with pytest.raises(KeyError):
            db.prune(TICKET_KIND, "purge", where={"nope": 1})
        with pytest.raises(TypeError):
            db.prune(TICKET_KIND, "purge", where={"due_at": "old"})
        assert db.count(TICKET_KIND) == 6

    def test_pruned_id_can_be_inserted_again(self, db: Store) -> None:
        """After a prune the id is free: inserting it creates a new entity with a new history."""
        _file(db, "t1", assignee="old")
        _move(db, "t1", "finish")
        assert db.prune(TICKET_KIND, "purge") == 1
        row = _file(db, "t1", assignee="new")
        assert (row.state, row.fence, row["assignee"]) == (_T.OPEN, 0, "new")
        assert [r.event for r in db.history(TICKET_KIND, "t1")] == ["file"]

    # -- atomic ---------------------------------------------------------------------------------

    def test_atomic_block_that_raises_undoes_every_write(self, db: Store) -> None:
        """An exception escaping atomic() undoes its inserts, transitions and prunes, history
        included."""
        _file(db, "x1")
        _file(db, "x2")
        _move(db, "x2", "finish")
        before = {i: _snapshot(db, i) for i in ("x1", "x2", "n1")}

        def body() -> None:
            _file(db, "n1")
            _move(db, "n1", "hold")
            _move(db, "x1", "touch", changes={"assignee": "inside"})
            _move(db, "x1", "drop")
            assert db.prune(TICKET_KIND, "purge") == 2
            assert db.get(TICKET_KIND, "x2") is None

        _abort_block(db, body)
        assert {i: _snapshot(db, i) for i in before} == before
        assert db.count(TICKET_KIND) == 2
        assert _move(db, "x1", "hold", fence=0).fence == 1

    def test_nested_block_that_raises_undoes_only_its_own_writes(self, db: Store) -> None:
        """A failing nested atomic() block undoes only its writes; the outer block still
        commits."""
        _file(db, "base")
        with db.atomic():
            _file(db, "outer")
            _move(db, "base", "touch")

            def inner() -> None:
                _file(db, "inner")
                _move(db, "outer", "hold")
                _move(db, "base", "touch")

            _abort_block(db, inner)
            assert db.get(TICKET_KIND, "inner") is None
            assert _get(db, "outer").state is _T.OPEN
            _move(db, "outer", "drop")
        assert db.get(TICKET_KIND, "inner") is None
        assert db.history(TICKET_KIND, "inner") == []
        assert [r.event for r in db.history(TICKET_KIND, "outer")] == ["file", "drop"]
        assert (_get(db, "base").fence, len(db.history(TICKET_KIND, "base"))) == (1, 2)

    def test_outer_failure_undoes_committed_inner_block(self, db: Store) -> None:
        """Writes of a nested block that completed are undone when the outer block fails."""
        _file(db, "base")

        def body() -> None:
            with db.atomic():
                _file(db, "inner")
                _move(db, "base", "hold")
            assert db.get(TICKET_KIND, "inner") is not None

        _abort_block(db, body)
        assert db.get(TICKET_KIND, "inner") is None
        assert db.history(TICKET_KIND, "inner") == []
        assert (_get(db, "base").state, _get(db, "base").fence) == (_T.OPEN, 0)

    def test_committed_block_is_visible_after(self, db: Store) -> None:
        """Writes of an atomic() block that completes are visible afterwards, from any thread."""
        _file(db, "old")
        _move(db, "old", "finish")
        with db.atomic():
            _file(db, "c1")
            _move(db, "c1", "hold", changes={"score": 2.0})
            assert db.prune(TICKET_KIND, "purge") == 1
            assert _get(db, "c1").state is _T.HELD
        seen: list[object] = []

        def read() -> None:
            try:
                seen.append(_snapshot(db, "c1"))
                seen.append(db.get(TICKET_KIND, "old"))
            except BaseException as exc:
                seen.append(exc)

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        thread.join(_JOIN_TIMEOUT)
        assert not thread.is_alive()
        assert seen == [_snapshot(db, "c1"), None]
        row = _get(db, "c1")
        assert (row.state, row.fence, row["score"]) == (_T.HELD, 1, 2.0)
        assert [r.event for r in db.history(TICKET_KIND, "c1")] == ["file", "hold"]

    def test_caught_failure_inside_block_keeps_other_writes(self, db: Store) -> None:
        """A refused transition caught inside an atomic() block does not undo the block's other
        writes."""
        _file(db, "base")
        with db.atomic():
            _file(db, "c1")
            _move(db, "base", "touch")
            with pytest.raises(InvalidTransition):
                _move(db, "c1", "resume")
            with pytest.raises(StaleState):
                _move(db, "base", "hold", fence=0)
            with pytest.raises(StaleState):
                _move(db, "c1", "hold", expect={"assignee": "nobody"})
            with pytest.raises(UnknownEntity):
                _move(db, "ghost", "hold")
            _file(db, "c2")
        assert _get(db, "c1").state is _T.OPEN
        assert _get(db, "c2").fence == 0
        assert _get(db, "base").fence == 1
        assert len(db.history(TICKET_KIND, "c1")) == 1
        assert db.count(TICKET_KIND) == 3

    # -- isolation of returned values -----------------------------------------------------------

    def test_returned_values_are_copies(self, db: Store) -> None:
        """Mutating a returned row's values, a returned history or the caller's input mapping
        does not change the store."""
        values: dict[str, object] = {"title": "t", "assignee": "alice"}
        row, _ = db.insert(TICKET_KIND, "t1", values, event="file", audit=_AUDIT)
        values["assignee"] = "mallory"
        changes: dict[str, object] = {"priority": 9}
        moved = _move(db, "t1", "touch", changes=changes)
        changes["priority"] = 10
        expected = dict(moved.values)
        assert expected["assignee"] == "alice"
        assert expected["priority"] == 9
        for returned in (row, moved, _get(db, "t1"), *db.select(TICKET_KIND)):
            if isinstance(returned.values, MutableMapping):
                returned.values["assignee"] = "mallory"
                returned.values["priority"] = 0
                returned.values["extra"] = 1
        history = db.history(TICKET_KIND, "t1")
        history.clear()
        assert dict(_get(db, "t1").values) == expected
        assert len(db.history(TICKET_KIND, "t1")) == 2

    # -- the obligation kind and time-based selection -------------------------------------------

    def test_obligation_kind_round_trip(self, db: Store) -> None:
        """OBLIGATION_KIND rows go record, attempt, fail, claim, deliver, prune with their values
        and audit."""
        row = _record(db, "ob-1", 100.0, thread_id=None)
        assert (row.state, row.fence) == (_O.PENDING, 0)
        assert row["attempts"] == 0
        assert row["adapter_profile"] == "default"
        assert row["owner_pid"] is None
        owner = {"owner_host": "h", "owner_pid": 42, "owner_started_at": 7, "owner_token": "k"}
        k = OBLIGATION_KIND
        db.transition(
            k,
            "ob-1",
            "attempt",
            audit=Audit(101.0, "h:42"),
            fence=0,
            changes={**owner, "attempts": 1, "updated_at": 101, "lease_expires_at": 131.0},
        )
        failed = db.transition(
            k,
            "ob-1",
            "fail",
            audit=Audit(102.0, "h:42", 1, "timeout"),
            fence=1,
            changes={"last_error": "timeout", "error_kind": "transient", "updated_at": 102.0},
        )
        assert (failed.state, failed.fence, failed["owner_pid"]) == (_O.FAILED, 2, 42)
        with pytest.raises(ValueError, match="immutable"):
            db.transition(k, "ob-1", "claim", audit=Audit(103.0), changes={"content": "x"})
        db.transition(k, "ob-1", "claim", audit=Audit(103.0), expect={"owner_pid": 42})
        done = db.transition(
            k, "ob-1", "deliver", audit=Audit(104.0), fence=3, changes={"updated_at": 104.0}
        )
        assert (done.state, done.fence, done["last_error"]) == (_O.DELIVERED, 4, "timeout")
        assert type(done["updated_at"]) is float
        history = db.history(k, "ob-1")
        assert [(r.event, r.from_state, r.to_state) for r in history] == [
            ("record", None, _O.PENDING),
            ("attempt", _O.PENDING, _O.ATTEMPTING),
            ("fail", _O.ATTEMPTING, _O.FAILED),
            ("claim", _O.FAILED, _O.ATTEMPTING),
            ("deliver", _O.ATTEMPTING, _O.DELIVERED),
        ]
        assert (history[2].owner, history[2].attempts, history[2].reason) == ("h:42", 1, "timeout")
        _record(db, "ob-2", 100.0)
        assert db.prune(k, "prune", where={"updated_at": lt(200.0)}) == 1
        assert db.get(k, "ob-1") is None
        assert db.history(k, "ob-1") == []
        assert _ids(db.select(k)) == ["ob-2"]
        assert db.count(TICKET_KIND) == 0

    def test_stale_cutoff_selects_exactly_the_old_rows(self, db: Store) -> None:
        """With a fake clock, created_at < now - cutoff selects exactly the rows older than the
        cutoff."""
        clock = FakeClock()
        cutoff = 1800.0
        for n in range(3):
            _record(db, f"old-{n}", clock.now())
            clock.advance(60)
        clock.advance(cutoff)
        edge = clock.now()
        _record(db, "edge", edge)
        for n in range(2):
            clock.advance(60)
            _record(db, f"new-{n}", clock.now())
        now = clock.now()
        k = OBLIGATION_KIND
        stale = db.select(k, where={"created_at": lt(now - cutoff)}, order_by="created_at")
        assert _ids(stale) == ["old-0", "old-1", "old-2"]
        assert db.count(k, where={"created_at": lt(now - cutoff)}) == 3
        assert _ids(db.select(k, where={"created_at": le(edge)})) == [
            "edge",
            "old-0",
            "old-1",
            "old-2",
        ]
        clock.advance(cutoff)
        # new-1 was written exactly `cutoff` ago: not strictly older, so not stale.
        later = db.select(k, states=[_O.PENDING], where={"created_at": lt(clock.now() - cutoff)})
        assert _ids(later) == ["edge", "new-0", "old-0", "old-1", "old-2"]

    def test_expired_leases_select_only_expired(self, db: Store) -> None:
        """With a fake clock, lease_expires_at <= now selects only leases that have expired."""
        clock = FakeClock()
        k = OBLIGATION_KIND
        for name, lease in (("short", 30.0), ("long", 90.0), ("none", None)):
            _record(db, name, clock.now())
            expires = None if lease is None else clock.now() + lease
            db.transition(
                k,
                name,
                "attempt",
                audit=Audit(clock.now()),
                fence=0,
                changes={"lease_expires_at": expires},
            )
        _record(db, "pending", clock.now(), lease_expires_at=clock.now())

        def expired() -> list[str]:
            where = {"lease_expires_at": le(clock.now())}
            return _ids(db.select(k, states=[_O.ATTEMPTING], where=where))

        assert expired() == []
        clock.advance(29)
        assert expired() == []
        clock.advance(1)
        assert expired() == ["short"]
        clock.advance(59.5)
        assert expired() == ["short"]
        clock.advance(0.5)
        assert expired() == ["long", "short"]
        clock.advance(1e6)
        assert expired() == ["long", "short"]
        assert _ids(db.select(k, where={"lease_expires_at": le(clock.now())})) == [
            "long",
            "pending",
            "short",
        ]

    # ==========================================================================================
    # Ledger-level contract: the delivery ledger's guarantees hold on this store.
    # ==========================================================================================

    @staticmethod
    def _ledgers(db: Store, clock: FakeClock) -> tuple[Ledger, Ledger]:
        """A dead owner's ledger and a live one, on the same host, sharing ``clock``."""
        me = Incarnation.current()
        dead = Incarnation(me.host, 4_000_000, 1, "dead-owner")
        probe = _ContractProbe(alive={me.pid})
        return (
            Ledger(db, clock=clock, incarnation=dead, probe=probe),
            Ledger(db, clock=clock, incarnation=me, probe=probe),
        )

    @staticmethod
    def _record(ledger: Ledger, oid: str, **fields: Any) -> str:
        values: dict[str, Any] = {
            "session_key": "agent:main:slack:channel:C1",
            "platform": "slack",
            "chat_id": "C1",
            "content": f"reply {oid}",
        }
        values.update(fields)
        return ledger.record(obligation_id=oid, **values).obligation_id

    def test_ledger_lifecycle_and_history(self, db: Store) -> None:
        """record -> attempting -> delivered through the ledger leaves a three-entry history."""
        clock = FakeClock()
        _, live = self._ledgers(db, clock)
        oid = self._record(live, "ob-1")
        live.mark_attempting(oid)
        clock.advance(1)
        done = live.mark_delivered(oid)
        assert done.state is ObligationState.DELIVERED
        assert done.updated_at == clock.now()
        assert [(h.event, h.from_state, h.to_state) for h in live.history(oid)] == [
            ("record", None, ObligationState.PENDING),
            ("attempt", ObligationState.PENDING, ObligationState.ATTEMPTING),
            ("deliver", ObligationState.ATTEMPTING, ObligationState.DELIVERED),
        ]

    def test_ledger_strict_lifecycle_changes_nothing(self, db: Store) -> None:
        """Settling a row that is not attempting raises InvalidTransition and changes nothing."""
        _, live = self._ledgers(db, FakeClock())
        oid = self._record(live, "ob-1")
        before = live.get(oid)
        with pytest.raises(InvalidTransition):
            live.mark_delivered(oid)
        with pytest.raises(InvalidTransition):
            live.mark_failed(oid, "boom")
        with pytest.raises(InvalidTransition):
            live.release(oid)
        assert live.get(oid) == before
        assert len(live.history(oid)) == 1

    def test_ledger_dead_owner_rows_claimed_once_and_zombie_refused(self, db: Store) -> None:
        """A dead owner's rows are claimed once; the owner's late write is refused (fence)."""
        clock = FakeClock()
        zombie, live = self._ledgers(db, clock)
        pending = self._record(zombie, "ob-pending")
        sent = self._record(zombie, "ob-sent")
        zombie.mark_attempting(sent)
        claims = {c.obligation_id: c for c in live.sweep_recoverable()}
        assert set(claims) == {pending, sent}
        assert (claims[pending].needs_marker, claims[pending].reason) == (False, None)
        assert (claims[sent].needs_marker, claims[sent].reason) == (True, "recovered")
        assert live.sweep_recoverable() == []
        with pytest.raises(StaleState):
            zombie.mark_delivered(sent)
        row = live.get(sent)
        assert row is not None
        assert row.state is ObligationState.ATTEMPTING
        assert row.owner.token == live.incarnation.token
        assert live.mark_delivered(sent).state is ObligationState.DELIVERED

    def test_ledger_concurrent_sweeps_claim_each_row_once(self, db: Store) -> None:
        """Two live sweepers racing over the same dead rows claim every row exactly once."""
        clock = FakeClock()
        zombie, live = self._ledgers(db, clock)
        ids = [self._record(zombie, f"ob-{i:03d}") for i in range(60)]
        me = live.incarnation
        other = Ledger(
            db,
            clock=clock,
            incarnation=Incarnation(me.host, me.pid, me.started_at, "second-sweeper"),
            probe=_ContractProbe(alive={me.pid}),
        )
        results: dict[str, list[str]] = {}
        errors: list[BaseException] = []
        start = threading.Barrier(2, timeout=_JOIN_TIMEOUT)

        def sweep(name: str, ledger: Ledger) -> None:
            try:
                start.wait()
                results[name] = [c.obligation_id for c in ledger.sweep_recoverable()]
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=sweep, args=(n, lg), daemon=True)
            for n, lg in (("a", live), ("b", other))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(_JOIN_TIMEOUT)
        assert not any(t.is_alive() for t in threads), "a sweeper did not finish"
        assert not errors
        assert set(results) == {"a", "b"}
        claimed = Counter(results.get("a", []) + results.get("b", []))
        assert set(claimed) == set(ids)
        assert max(claimed.values()) == 1

    def test_ledger_fake_clock_abandons_stale_rows_and_prunes_only_settled(self, db: Store) -> None:
        """Stale owed rows are abandoned with a reason; pruning never deletes an owed row."""
        clock = FakeClock()
        zombie, live = self._ledgers(db, clock)
        stale = self._record(zombie, "ob-stale")
        clock.advance(live.policy.stale_after + 1)
        fresh = self._record(zombie, "ob-fresh")
        claims = live.sweep_recoverable()
        assert [c.obligation_id for c in claims] == [fresh]
        abandoned = live.get(stale)
        assert abandoned is not None
        assert abandoned.state is ObligationState.ABANDONED
        assert "stale" in (live.history(stale)[-1].reason or "")
        clock.advance(live.policy.retention + 1)
        assert live.prune() == 1
        assert live.get(stale) is None
        assert live.history(stale) == []
        owed = live.get(fresh)
        assert owed is not None
        assert owed.state is ObligationState.ATTEMPTING


class _ContractProbe:
    """Liveness by pid set: pids in ``alive`` are alive with any start time."""

    def __init__(self, alive: set[int]) -> None:
        self._alive = alive

    def pid_exists(self, pid: int) -> bool:
        return pid in self._alive

    def start_time(self, pid: int) -> int | None:
        return None

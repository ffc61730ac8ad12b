"""The contract kit's own lifecycle, entity kind, store opener and helpers, shared by every
section of :class:`~stores.testing.StoreContract`."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from enum import StrEnum
from typing import Any

import pytest

from statecore.entity import EntityKind, Field, Index
from statecore.lifecycle import Lifecycle, Transition
from statecore.lifecycles import ObligationState
from statecore.obligation import OBLIGATION_KIND
from statecore.store import (
    Audit,
    Row,
    Store,
    ge,
    gt,
    lt,
    ne,
    one_of,
)

__all__ = [
    "TICKET",
    "TICKET_KIND",
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


TS = TicketState

TICKET: Lifecycle[TicketState] = Lifecycle(
    "ticket",
    TicketState,
    initial=TS.OPEN,
    terminal=(TS.DONE, TS.DROPPED),
    description="The store contract kit's test lifecycle.",
    transitions=(
        Transition("file", None, TS.OPEN),  # creation
        Transition("touch", TS.OPEN, TS.OPEN),  # a self-loop
        Transition("hold", TS.OPEN, TS.HELD),
        Transition("resume", TS.HELD, TS.OPEN),
        Transition("finish", (TS.OPEN, TS.HELD), TS.DONE),  # multi-source
        # One event, a different target per source.
        Transition("advance", TS.OPEN, TS.HELD),
        Transition("advance", TS.HELD, TS.DONE),
        Transition("drop", (TS.OPEN, TS.HELD), TS.DROPPED),  # multi-source
        Transition("purge", (TS.DONE, TS.DROPPED), None),  # removal from every terminal state
        Transition("archive", TS.DONE, None),  # removal from one terminal state only
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
        Index(("assignee", "priority"), states=frozenset({TS.OPEN, TS.HELD})),
        Index(("due_at",)),
    ),
)
"""The kit's test entity kind: every field type, nullable and not, an immutable field,
defaults, and a partial index."""

OS = ObligationState
AUDIT = Audit(at=1_000.0, owner="kit")
JOIN_TIMEOUT = 60.0
SEED_IDS = ("a1", "a2", "a3", "a4", "a5", "a6")


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


def file_ticket(
    db: Store, ticket_id: str, audit: Audit = AUDIT, **values: object
) -> Row[TicketState]:
    """Insert a new ticket (title defaults to its id); fail if it already existed."""
    row, created = db.insert(
        TICKET_KIND, ticket_id, {"title": ticket_id, **values}, event="file", audit=audit
    )
    assert created, f"{ticket_id} already existed"
    return row


def move(
    db: Store, ticket_id: str, event: str, audit: Audit = AUDIT, **kwargs: Any
) -> Row[TicketState]:
    return db.transition(TICKET_KIND, ticket_id, event, audit=audit, **kwargs)


def get_ticket(db: Store, ticket_id: str) -> Row[TicketState]:
    row = db.get(TICKET_KIND, ticket_id)
    assert row is not None, f"{ticket_id} is missing"
    return row


def snapshot(db: Store, ticket_id: str) -> tuple[object, ...]:
    """Everything stored about a ticket: state, fence, values and history."""
    row = db.get(TICKET_KIND, ticket_id)
    values = None if row is None else (row.state, row.fence, dict(row.values))
    return (values, db.history(TICKET_KIND, ticket_id))


def outcome_of(outcome: object) -> object:
    """A batch item's outcome in comparable form: rows as they are, errors by type and text."""
    if isinstance(outcome, Exception):
        return (type(outcome).__name__, str(outcome))
    return outcome


def ids_of(rows: list[Row[Any]]) -> list[str]:
    return [row.id for row in rows]


def seed(db: Store) -> None:
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
    file_ticket(db, "a4", score=2.5, due_at=300.0)
    file_ticket(db, "a1", assignee="alice", priority=1, score=0.5, urgent=True, due_at=100.0)
    file_ticket(db, "a6", assignee="bob", priority=2, score=0.5, due_at=150.0)
    file_ticket(db, "a3", assignee="bob", score=1.5)
    file_ticket(db, "a5", assignee="alice", priority=5, urgent=True)
    file_ticket(db, "a2", priority=2, due_at=200.0)
    move(db, "a2", "hold")
    move(db, "a3", "finish")
    move(db, "a5", "drop")
    move(db, "a6", "touch")
    move(db, "a6", "touch")


def obligation_values(at: float, **extra: object) -> dict[str, object]:
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


def record_obligation(
    db: Store, obligation_id: str, at: float, **extra: object
) -> Row[ObligationState]:
    row, created = db.insert(
        OBLIGATION_KIND,
        obligation_id,
        obligation_values(at, **extra),
        event="record",
        audit=Audit(at),
    )
    assert created
    return row


def abort_block(db: Store, body: Callable[[], object]) -> None:
    """Run ``body`` in an ``atomic()`` block, then raise :class:`_Boom` inside it."""

    def run() -> None:
        with db.atomic():
            body()
            raise _Boom

    with pytest.raises(_Boom):
        run()


# (states, where) filters whose select and count must agree, over the seeded tickets.
FILTERS: list[tuple[list[TicketState] | None, dict[str, object] | None]] = [
    (None, None),
    ([TS.OPEN], None),
    ([TS.DONE, TS.DROPPED], None),
    ([], None),
    (None, {"assignee": None}),
    (None, {"score": lt(1.0)}),
    (None, {"score": ne(None), "priority": ge(2)}),
    ([TS.OPEN, TS.HELD], {"due_at": gt(120)}),
    (None, {"ticket_id": one_of("a1", "a5", "zz")}),
    (None, {"fence": 1}),
    ([TS.HELD], {"assignee": "alice"}),
]


class ContractProbe:
    """Liveness by pid set: pids in ``alive`` are alive with any start time."""

    def __init__(self, alive: set[int]) -> None:
        self._alive = alive

    def pid_exists(self, pid: int) -> bool:
        return pid in self._alive

    def start_time(self, pid: int) -> int | None:
        return None

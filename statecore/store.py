"""The Store protocol (the port) and the guard logic every store shares.

A store persists entities of declared :class:`~statecore.entity.EntityKind` s.  Its one
state-changing primitive is the **guarded transition**: a single atomic conditional write
``state := target WHERE id = :id AND state IN sources(event) [AND fence = :fence] [AND ...]``
that also bumps the fence and appends an audit entry in the same transaction.  When the write
matches nothing the store re-reads the row and raises the error that says who is to blame:
:class:`~statecore.errors.UnknownEntity`, :class:`~statecore.errors.InvalidTransition` (the
lifecycle forbids the move) or :class:`~statecore.errors.StaleState` (a concurrent writer won).

The guard is planned once here (:func:`plan_transition`) and either evaluated in Python
(:meth:`TransitionPlan.matches`, used by the in-memory store under its lock) or compiled to SQL
from the same plan, so a fake store can never be looser than a real one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from enum import Enum
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

import attrs

from statecore.entity import EntityKind
from statecore.errors import InvalidTransition, StaleState, UnknownEntity
from statecore.lifecycle import Timer

__all__ = [
    "Audit",
    "Cmp",
    "Due",
    "KindCatalog",
    "KindRecord",
    "Row",
    "Store",
    "TimerStore",
    "TransitionPlan",
    "TransitionRecord",
    "Where",
    "check_due_query",
    "check_id",
    "check_increments",
    "check_limit",
    "creation_target",
    "ge",
    "gt",
    "le",
    "lt",
    "ne",
    "normalize_where",
    "one_of",
    "order_key",
    "plan_creation",
    "plan_transition",
    "removal_sources",
    "rows_matching",
    "valid_states",
]

S = TypeVar("S", bound=Enum)

Op = Literal["=", "!=", "<", "<=", ">", ">=", "in"]


@attrs.frozen
class Cmp:
    """One comparison in a ``where`` or ``expect`` mapping, with SQL's semantics everywhere:
    ``= None`` means IS NULL, ``!= None`` IS NOT NULL, and any other comparison with a NULL
    column is false."""

    op: Op
    value: Any

    def test(self, actual: object) -> bool:
        """Evaluate against a stored value exactly as the SQL the stores generate would."""
        op, value = self.op, self.value
        if op == "=":
            return actual is None if value is None else actual is not None and actual == value
        if op == "!=":
            return actual is not None if value is None else actual is not None and actual != value
        if actual is None:
            return False
        if op == "in":
            return actual in value
        if op == "<":
            return bool(actual < value)
        if op == "<=":
            return bool(actual <= value)
        if op == ">":
            return bool(actual > value)
        return bool(actual >= value)


def lt(value: object) -> Cmp:
    """``column < value`` (false for NULL)."""
    return Cmp("<", value)


def le(value: object) -> Cmp:
    """``column <= value`` (false for NULL)."""
    return Cmp("<=", value)


def gt(value: object) -> Cmp:
    """``column > value`` (false for NULL)."""
    return Cmp(">", value)


def ge(value: object) -> Cmp:
    """``column >= value`` (false for NULL)."""
    return Cmp(">=", value)


def ne(value: object) -> Cmp:
    """``column != value``; ``ne(None)`` is IS NOT NULL."""
    return Cmp("!=", value)


def one_of(*values: object) -> Cmp:
    """``column IN (values)``; None is not allowed among them (use ``= None``)."""
    if any(v is None for v in values):
        raise ValueError("one_of() cannot match NULL; compare with None instead")
    return Cmp("in", frozenset(values))


Where = tuple[tuple[str, Cmp], ...]
"""A normalized condition list: (column, comparison) pairs, all of which must hold."""


def normalize_where(kind: EntityKind[Any], where: Mapping[str, object] | None) -> Where:
    """Check and normalize a ``where``/``expect`` mapping against ``kind``.

    Keys are declared fields, the id field or ``fence``; a plain value means equality (None:
    IS NULL).  Raises ``KeyError``/``TypeError``/``ValueError`` naming the column.
    """
    if not where:
        return ()
    out: list[tuple[str, Cmp]] = []
    for column, raw in where.items():
        cmp = raw if isinstance(raw, Cmp) else Cmp("=", raw)
        if cmp.op == "in":
            cmp = Cmp("in", frozenset(_check_value(kind, column, v) for v in cmp.value))
        else:
            checked = _check_value(kind, column, cmp.value)
            if checked is not cmp.value:
                cmp = Cmp(cmp.op, checked)
        out.append((column, cmp))
    return tuple(out)


def _check_value(kind: EntityKind[Any], column: str, value: object) -> object:
    """Check one compared value against its column (declared field, id field or fence)."""
    if column == kind.id_field:
        return value if value is None else check_id(value)
    if column == "fence":
        return value if value is None else _check_int(value)
    field = kind.field(column)
    # None compares as IS NULL whatever the field's nullability; anything else must fit it.
    return None if value is None else field.checked(value, kind.name)


def check_id(value: object) -> object:
    """Return ``value`` if it is a str (an entity id); raise ``TypeError`` otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"an id must be a str, not {type(value).__name__}")
    return value


def _check_int(value: object) -> object:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"fence must be an int, not {type(value).__name__}")
    return value


@attrs.frozen
class Audit:
    """What a transition's audit entry records besides the move itself."""

    at: float
    owner: str | None = None
    attempts: int | None = None
    reason: str | None = None


@attrs.frozen
class TransitionRecord:
    """One audit entry: an entity's move (``from_state`` None for its creation)."""

    entity_id: str
    event: str
    from_state: Enum | None
    to_state: Enum
    at: float
    owner: str | None
    attempts: int | None
    reason: str | None


@attrs.frozen
class Row(Generic[S]):
    """A stored entity as read back: its id, state, fence and field values (a copy)."""

    id: str
    state: S
    fence: int
    values: Mapping[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]


@attrs.frozen
class TransitionPlan(Generic[S]):
    """A planned guarded transition: what must hold, what is written."""

    kind: EntityKind[S]
    entity_id: str
    event: str
    targets: Mapping[S, S]
    """source state -> target state (usually one target for every source)."""
    fence: int | None
    expect: Where
    changes: Mapping[str, object]

    def matches(self, state: S, fence: int, values: Mapping[str, object]) -> bool:
        """True when a row with this state, fence and values satisfies the guard."""
        if state not in self.targets:
            return False
        if self.fence is not None and fence != self.fence:
            return False
        kind, entity_id = self.kind, self.entity_id
        return all(
            cmp.test(_column(kind, entity_id, fence, values, col)) for col, cmp in self.expect
        )

    def miss(self, row: Row[S] | None) -> Exception:
        """The error to raise when the guarded write matched nothing and ``row`` is current."""
        if row is None:
            return UnknownEntity(self.kind.name, self.entity_id)
        if self.fence is not None and row.fence != self.fence:
            return StaleState(self.entity_id, f"fence {self.fence}", f"fence {row.fence}")
        if row.state not in self.targets:
            return _refusal(self.kind, row.state, self.event)
        for column, cmp in self.expect:
            actual = _column(self.kind, row.id, row.fence, row.values, column)
            if not cmp.test(actual):
                return StaleState(
                    self.entity_id, f"{column} {cmp.op} {cmp.value!r}", f"{column}={actual!r}"
                )
        return StaleState(self.entity_id, "the guarded row", "it changed concurrently")


def _column(
    kind: EntityKind[Any], entity_id: str, fence: int, values: Mapping[str, object], column: str
) -> object:
    if column == kind.id_field:
        return entity_id
    if column == "fence":
        return fence
    return values[column]


def _refusal(kind: EntityKind[Any], state: Enum, event: str) -> InvalidTransition:
    try:
        kind.lifecycle.target(state, event)
    except InvalidTransition as exc:
        return exc
    return InvalidTransition(kind.lifecycle.name, state, event)  # pragma: no cover


def plan_transition(
    kind: EntityKind[S],
    entity_id: str,
    event: str,
    *,
    fence: int | None = None,
    expect: Mapping[str, object] | None = None,
    changes: Mapping[str, object] | None = None,
) -> TransitionPlan[S]:
    """Check a requested transition against the declaration and plan its guarded write.

    Raises :class:`InvalidTransition` for an undeclared, creation or removal event, and
    ``TypeError``/``ValueError``/``KeyError`` for bad ids, fences, conditions or changes --
    before anything is written.
    """
    check_id(entity_id)
    if fence is not None:
        _check_int(fence)
    lifecycle = kind.lifecycle
    lifecycle.sources(event)  # raises InvalidTransition for an undeclared event
    if lifecycle.creates(event) or lifecycle.removes(event):
        raise InvalidTransition(lifecycle.name, None, event, "not a move; use insert() or prune()")
    return TransitionPlan(
        kind,
        entity_id,
        event,
        lifecycle.moves(event),
        fence,
        normalize_where(kind, expect),
        kind.changed_values(changes or {}),
    )


@runtime_checkable
class Store(Protocol):
    """Persistence for lifecycle entities, enforcing each kind's lifecycle on every write.

    Implementations must be safe to call from several threads.  Every method either completes
    or raises having changed nothing.  Driver failures raise
    :class:`~statecore.errors.StoreError` with the cause chained.
    """

    def register(self, kind: EntityKind[Any]) -> None:
        """Make the store ready to hold ``kind`` (create or migrate its storage); idempotent."""
        ...

    def insert(
        self,
        kind: EntityKind[S],
        entity_id: str,
        values: Mapping[str, object],
        *,
        event: str,
        audit: Audit,
    ) -> tuple[Row[S], bool]:
        """Create an entity through the creation ``event`` (fence 0, the initial state).

        Idempotent: when ``entity_id`` exists, returns ``(existing_row, False)`` and writes
        nothing; otherwise ``(new_row, True)`` with the audit entry written.  Raises
        :class:`InvalidTransition` if ``event`` is not a creation event.
        """
        ...

    def get(self, kind: EntityKind[S], entity_id: str) -> Row[S] | None:
        """The entity, or None."""
        ...

    def transition(
        self,
        kind: EntityKind[S],
        entity_id: str,
        event: str,
        *,
        audit: Audit,
        fence: int | None = None,
        expect: Mapping[str, object] | None = None,
        changes: Mapping[str, object] | None = None,
    ) -> Row[S]:
        """Apply ``event`` as one guarded write; return the row as written (fence + 1).

        The guard: state in ``sources(event)``, ``fence`` (when given) equal, every ``expect``
        condition true.  ``changes`` sets mutable fields in the same write.  Raises
        :class:`UnknownEntity`, :class:`InvalidTransition` or :class:`StaleState`.
        """
        ...

    def transition_many(
        self,
        kind: EntityKind[S],
        entity_ids: Sequence[str],
        event: str,
        *,
        audit: Audit,
        expect: Mapping[str, object] | None = None,
        changes: Mapping[str, object] | None = None,
        increments: Mapping[str, int] | None = None,
    ) -> list[Row[S]]:
        """Apply ``event`` to every listed entity the guard admits, in one transaction.

        The guard is the one :meth:`transition` uses, without a fence: state in
        ``sources(event)`` and every ``expect`` condition.  Entities it does not admit (unknown,
        in another state, failing ``expect``) are skipped, unchanged.  ``increments`` adds to
        integer fields.  Returns the rows written, in the order of ``entity_ids``; each gets
        its audit entry.  Raises as :meth:`transition` for bad input, before any write.
        """
        ...

    def select(
        self,
        kind: EntityKind[S],
        *,
        states: Iterable[S] | None = None,
        where: Mapping[str, object] | None = None,
        order_by: str | None = None,
        limit: int | None = None,
    ) -> list[Row[S]]:
        """Entities in ``states`` (all when None) matching ``where``.

        Ordered by ``order_by`` (NULLs first) then id, or by id alone; at most ``limit``.
        """
        ...

    def count(
        self,
        kind: EntityKind[S],
        *,
        states: Iterable[S] | None = None,
        where: Mapping[str, object] | None = None,
    ) -> int:
        """How many entities :meth:`select` would return without a limit."""
        ...

    def prune(
        self,
        kind: EntityKind[S],
        event: str,
        *,
        where: Mapping[str, object] | None = None,
        limit: int | None = None,
    ) -> int:
        """Delete entities the removal ``event`` allows (terminal states only) matching
        ``where``, with their audit history; return how many were deleted.

        Raises :class:`InvalidTransition` when ``event`` is not a removal event.
        """
        ...

    def history(self, kind: EntityKind[S], entity_id: str) -> list[TransitionRecord]:
        """The entity's audit entries, oldest first (empty once pruned or never created)."""
        ...

    def atomic(self) -> AbstractContextManager[None]:
        """A transaction on this thread: everything inside commits together or not at all.

        Nests (inner blocks are savepoints: an exception escaping an inner block undoes only
        that block).  Other threads' writes wait for the outermost block to finish.  A refused
        operation inside a block (``InvalidTransition``, ``StaleState``, bad input) writes
        nothing and may be caught; a ``StoreError`` leaves the block in doubt: let it escape.
        """
        ...

    def close(self) -> None:
        """Release every resource; further calls raise :class:`StoreError`.  Idempotent."""
        ...


@attrs.frozen
class Due(Generic[S]):
    """A row whose timer is due: the row as read (its fence guards the firing), when it
    entered the timer's source state, and when the timer falls due."""

    row: Row[S]
    entered_at: float
    due_at: float


@runtime_checkable
class TimerStore(Protocol):
    """A store that finds due timers itself (every shipped store does).

    A row's *entered time* is the ``at`` of the audit entry of the write that last set its
    state (its creation, a move -- into the same state too --, a bulk move); a migration of
    its lifecycle keeps it.  :class:`~statecore.timers.Timers` reads a store without this
    method through ``select`` and ``history`` instead (every row of the source state read).
    """

    def due_timers(
        self, kind: EntityKind[S], timer: Timer[S], *, now: float | None, limit: int
    ) -> list[Due[S]]:
        """Rows in ``timer.source`` whose timer is due at ``now`` (entered time plus the
        duration -- fixed, or the row's field; a row whose field is None has none -- at or
        before ``now``; None: every row with a timer), soonest due first, then by id; at most
        ``limit``.  Inside an ``atomic()`` block a store that can lock rows (PostgreSQL) locks
        those it returns and skips rows another transaction holds, so that several processes
        firing timers share the work.  Raises ``StoreError`` as any read."""
        ...


@attrs.frozen
class KindRecord:
    """A store's record of one registered entity kind: what the catalog keeps."""

    name: str
    lifecycle: str
    version: int
    declaration: Mapping[str, Any]
    """The kind as :func:`statecore.catalog.declaration_json` writes it."""
    registered_at: float


@runtime_checkable
class KindCatalog(Protocol):
    """A store that records every kind registered with it, with its lifecycle's version and
    declaration (every shipped store does): the CLI and the dashboard list, draw and count
    any lifecycle from it, and a newer version of a lifecycle is migrated against it."""

    def catalog(self) -> list[KindRecord]:
        """Every kind registered with this store (by any process), by name."""
        ...


def removal_sources(kind: EntityKind[S], event: str) -> frozenset[S]:
    """The states ``event`` may remove; raises :class:`InvalidTransition` if not a removal."""
    lifecycle = kind.lifecycle
    sources = lifecycle.sources(event)
    if not lifecycle.removes(event):
        raise InvalidTransition(lifecycle.name, None, event, "not a removal event")
    return sources


def creation_target(kind: EntityKind[S], event: str) -> S:
    """The state a creation ``event`` starts entities in; raises :class:`InvalidTransition`."""
    return kind.lifecycle.target(None, event)


def plan_creation(
    kind: EntityKind[S], entity_id: str, event: str, values: Mapping[str, object]
) -> tuple[S, dict[str, object]]:
    """Check a requested creation: ``(initial state, checked values)``.

    Raises ``TypeError`` for an id that is not a str, ``ValueError`` for an empty one,
    :class:`InvalidTransition` when ``event`` is not a creation event, and what
    :meth:`EntityKind.new_values` raises for bad values -- before anything is written.
    """
    check_id(entity_id)
    if not entity_id:
        raise ValueError(f"{kind.name} id must be a non-empty str")
    return creation_target(kind, event), kind.new_values(values)


def check_increments(
    kind: EntityKind[Any],
    increments: Mapping[str, int] | None,
    changes: Mapping[str, object] | None = None,
) -> dict[str, int]:
    """Check ``increments``: mutable, non-nullable int fields, int amounts, and none of them
    also set by ``changes`` (one write cannot both set and add to a field)."""
    checked: dict[str, int] = {}
    for name, amount in (increments or {}).items():
        field = kind.field(name)
        if field.type is not int or field.nullable or field.immutable:
            raise ValueError(f"{kind.name}.{name} cannot be incremented (not a mutable int)")
        if changes and name in changes:
            raise ValueError(f"{kind.name}.{name} is both changed and incremented")
        if not isinstance(amount, int) or isinstance(amount, bool):
            raise TypeError(f"increment of {kind.name}.{name} must be an int, not {amount!r}")
        checked[name] = amount
    return checked


def check_due_query(kind: EntityKind[Any], timer: object, now: object, limit: object) -> None:
    """Refuse a ``due_timers`` call no store can answer, before anything is read: ``TypeError``
    for a ``timer`` that is not a :class:`~statecore.lifecycle.Timer`, a ``limit`` not an int
    or a ``now`` neither a number nor None; ``ValueError`` for a negative ``limit``, a timer
    not of ``kind``'s lifecycle or a NaN ``now`` (every shipped store checks with this)."""
    if not isinstance(timer, Timer):
        raise TypeError(f"timer must be a Timer, not {type(timer).__name__}")
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    if limit < 0:
        raise ValueError(f"limit must be a non-negative int, not {limit!r}")
    lifecycle = kind.lifecycle
    if not isinstance(timer.source, lifecycle.state_type) or timer not in lifecycle.timers:
        raise ValueError(f"{timer!r} is not a timer of entity kind {kind.name!r}")
    if now is not None:
        if isinstance(now, bool) or not isinstance(now, int | float):
            raise TypeError(f"now must be a number or None, not {type(now).__name__}")
        if now != now:  # noqa: PLR0124 - NaN
            raise ValueError("now must be a number, not NaN")


def check_limit(limit: int | None) -> None:
    """Refuse a limit that is not a non-negative int."""
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, not {limit!r}")


def valid_states(kind: EntityKind[S], states: Iterable[S] | None) -> frozenset[S] | None:
    """Check a ``states`` filter against the kind's lifecycle."""
    if states is None:
        return None
    checked = frozenset(states)
    for state in checked:
        if not isinstance(state, kind.lifecycle.state_type):
            raise InvalidTransition(kind.lifecycle.name, state, "select", "undeclared state")
    return checked


def order_key(kind: EntityKind[Any], order_by: str | None) -> Any:
    """The Python sort key matching SQL ``ORDER BY <order_by> (NULLs first), id``.

    Raises ``KeyError`` for a column that is not a field, the id field or ``fence``.
    """
    if order_by is not None and order_by not in (kind.id_field, "fence"):
        kind.field(order_by)

    def key(row: Row[Any]) -> tuple[Any, ...]:
        if order_by is None:
            return (row.id,)
        value = _column(kind, row.id, row.fence, row.values, order_by)
        return (value is not None, 0 if value is None else value, row.id)

    return key


def rows_matching(
    rows: Iterator[Row[S]], states: frozenset[S] | None, where: Where, kind: EntityKind[S]
) -> Iterator[Row[S]]:
    """Filter rows by states and a normalized where, with the SQL semantics of :class:`Cmp`."""
    for row in rows:
        if states is not None and row.state not in states:
            continue
        if all(cmp.test(_column(kind, row.id, row.fence, row.values, c)) for c, cmp in where):
            yield row

"""The SQLite store's speed shortcuts, all in one place: what it does faster than the plain path.

Every shortcut here is an optimisation only; each admits exactly what the plain path would and
writes exactly what it would:

* :class:`CompiledKind` -- a kind's statement texts, built once at ``register()`` and then by
  shape, and its row decoder (by column position, without a second check of values the store
  already checked).
* :class:`FastUpdate` -- a transition shape learned from its first full plan: a later call of
  the same shape with plain values binds them directly instead of planning again.  Of a row the
  store wrote last (:meth:`CompiledKind.remember`), such a call proves in its ``UPDATE`` that
  the row is still that one, and the row written is known without reading it back.
* :func:`due_params`, :func:`catalog_row`, :func:`kind_records` -- the checked bound values of
  a timer's due query and the catalog's rows in and out (plain checks and conversions, kept
  here so that the store's module stays one method per operation).
* :class:`Step`, :func:`distinct_runs`, :func:`pieces` -- a batch of moves or creations cut into
  runs of one shape on distinct entities, each run into a few multi-row statements whose texts
  repeat (and so stay in the driver's statement cache).

No SQL is written here: every text comes from ``stores._sqlite_sql``, whose output is pinned by
golden files.  Nothing here touches a connection either.
"""

from __future__ import annotations

import contextlib
import json
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any, TypeVar

import stores._sqlite_sql as sql
from statecore.batch import Move
from statecore.catalog import declaration_json
from statecore.entity import EntityKind
from statecore.errors import StaleVersion, StoreError
from statecore.lifecycle import Timer
from statecore.store import (
    Audit,
    KindRecord,
    Row,
    TransitionPlan,
    TransitionRecord,
    Where,
    check_due_query,
    plan_transition,
)
from statecore.trusted import trusted_constructor

__all__ = [
    "BATCH_PIECE",
    "CompiledKind",
    "FastUpdate",
    "Step",
    "audit_values",
    "catalog_row",
    "distinct_runs",
    "due_params",
    "fast_key",
    "kind_records",
    "learn",
    "new_row",
    "pieces",
]

_T = TypeVar("_T")

KNOWN_ROWS = 1024
"""Rows a compiled kind keeps as the last written per id (for proved transitions)."""

BATCH_PIECE = 64
"""Rows per multi-row statement of a batch (parameters stay well under any SQLite limit)."""

new_row = trusted_constructor(Row)
"""Builds a Row without checking it again: for values the store has just checked or decoded."""


class CompiledKind:
    """One registered kind's statement texts and row decoder, built once at register(); texts
    that depend on a plan's shape are built on first use and kept."""

    __slots__ = (
        "column_values",
        "columns",
        "fast",
        "final",
        "get_sql",
        "history_sql",
        "insert_sql",
        "kind",
        "known",
        "members",
        "select_cols",
        "state_values",
        "states",
        "stored_version",
        "texts",
        "values",
    )

    def __init__(
        self, kind: EntityKind[Any], stored_version: Callable[[], int | None] = lambda: None
    ) -> None:
        self.kind = kind
        # The version the store's catalog holds now (read only when a value is not a state).
        self.stored_version = stored_version
        self.columns = tuple(f.name for f in kind.fields)
        self.select_cols = sql.select_cols(kind)
        self.states: dict[str, Enum] = {s.value: s for s in kind.lifecycle.states}
        # Each state's stored text (a dict lookup costs less than the Enum's value property).
        self.state_values: dict[Enum, str] = {s: s.value for s in kind.lifecycle.states}
        self.final = frozenset(
            s for s in kind.lifecycle.states if not kind.lifecycle.allowed_events(s)
        )
        self.get_sql = sql.get_sql(kind)
        self.history_sql = sql.history_sql(kind)
        self.insert_sql = sql.insert_sql(kind)
        # The membership columns' values of a row created in each state (bound by inserts).
        self.members: dict[Enum, tuple[int | None, ...]] = {
            s: sql.member_values(kind, s) for s in kind.lifecycle.states
        }
        # The declared fields' values of a checked mapping, in column order (itemgetter runs in
        # C; one field needs a tuple of its own).
        self.column_values: Callable[[Mapping[str, object]], tuple[Any, ...]] = (
            operator.itemgetter(*self.columns)
            if len(self.columns) > 1
            else lambda values: tuple(values[n] for n in self.columns)
        )
        # Statement texts by shape: guarded updates, multi-row inserts, bulk updates.
        self.texts: dict[tuple[Any, ...], str] = {}
        # Shapes seen with plain values only: (event, unfenced?, expect keys, change keys).
        self.fast: dict[tuple[Any, ...], FastUpdate] = {}
        self.values = _values_decoder(kind)
        # The row this store last wrote for each id (a few, see remember): a later transition
        # of that id proves the row unchanged instead of reading it back (see FastUpdate).
        self.known: dict[str, Row[Any]] = {}

    def remember(self, row: Row[Any]) -> None:
        """Keep ``row`` as the one this store last wrote for its id, unless its state is final
        (no transition leaves it); at most :data:`KNOWN_ROWS` are kept, the oldest dropped.
        A kept row is only ever a hint: a transition proves it in the statement itself."""
        known = self.known
        known.pop(row.id, None)
        if row.state in self.final:
            return
        known[row.id] = row
        if len(known) > KNOWN_ROWS:
            # Another thread may be changing the dict too: an eviction it races with is only
            # skipped (the next one catches up).
            with contextlib.suppress(RuntimeError, KeyError, StopIteration):
                del known[next(iter(known))]

    def insert_params(
        self, entity_id: str, state: Enum, checked: Mapping[str, object], event: str, audit: Audit
    ) -> list[Any]:
        """The bound values of :attr:`insert_sql` (one row of ``insert_rows_sql``): a creation
        in ``state`` with its ``checked`` values, audited as ``event``."""
        return [
            entity_id,
            self.state_values[state],
            0,
            *self.column_values(checked),
            *audit_values(event, audit),
            *self.members[state],
        ]

    def update_sql(self, plan: TransitionPlan[Any]) -> str:
        """:func:`~stores._sqlite_sql.update_sql` for the plan's shape (built once per shape)."""
        shape = (plan.event, plan.fence is not None, tuple(plan.changes), _where_shape(plan.expect))
        text = self.texts.get(shape)
        if text is None:
            text = self.texts[shape] = sql.update_sql(plan)
        return text

    def insert_rows_sql(self, count: int) -> str:
        """:func:`~stores._sqlite_sql.insert_rows_sql` for ``count`` rows (built once)."""
        key = ("insert", count)
        text = self.texts.get(key)
        if text is None:
            text = self.texts[key] = sql.insert_rows_sql(self.kind, count)
        return text

    def bulk_update_sql(self, shape: sql.BulkShape, rows: int) -> str:
        """:func:`~stores._sqlite_sql.bulk_update_sql` for ``rows`` rows (built once)."""
        key = ("bulk", shape, rows)
        text = self.texts.get(key)
        if text is None:
            text = self.texts[key] = sql.bulk_update_sql(self.kind, shape, rows)
        return text

    def learn(self, key: tuple[Any, ...], plan: TransitionPlan[Any]) -> None:
        """Remember the fast path for a plan first seen under ``key``, when it has one."""
        learned = learn(self.kind, plan, self.update_sql(plan))
        if learned is not None:
            self.fast[key] = learned

    def row(self, raw: Sequence[Any], path: str) -> Row[Any]:
        """The Row a statement read or returned (a transition's trailing prev_state ignored);
        raises :class:`~statecore.errors.StaleVersion` for a state this kind does not declare
        when the store holds another version of its lifecycle, else ``StoreError`` naming
        ``path``."""
        try:
            state = self.states[raw[1]]
        except KeyError:
            raise self.unknown(raw[0], raw[1], path) from None
        return new_row(raw[0], state, raw[2], self.values(raw))

    def unknown(self, entity_id: str, value: object, path: str) -> StoreError:
        """The error for a stored state value this kind's lifecycle does not know."""
        lifecycle, what = self.kind.lifecycle, f"{path}: {self.kind.name} {entity_id!r}"
        stored = self.stored_version()
        if stored is not None and stored != lifecycle.version:
            detail = f"{what} is in state {value!r}"
            return StaleVersion(lifecycle.name, lifecycle.version, stored, detail)
        return StoreError(f"{what} has unknown state {value!r}")

    def records(
        self, entity_id: str, raws: Sequence[Sequence[Any]], path: str
    ) -> list[TransitionRecord]:
        """An entity's audit entries as read (``history_sql``); a value that is not a state of
        this version (an entry written before a migration) decodes through
        ``Lifecycle.decode``, else raises as :meth:`unknown`."""
        states = self.states
        try:
            return [
                TransitionRecord(
                    entity_id,
                    event,
                    None if source is None else states[source],
                    states[target],
                    at,
                    owner,
                    attempts,
                    reason,
                )
                for event, source, target, at, owner, attempts, reason in raws
            ]
        except KeyError:
            pass

        def decode(value: str) -> Enum:
            state = states.get(value)
            try:
                return state if state is not None else self.kind.lifecycle.decode(value)
            except ValueError:
                raise self.unknown(entity_id, value, path) from None

        return [
            TransitionRecord(entity_id, e, None if s is None else decode(s), decode(t), *rest)
            for e, s, t, *rest in raws
        ]


def _values_decoder(kind: EntityKind[Any]) -> Callable[[Sequence[Any]], dict[str, Any]]:
    """The field values of a row as read (id, state, fence, then the fields in order; a
    trailing prev_state ignored), as a dict.  SQLite may hand back a REAL column's whole number
    as an int (RETURNING does) and stores bools as ints: those columns are converted back.

    Generated straight-line (one dict display), as :func:`~statecore.trusted.trusted_constructor`
    is and for the same reason: it runs for every row read.  The source holds nothing but the
    kind's field names (checked identifiers) and column positions."""
    items = []
    for position, f in enumerate(kind.fields, start=3):
        if f.type in (bool, float):
            convert = f.type.__name__
            value = (
                f"(v if (v := raw[{position}]) is None or type(v) is {convert} else {convert}(v))"
            )
        else:
            value = f"raw[{position}]"
        items.append(f"{f.name!r}: {value}")
    namespace: dict[str, Any] = {}
    exec(f"def values(raw):\n    return {{{', '.join(items)}}}", namespace)
    decoder: Callable[[Sequence[Any]], dict[str, Any]] = namespace["values"]
    return decoder


def _where_shape(where: Where) -> tuple[tuple[str, str, bool, int], ...]:
    """What of a condition list decides its SQL text (values are bound, not inlined)."""
    return tuple(
        (col, cmp.op, cmp.value is None, len(cmp.value) if cmp.op == "in" else 1)
        for col, cmp in where
    )


class FastUpdate:
    """A transition shape already planned once: its SQL and a check of each bound value's type.

    A later call of the same shape whose values all have exactly the types the first one had
    (text plain ASCII, a float not NaN) is admitted by the very checks plan_transition would
    run, so it skips planning; any other value (None, a comparison, a convertible type) takes
    the full path.

    ``values(entity_id, fence, expect, changes, audit, bulk)`` returns the bound values, or
    None when any needs the full checks: in the order of
    :func:`~stores._sqlite_sql.update_params` or, with ``bulk``, of a
    :func:`~stores._sqlite_sql.bulk_row` (``audit``: the audit columns' values).  It is
    generated straight-line per shape, like the row decoder: it runs for every transition.

    For a row the store knows (:meth:`CompiledKind.remember`) whose state the event moves
    (``moves``), ``proved_sql`` is the same ``UPDATE`` returning nothing and also comparing the
    known row's state, fence and ``compared`` fields (every field the move leaves), bound after
    ``values``; when it writes a row, that row is the known one moved: its state the move's
    target, its fence one higher, its values ``apply(known.values, changes)``.
    """

    __slots__ = ("apply", "compared", "moves", "proved_sql", "sql", "values")

    def __init__(
        self,
        sql: str,
        fenced: bool,
        changes: Sequence[tuple[str, type]],
        expect: Sequence[tuple[str, type]],
        *,
        moves: Mapping[Enum, Enum],
        proved_sql: str,
        compared: tuple[str, ...],
    ) -> None:
        self.sql = sql
        self.values: Callable[..., list[Any] | None] = _values_binder(fenced, changes, expect)
        self.moves = moves
        self.proved_sql = proved_sql
        self.apply = _applier(changes)
        # The known row's values the proof compares, in proved_sql's order.
        self.compared: Callable[[Mapping[str, object]], tuple[Any, ...]] = (
            operator.itemgetter(*compared)
            if len(compared) > 1
            else lambda values: tuple(values[n] for n in compared)
        )


def _values_binder(
    fenced: bool, changes: Sequence[tuple[str, type]], expect: Sequence[tuple[str, type]]
) -> Callable[..., list[Any] | None]:
    """The generated ``values`` of a :class:`FastUpdate` (see there).  Its source holds field
    names (as string literals) and refers to the expected types by name only."""
    namespace: dict[str, Any] = {}
    lines = [
        "def values(entity_id, fence, expect, changes, audit, bulk):",
        "    if type(entity_id) is not str: return None",
    ]
    if fenced:
        lines.append("    if type(fence) is not int: return None")
    names: dict[str, list[str]] = {"changes": [], "expect": []}
    for source, fields in (("changes", changes), ("expect", expect)):
        for i, (name, expected) in enumerate(fields):
            var = f"{source[0]}{i}"
            namespace[f"{var}_type"] = expected
            lines.append(f"    {var} = {source}[{name!r}]")
            # The plain path's checks, for this type: text must be ASCII, a number equal to
            # itself (not NaN).
            extra = f"not {var}.isascii()" if expected is str else f"{var} != {var}"
            lines.append(f"    if type({var}) is not {var}_type or {extra}: return None")
            names[source].append(var)
    key = "entity_id, fence" if fenced else "entity_id"
    changed = "".join(f"{v}, " for v in names["changes"])
    compared = "".join(f", {v}" for v in names["expect"])
    lines.append(f"    if bulk: return [{key}, {changed}*audit{compared}]")
    lines.append(f"    return [{changed}*audit, {key}{compared}]")
    exec("\n".join(lines), namespace)
    binder: Callable[..., list[Any] | None] = namespace["values"]
    return binder


def _applier(
    changes: Sequence[tuple[str, type]],
) -> Callable[[Mapping[str, object], Mapping[str, object] | None], dict[str, object]]:
    """``apply(known, changes)``: the values a proved move leaves, ``known``'s with the changes
    made, each in the form a read returns it (a float ``-0.0`` reads back as ``0.0``: adding
    ``0.0`` does the same).  Generated straight-line per shape, like the binder."""
    lines = ["def apply(known, changes):", "    values = dict(known)"]
    for name, expected in changes:
        normal = " + 0.0" if expected is float else ""
        lines.append(f"    values[{name!r}] = changes[{name!r}]{normal}")
    lines.append("    return values")
    namespace: dict[str, Any] = {}
    exec("\n".join(lines), namespace)
    apply: Callable[[Mapping[str, object], Mapping[str, object] | None], dict[str, object]]
    apply = namespace["apply"]
    return apply


def learn(kind: EntityKind[Any], plan: TransitionPlan[Any], text: str) -> FastUpdate | None:
    """The fast path for a plan's shape (whose UPDATE is ``text``), when every value it binds is
    a plain, non-NULL value of a declared field compared by equality (the shape a ledger's
    writes take); None otherwise."""
    fields = kind.by_name
    if not all(v is not None for v in plan.changes.values()):
        return None
    for column, cmp in plan.expect:
        if column not in fields or cmp.op != "=" or cmp.value is None:
            return None
    compared = tuple(f.name for f in kind.fields if f.name not in plan.changes)
    return FastUpdate(
        text,
        plan.fence is not None,
        [(name, fields[name].type) for name in plan.changes],
        [(col, fields[col].type) for col, _ in plan.expect],
        moves=plan.targets,
        proved_sql=sql.proved_update_sql(plan, compared),
        compared=compared,
    )


def fast_key(
    event: str,
    fence: object,
    expect: Mapping[str, object] | None,
    changes: Mapping[str, object] | None,
) -> tuple[Any, ...]:
    """The key a call's :class:`FastUpdate` is learned and found under."""
    return (event, fence is None, tuple(expect) if expect else (), tuple(changes or ()))


class Step:
    """One checked move of a batch: its bulk shape (None: it runs alone) and the values of its
    bulk row (see :func:`~stores._sqlite_sql.bulk_row`)."""

    __slots__ = ("index", "move", "plan", "shape", "values")

    def __init__(
        self,
        index: int,
        move: Move,
        plan: TransitionPlan[Any] | None,
        shape: sql.BulkShape | None,
        values: list[Any],
    ) -> None:
        self.index = index
        self.move = move
        self.plan = plan
        self.shape = shape
        self.values = values

    @classmethod
    def of(cls, c: CompiledKind, index: int, move: Move) -> Step:
        """Check ``move`` exactly as transition() would; raises its refusal."""
        expect, changes = move.expect, move.changes
        key = fast_key(move.event, move.fence, expect, changes)
        fast = c.fast.get(key)
        if fast is not None:
            # A shape planned before, and plain values: admitted by the same checks (see
            # FastUpdate), so the plan is made only if the move misses.
            values = fast.values(
                move.entity_id,
                move.fence,
                expect,
                changes,
                audit_values(move.event, move.audit),
                bulk=True,
            )
            if values is not None:
                known: sql.BulkShape = (move.event, move.fence is not None, key[3], key[2])
                return cls(index, move, None, known, values)
        plan = plan_transition(
            c.kind, move.entity_id, move.event, fence=move.fence, expect=expect, changes=changes
        )
        if fast is None:
            c.learn(key, plan)
        shape = sql.bulk_shape(plan)
        if shape is None:
            return cls(index, move, plan, None, [])
        return cls(
            index, move, plan, shape, sql.bulk_row(plan, audit_values(move.event, move.audit))
        )

    def planned(self, kind: EntityKind[Any]) -> TransitionPlan[Any]:
        """The move's plan (made now if the fast check admitted it)."""
        if self.plan is None:
            m = self.move
            self.plan = plan_transition(
                kind, m.entity_id, m.event, fence=m.fence, expect=m.expect, changes=m.changes
            )
        return self.plan


def audit_values(event: str, audit: Audit) -> tuple[Any, ...]:
    """The values of the audit columns for a write by ``event`` (see
    :data:`~stores._sqlite_sql.AUDIT_COLUMNS`)."""
    return (event, audit.at, audit.owner, audit.attempts, audit.reason)


def distinct_runs(items: list[_T], key: Callable[[_T], tuple[str, object]]) -> list[list[_T]]:
    """Split ``items`` into consecutive runs of one shape (``key``'s second part) without a
    repeated id (its first part): a later write of the same entity must see the earlier one.
    An item whose shape is None is a run of its own."""
    runs: list[list[_T]] = []
    ids: set[str] = set()
    shape: object = None
    for item in items:
        entity_id, item_shape = key(item)
        if not runs or entity_id in ids or item_shape != shape or item_shape is None:
            runs.append([])
            ids = set()
            shape = item_shape
        runs[-1].append(item)
        ids.add(entity_id)
    return runs


def pieces(run: list[_T]) -> list[list[_T]]:
    """A run cut into statements of at most BATCH_PIECE rows, the largest power of two first
    (statement texts then repeat, and stay cached)."""
    out: list[list[_T]] = []
    start = 0
    while start < len(run):
        left = len(run) - start
        size = BATCH_PIECE if left >= BATCH_PIECE else 1 << (left.bit_length() - 1)
        out.append(run[start : start + size])
        start += size
    return out


def due_params(kind: EntityKind[Any], timer: object, now: object, limit: object) -> list[Any]:
    """The bound values of ``stores._sqlite_sql.due_timers_sql`` for ``timer`` at ``now``
    (None: unbounded), at most ``limit`` rows.  Raises ``TypeError`` for a ``timer`` not a
    Timer, a ``limit`` not an int or a ``now`` not a number; ``ValueError`` for a negative
    ``limit``, a NaN ``now`` or a timer not of ``kind``'s lifecycle."""
    check_due_query(kind, timer, now, limit)
    assert isinstance(timer, Timer)
    if now is None:
        return [limit]
    assert isinstance(now, int | float)
    seconds = timer.seconds
    if seconds is None:
        return [now, limit]
    # The index range: every entered time whose sum with the duration is <= now (rounded up,
    # so that no float rounding drops one); the exact sum decides in the statement.
    bound = now - seconds
    if math.isfinite(bound):
        bound += 4 * math.ulp(max(abs(now), abs(seconds), abs(bound)))
    return [bound, now, limit]


def catalog_row(kind: EntityKind[Any], at: float) -> tuple[str, str, int, str, float]:
    """``kind``'s catalog row as ``stores._sqlite_upgrade_sql.KIND_UPSERT`` binds it: name,
    lifecycle, version, declaration (deterministic JSON), registered at ``at``."""
    declaration = json.dumps(declaration_json(kind), sort_keys=True, separators=(",", ":"))
    return (kind.name, kind.lifecycle.name, kind.lifecycle.version, declaration, at)


def kind_records(raws: Sequence[Sequence[Any]], path: str) -> list[KindRecord]:
    """The catalog's rows as read (``stores._sqlite_upgrade_sql.KINDS_ALL``); ``StoreError`` naming
    ``path`` for a row that is not one this store wrote."""
    try:
        return [
            KindRecord(str(name), str(lc), int(version), json.loads(declaration), float(at))
            for name, lc, version, declaration, at in raws
        ]
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{path}: unreadable kind catalog: {exc}") from exc

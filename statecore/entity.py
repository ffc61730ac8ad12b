"""Persisted entity kinds: the schema a Store keeps for one lifecycle, declared once.

An :class:`EntityKind` names a lifecycle, the table and id column it is stored in, and its
typed fields.  Every store builds its storage from this declaration (SQLite: a table with one
column per field and the declared, partial where useful, indexes), and every value written
through a store is checked against it first, so bad input is refused before anything is changed.

Columns managed by the store itself are not fields: the id, ``state``, ``fence`` (an integer
bumped by every transition, so a stale writer can be refused) and, where a store needs it,
``prev_state`` (the state before the last transition, for its audit entry).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import Any, Generic, TypeVar

import attrs

from statecore.errors import DeclarationError
from statecore.lifecycle import Lifecycle

__all__ = ["RESERVED_COLUMNS", "EntityKind", "Field", "Index"]

S = TypeVar("S", bound=Enum)

RESERVED_COLUMNS = frozenset({"state", "fence", "prev_state", "entered_at"})
"""Column names a kind may not declare as fields: the store manages them."""

_TYPES: tuple[type, ...] = (str, int, float, bool)


@attrs.frozen
class Field:
    """One typed column of an entity kind.

    ``type`` is one of ``str``, ``int``, ``float``, ``bool``; ``nullable`` fields accept None;
    ``default`` fills the field when an insert omits it (and older rows when a store adds the
    column to an existing table).  ``immutable`` fields are written at creation only.
    """

    name: str
    type: type
    nullable: bool = True
    default: Any = None
    immutable: bool = False

    def checked(self, value: object, kind: str) -> object:
        """:meth:`check`, skipped for the common value that plainly fits: exactly this field's
        type and, for text, ASCII (non-ASCII text is still checked: it must be encodable), for
        a number, equal to itself (NaN is still checked: it is refused)."""
        if (
            type(value) is self.type
            and value == value  # noqa: PLR0124 - False for NaN only
            and not (isinstance(value, str) and not value.isascii())
        ):
            return value
        return self.check(value, kind)

    def check(self, value: object, kind: str) -> object:
        """Return ``value`` if it fits this field; raise ``TypeError``/``ValueError`` if not."""
        if value is None:
            if not self.nullable:
                raise ValueError(f"{kind}.{self.name} may not be None")
            return None
        expected = self.type
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if expected is int and isinstance(value, bool):
            raise TypeError(f"{kind}.{self.name} must be an int, not a bool")
        if not isinstance(value, expected):
            raise TypeError(
                f"{kind}.{self.name} must be {expected.__name__}, not {type(value).__name__}"
            )
        if value != value:  # noqa: PLR0124 - NaN: SQLite would store NULL, other stores NaN
            raise ValueError(f"{kind}.{self.name} must be a number, not NaN")
        if isinstance(value, str) and not value.isascii():
            _check_utf8(kind, self.name, value)
        return value


def _creation_check(
    kind: str, fields: tuple[Field, ...]
) -> Callable[[Mapping[str, object]], dict[str, object]]:
    """``EntityKind.new_values``' checks of ``fields`` (their names known to be identifiers),
    generated straight-line: each value -- or its default -- that plainly fits (exactly the
    field's type, text ASCII, a float not NaN; None where the field allows it) is taken as it
    is, and any other goes through :meth:`Field.check`, which converts it or raises naming the
    field.  Generated because it runs for every field of every creation, and a loop over the
    fields costs more than the checks (as for :func:`~statecore.trusted.trusted_constructor`)."""
    namespace: dict[str, Any] = {"kind": kind}
    lines = ["def check(values):", "    get = values.get"]
    for i, f in enumerate(fields):
        namespace[f"field_{i}"] = f
        namespace[f"default_{i}"] = f.default
        namespace[f"type_{i}"] = f.type
        odd = f"type(v{i}) is not type_{i}"
        if f.type is str:
            odd += f" or not v{i}.isascii()"
        elif f.type is float:
            odd += f" or v{i} != v{i}"  # NaN
        lines.append(f"    v{i} = get({f.name!r}, default_{i})")
        if f.nullable:
            lines.append(f"    if v{i} is not None and ({odd}):")
        else:
            lines.append(f"    if v{i} is None or {odd}:")
        lines.append(f"        v{i} = field_{i}.check(v{i}, kind)")
    lines.append(f"    return {{{', '.join(f'{f.name!r}: v{i}' for i, f in enumerate(fields))}}}")
    exec("\n".join(lines), namespace)
    check: Callable[[Mapping[str, object]], dict[str, object]] = namespace["check"]
    return check


def _check_utf8(kind: str, name: str, value: str) -> None:
    # Text must survive every store: an unpaired surrogate (from surrogateescape decoding) has
    # no UTF-8 form, so refuse it here rather than let one store keep what another cannot.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{kind}.{name} is not valid Unicode text (unpaired surrogate)") from None


@attrs.frozen
class Index:
    """A secondary index over ``fields`` (declared fields, managed columns or the id); with
    ``states``, only rows in those states (a partial index: a sweep over owed rows never touches
    settled ones)."""

    fields: tuple[str, ...]
    states: frozenset[Enum] | None = None


@attrs.frozen(init=False)
class EntityKind(Generic[S]):
    """The persisted shape of one lifecycle's entities.

    Raises ``ValueError`` at declaration for a field that shadows a managed column, a duplicate
    field, an unsupported type, an index over an undeclared field, or a partial index naming a
    state of another lifecycle.
    """

    name: str
    lifecycle: Lifecycle[S]
    table: str
    id_field: str
    fields: tuple[Field, ...]
    indexes: tuple[Index, ...]
    by_name: Mapping[str, Field]
    # new_values' checks, generated from the fields (derived: not compared).
    _creation_check: Callable[[Mapping[str, object]], dict[str, object]] = attrs.field(
        eq=False, repr=False
    )

    def __init__(
        self,
        name: str,
        lifecycle: Lifecycle[S],
        *,
        table: str,
        id_field: str,
        fields: Iterable[Field],
        indexes: Iterable[Index] = (),
    ) -> None:
        fields = tuple(fields)
        indexes = tuple(indexes)
        for ident in (name, table, id_field):
            if not ident.isidentifier():
                raise ValueError(f"entity kind {name!r}: {ident!r} is not an identifier")
        by_name: dict[str, Field] = {}
        for f in fields:
            if not f.name.isidentifier():
                raise ValueError(f"entity kind {name!r}: field {f.name!r} is not an identifier")
            if f.name in RESERVED_COLUMNS or f.name == id_field:
                raise ValueError(f"entity kind {name!r}: field {f.name!r} is managed by the store")
            if f.name in by_name:
                raise ValueError(f"entity kind {name!r}: field {f.name!r} declared twice")
            if f.type not in _TYPES:
                raise ValueError(f"entity kind {name!r}: field {f.name!r} has unsupported type")
            if f.default is not None:
                f.check(f.default, name)
            by_name[f.name] = f
        for index in indexes:
            for column in index.fields:
                if column not in by_name and column not in RESERVED_COLUMNS and column != id_field:
                    raise ValueError(f"entity kind {name!r}: index over undeclared {column!r}")
            for state in index.states or ():
                if not isinstance(state, lifecycle.state_type):
                    raise ValueError(f"entity kind {name!r}: index state {state!r} undeclared")
        for timer in lifecycle.timers:
            if timer.field is None:
                continue
            timed = by_name.get(timer.field)
            if timed is None or timed.type not in (int, float):
                raise DeclarationError(
                    lifecycle.name,
                    f"entity kind {name!r}: timer {timer.event!r} reads its duration from "
                    f"{timer.field!r}, which is not a declared int or float field",
                )
        check = _creation_check(name, fields)
        self.__attrs_init__(name, lifecycle, table, id_field, fields, indexes, by_name, check)

    def field(self, name: str) -> Field:
        """The declared field ``name``; raises ``KeyError`` naming the kind if undeclared."""
        try:
            return self.by_name[name]
        except KeyError:
            raise KeyError(f"{self.name} has no field {name!r}") from None

    def new_values(self, values: Mapping[str, object]) -> dict[str, object]:
        """Check a full set of creation values; defaults fill omitted fields.

        Raises ``TypeError``/``ValueError``/``KeyError`` naming the field; nothing is written.
        """
        if not values.keys() <= self.by_name.keys():
            unknown = sorted(set(values) - self.by_name.keys())
            raise KeyError(f"{self.name} has no field {unknown[0]!r}")
        return self._creation_check(values)

    def changed_values(self, changes: Mapping[str, object]) -> dict[str, object]:
        """Check the values a transition changes: declared, mutable, of the right type."""
        checked: dict[str, object] = {}
        for name, value in changes.items():
            f = self.field(name)
            if f.immutable:
                raise ValueError(f"{self.name}.{name} is immutable once created")
            checked[name] = f.checked(value, self.name)
        return checked

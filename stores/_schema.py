"""What every SQL store decides the same way about its tables: how an existing table of a kind
is brought up to date, and which registered kind a call refers to.  The statements themselves
come from each store's own SQL seam (passed in)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from statecore.entity import EntityKind, Field
from statecore.errors import StoreError

__all__ = ["migration", "registered"]


class _Compiled(Protocol):
    @property
    def kind(self) -> EntityKind[Any]: ...


_C = TypeVar("_C", bound=_Compiled)


def migration(
    where: str,
    kind: EntityKind[Any],
    have: set[str],
    *,
    add_managed: Callable[[EntityKind[Any], str], str],
    add_field: Callable[[EntityKind[Any], Field], str],
    managed: Iterable[str] = ("fence", "prev_state"),
) -> list[str]:
    """The statements adding what an existing table of ``kind`` lacks (it has the columns
    ``have``), for the store at ``where``.  Raises ``StoreError`` when the table is not one of
    ``kind`` or a required column without a default would have to be added to existing rows.
    ``managed`` names the columns the store itself keeps on every table."""
    if kind.id_field not in have or "state" not in have:
        raise StoreError(
            f"{where}: table {kind.table} exists without "
            f"{kind.id_field}/state columns; it is not a {kind.name} table"
        )
    statements = [add_managed(kind, column) for column in managed if column not in have]
    for f in kind.fields:
        if f.name not in have:
            if not f.nullable and f.default is None:
                raise StoreError(
                    f"{where}: cannot add required column {kind.table}.{f.name} "
                    "to existing rows: it has no default"
                )
            statements.append(add_field(kind, f))
    return statements


def registered(where: str, kinds: Mapping[str, _C], kind: EntityKind[Any], *, closed: bool) -> _C:
    """The compiled form of ``kind`` in ``kinds``.  Raises ``StoreError`` when it was never
    registered, when another kind of that name was, or when the store is ``closed``."""
    compiled = kinds.get(kind.name)
    if compiled is None:
        raise StoreError(f"entity kind {kind.name!r} is not registered with this store")
    if compiled.kind is not kind and compiled.kind != kind:
        raise StoreError(f"a different entity kind named {kind.name!r} is registered")
    if closed:
        raise StoreError(f"{where}: the store is closed")
    return compiled

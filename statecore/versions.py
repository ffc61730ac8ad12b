"""Versioned lifecycles: how a lifecycle's newer version says where the states of an older
one went, checked at declaration, and what a store migrating stored rows asks of it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar

import attrs

from statecore.errors import DeclarationError, MigrationError, StaleVersion

__all__ = ["Migration", "declared_migrations", "decode_state", "migration_moves"]

S = TypeVar("S", bound=Enum)
S_co = TypeVar("S_co", bound=Enum, covariant=True)


@attrs.frozen(init=False)
class Migration(Generic[S]):
    """How the states of an older version of a lifecycle map onto this one.

    ``Migration(from_version, {"old_value": NewState.X, ...})``: each key is the persisted
    value of a state of version ``from_version``; its value is the state of this version that
    rows in it move to (a rename, a merge of several old states into one, or a removed state
    with the state that replaces it).  An old state whose value is still a state of this
    version maps to it by itself and need not be listed.
    """

    from_version: int
    states: Mapping[str, S]

    def __init__(self, from_version: int, states: Mapping[str, S]) -> None:
        self.__attrs_init__(from_version, MappingProxyType(dict(states)))


def declared_migrations(
    lifecycle: str,
    version: int,
    state_type: type[Enum],
    states: Iterable[Enum],
    migrations: Iterable[Migration[Any]],
) -> Mapping[int, Migration[Any]]:
    """The migrations by the version they come from.  Raises :class:`DeclarationError` for a
    version out of range or twice, a key that is not a state's value, a target that is not a
    state of this version, or an old value that is still a state here but mapped elsewhere."""
    by_version: dict[int, Migration[Any]] = {}
    known = {s.value for s in states}
    for m in migrations:
        if not isinstance(m, Migration):
            raise DeclarationError(lifecycle, f"{m!r} is not a Migration")
        v = m.from_version
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v < version:
            raise DeclarationError(
                lifecycle,
                f"a migration from version {v!r} must come from a version between 1 and "
                f"{version - 1}",
            )
        if v in by_version:
            raise DeclarationError(lifecycle, f"two migrations from version {v}")
        for old, new in m.states.items():
            if not isinstance(old, str) or not old.isidentifier():
                raise DeclarationError(
                    lifecycle, f"migration from {v}: {old!r} is not a state's value"
                )
            if not isinstance(new, state_type):
                raise DeclarationError(
                    lifecycle,
                    f"migration from {v}: {old!r} maps to {new!r}, not a state of version "
                    f"{version}",
                )
            if old in known and new.value != old:
                raise DeclarationError(
                    lifecycle,
                    f"migration from {v}: {old!r} is still a state of version {version}; it "
                    f"cannot also map to {new.value!r}",
                )
        by_version[v] = m
    return MappingProxyType(by_version)


class _Versioned(Protocol[S_co]):
    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def state_type(self) -> type[S_co]: ...
    @property
    def states(self) -> tuple[S_co, ...]: ...
    @property
    def migrations(self) -> Mapping[int, Migration[Any]]: ...


def decode_state(lifecycle: _Versioned[S], value: object) -> S:
    """The state ``value`` names in ``lifecycle``, directly or through the newest migration
    that maps it; raises ``ValueError`` naming the lifecycle and version."""
    try:
        return lifecycle.state_type(value)
    except ValueError:
        pass
    for migration in sorted(lifecycle.migrations.values(), key=lambda m: -m.from_version):
        state: S | None = migration.states.get(value) if isinstance(value, str) else None
        if state is not None:
            return state
    raise ValueError(
        f"{value!r} is not a state of lifecycle {lifecycle.name!r} version {lifecycle.version}"
    )


def migration_moves(
    lifecycle: _Versioned[S], stored_version: int, stored_states: Iterable[str]
) -> dict[str, S]:
    """Old value -> new state for each of ``stored_states`` (of ``stored_version``) that is not
    a state of ``lifecycle``.  Raises :class:`MigrationError` naming the states nothing maps,
    :class:`StaleVersion` when the store's version is newer than the lifecycle's."""
    name, version = lifecycle.name, lifecycle.version
    if stored_version > version:
        raise StaleVersion(name, version, stored_version, "upgrade this process")
    known = {s.value for s in lifecycle.states}
    migration = lifecycle.migrations.get(stored_version)
    mapping = {} if migration is None else dict(migration.states)
    moves: dict[str, S] = {}
    unmapped: list[str] = []
    for value in stored_states:
        if value in mapping:
            moves[value] = mapping[value]
        elif value not in known:
            unmapped.append(value)
    if unmapped:
        why = (
            f"no migration from version {stored_version} is declared"
            if migration is None
            else f"the migration from version {stored_version} does not map them"
        )
        raise MigrationError(name, stored_version, version, tuple(sorted(set(unmapped))), why)
    return moves

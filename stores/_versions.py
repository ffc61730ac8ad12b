"""What every store decides the same way when a kind is registered against its catalog: which
stored states move where (a newer version of the lifecycle migrating its rows), or why the
registration is refused.  Each store runs the moves in its own statements, in register()'s
transaction, writing one audit entry per moved row (event :data:`MIGRATE_EVENT`, reason from
:func:`migration_reason`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

import attrs

from statecore.entity import EntityKind
from statecore.store import KindRecord

__all__ = [
    "MIGRATE_EVENT",
    "MIGRATION_OWNER",
    "VersionPlan",
    "migration_reason",
    "plan_versions",
]

MIGRATE_EVENT = "migrate"
"""The event of a migration's audit entries (reserved: no lifecycle may declare it)."""

MIGRATION_OWNER = "statecore migration"
"""The owner a migration's audit entries name."""


@attrs.frozen
class VersionPlan:
    """What registering a kind does to the rows a store holds: ``moves`` (persisted old value
    -> new state; empty: nothing to migrate), from ``from_version`` to ``to_version``."""

    from_version: int
    to_version: int
    moves: Mapping[str, Enum]

    @property
    def migrates(self) -> bool:
        """True when rows move (or the recorded version changes)."""
        return bool(self.moves) or self.from_version != self.to_version


def plan_versions(
    kind: EntityKind[Any], stored: KindRecord | None, present: Iterable[str]
) -> VersionPlan:
    """The plan for registering ``kind`` where the catalog holds ``stored`` (None: never
    recorded -- a table from before the catalog counts as version 1) and rows are in the
    states ``present`` (persisted values).  Raises :class:`~statecore.errors.StaleVersion` when
    the store holds a newer version than ``kind``'s lifecycle, and
    :class:`~statecore.errors.MigrationError` naming every state of the stored version (its
    recorded states, and any state a row is in) that is neither a state of the new version nor
    mapped by its migration.  Nothing is written by this function."""
    lifecycle = kind.lifecycle
    version = 1 if stored is None else stored.version
    states = set(present)
    if stored is not None and stored.version != lifecycle.version:
        declared = stored.declaration.get("lifecycle", {}).get("states", [])
        states.update(str(s) for s in declared)
    moves = lifecycle.migration_from(version, sorted(states))
    return VersionPlan(version, lifecycle.version, moves)


def migration_reason(kind: EntityKind[Any], plan: VersionPlan, old: str) -> str:
    """The audit reason of one moved row: which lifecycle, versions and states."""
    new = plan.moves[old].value
    return (
        f"lifecycle {kind.lifecycle.name} version {plan.from_version} -> {plan.to_version}: "
        f"{old!r} -> {new!r}"
    )

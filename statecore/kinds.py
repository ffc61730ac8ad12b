"""Every declared entity kind, for tooling: the kernel's own, then those installed packages
declare through the ``statecore.kinds`` entry point group (each entry: a sequence of
:class:`~statecore.entity.EntityKind`).  A user's package declares its kinds the same way::

    [project.entry-points."statecore.kinds"]
    approvals = "approvals:KINDS"

and the generated lifecycle tests (``stores.testing.lifecycle_tests("approval")``), the CLI and
the dashboard find them by name.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Any, TypeVar

from statecore.entity import EntityKind
from statecore.errors import UnknownKind
from statecore.leases import OWNER_KIND
from statecore.obligation import OBLIGATION_KIND

__all__ = ["KINDS_ENTRY_POINT_GROUP", "declared_in", "kind_named", "known_kinds"]

log = logging.getLogger(__name__)

T = TypeVar("T")

KINDS_ENTRY_POINT_GROUP = "statecore.kinds"


def known_kinds() -> tuple[EntityKind[Any], ...]:
    """The kernel's kinds (the obligation's, the owner record's), then every kind the
    ``statecore.kinds`` entry points declare, first declaration of a name winning.  An entry
    that cannot be loaded is logged and passed over."""
    found: dict[str, EntityKind[Any]] = {k.name: k for k in (OBLIGATION_KIND, OWNER_KIND)}
    for kind in declared_in(KINDS_ENTRY_POINT_GROUP, EntityKind):
        found.setdefault(kind.name, kind)
    return tuple(found.values())


def declared_in(group: str, of: type[T]) -> list[T]:
    """Every ``of`` the entry points of ``group`` declare (each entry: a sequence), entries in
    name order; an entry that cannot be loaded is logged and passed over."""
    values: list[T] = []
    for entry in sorted(entry_points(group=group), key=lambda e: e.name):
        try:
            declared = entry.load()
        except Exception:
            log.warning("cannot load %s from %s", group, entry.value, exc_info=True)
            continue
        values.extend(v for v in declared if isinstance(v, of))
    return values


def kind_named(name: str) -> EntityKind[Any]:
    """The declared kind ``name``; raises :class:`~statecore.errors.UnknownKind` naming the
    known ones when no installed package declares it."""
    kinds = known_kinds()
    for kind in kinds:
        if kind.name == name:
            return kind
    raise UnknownKind(name, tuple(k.name for k in kinds))

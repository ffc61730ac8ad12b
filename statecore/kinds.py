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
from typing import Any

from statecore.entity import EntityKind
from statecore.errors import UnknownKind
from statecore.leases import OWNER_KIND
from statecore.obligation import OBLIGATION_KIND

__all__ = ["KINDS_ENTRY_POINT_GROUP", "kind_named", "known_kinds"]

log = logging.getLogger(__name__)

KINDS_ENTRY_POINT_GROUP = "statecore.kinds"


def known_kinds() -> tuple[EntityKind[Any], ...]:
    """The kernel's kinds (the obligation's, the owner record's), then every kind the
    ``statecore.kinds`` entry points declare, first declaration of a name winning.  An entry
    that cannot be loaded is logged and passed over."""
    found: dict[str, EntityKind[Any]] = {k.name: k for k in (OBLIGATION_KIND, OWNER_KIND)}
    for entry in sorted(entry_points(group=KINDS_ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            declared = entry.load()
        except Exception:
            log.warning("cannot load entity kinds from %s", entry.value, exc_info=True)
            continue
        for kind in declared:
            if isinstance(kind, EntityKind):
                found.setdefault(kind.name, kind)
    return tuple(found.values())


def kind_named(name: str) -> EntityKind[Any]:
    """The declared kind ``name``; raises :class:`~statecore.errors.UnknownKind` naming the
    known ones when no installed package declares it."""
    kinds = known_kinds()
    for kind in kinds:
        if kind.name == name:
            return kind
    raise UnknownKind(name, tuple(k.name for k in kinds))

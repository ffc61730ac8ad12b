"""``statecore lifecycles``: every declared lifecycle, as a transition table and a diagram.

The kernel's own lifecycles come first, then those installed packages declare through the
``statecore.lifecycles`` entry point group (each entry: a sequence of lifecycles).
"""

from __future__ import annotations

import argparse
import logging
from enum import Enum
from typing import Any

from statecore.cli.plugin import EXIT_OK, Command, Context
from statecore.kinds import declared_in
from statecore.leases import OWNER
from statecore.lifecycle import Lifecycle
from statecore.lifecycles import DECLARED_LIFECYCLES

__all__ = ["ENTRY_POINT_GROUP", "LIFECYCLES_COMMAND", "all_lifecycles", "lifecycle_json"]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "statecore.lifecycles"

_FORMATS = ("table", "mermaid", "dot")


def all_lifecycles() -> tuple[Lifecycle[Any], ...]:
    """statecore's own lifecycles (the obligation's, then the owner record's), then those
    installed packages declare through the ``statecore.lifecycles`` entry point group (each
    entry: a sequence of lifecycles)."""
    own = (*DECLARED_LIFECYCLES, OWNER)
    found: dict[str, Lifecycle[Any]] = {lc.name: lc for lc in own}
    for lifecycle in declared_in(ENTRY_POINT_GROUP, Lifecycle):
        found.setdefault(lifecycle.name, lifecycle)
    return tuple(found.values())


def lifecycle_json(lifecycle: Lifecycle[Any]) -> dict[str, Any]:
    """A lifecycle as a JSON-ready object: name, description, states, initial and terminal
    states, and each transition's event, sources and target (None: creation / removal)."""

    def value(state: Enum | None) -> object:
        return None if state is None else state.value

    return {
        "name": lifecycle.name,
        "description": lifecycle.description,
        "states": [value(s) for s in lifecycle.states],
        "initial": value(lifecycle.initial),
        "terminal": sorted(str(value(s)) for s in lifecycle.terminal),
        "transitions": [
            {"event": t.event, "from": [value(s) for s in t.sources], "to": value(t.target)}
            for t in lifecycle.transitions
        ],
    }


def _build(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name",
        nargs="*",
        help="only these lifecycles (default: all): "
        + ", ".join(lc.name for lc in all_lifecycles()),
    )
    parser.add_argument(
        "--format",
        choices=(*_FORMATS, "all"),
        default="all",
        help="table, mermaid, dot, or all of table and mermaid (default)",
    )

    def run(args: argparse.Namespace, ctx: Context) -> int:
        declared = all_lifecycles()
        known = {lc.name: lc for lc in declared}
        unknown = [n for n in args.name if n not in known]
        if unknown:
            parser.error(f"unknown lifecycle {unknown[0]!r}; known: {', '.join(known)}")
        chosen = [known[n] for n in args.name] if args.name else list(declared)
        ctx.emit(
            [lifecycle_json(lc) for lc in chosen],
            lambda: "\n".join(_render(lc, args.format) for lc in chosen),
        )
        return EXIT_OK

    parser.set_defaults(run=run)


def _render(lifecycle: Lifecycle[Any], fmt: str) -> str:
    if fmt == "table":
        return lifecycle.describe()
    if fmt == "mermaid":
        return lifecycle.to_mermaid()
    if fmt == "dot":
        return lifecycle.to_dot()
    title = f"== {lifecycle.name} =="
    if lifecycle.description:
        title = f"{title}  {lifecycle.description}"
    return f"{title}\n\n{lifecycle.describe()}\n```mermaid\n{lifecycle.to_mermaid()}```\n"


LIFECYCLES_COMMAND = Command(
    "lifecycles",
    "print every declared lifecycle as a transition table and as a diagram",
    _build,
)

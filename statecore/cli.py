"""The ``statecore`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any, TextIO

from statecore.lifecycle import Lifecycle
from statecore.lifecycles import DECLARED_LIFECYCLES

__all__ = ["all_lifecycles", "main"]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "statecore.lifecycles"


def all_lifecycles() -> tuple[Lifecycle[Any], ...]:
    """statecore's own lifecycles, then those installed packages declare through the
    ``statecore.lifecycles`` entry point group (each entry: a sequence of lifecycles)."""
    own = DECLARED_LIFECYCLES
    found: dict[str, Lifecycle[Any]] = {lc.name: lc for lc in own}
    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            declared = entry.load()
        except Exception:
            log.warning("cannot load lifecycles from %s", entry.value, exc_info=True)
            continue
        for lifecycle in declared:
            if isinstance(lifecycle, Lifecycle):
                found.setdefault(lifecycle.name, lifecycle)
    return tuple(found.values())


_FORMATS = ("table", "mermaid", "dot")


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run the command line; return the process exit status (0 success, 2 usage error)."""
    stream = sys.stdout if out is None else out
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "lifecycles":
        return _lifecycles(args.name, args.format, stream, parser)
    parser.print_help(stream)
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="statecore",
        description="Declared lifecycles for gateways that never lose a reply.",
    )
    commands = parser.add_subparsers(dest="command")
    lifecycles = commands.add_parser(
        "lifecycles",
        help="print every declared lifecycle as a transition table and as a diagram",
        description="Print every declared lifecycle, generated from its declaration.",
    )
    lifecycles.add_argument(
        "name",
        nargs="*",
        help="only these lifecycles (default: all): "
        + ", ".join(lc.name for lc in all_lifecycles()),
    )
    lifecycles.add_argument(
        "--format",
        choices=(*_FORMATS, "all"),
        default="all",
        help="table, mermaid, dot, or all of table and mermaid (default)",
    )
    return parser


def _lifecycles(names: list[str], fmt: str, out: TextIO, parser: argparse.ArgumentParser) -> int:
    declared = all_lifecycles()
    known = {lc.name: lc for lc in declared}
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown lifecycle {unknown[0]!r}; known: {', '.join(known)}")
    chosen = [known[n] for n in names] if names else list(declared)
    for index, lifecycle in enumerate(chosen):
        if index:
            out.write("\n")
        out.write(_render(lifecycle, fmt))
    return 0


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


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

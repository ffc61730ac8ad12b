"""The ``statecore`` command line: see, count and repair what a store holds.

``statecore [--store URL] [--json] COMMAND ...`` (also ``python -m statecore``).  The kernel's
commands are ``lifecycles``, ``ledger``, ``doctor`` and ``kinds``; installed packages add theirs
(``buffer``, ``undeliverable``, ``sessions``, ``delegations``, ...) and their store URL schemes
through entry point groups (:mod:`statecore.cli.plugin`).  Human tables by default, JSON with
``--json``; exit status 0 when done, 1 when ``doctor`` finds a problem, 2 when refused with
nothing changed (usage, unknown store URL, id or state, a missing, locked or corrupt database).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TextIO

from statecore.cli.doctor import DOCTOR_COMMAND
from statecore.cli.kinds import KINDS_COMMAND
from statecore.cli.ledger import LEDGER_COMMAND
from statecore.cli.lifecycles import LIFECYCLES_COMMAND, all_lifecycles
from statecore.cli.plugin import (
    COMMANDS_GROUP,
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    Command,
    Context,
    common_options,
    installed,
)
from statecore.errors import StatecoreError

__all__ = ["all_lifecycles", "main", "statecore_version"]

log = logging.getLogger(__name__)

BUILTIN_COMMANDS: tuple[Command, ...] = (
    LIFECYCLES_COMMAND,
    LEDGER_COMMAND,
    DOCTOR_COMMAND,
    KINDS_COMMAND,
)


def statecore_version() -> str:
    """The installed distribution's version (``unknown`` when it is not installed)."""
    try:
        return version("statecore")
    except PackageNotFoundError:  # pragma: no cover - running from a bare source tree
        return "unknown"


def main(
    argv: Sequence[str] | None = None,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run the command line on ``argv`` (default: the process arguments) and return the exit
    status: 0 done, 1 findings (``doctor``), 2 refused with nothing changed.

    Refusals print ``statecore: error: <message>`` on ``err``; argument errors raise
    ``SystemExit(2)`` from argparse after printing the usage.  ``env`` (default: the process
    environment) supplies ``STATECORE_STORE_URL`` when ``--store`` is not given.
    """
    stream = sys.stdout if out is None else out
    errors = sys.stderr if err is None else err
    tokens = list(sys.argv[1:] if argv is None else argv)
    available = _commands()
    forward = available[tokens[0]].forward if tokens and tokens[0] in available else None
    if forward is not None:
        return forward(tokens[1:])
    parser = _parser(available.values())
    args = parser.parse_args(tokens)
    if args.version:
        stream.write(f"statecore {statecore_version()}\n")
        return EXIT_OK
    if args.verbose:
        logging.basicConfig(
            level=logging.INFO, stream=errors, format="%(levelname)s %(name)s: %(message)s"
        )
    run = getattr(args, "run", None)
    if run is None:
        getattr(args, "help_parser", parser).print_help(stream)
        return EXIT_USAGE
    ctx = Context(args, stream, errors, os.environ if env is None else env)
    try:
        status = run(args, ctx)
    except CliError as exc:
        errors.write(f"statecore: error: {exc.message}\n")
        return exc.code
    except (StatecoreError, ValueError) as exc:
        errors.write(f"statecore: error: {exc}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader left early (``statecore ledger ls | head``): what it read was right.
        if out is None:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    finally:
        ctx.close()
    return int(status) if status in (EXIT_OK, EXIT_FINDINGS, EXIT_USAGE) else EXIT_FINDINGS


def _commands() -> dict[str, Command]:
    """Every command by name: the kernel's, then those installed packages registered (entry
    point group ``statecore.cli``); a name already taken is ignored with a warning."""
    found: dict[str, Command] = {}
    for command in (*BUILTIN_COMMANDS, *_plugins()):
        if command.name in found:
            log.warning("command %r is already defined; the later one is ignored", command.name)
            continue
        found[command.name] = command
    return found


def _parser(available: Iterable[Command]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="statecore",
        description="See, count and repair what a statecore store holds; print the declared "
        "lifecycles.",
        epilog="Exit status: 0 done, 1 problems found (doctor), 2 refused with nothing changed.",
        parents=[common_options(top=True)],
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log what the command does on stderr"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in available:
        sub = commands.add_parser(
            command.name,
            help=command.help,
            description=command.help[:1].upper() + command.help[1:] + ".",
            parents=[common_options()],
        )
        sub.set_defaults(help_parser=sub)
        command.build(sub)
    return parser


def _plugins() -> list[Command]:
    """The commands installed packages registered (entry point group ``statecore.cli``)."""
    found = []
    for name, command in installed(COMMANDS_GROUP).items():
        if not isinstance(command, Command):
            log.warning("%s entry %r is not a statecore.cli.plugin.Command", COMMANDS_GROUP, name)
            continue
        found.append(command)
    return found

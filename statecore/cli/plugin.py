"""How commands plug into ``statecore``: the command, the context it runs in, the exit codes,
and the entry point groups through which installed packages add commands, store URL schemes
and storage checks.

The kernel imports no store and no relay; it finds them by name at run time:

* ``statecore.stores``: ``scheme = "module:opener"``, an ``opener(url) -> Store`` that opens
  an existing store (it must refuse, with ``ValueError`` or ``StoreError``, rather than create
  what the URL names when it does not exist);
* ``statecore.doctor``: ``scheme = "module:checks"``, a :class:`StorageChecks` that
  ``statecore doctor`` runs on a URL of that scheme before it reads the ledger;
* ``statecore.cli``: ``name = "module:COMMAND"``, a :class:`Command` added as
  ``statecore <name>``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from enum import StrEnum
from importlib.metadata import entry_points
from typing import Any, Protocol, TextIO
from urllib.parse import urlsplit

import attrs

from statecore.cli.output import Progress, to_json
from statecore.errors import StoreError
from statecore.store import Store

__all__ = [
    "COMMANDS_GROUP",
    "DOCTOR_GROUP",
    "EXIT_FINDINGS",
    "EXIT_OK",
    "EXIT_USAGE",
    "STORES_GROUP",
    "STORE_URL_ENV",
    "Check",
    "CheckStatus",
    "CliError",
    "Command",
    "Context",
    "ProgressFactory",
    "Run",
    "StorageChecks",
    "add_leaf",
    "common_options",
    "forwarding",
    "installed",
    "serve_until_signalled",
    "store_scheme",
]

log = logging.getLogger(__name__)

EXIT_OK = 0
"""Done, nothing to report."""
EXIT_FINDINGS = 1
"""Done, and something is wrong (``doctor`` found a problem)."""
EXIT_USAGE = 2
"""Refused, nothing changed: bad arguments, an unknown store URL, id or state, a database that
is missing, locked or not a database."""

STORE_URL_ENV = "STATECORE_STORE_URL"
"""The environment variable read when ``--store`` is not given."""
STORES_GROUP = "statecore.stores"
DOCTOR_GROUP = "statecore.doctor"
COMMANDS_GROUP = "statecore.cli"


class CliError(Exception):
    """A refusal the command line reports as ``statecore: error: <message>`` on stderr, with
    exit status ``code`` (default :data:`EXIT_USAGE`); raise it having changed nothing."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class CheckStatus(StrEnum):
    """What one doctor check found."""

    OK = "ok"
    INFO = "info"
    PROBLEM = "problem"


@attrs.frozen
class Check:
    """One line of ``statecore doctor``'s report: what was checked, what it found, a one-line
    summary, values for scripts (``details``, shown by ``--json``) and extra lines for people
    (``notes``, indented under the summary).  A storage check that is ``fatal`` found the store
    unfit to open (damage, a newer layout): the doctor then leaves it alone."""

    name: str
    status: CheckStatus
    summary: str
    details: Mapping[str, Any] = attrs.field(factory=dict)
    notes: tuple[str, ...] = ()
    fatal: bool = False

    def to_json(self) -> dict[str, Any]:
        """The check as a JSON-ready object (``notes`` left out: they repeat ``details``)."""
        return {
            "name": self.name,
            "status": self.status.value,
            "summary": self.summary,
            "details": dict(self.details),
        }


ProgressFactory = Callable[[str, "int | None"], Progress]
"""``progress(label, total)``: a :class:`Progress` on the command's stderr (``None`` total: work
of unknown size)."""


class StorageChecks(Protocol):
    """The storage checks of one URL scheme (entry point group ``statecore.doctor``)."""

    def __call__(self, url: str, *, quick: bool, progress: ProgressFactory) -> list[Check]:
        """Examine the storage ``url`` names without writing to it; ``quick`` asks for the
        cheaper form of a long check.  Raise :class:`CliError` (or ``ValueError`` /
        ``StoreError``) when it cannot be examined at all (missing, not a database, locked);
        report what is wrong with it as :class:`Check` s of status ``problem``."""
        ...


Run = Callable[[argparse.Namespace, "Context"], int]
"""A command's body: given the parsed arguments and the context, return the exit status."""


@attrs.frozen
class Command:
    """A top-level ``statecore`` command: its name, one line of help, and ``build``, which adds
    its arguments (or its own subcommands, through :func:`add_leaf`) to the parser the command
    line made for it with the common options, and sets ``run`` on it
    (``parser.set_defaults(run=...)``) where it is a leaf.

    A command with an argument parser of its own (a runner) gives ``forward`` instead (see
    :func:`forwarding`): ``statecore NAME ARGS...`` calls ``forward(ARGS)`` and exits with what
    it returns; ``build`` is then not called."""

    name: str
    help: str
    build: Callable[[argparse.ArgumentParser], None]
    forward: Callable[[list[str]], int] | None = None


def serve_until_signalled(serve: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """What a long-running command (``statecore connector``, ``gateway``, ``dashboard``) does
    once its settings are checked: log at INFO to standard error, then run ``serve(stop)`` in a
    new event loop, where SIGTERM or SIGINT sets ``stop`` and ``serve`` stops gracefully and
    returns.  Raises what ``serve`` raises (the command maps it to its exit status)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(stop)

    asyncio.run(run())


def forwarding(name: str, help: str, main: Callable[[list[str]], int]) -> Command:
    """A command that hands everything after its name to ``main(argv)`` (a program with its own
    parser, e.g. ``statecore connector --config c.toml``) and exits with what it returns.  It
    must come first on the command line: ``statecore NAME ...``."""

    def build(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER, help=f"the arguments of {name}")
        parser.set_defaults(run=lambda args, ctx: main(list(args.args)))

    return Command(name, help, build, main)


def common_options(*, top: bool = False) -> argparse.ArgumentParser:
    """The options every command takes (``--store``, ``--json``), as a parent parser.  On
    subcommands they default to *unset*, so ``statecore --json ledger ls`` and
    ``statecore ledger ls --json`` mean the same."""
    parent = argparse.ArgumentParser(add_help=False)
    unset: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    parent.add_argument(
        "--store",
        metavar="URL",
        help=f"the store to open: sqlite:///path.db, memory://, ... (default: ${STORE_URL_ENV})",
        **unset,
    )
    parent.add_argument(
        "--json",
        action="store_true",
        help="print JSON for scripts instead of tables",
        **unset,
    )
    return parent


def add_leaf(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help: str,
    run: Run,
) -> argparse.ArgumentParser:
    """Add subcommand ``name`` with the common options, running ``run``; returns its parser
    for the caller to add arguments to."""
    parser = commands.add_parser(
        name, help=help, description=help[:1].upper() + help[1:] + ".", parents=[common_options()]
    )
    parser.set_defaults(run=run)
    return parser


class Context:
    """What a command runs with: its output streams, whether to print JSON, the store URL, and
    the stores it opened (closed by the command line when the command returns).

    ``Context(args, out, err, env)``: ``args`` as parsed, ``env`` the environment to read
    :data:`STORE_URL_ENV` from.
    """

    def __init__(
        self, args: argparse.Namespace, out: TextIO, err: TextIO, env: Mapping[str, str]
    ) -> None:
        self.args = args
        self.out = out
        self.err = err
        self.json: bool = bool(getattr(args, "json", False))
        self._env = env
        self._opened: list[Store] = []

    def now(self) -> float:
        """The wall-clock time, seconds since the epoch."""
        return time.time()

    def store_url(self) -> str:
        """The store URL: ``--store``, else :data:`STORE_URL_ENV`.  Raises :class:`CliError`
        when neither is set."""
        url = getattr(self.args, "store", None) or self._env.get(STORE_URL_ENV)
        if not url:
            raise CliError(f"no store given: pass --store URL or set {STORE_URL_ENV}")
        return str(url)

    def open_store(self) -> Store:
        """Open the store :meth:`store_url` names with the opener its scheme's package
        registered; it is closed when the command returns.  Raises :class:`CliError` for an
        unknown scheme, a malformed URL or a store that cannot be opened (missing, locked, not
        a database), naming it."""
        url = self.store_url()
        opener = installed(STORES_GROUP).get(store_scheme(url))
        if opener is None:
            raise CliError(_unknown_scheme(url))
        try:
            store: Store = opener(url)
        except CliError:
            raise
        except (ValueError, StoreError, OSError) as exc:
            raise CliError(f"cannot open store {url}: {exc}") from exc
        self._opened.append(store)
        return store

    def storage_checks(self) -> StorageChecks | None:
        """The storage checks registered for the store URL's scheme, or None."""
        found: StorageChecks | None = installed(DOCTOR_GROUP).get(store_scheme(self.store_url()))
        return found

    def progress(self, label: str, total: int | None) -> Progress:
        """A progress bar on stderr, drawn only when stderr is a terminal."""
        return Progress(label, total, self.err)

    def emit(self, data: object, text: str | Callable[[], str]) -> None:
        """Print ``data`` as JSON when ``--json`` was given, else ``text`` (or what it
        returns)."""
        if self.json:
            self.out.write(to_json(data))
        else:
            self.out.write(text if isinstance(text, str) else text())

    def close(self) -> None:
        """Close every store this context opened."""
        opened, self._opened = self._opened, []
        for store in opened:
            try:
                store.close()
            except StoreError:  # pragma: no cover - closing is best effort
                log.warning("closing %r failed", store, exc_info=True)


def store_scheme(url: str) -> str:
    """The scheme of a store URL (``sqlite`` of ``sqlite:///x.db``); raises :class:`CliError`
    for text that is not a URL."""
    scheme = urlsplit(url).scheme if "://" in url else ""
    if not scheme:
        hint = f" (a file? use sqlite:///{url})" if url and "/" not in url[:1] else ""
        raise CliError(f"not a store URL: {url!r}{hint}")
    return scheme.lower()


def _unknown_scheme(url: str) -> str:
    known = ", ".join(f"{s}://" for s in sorted(installed(STORES_GROUP))) or "none installed"
    return f"unknown store URL scheme {store_scheme(url)!r} in {url!r}; known: {known}"


def installed(group: str) -> dict[str, Any]:
    """What the installed packages registered in entry point ``group``, loaded, by name (first
    registration of a name wins); one that cannot be loaded is left out with a warning."""
    found: dict[str, Any] = {}
    for entry in sorted(entry_points(group=group), key=lambda e: (e.name, e.value)):
        if entry.name in found:
            continue
        try:
            found[entry.name] = entry.load()
        except Exception:
            log.warning("cannot load %s entry %r from %s", group, entry.name, entry.value)
    return found

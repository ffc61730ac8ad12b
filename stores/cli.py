"""What the stores add to the ``statecore`` command line: the openers of ``sqlite://``,
``postgresql://`` and ``memory://`` URLs (entry point group ``statecore.stores``) and the SQLite
storage checks of ``statecore doctor`` (group ``statecore.doctor``).

An opener for the command line opens what exists: a missing SQLite file is refused, never
created.  The storage checks read the file through a read-only connection, so a doctor run
changes nothing, even on a file this code would upgrade on opening.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from statecore.cli.output import size
from statecore.cli.plugin import Check, CheckStatus, CliError, ProgressFactory
from statecore.errors import StoreError
from statecore.store import Store
from stores._sqlite_conn import check_header
from stores.sqlite import SCHEMA_VERSION
from stores.url import open_store

__all__ = ["open_memory", "open_postgres", "open_sqlite", "sqlite_checks", "sqlite_path"]

_PROGRESS_STEPS = 20_000
"""SQLite virtual-machine steps between two progress callbacks of the integrity check."""
_SHOWN_ERRORS = 10


def sqlite_path(url: str) -> str:
    """The file a ``sqlite:///path`` URL names (``sqlite:////abs/path`` too), as
    :func:`stores.open_store` reads it.  Raises ``ValueError`` for another URL."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc:
        raise ValueError(f"not a sqlite:///path URL: {url!r}")
    path = unquote(parts.path)
    path = path[1:] if path.startswith("/") else path
    if not path:
        raise ValueError(f"sqlite URL without a path: {url!r}")
    return path


def open_sqlite(url: str) -> Store:
    """Open the existing SQLite database ``url`` names (options as :func:`stores.open_store`
    takes them).  The caller must ``close()`` it.  Raises ``StoreError`` naming the file when
    it does not exist, is not a database or stays locked past the busy timeout, ``ValueError``
    for a malformed URL."""
    path = sqlite_path(url)
    if not Path(path).is_file():
        raise StoreError(f"{path}: no such database file (a gateway creates it on first start)")
    return open_store(url)


def open_memory(url: str) -> Store:
    """A new, empty in-memory store (``memory://``): for trying the command line out.  Raises
    ``ValueError`` for a URL with a path or options."""
    return open_store(url)


def open_postgres(url: str) -> Store:
    """Open the PostgreSQL database a ``postgresql://`` (or ``postgres://``) URL names, options
    as :func:`stores.open_store` takes them.  Opening creates the version and audit tables if
    the database has none yet.  The caller must ``close()`` it.  Raises ``StoreError`` naming
    host and database (never the password) when the server cannot be reached, refuses the
    login or holds a newer schema; ``ValueError`` for a malformed URL."""
    return open_store(url)


def sqlite_checks(url: str, *, quick: bool, progress: ProgressFactory) -> list[Check]:
    """The SQLite file's health, read without writing: schema version, journal mode,
    ``PRAGMA integrity_check`` (``quick_check`` when ``quick``), file size.

    Raises :class:`CliError` when the file is missing, ``StoreError`` when it is not a SQLite
    database or cannot be read at all (locked); damage inside a database is reported as
    checks of status ``problem``.
    """
    path = sqlite_path(url)
    if not Path(path).is_file():
        raise CliError(f"{path}: no such database file")
    check_header(path)
    try:
        conn = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot open read-only: {exc}") from exc
    try:
        return [
            *_schema_and_journal(conn, path),
            _integrity(conn, path, quick=quick, progress=progress),
            _size(conn, path),
        ]
    finally:
        conn.close()


def _schema_and_journal(conn: sqlite3.Connection, path: str) -> list[Check]:
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        tables = conn.execute("SELECT count(*) FROM sqlite_schema WHERE type = 'table'")
        has_tables = int(tables.fetchone()[0]) > 0
        mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
    except sqlite3.Error as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise StoreError(f"{path}: locked: {exc}") from exc
        if "not a database" in str(exc):
            raise StoreError(f"{path}: not a SQLite database ({exc})") from exc
        return [Check("schema", CheckStatus.PROBLEM, f"cannot be read: {exc}", fatal=True)]
    details = {"version": version, "expected": SCHEMA_VERSION}
    if version == SCHEMA_VERSION:
        schema = Check("schema version", CheckStatus.OK, f"{version}", details)
    elif version > SCHEMA_VERSION:
        schema = Check(
            "schema version",
            CheckStatus.PROBLEM,
            f"{version} is newer than this statecore understands ({SCHEMA_VERSION}): "
            "upgrade statecore",
            details,
            fatal=True,
        )
    elif version > 0 or has_tables:
        # Every older layout (1 to the current one, and the unversioned one) is upgraded in
        # place, its history kept, when a store opens the file.
        what = "an older layout: opening it upgrades it"
        schema = Check("schema version", CheckStatus.INFO, f"{version} ({what})", details)
    else:
        schema = Check("schema version", CheckStatus.INFO, "0 (an empty database)", details)
    if mode == "wal":
        journal = Check("journal mode", CheckStatus.OK, "wal", {"mode": mode})
    else:
        journal = Check(
            "journal mode",
            CheckStatus.PROBLEM if version else CheckStatus.INFO,
            f"{mode}, not wal: writers block readers until a store opens it again (it sets wal)",
            {"mode": mode},
        )
    return [schema, journal]


def _integrity(
    conn: sqlite3.Connection, path: str, *, quick: bool, progress: ProgressFactory
) -> Check:
    pragma = "quick_check" if quick else "integrity_check"
    label = f"{pragma} of {os.path.basename(path)} ({size(os.path.getsize(path))})"
    with progress(label, None) as bar:

        def step() -> int:
            bar.tick()
            return 0  # go on

        conn.set_progress_handler(step, _PROGRESS_STEPS)
        try:
            found = [str(r[0]) for r in conn.execute(f"PRAGMA {pragma}({_SHOWN_ERRORS})")]
        except sqlite3.Error as exc:
            found = [str(exc)]
        finally:
            conn.set_progress_handler(None, 0)
    if found == ["ok"]:
        return Check("integrity", CheckStatus.OK, f"ok ({pragma})", {"check": pragma})
    return Check(
        "integrity",
        CheckStatus.PROBLEM,
        f"{pragma} found damage: {found[0]}",
        {"check": pragma, "errors": found},
        tuple(found[1:]),
        fatal=True,
    )


def _size(conn: sqlite3.Connection, path: str) -> Check:
    file_bytes = os.path.getsize(path)
    wal = Path(f"{path}-wal")
    wal_bytes = wal.stat().st_size if wal.is_file() else 0
    try:
        free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        page = int(conn.execute("PRAGMA page_size").fetchone()[0])
    except sqlite3.Error:
        free, page = 0, 0
    return Check(
        "file size",
        CheckStatus.INFO,
        f"{size(file_bytes)} (+ {size(wal_bytes)} WAL; {size(free * page)} free pages; "
        f"{page}-byte pages)",
        {"bytes": file_bytes, "wal_bytes": wal_bytes, "free_bytes": free * page, "page_size": page},
    )

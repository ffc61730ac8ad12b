"""Connections and transactions of the SQLite store.

One long-lived connection per thread, never one per call: opening and setting up a connection
costs many times the statements of a call, and closing the last one checkpoints the WAL.  Each
is opened in WAL mode with the store's ``synchronous`` level and busy timeout.  Writes run in
``BEGIN IMMEDIATE`` transactions, nested blocks in savepoints, and a driver error anywhere is
translated to :class:`~statecore.errors.StoreError` naming the file.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import stores._sqlite_pragmas as pragmas
from statecore.errors import StaleVersion, StatecoreError, StoreError
from stores._sqlite_upgrade_sql import KIND_RECORD, STALE_MARK

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "Connections",
    "Statement",
    "Txn",
    "check_checkpoint_pages",
    "check_header",
    "check_page_size",
    "default_checkpoint_pages",
]

DEFAULT_PAGE_SIZE = 2048
"""The page size of a file the store creates.  Every commit writes each page it changed to the
WAL whole, and a lifecycle's commits change about ten pages (the row, its indexes, the audit
table), each only by a row or an index entry: smaller pages write less for the same change.
Below 2048 bytes a longer reply no longer fits one page and spills into overflow pages
(``benchmarks/README.md`` has the figures)."""


def default_checkpoint_pages(synchronous: str) -> int:
    """WAL pages a commit may leave before it checkpoints, when the store is not told.

    At ``NORMAL``, 4000 (SQLite's own default is 1000): a checkpoint copies each page once
    however often it was written since the last one, and syncs both files, the only syncs at
    that level, so fewer, larger checkpoints copy and sync less per commit, for a WAL file of up
    to ``page_size * 4000`` bytes (8 MB by default).  At ``FULL``, SQLite's 1000: every commit
    syncs the WAL anyway, and while the WAL file grows each of those syncs also writes its new
    size, so a larger WAL costs more than its fewer checkpoints save (``benchmarks/README.md``
    has the figures)."""
    return 1000 if synchronous == "FULL" else 4000


def check_page_size(page_size: object) -> None:
    """Refuse a page size SQLite would ignore: ``TypeError`` for a non-int, ``ValueError``
    unless a power of two from 512 to 65536."""
    if not isinstance(page_size, int) or isinstance(page_size, bool):
        raise TypeError(f"page_size must be an int, not {type(page_size).__name__}")
    if not 512 <= page_size <= 65536 or page_size & (page_size - 1):
        raise ValueError(f"page_size must be a power of two from 512 to 65536: {page_size!r}")


def check_checkpoint_pages(pages: object) -> None:
    """Refuse a checkpoint threshold that would never checkpoint: ``TypeError`` for a
    non-int (None is the default, see :func:`default_checkpoint_pages`), ``ValueError`` below
    1."""
    if pages is None:
        return
    if not isinstance(pages, int) or isinstance(pages, bool):
        raise TypeError(f"checkpoint_pages must be an int, not {type(pages).__name__}")
    if pages < 1:
        raise ValueError(f"checkpoint_pages must be at least 1: {pages!r}")


def check_header(path: str) -> None:
    """Refuse a file that exists, is non-empty and is not a SQLite database, or a path whose
    directory does not exist (``StoreError`` naming the path).

    The file is read through SQLite, never through a file descriptor of our own: closing any
    descriptor of a database file drops every POSIX lock this process holds on it, including
    those of the connections other stores of this process have open to the same file.  Without
    those locks, another process closing its connection believes it is the last one, checkpoints
    and deletes the WAL under our open connections, and the commits they make afterwards are
    seen by nobody else and lost on a crash.  SQLite keeps the descriptors of a file that the
    process still holds locks on open until the last of them is released.
    """
    target = Path(path)
    try:
        if not target.exists():
            if not target.parent.is_dir():
                raise StoreError(f"{path}: directory {target.parent} does not exist")
            return
        if target.is_dir():
            raise StoreError(f"{path}: cannot read: it is a directory")
        if not os.access(target, os.R_OK):
            raise StoreError(f"{path}: cannot read: permission denied")
        if target.stat().st_size == 0:
            return
    except OSError as exc:
        raise StoreError(f"{path}: cannot read: {exc}") from exc
    try:
        probe = sqlite3.connect(path, timeout=0, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot read: {exc}") from exc
    try:
        probe.execute(pragmas.SCHEMA_VERSION).fetchone()
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc) or "malformed" in str(exc):
            raise StoreError(f"{path}: not a SQLite database") from exc
        # Anything else (a lock held elsewhere) is for the store's own connection to report.
    finally:
        probe.close()


class _Local(threading.local):
    conn: sqlite3.Connection | None = None
    depth = 0


class Connections:
    """The connections of one store to its file: one per thread, opened on first use and all
    closed by :meth:`close`; and the translation of driver errors into ``StoreError``."""

    def __init__(
        self,
        path: str,
        synchronous: str,
        busy_ms: int,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
        checkpoint_pages: int | None = None,
    ) -> None:
        self.path = path
        self.synchronous = synchronous
        self.busy_ms = busy_ms
        self.page_size = page_size
        self.checkpoint_pages = (
            default_checkpoint_pages(synchronous) if checkpoint_pages is None else checkpoint_pages
        )
        self.local = _Local()
        self.closed = False
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        # Lifecycle name -> the version this process registered (named by a refusal).
        self.versions: dict[str, int] = {}

    def catalog_version(self, name: str) -> int | None:
        """The version the catalog records for kind ``name`` now (None: not recorded, or
        unreadable -- only an error's message depends on it)."""
        try:
            raw = self.conn().execute(KIND_RECORD, (name,)).fetchone()
        except (sqlite3.Error, StoreError):
            return None
        return None if raw is None else int(raw[2])

    def conn(self) -> sqlite3.Connection:
        """The calling thread's connection (opened now if it has none); ``StoreError`` once the
        store is closed."""
        conn = self.local.conn
        if conn is not None:
            return conn
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_ms / 1000,
            isolation_level=None,  # we issue BEGIN IMMEDIATE / COMMIT ourselves
            check_same_thread=False,  # only so close() may close every thread's connection
            cached_statements=256,
        )
        try:
            conn.execute(pragmas.busy_timeout_sql(self.busy_ms))
            # Takes effect only while the file has no page yet: before WAL mode writes its
            # header.  An existing file keeps its page size.
            conn.execute(pragmas.page_size_sql(self.page_size))
            mode = conn.execute(pragmas.JOURNAL_WAL).fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: cannot use WAL journaling (got {mode!r})")
            conn.execute(pragmas.synchronous_sql(self.synchronous))
            conn.execute(pragmas.autocheckpoint_sql(self.checkpoint_pages))
            conn.execute(pragmas.FOREIGN_KEYS_ON)
        except BaseException:
            conn.close()
            raise
        with self._lock:
            if self.closed:
                conn.close()
                raise StoreError(f"{self.path}: the store is closed")
            self._connections.append(conn)
        self.local.conn = conn
        return conn

    def in_atomic(self) -> sqlite3.Connection:
        """The calling thread's connection while it is inside ``atomic()``; ``StoreError``
        outside one (nothing to join: a statement there would commit on its own) or once the
        store is closed."""
        conn = self.local.conn
        if self.closed:
            raise StoreError(f"{self.path}: the store is closed")
        if self.local.depth == 0 or conn is None:
            raise StoreError(
                f"{self.path}: connection() is only valid inside a store.atomic() block "
                "(its writes then commit or roll back with the store's)"
            )
        return conn

    @contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Translate driver errors into StoreError naming the path; let ours through."""
        try:
            yield
        except StatecoreError:
            raise
        except (sqlite3.Error, OSError) as exc:
            raise self.error(exc, what) from exc

    def error(self, exc: BaseException, what: str) -> StoreError:
        """The StoreError for a driver failure during ``what`` (chain it with ``from``): a
        version trigger's refusal (see ``stores._sqlite_upgrade_sql.version_trigger_sql``) is a
        :class:`~statecore.errors.StaleVersion`."""
        message = str(exc)
        if message.startswith(STALE_MARK):
            name, _, stored = message[len(STALE_MARK) :].rpartition("@")
            ours = self.versions.get(name, 1)
            detail = f"{self.path}: {what} refused: a state version {stored} does not declare"
            return StaleVersion(name, ours, int(stored), detail)
        if "not a database" in message or "malformed" in message:
            return StoreError(f"{self.path}: not a usable SQLite database ({message})")
        if "locked" in message or "busy" in message:
            return StoreError(
                f"{self.path}: database locked for longer than the busy timeout "
                f"({self.busy_ms} ms) during {what}"
            )
        return StoreError(f"{self.path}: {what} failed: {message}")

    @property
    def opened(self) -> tuple[sqlite3.Connection, ...]:
        """The connections open now, one per thread that has used the store."""
        with self._lock:
            return tuple(self._connections)

    def close(self) -> None:
        """Close every thread's connection; later uses raise ``StoreError``.  Idempotent."""
        with self._lock:
            self.closed = True
            connections, self._connections = self._connections, []
        for conn in connections:
            with contextlib.suppress(sqlite3.Error):  # closing is best effort
                conn.close()
        self.local = _Local()


class Statement:
    """One write statement, as a context: outside any transaction it commits on its own (with
    the triggers it fires: one statement is atomic), inside ``atomic()`` it is part of the
    enclosing transaction.  No BEGIN, no COMMIT: a single write costs one round trip into
    SQLite.  Driver errors are translated to StoreError naming ``what``.
    """

    __slots__ = ("db", "what")

    def __init__(self, db: Connections, what: str) -> None:
        self.db = db
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if isinstance(exc, sqlite3.Error | OSError):
            raise self.db.error(exc, self.what) from exc


class Txn:
    """One (possibly nested) transaction on the calling thread's connection.

    A plain class rather than a generator context manager: it sits on every write's hot path.
    Driver errors anywhere inside are translated to StoreError after the rollback.  With
    ``savepoint=False`` a nested use adds nothing to the enclosing transaction: a single
    guarded write either matches (and writes) or changes nothing, and a driver error fails the
    enclosing block anyway.
    """

    __slots__ = ("conn", "db", "depth", "joined", "savepoint", "what")

    def __init__(self, db: Connections, what: str, *, savepoint: bool = True) -> None:
        self.db = db
        self.what = what
        self.savepoint = savepoint

    def __enter__(self) -> None:
        db = self.db
        local = db.local
        try:
            conn = local.conn or db.conn()
            depth = local.depth
            self.joined = depth > 0 and not self.savepoint
            if not self.joined:
                conn.execute(pragmas.BEGIN if depth == 0 else pragmas.savepoint_sql(depth))
        except sqlite3.Error as exc:
            raise db.error(exc, f"{self.what} (begin)") from exc
        self.conn, self.depth = conn, depth
        if not self.joined:
            local.depth = depth + 1

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        db, conn, depth = self.db, self.conn, self.depth
        if self.joined:
            if isinstance(exc, sqlite3.Error | OSError):
                raise db.error(exc, self.what) from exc
            return
        db.local.depth = depth
        if kind is None:
            try:
                conn.execute(pragmas.COMMIT if depth == 0 else pragmas.release_sql(depth))
                return
            except sqlite3.Error as error:
                self._rollback()
                raise db.error(error, f"{self.what} (commit)") from error
        self._rollback()
        if isinstance(exc, sqlite3.Error | OSError):
            raise db.error(exc, self.what) from exc

    def _rollback(self) -> None:
        conn, depth = self.conn, self.depth
        with contextlib.suppress(sqlite3.Error):
            if depth == 0:
                if conn.in_transaction:
                    conn.execute(pragmas.ROLLBACK)
            else:
                conn.execute(pragmas.rollback_to_sql(depth))
                conn.execute(pragmas.release_sql(depth))

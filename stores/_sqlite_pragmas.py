"""The SQL text of the SQLite store's connections and transactions: the pragmas each connection
is set up with and the statements that open, nest and end a transaction.  Pure text, like the
rest of the store's SQL seam (``stores._sqlite_sql``); the values are checked by the store."""

from __future__ import annotations

__all__ = [
    "BEGIN",
    "COMMIT",
    "FOREIGN_KEYS_ON",
    "JOURNAL_WAL",
    "ROLLBACK",
    "SCHEMA_VERSION",
    "USER_VERSION",
    "autocheckpoint_sql",
    "busy_timeout_sql",
    "page_size_sql",
    "release_sql",
    "rollback_to_sql",
    "savepoint_sql",
    "set_user_version_sql",
    "synchronous_sql",
]

JOURNAL_WAL = "PRAGMA journal_mode = WAL"
"""Switches the file to WAL journaling; returns the mode now in force."""

FOREIGN_KEYS_ON = "PRAGMA foreign_keys = ON"
SCHEMA_VERSION = "PRAGMA schema_version"
"""Reads the file's header (fails with "file is not a database" for any other file)."""
USER_VERSION = "PRAGMA user_version"
"""Reads the schema version a file was written with."""

BEGIN = "BEGIN IMMEDIATE"
"""Opens a write transaction: the write lock is taken at once, not at the first write."""

COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"


def busy_timeout_sql(busy_ms: int) -> str:
    """How long a connection waits for another's write lock before failing."""
    return f"PRAGMA busy_timeout = {int(busy_ms)}"


def synchronous_sql(level: str) -> str:
    """The durability level (``NORMAL`` or ``FULL``; checked by the store)."""
    return f"PRAGMA synchronous = {level}"


def page_size_sql(size: int) -> str:
    """The page size of a file not yet written (checked by the store)."""
    return f"PRAGMA page_size = {int(size)}"


def autocheckpoint_sql(pages: int) -> str:
    """How many WAL pages a commit may leave before it checkpoints (checked by the store)."""
    return f"PRAGMA wal_autocheckpoint = {int(pages)}"


def set_user_version_sql(version: int) -> str:
    """Records the schema version of the layout this code writes."""
    return f"PRAGMA user_version = {int(version)}"


def savepoint_sql(depth: int) -> str:
    """Opens the savepoint of a block nested ``depth`` deep."""
    return f"SAVEPOINT sp{depth}"


def release_sql(depth: int) -> str:
    """Keeps the work of the block nested ``depth`` deep (its enclosing block commits it)."""
    return f"RELEASE sp{depth}"


def rollback_to_sql(depth: int) -> str:
    """Undoes the work of the block nested ``depth`` deep (release it afterwards)."""
    return f"ROLLBACK TO sp{depth}"

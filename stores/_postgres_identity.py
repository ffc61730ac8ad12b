"""Which database cluster a store's data was written on, recorded once and checked always.

Every PostgreSQL cluster has a ``system_identifier`` (``pg_control_system()``), chosen by
``initdb`` and kept by every copy of its files (a streaming replica, a base backup) but not by
a new cluster or a logical dump restored into one.  The store records it in the schema's
``statecore_meta`` table at its first open, compares it at every later open and on every new
connection of its pool (the pool's ``configure`` hook), and on a mismatch raises
:class:`~statecore.errors.StoreIdentityChanged` -- and keeps refusing every call from then on:
a store that came back from elsewhere (a restored backup, an unrelated server at the same
address) must not be written to, nor its owed rows re-sent as if nothing happened, before an
operator decides.  The operator's override, for data that really was restored, is the
constructor's ``adopt_system_identifier``: it must name the server's identifier, which is then
recorded.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from statecore.errors import StoreError, StoreIdentityChanged

__all__ = ["META_TABLE", "Identity", "meta_schema_sql", "record_identity", "server_identifier"]

META_TABLE = "statecore_meta"
"""The schema's key/value facts about itself (``system_identifier``)."""
_KEY = "system_identifier"


def meta_schema_sql() -> str:
    """The meta table, if absent."""
    return (
        f"CREATE TABLE IF NOT EXISTS {META_TABLE} ("
        'key TEXT COLLATE "C" PRIMARY KEY, value TEXT NOT NULL)'
    )


def server_identifier(conn: psycopg.Connection[Any]) -> int:
    """The connected cluster's system identifier.  Raises ``psycopg.Error``."""
    row = conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone()
    assert row is not None  # the function always returns one row
    return int(row[0])


def record_identity(conn: psycopg.Connection[Any], where: str, adopt: int | None) -> int:
    """Inside the open's transaction (the schema's lock held): the cluster's identifier,
    recorded when the schema has none yet, or replaced by ``adopt`` when the operator named the
    server's new one.  Raises ``StoreIdentityChanged`` when the schema's data was written on
    another cluster (nothing written), ``StoreError`` for an ``adopt`` that is not the server's
    identifier, ``psycopg.Error`` when the server fails."""
    found = server_identifier(conn)
    if adopt is not None and adopt != found:
        raise StoreError(
            f"{where}: adopt_system_identifier={adopt} is not this server's system identifier "
            f"({found}); nothing was changed"
        )
    conn.execute(meta_schema_sql())
    row = conn.execute(f"SELECT value FROM {META_TABLE} WHERE key = %s", (_KEY,)).fetchone()
    if row is None:
        conn.execute(f"INSERT INTO {META_TABLE} (key, value) VALUES (%s, %s)", (_KEY, str(found)))
        return found
    recorded = int(row[0])
    if recorded == found:
        return found
    if adopt is None:
        raise StoreIdentityChanged(where, recorded, found)
    conn.execute(f"UPDATE {META_TABLE} SET value = %s WHERE key = %s", (str(found), _KEY))
    return found


class Identity:
    """The identifier one open store expects, and the mismatch it met, once it met one (from
    then on every call of the store raises it)."""

    def __init__(self, where: str, expected: int) -> None:
        self.where = where
        self.expected = expected
        self.changed: StoreIdentityChanged | None = None
        self._lock = threading.Lock()

    def check(self, conn: psycopg.Connection[Any]) -> None:
        """The pool's ``configure`` hook: refuse a new connection to another cluster (the pool
        discards it).  Raises ``StoreIdentityChanged`` (remembered), ``psycopg.Error``."""
        if self.changed is not None:
            raise self.changed
        found = server_identifier(conn)
        if found != self.expected:
            conn.close()  # the pool does not close a connection its hook refused
            with self._lock:
                if self.changed is None:
                    self.changed = StoreIdentityChanged(self.where, self.expected, found)
            raise self.changed

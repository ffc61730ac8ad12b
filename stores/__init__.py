"""Implementations of statecore's Store protocol, and the contract kit every store must pass.

* :class:`InMemoryStore` -- process memory, one lock; for tests and single-process use.
* :class:`SQLiteStore` -- one SQLite file (WAL); the embedded default.
* :class:`PostgresStore` -- a PostgreSQL database, shared by processes on many hosts (needs the
  ``statecore[postgres]`` extra; imported on first use, so ``import stores`` never needs psycopg).
* :func:`open_store` -- any of them, from a URL (``memory://``, ``sqlite:///path``,
  ``postgresql://host/db``).
* ``stores.testing.StoreContract`` -- the contract suite, for any store (imported separately:
  it needs pytest).
"""

from typing import TYPE_CHECKING, Any

from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from stores.url import open_store

if TYPE_CHECKING:
    from stores.postgres import PostgresStore

__all__ = ["InMemoryStore", "PostgresStore", "SQLiteStore", "open_store"]


def __getattr__(name: str) -> Any:
    """``stores.PostgresStore``, imported on first use (it needs psycopg)."""
    if name == "PostgresStore":
        from stores.postgres import PostgresStore  # noqa: PLC0415

        return PostgresStore
    raise AttributeError(f"module 'stores' has no attribute {name!r}")

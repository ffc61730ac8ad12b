"""Implementations of statecore's Store protocol, and the contract kit every store must pass.

* :class:`InMemoryStore` -- process memory, one lock; for tests and single-process use.
* :class:`SQLiteStore` -- one SQLite file (WAL); the embedded default.
* :func:`open_store` -- either, from a URL (``memory://``, ``sqlite:///path``).
* ``stores.testing.StoreContract`` -- the contract suite, for any store (imported separately:
  it needs pytest).
"""

from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from stores.url import open_store

__all__ = ["InMemoryStore", "SQLiteStore", "open_store"]

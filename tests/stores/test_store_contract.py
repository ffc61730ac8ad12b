"""The store contract kit run against every store implementation in this repository."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

if "stores.testing" not in sys.modules:  # detailed assertion messages from the kit's asserts
    pytest.register_assert_rewrite("stores.testing")

from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from stores.testing import StoreContract, StoreFactory


class TestInMemoryStore(StoreContract):
    """The in-memory reference store passes the whole contract."""

    @pytest.fixture
    def store(self) -> StoreFactory:
        """A fresh InMemoryStore per call."""
        return InMemoryStore


class TestSQLiteStore(StoreContract):
    """The SQLite store passes the whole contract, each store in a new database file."""

    @pytest.fixture
    def store(self, tmp_path: Path) -> StoreFactory:
        """A fresh SQLiteStore on a new file under tmp_path per call."""
        paths = (tmp_path / f"store-{n}.sqlite3" for n in itertools.count())
        return lambda: SQLiteStore(next(paths), synchronous="NORMAL")

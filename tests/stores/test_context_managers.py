"""``with InMemoryStore() as store:`` and ``with SQLiteStore(path) as store:`` close the store when
the block ends, normally or by an exception."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from statecore import Audit, StoreError
from statecore.store import Store
from stores import InMemoryStore, SQLiteStore
from stores.testing import TICKET_KIND

Opener = Callable[[Path], InMemoryStore | SQLiteStore]

OPENERS = [
    pytest.param(lambda _path: InMemoryStore(), id="memory"),
    pytest.param(lambda path: SQLiteStore(path / "store.db"), id="sqlite"),
]


def _write_one(store: Store) -> None:
    """Register the kit's ticket kind and create one ticket."""
    store.register(TICKET_KIND)
    store.insert(TICKET_KIND, "t1", {"title": "t"}, event="file", audit=Audit(1.0))


def _is_closed(store: Store) -> bool:
    """True when the store refuses calls as a closed store does."""
    try:
        store.get(TICKET_KIND, "t1")
    except StoreError:
        return True
    return False


@pytest.mark.parametrize("opener", OPENERS)
def test_with_block_yields_the_store_and_closes_it(opener: Opener, tmp_path: Path) -> None:
    """``as`` binds the store itself, usable inside the block and closed after it."""
    store = opener(tmp_path)
    with store as entered:
        assert entered is store
        _write_one(entered)
        assert entered.get(TICKET_KIND, "t1") is not None
        assert not _is_closed(entered)
    assert _is_closed(store)


@pytest.mark.parametrize("opener", OPENERS)
def test_an_exception_closes_the_store_and_propagates(opener: Opener, tmp_path: Path) -> None:
    """An exception leaving the block still closes the store, and is not swallowed."""
    store = opener(tmp_path)

    def fail_inside() -> None:
        with store:
            _write_one(store)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_inside()
    assert _is_closed(store)


@pytest.mark.parametrize("opener", OPENERS)
def test_closing_inside_the_block_is_harmless(opener: Opener, tmp_path: Path) -> None:
    """An explicit close() inside the block, then the block's own close, raise nothing."""
    store = opener(tmp_path)
    with store:
        store.close()
    assert _is_closed(store)


def test_sqlite_writes_made_in_the_block_are_on_disk_after_it(tmp_path: Path) -> None:
    """What a block wrote through a SQLite store is read back by the next store on the file."""
    path = tmp_path / "store.db"
    with SQLiteStore(path) as store:
        _write_one(store)
    with SQLiteStore(path) as again:
        again.register(TICKET_KIND)
        row = again.get(TICKET_KIND, "t1")
        assert row is not None
        assert row["title"] == "t"


def test_a_subclass_is_a_context_manager_too() -> None:
    """A store built on a shipped one (as docs/stores.md's example is) closes on exit as well."""

    class Wrapped(InMemoryStore):
        """A subclass that only records that it was closed."""

        closed_calls = 0

        def close(self) -> None:
            self.closed_calls += 1
            super().close()

    with Wrapped() as store:
        pass
    assert store.closed_calls == 1
    assert _is_closed(store)

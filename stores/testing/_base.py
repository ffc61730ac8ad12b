"""The store contract's fixtures, shared by every section: ``new_store`` wraps the subclass's
factory, ``db`` is one fresh store with the kit's kinds registered."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from statecore.store import (
    Store,
)
from stores.testing._kit import (
    StoreFactory,
    StoreOpener,
)


class KitFixtures:
    """The kit's fixtures: ``new_store`` wraps the subclass's factory, ``db`` is one fresh store."""

    @pytest.fixture
    def new_store(self, store: StoreFactory) -> Iterator[StoreOpener]:
        """Wraps the subclass's factory; closes every store it opened at teardown."""
        with ExitStack() as stack:
            yield StoreOpener(store, stack)

    @pytest.fixture
    def db(self, new_store: StoreOpener) -> Store:
        """One fresh store with the kit's kinds registered."""
        return new_store()

"""The store contract: registering kinds, closing, and what a closed store refuses."""

from __future__ import annotations

import pytest

from statecore.errors import StoreError
from statecore.obligation import OBLIGATION_KIND
from statecore.store import Store
from stores.testing._base import KitFixtures
from stores.testing._kit import (
    AUDIT,
    TICKET_KIND,
    TS,
    StoreOpener,
    file_ticket,
    get_ticket,
)


def _every_ticket_operation_raises_store_error(db: Store, new_id: str) -> None:
    """Each read and write on the ticket kind raises StoreError (``new_id`` is a fresh ticket)."""
    k = TICKET_KIND
    with pytest.raises(StoreError):
        db.insert(k, new_id, {"title": "x"}, event="file", audit=AUDIT)
    with pytest.raises(StoreError):
        db.get(k, "t1")
    with pytest.raises(StoreError):
        db.transition(k, "t1", "hold", audit=AUDIT)
    with pytest.raises(StoreError):
        db.select(k)
    with pytest.raises(StoreError):
        db.count(k)
    with pytest.raises(StoreError):
        db.prune(k, "purge")
    with pytest.raises(StoreError):
        db.history(k, "t1")


class RegistrationContract(KitFixtures):
    """Registering kinds, closing, and what a closed store refuses."""

    def test_factory_returns_fresh_empty_stores(self, new_store: StoreOpener) -> None:
        """Each call of the factory gives an independent, empty store."""
        first, second = new_store(), new_store()
        file_ticket(first, "t1")
        assert second.get(TICKET_KIND, "t1") is None
        assert second.count(TICKET_KIND) == 0
        assert first.count(TICKET_KIND) == 1
        assert second.count(OBLIGATION_KIND) == 0

    def test_register_is_idempotent(self, db: Store) -> None:
        """Registering an already registered kind again changes nothing and keeps its rows."""
        file_ticket(db, "t1")
        db.register(TICKET_KIND)
        db.register(TICKET_KIND)
        db.register(OBLIGATION_KIND)
        assert get_ticket(db, "t1").state is TS.OPEN
        assert db.count(TICKET_KIND) == 1
        assert len(db.history(TICKET_KIND, "t1")) == 1

    def test_unregistered_kind_raises_store_error(self, new_store: StoreOpener) -> None:
        """Every operation on a kind the store never registered raises StoreError."""
        db = new_store(register=False)
        db.register(OBLIGATION_KIND)
        _every_ticket_operation_raises_store_error(db, "t1")

    def test_operations_after_close_raise_store_error(self, db: Store) -> None:
        """After close() every operation, atomic() included, raises StoreError."""
        file_ticket(db, "t1")
        db.close()
        _every_ticket_operation_raises_store_error(db, "t2")
        with pytest.raises(StoreError), db.atomic():
            pass

    def test_register_after_close_raises_store_error(self, db: Store) -> None:
        """After close() register() raises StoreError, for a kind registered before or not."""
        db.close()
        with pytest.raises(StoreError):
            db.register(TICKET_KIND)
        with pytest.raises(StoreError):
            db.register(OBLIGATION_KIND)

    def test_close_is_idempotent(self, db: Store) -> None:
        """Closing a store twice is fine and it stays closed."""
        db.close()
        db.close()
        with pytest.raises(StoreError):
            db.count(TICKET_KIND)

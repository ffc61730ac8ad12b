"""The store contract: returned rows are copies: mutating them changes nothing stored."""

from __future__ import annotations

from collections.abc import MutableMapping

from statecore.store import (
    Store,
)
from stores.testing._base import KitFixtures
from stores.testing._kit import (
    AUDIT,
    TICKET_KIND,
    get_ticket,
    move,
)


class IsolationContract(KitFixtures):
    """Returned rows are copies: mutating them changes nothing stored."""

    def test_returned_values_are_copies(self, db: Store) -> None:
        """Mutating a returned row's values, a returned history or the caller's input mapping
        does not change the store."""
        values: dict[str, object] = {"title": "t", "assignee": "alice"}
        row, _ = db.insert(TICKET_KIND, "t1", values, event="file", audit=AUDIT)
        values["assignee"] = "mallory"
        changes: dict[str, object] = {"priority": 9}
        moved = move(db, "t1", "touch", changes=changes)
        changes["priority"] = 10
        expected = dict(moved.values)
        assert expected["assignee"] == "alice"
        assert expected["priority"] == 9
        for returned in (row, moved, get_ticket(db, "t1"), *db.select(TICKET_KIND)):
            if isinstance(returned.values, MutableMapping):
                returned.values["assignee"] = "mallory"
                returned.values["priority"] = 0
                returned.values["extra"] = 1
        history = db.history(TICKET_KIND, "t1")
        history.clear()
        assert dict(get_ticket(db, "t1").values) == expected
        assert len(db.history(TICKET_KIND, "t1")) == 2

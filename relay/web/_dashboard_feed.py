"""The dashboard's change feed: which rows changed since the last poll, read from the store.

Each poll reads, per watched kind and change column, the rows whose change time is at or after
the kind's low-water mark, oldest first, a bounded page at a time.  The mark trails the newest
change seen by :data:`OVERLAP_S`, because a writer stamps ``updated_at`` before its transaction
commits: a row stamped just before the last poll but committed just after it is still found.
Rows read twice are told apart by their fence (bumped by every transition), so each change is
reported once.  The feed keeps a bounded ring of the latest changes for browsers that connect
later.

The feed is not thread-safe: it is used from the dashboard's one store thread only.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any

from relay.web._dashboard_reads import WATCHED, Watched, row_json
from statecore.store import Row, Store, ge

__all__ = ["HISTORY_READS", "OVERLAP_S", "PAGE", "RING", "ChangeFeed"]

OVERLAP_S = 5.0
"""How far behind the newest change seen each kind's low-water mark stays."""
PAGE = 500
"""Rows one poll reads per kind and column at most; the rest are read by the next polls."""
HISTORY_READS = 50
"""Audit histories one poll reads (for the event and the state a row came from); the changes
beyond it are reported without them."""
RING = 200
"""Latest changes kept for a browser that connects later."""
_SEEN_MAX = 20_000
"""Fences remembered at most (oldest forgotten first): the bound on the feed's memory."""


class ChangeFeed:
    """Finds the rows of :data:`WATCHED` that changed since the last :meth:`poll`.

    ``ChangeFeed(since, *, show_content=False)``: changes at or after ``since`` (seconds since
    the epoch) are reported, replies' content only with ``show_content``.  Use it from one
    thread only.
    """

    def __init__(self, since: float, *, show_content: bool = False) -> None:
        self._show_content = show_content
        self._marks: dict[tuple[str, str], float] = {
            (w.kind.name, column): since for w in WATCHED for column in w.changed
        }
        # (kind, id) -> the fence last reported: a row read again unchanged is not reported.
        self._seen: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._ring: deque[dict[str, Any]] = deque(maxlen=RING)
        self.generation = 0
        """Bumped by every poll: a message stamped with it is newer than any snapshot taken
        at a lower one."""

    @property
    def recent(self) -> list[dict[str, Any]]:
        """The latest changes, oldest first (a copy)."""
        return list(self._ring)

    def poll(self, store: Store) -> list[dict[str, Any]]:
        """Read what changed since the last poll; return the changes, oldest first (also kept
        in the ring).  Raises ``StoreError`` when the store cannot be read; the marks then stay
        where they were, so the next poll reads the same rows again."""
        found: list[tuple[float, Watched, Row[Any]]] = []
        marks = dict(self._marks)
        for watched in WATCHED:
            store.register(watched.kind)
            for column in watched.changed:
                key = (watched.kind.name, column)
                rows = store.select(
                    watched.kind,
                    where={column: ge(marks[key])},
                    order_by=column,
                    limit=PAGE,
                )
                for row in rows:
                    if self._seen.get((watched.kind.name, row.id)) != row.fence:
                        found.append((_changed_at(watched, row), watched, row))
                marks[key] = _next_mark(marks[key], rows, column)
        found.sort(key=lambda item: (item[0], item[1].kind.name, item[2].id))
        changes: list[dict[str, Any]] = []
        reported: set[tuple[str, str]] = set()
        for at, watched, row in found:
            key = (watched.kind.name, row.id)
            if key in reported:  # a session read through both its columns in one poll
                continue
            reported.add(key)
            record = None
            if len(reported) <= HISTORY_READS:
                history = store.history(watched.kind, row.id)
                record = history[-1] if history else None
            changes.append(row_json(watched, row, at, record, show_content=self._show_content))
        # Only now that every read succeeded does the feed move on.
        self._marks = marks
        for change in changes:
            self._remember((change["kind"], change["id"]), change["fence"])
            self._ring.append(change)
        self.generation += 1
        return changes

    def _remember(self, key: tuple[str, str], fence: int) -> None:
        self._seen[key] = fence
        self._seen.move_to_end(key)
        while len(self._seen) > _SEEN_MAX:
            self._seen.popitem(last=False)


def _changed_at(watched: Watched, row: Row[Any]) -> float:
    """When ``row`` last changed, as far as its change columns say."""
    times = [row[c] for c in watched.changed if row[c] is not None]
    return float(max(times))


def _next_mark(mark: float, rows: list[Row[Any]], column: str) -> float:
    """The next low-water mark of one column after reading ``rows`` (sorted by it) from
    ``mark``: past a full page, its last value (the rest is read next time); otherwise the
    newest value read, less the overlap, never moving back."""
    if not rows:
        return mark
    newest = float(rows[-1][column])
    if len(rows) >= PAGE:
        return max(mark, newest)
    return max(mark, newest - OVERLAP_S)

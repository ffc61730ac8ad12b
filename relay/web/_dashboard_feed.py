"""The dashboard's change feed: which rows changed since the last poll, read from the store.

Each poll reads, per watched kind and change column, the rows whose change time is at or after
the kind's low-water mark, oldest first, a bounded page at a time.  The mark trails the newest
change seen by :data:`OVERLAP_S`, because a writer stamps ``updated_at`` before its transaction
commits: a row stamped just before the last poll but committed just after it is still found.
Rows read twice are told apart by their fence (bumped by every transition); of a row that
changed, each audit entry not reported yet is one change, so a row recorded, attempted and
delivered between two polls shows as its three moves, and each move is reported once.  The
feed keeps a bounded ring of the latest changes for browsers that connect later.

The feed is not thread-safe: it is used from the dashboard's one store thread only.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from typing import Any

import attrs

from relay.web._dashboard_reads import WATCHED, Watched, entry_json, row_json
from statecore.store import Row, Store, TransitionRecord, ge

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
    """Finds the rows of :data:`WATCHED` that changed since the last :meth:`poll`, and reports
    each of their new audit entries.

    ``ChangeFeed(since, *, show_content=False)``: changes at or after ``since`` (seconds since
    the epoch) are reported, replies' content only with ``show_content``.  Use it from one
    thread only.
    """

    def __init__(self, since: float, *, show_content: bool = False) -> None:
        self._show_content = show_content
        self._since = since
        self._marks: dict[tuple[str, str], float] = {
            (w.kind.name, column): since for w in WATCHED for column in w.changed
        }
        # (kind, id) -> what was reported of it: a row read again unchanged is not reported,
        # and of a changed one only the audit entries past those already reported.
        self._seen: OrderedDict[tuple[str, str], _Reported] = OrderedDict()
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
        in the ring): one per audit entry not reported before (a row recorded, attempted and
        delivered between two polls is three changes), or one without an event for a row whose
        history was not read.  Raises ``StoreError`` when the store cannot be read; the marks
        then stay where they were, so the next poll reads the same rows again."""
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
                    reported = self._seen.get((watched.kind.name, row.id))
                    if reported is None or reported.fence != row.fence:
                        found.append((_changed_at(watched, row), watched, row))
                marks[key] = _next_mark(marks[key], rows, column)
        found.sort(key=lambda item: (item[0], item[1].kind.name, item[2].id))
        per_row: list[list[dict[str, Any]]] = []
        now_reported: dict[tuple[str, str], _Reported] = {}
        for at, watched, row in found:
            key = (watched.kind.name, row.id)
            if key in now_reported:  # a session read through both its columns in one poll
                continue
            if len(now_reported) < HISTORY_READS:
                history = store.history(watched.kind, row.id)
                entries = self._unreported(key, history)
                changes = [
                    entry_json(watched, row, r, show_content=self._show_content) for r in entries
                ]
                if not history:  # nothing audited (pruned meanwhile): the row as it is
                    changes = [row_json(watched, row, at, None, show_content=self._show_content)]
                now_reported[key] = _Reported(row.fence, len(history), at)
            else:
                changes = [row_json(watched, row, at, None, show_content=self._show_content)]
                now_reported[key] = _Reported(row.fence, None, at)
            per_row.append(changes)
        # Oldest first across rows; each row's entries stay in their audit order.
        merged = list(heapq.merge(*per_row, key=lambda change: float(change["at"])))
        # Only now that every read succeeded does the feed move on.
        self._marks = marks
        for key, reported in now_reported.items():
            self._remember(key, reported)
        self._ring.extend(merged)
        self.generation += 1
        return merged

    def _unreported(
        self, key: tuple[str, str], history: list[TransitionRecord]
    ) -> list[TransitionRecord]:
        """The entries of ``history`` not reported yet: past the count reported before; after
        the change last reported when that count is unknown (or the row was pruned and made
        anew); for a row not seen before, those since the feed began."""
        reported = self._seen.get(key)
        if reported is None:
            return [r for r in history if r.at >= self._since]
        if reported.entries is None or reported.entries > len(history):  # or made anew
            return [r for r in history if r.at > reported.at]
        return history[reported.entries :]

    def _remember(self, key: tuple[str, str], reported: _Reported) -> None:
        self._seen[key] = reported
        self._seen.move_to_end(key)
        while len(self._seen) > _SEEN_MAX:
            self._seen.popitem(last=False)


@attrs.frozen
class _Reported:
    """What the feed reported of one row: its fence then, how many of its audit entries (None:
    its history was not read) and the time of its last change reported."""

    fence: int
    entries: int | None
    at: float


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

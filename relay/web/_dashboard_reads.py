"""What the dashboard reads from a store: the watched kinds, their counts per state and oldest
owed row, and the JSON shapes of their rows and audit entries.

Every function here is a plain blocking read, to be called on the dashboard's one store thread
(never on the event loop); none writes, apart from registering a kind (idempotent).  What a
browser receives is chosen here, field by field: ids, states, times, and of an obligation its
platform, chat and content (the bot's own reply, which the page shows as text).  Buffered user
messages, delegation payloads and owner tokens are never sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

import attrs

from relay.connector.buffer import BUFFER_KIND
from statecore.entity import EntityKind
from statecore.gateway.delegations import DELEGATION_KIND
from statecore.gateway.sessions import SESSION_KIND
from statecore.obligation import OBLIGATION_KIND
from statecore.store import Row, Store, TransitionRecord
from statecore.survey import OWED_STATES, ledger_stats

__all__ = [
    "CONTENT_CHARS",
    "OWED_LISTED",
    "WATCHED",
    "Watched",
    "count_kind",
    "owed_obligations",
    "row_json",
]

CONTENT_CHARS = 500
"""An obligation's content is cut to this many characters in anything sent to a browser."""
OWED_LISTED = 50
"""Owed obligations a new browser is sent, oldest first."""


@attrs.frozen
class Watched:
    """One kind the dashboard shows: the store's kind, what the page calls it, the columns
    whose values are the times of its changes (read to find what changed since the last poll)
    and the column its rows' age is counted from."""

    kind: EntityKind[Any]
    title: str
    changed: tuple[str, ...]
    born: str

    @property
    def owed(self) -> tuple[Enum, ...]:
        """Its states from which work is still owed: every state but the terminal ones."""
        lifecycle = self.kind.lifecycle
        return tuple(s for s in lifecycle.states if s not in lifecycle.terminal)


WATCHED: tuple[Watched, ...] = (
    Watched(OBLIGATION_KIND, "obligations", ("updated_at",), "created_at"),
    Watched(BUFFER_KIND, "buffer entries", ("updated_at",), "created_at"),
    # A session has no updated_at: its start and its end are its changes a poll can see (a
    # flag move changes neither, and is not streamed).
    Watched(SESSION_KIND, "sessions", ("started_at", "ended_at"), "started_at"),
    Watched(DELEGATION_KIND, "delegations", ("updated_at",), "created_at"),
)
"""The kinds the dashboard counts and streams, in the order the page shows them."""


def count_kind(store: Store, watched: Watched, now: float) -> dict[str, Any]:
    """``watched``'s rows per state (every declared state, 0 when empty), how many are owed,
    and the oldest owed one (its id and when it was made; None when nothing is owed).  Raises
    ``StoreError`` when the store cannot be read."""
    kind = watched.kind
    store.register(kind)
    if kind is OBLIGATION_KIND:  # the ledger's own survey, as `statecore ledger stats` reads it
        stats = ledger_stats(store, now=now)
        counts = {s.value: n for s, n in stats.counts.items()}
        oldest = stats.oldest_owed
        oldest_id = None if oldest is None else oldest.obligation_id
        oldest_at = None if oldest is None else oldest.created_at
    else:
        counts = {s.value: store.count(kind, states=(s,)) for s in kind.lifecycle.states}
        rows = store.select(kind, states=watched.owed, order_by=watched.born, limit=1)
        oldest_id = rows[0].id if rows else None
        oldest_at = rows[0][watched.born] if rows else None
    return {
        "kind": kind.name,
        "title": watched.title,
        "states": counts,
        "owed": sum(counts[s.value] for s in watched.owed),
        "oldest_owed_id": oldest_id,
        "oldest_owed_at": oldest_at,
        "oldest_owed_age_s": None if oldest_at is None else max(0.0, now - oldest_at),
    }


def row_json(
    watched: Watched,
    row: Row[Any],
    at: float,
    record: TransitionRecord | None,
    *,
    show_content: bool,
) -> dict[str, Any]:
    """One row as the stream shows it: kind, id, state, fence, when it changed and, when its
    last audit entry ``record`` was read, the event and the state it came from; an obligation
    also with its platform, chat, attempts and -- with ``show_content`` -- its (cut) content,
    else ``content_hidden``."""
    out: dict[str, Any] = {
        "kind": watched.kind.name,
        "id": row.id,
        "state": row.state.value,
        "fence": row.fence,
        "at": at,
        "event": None if record is None else record.event,
        "from": None if record is None or record.from_state is None else record.from_state.value,
    }
    if watched.kind is OBLIGATION_KIND:
        out.update(_obligation_fields(row.values, show_content))
    return out


def _obligation_fields(values: Mapping[str, Any], show_content: bool) -> dict[str, Any]:
    content = str(values["content"]) if show_content else ""
    return {
        "platform": values["platform"],
        "chat_id": values["chat_id"],
        "attempts": values["attempts"],
        "content": content[:CONTENT_CHARS],
        "content_cut": len(content) > CONTENT_CHARS,
        # What users were told is theirs: shown only where the deployer chose to show it.
        "content_hidden": not show_content,
    }


def owed_obligations(store: Store, *, show_content: bool) -> list[dict[str, Any]]:
    """The owed obligations (oldest first, at most :data:`OWED_LISTED`) as the stream shows
    rows (without an event).  Raises ``StoreError`` when the store cannot be read."""
    watched = WATCHED[0]
    store.register(OBLIGATION_KIND)
    rows = store.select(
        OBLIGATION_KIND, states=OWED_STATES, order_by="created_at", limit=OWED_LISTED
    )
    return [
        row_json(watched, row, row["updated_at"], None, show_content=show_content) for row in rows
    ]

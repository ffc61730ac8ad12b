"""What the dashboard reads from a store: the watched kinds, their counts per state and oldest
owed row, the owed replies that keep failing, the latest changed obligations, the repairs each
obligation state allows, and the JSON shapes of their rows and audit entries.

Every function here is a plain blocking read, to be called on the dashboard's one store thread
(never on the event loop); none writes, apart from registering a kind (idempotent).  What a
browser receives is chosen here, field by field: ids, states, times, and of an obligation its
platform, chat and content (the bot's own reply, which the page shows as text) and, of a failed
one, its error kind, its last error (cut) and what it waits for.  Buffered and held user
messages, rejected events' raw forms, delegation payloads and owner tokens are never sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

import attrs

from relay.connector.buffer import BUFFER_KIND
from relay.connector.held import HOLD_KIND
from relay.connector.rejected import REJECTED_KIND
from statecore.entity import EntityKind
from statecore.gateway.delegations import DELEGATION_KIND
from statecore.gateway.sessions import SESSION_KIND
from statecore.lifecycle import Lifecycle
from statecore.lifecycles import OBLIGATION, ObligationState
from statecore.obligation import OBLIGATION_KIND
from statecore.store import Row, Store, TransitionRecord, ge
from statecore.survey import OWED_STATES, FailingRow, failing_rows, ledger_stats

__all__ = [
    "CONTENT_CHARS",
    "ERROR_CHARS",
    "FAILING_READ",
    "LATEST_LISTED",
    "OWED_LISTED",
    "REPAIRS",
    "WATCHED",
    "Watched",
    "all_counts",
    "count_kind",
    "entry_json",
    "failure_json",
    "flag_failing",
    "latest_obligations",
    "obligation_json",
    "owed_obligations",
    "read_failing",
    "repair_states",
    "row_json",
    "snapshot_reads",
]

CONTENT_CHARS = 500
"""An obligation's content is cut to this many characters in anything sent to a browser."""
OWED_LISTED = 50
"""Owed obligations a new browser is sent, oldest first."""
LATEST_LISTED = 50
"""Latest changed obligations (any state) a new browser is sent, newest first."""
ERROR_CHARS = 300
"""A failed obligation's last error is cut to this many characters in anything sent."""
FAILING_READ = 5000
"""Failed obligations one read examines at most, oldest first: past it the count of those that
keep failing is a lower bound (``keep_failing_exact`` is false)."""
REPAIRS = ("abandon", "retry")
"""The operator's repairs of an obligation, as the page names them."""


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
    # The connector's intake: events held for a gateway that has not said hello (owed: held)
    # and events its drivers could not map (owed: recorded, until an operator dismisses them).
    Watched(HOLD_KIND, "held events", ("updated_at",), "created_at"),
    Watched(REJECTED_KIND, "rejected events", ("recorded_at", "dismissed_at"), "recorded_at"),
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


def entry_json(
    watched: Watched, row: Row[Any], record: TransitionRecord, *, show_content: bool
) -> dict[str, Any]:
    """One audit entry ``record`` of ``row`` as the stream shows it: the row's fields (as
    :func:`row_json`), with the entry's time, event, the state it came from and the state it led
    to (and, of an obligation, the attempts it counted when it says)."""
    out = row_json(watched, row, record.at, record, show_content=show_content)
    out["state"] = record.to_state.value
    if "attempts" in out and record.attempts is not None:
        out["attempts"] = record.attempts
    return out


def repair_states(lifecycle: Lifecycle[Any] = OBLIGATION) -> dict[str, tuple[Enum, ...]]:
    """The states each of :data:`REPAIRS` may start from, in declaration order, read from the
    declared ``lifecycle``: ``abandon`` from every state whose moves include ``abandon``;
    ``retry`` (which records a new obligation, :func:`statecore.repair.retry_abandoned`) from
    every state ``abandon`` leads to.  Never raises for a lifecycle without ``abandon`` (both
    are then empty)."""
    states = lifecycle.states
    abandon_from = tuple(s for s in states if lifecycle.can(s, "abandon"))
    led_to = {lifecycle.target(s, "abandon") for s in abandon_from}
    return {"abandon": abandon_from, "retry": tuple(s for s in states if s in led_to)}


def latest_obligations(
    store: Store, *, now: float, show_content: bool, limit: int = LATEST_LISTED
) -> list[dict[str, Any]]:
    """The ``limit`` obligations changed last, whatever their state (delivered and abandoned
    ones too), newest change first, as the stream shows rows (without an event).

    The store orders ascending only, so the window of the newest changes is found by counting:
    widened back from ``now`` until it holds ``limit`` rows, then narrowed while it holds more
    than twice as many; only that window's rows are read.  Raises ``TypeError`` for a
    ``limit`` that is not an int, ``ValueError`` for one below 1, ``StoreError`` when the store
    cannot be read."""
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    kind = OBLIGATION_KIND
    store.register(kind)
    first = store.select(kind, order_by="updated_at", limit=1)
    if not first:
        return []
    rows = _newest_rows(store, float(first[0]["updated_at"]), now, limit)
    rows.sort(key=lambda r: (r["updated_at"], r.id), reverse=True)
    watched = WATCHED[0]
    return [
        row_json(watched, row, row["updated_at"], None, show_content=show_content)
        for row in rows[:limit]
    ]


def _newest_rows(store: Store, oldest: float, now: float, limit: int) -> list[Row[Any]]:
    """At least the ``limit`` obligations changed last (all of them when there are fewer), and
    not many more (see :func:`latest_obligations`)."""
    kind = OBLIGATION_KIND

    def since(at: float) -> int:
        return store.count(kind, where={"updated_at": ge(at)})

    # Widen: [lo, ...) holds at least `limit` rows (or every row); [hi, ...) fewer.
    hi: float | None = None
    width = 1.0
    while True:
        lo = now - width
        if lo <= oldest:
            lo, held = oldest, since(oldest)
            break
        held = since(lo)
        if held >= limit:
            break
        hi, width = lo, width * 4
    if hi is None and held > 2 * limit and since(now + 1.0) < limit:
        hi = now + 1.0  # a busy last second: what is newer still (a writer's clock ahead)
    # Narrow while the window holds more than twice what is asked, down to a millisecond.
    while held > 2 * limit and hi is not None and hi - lo > 1e-3:
        middle = (lo + hi) / 2
        count = since(middle)
        if count >= limit:
            lo, held = middle, count
        else:
            hi = middle
    if held <= 2 * limit:
        return store.select(kind, where={"updated_at": ge(lo)}, order_by="updated_at")
    if hi is None:  # more than `limit` rows stamped ahead of this clock: the oldest of those
        return store.select(
            kind, where={"updated_at": ge(now + 1.0)}, order_by="updated_at", limit=limit
        )
    # Many rows share the window's first millisecond: every row after it (fewer than
    # `limit`), and the rest from the shared ones.
    newer = store.select(kind, where={"updated_at": ge(hi)})
    shared = store.select(kind, where={"updated_at": ge(lo)}, order_by="updated_at", limit=limit)
    return list({row.id: row for row in (*shared, *newer)}.values())


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


def read_failing(store: Store) -> dict[str, FailingRow]:
    """The failed (owed) obligations by id, oldest first, at most :data:`FAILING_READ`, each
    with its error kind, its next timed retry and whether it keeps failing, as
    :func:`statecore.survey.failing_rows` reads them (as ``statecore doctor`` does).  Raises
    ``StoreError`` when the store cannot be read."""
    return {r.obligation.obligation_id: r for r in failing_rows(store, limit=FAILING_READ)}


def all_counts(store: Store, now: float) -> tuple[list[dict[str, Any]], dict[str, FailingRow]]:
    """Every watched kind's counts (:func:`count_kind`), the obligations' also with how many
    owed replies keep failing (``keep_failing``; ``keep_failing_exact`` false when there were
    more failed rows than :data:`FAILING_READ`, the count then being a lower bound), and the
    failed rows read (:func:`read_failing`, for :func:`flag_failing`).  Raises ``StoreError``
    when the store cannot be read."""
    counts = [count_kind(store, w, now) for w in WATCHED]
    failing = read_failing(store)
    obligations = counts[0]  # WATCHED[0] is the obligation kind
    obligations["keep_failing"] = sum(1 for r in failing.values() if r.keeps_failing)
    obligations["keep_failing_exact"] = len(failing) < FAILING_READ
    return counts, failing


def failure_json(row: FailingRow) -> dict[str, Any]:
    """What the page shows of a failed obligation: its error kind, whether it keeps failing,
    its attempts, its last error (cut), when the running gateway retries it (None: not by a
    timer) and what it waits for, in words."""
    error = row.obligation.last_error or ""
    return {
        "kind": row.kind.value,
        "keeps_failing": row.keeps_failing,
        "attempts": row.obligation.attempts,
        "last_error": error[:ERROR_CHARS],
        "error_cut": len(error) > ERROR_CHARS,
        "retry_at": row.retry_at,
        "waits_for": row.waits_for,
    }


def flag_failing(
    rows: Iterable[dict[str, Any]], failing: Mapping[str, FailingRow]
) -> list[dict[str, Any]]:
    """``rows`` (as :func:`row_json` and :func:`entry_json` make them), each obligation's a
    copy with ``keeps_failing`` and ``failure`` (:func:`failure_json`, None unless the row
    shows the ``failed`` state and is among ``failing``, :func:`read_failing`'s rows); rows of
    other kinds as they are."""
    failed = ObligationState.FAILED.value
    out: list[dict[str, Any]] = []
    for row in rows:
        if row["kind"] != OBLIGATION_KIND.name:
            out.append(row)
            continue
        found = failing.get(row["id"]) if row["state"] == failed else None
        out.append(
            {
                **row,
                "keeps_failing": found is not None and found.keeps_failing,
                "failure": None if found is None else failure_json(found),
            }
        )
    return out


def obligation_json(
    store: Store, row: Row[Any], record: TransitionRecord | None, *, show_content: bool
) -> dict[str, Any]:
    """One obligation ``row`` as a history shows it: :func:`row_json` (at its last change,
    with its last audit entry ``record``), flagged by :func:`flag_failing` (the failed rows are
    read only for a failed row).  Raises ``StoreError`` when the store cannot be read."""
    shown = row_json(WATCHED[0], row, row["updated_at"], record, show_content=show_content)
    failing = read_failing(store) if row.state is ObligationState.FAILED else {}
    return flag_failing([shown], failing)[0]


def snapshot_reads(
    store: Store, *, now: float, show_content: bool, recent: Iterable[dict[str, Any]]
) -> dict[str, Any]:
    """The store's part of a new browser's snapshot: the counts (:func:`all_counts`), the owed
    obligations, the latest changed ones and the ``recent`` changes, every obligation row
    flagged as it is now (:func:`flag_failing`).  Raises ``StoreError`` when the store cannot
    be read."""
    counts, failing = all_counts(store, now)
    owed = owed_obligations(store, show_content=show_content)
    latest = latest_obligations(store, now=now, show_content=show_content)
    return {
        "counts": counts,
        "obligations": flag_failing(owed, failing),
        "latest": flag_failing(latest, failing),
        "recent": flag_failing(recent, failing),
    }

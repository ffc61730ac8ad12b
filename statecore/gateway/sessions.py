"""Chat sessions as a persisted lifecycle: active until ended, with a reason.

A *session key* names one conversation place (a DM, a channel thread); over time it holds a
chain of *sessions*.  At most one session per key is active -- the key's *current* session.
A session ends with a reason, and the reasons fall into two families that routing of late
results depends on (:mod:`statecore.gateway.routing`):

* user boundaries (:data:`~statecore.gateway.routing.USER_BOUNDARY_END_REASONS`): the user reset,
  exited, switched or started a new session -- late results for the old one are dropped;
* everything else (idle, timeout, agent close, ...): late results go to the key's current
  session.

*Compression* ends a session with reason ``"compression"`` and starts its **successor** under the
same key in the same transaction, linking the two (``successor_id``); late results follow the
link.  ``resume_pending`` marks an active session whose interrupted turn would be resumed after
a restart; the gateway clears it before it redelivers anything, so a turn is never both
redelivered and replayed.

Every change is one guarded write through the Store, with its audit entry.  Changes that read
before they write (start, compress, the resume flag) run inside one ``atomic()`` block and are
fenced by the row they read.

:class:`SessionStore` is synchronous; asyncio code awaits the same methods through its ``aio``
facade (:class:`AsyncSessions`, see :mod:`statecore.gateway.aio`), which runs each on a worker
thread: ``await sessions.aio.current(key)``.
"""

from __future__ import annotations

import asyncio
import uuid
from enum import StrEnum
from typing import Any

import attrs

from statecore.checks import platform_id, require_text
from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind, Field, Index
from statecore.errors import UnknownEntity
from statecore.gateway.aio import off_loop
from statecore.gateway.routing import COMPRESSION_END_REASON, is_user_boundary
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit, Row, Store, TransitionRecord, lt

__all__ = [
    "SESSION",
    "SESSION_KIND",
    "AsyncSessions",
    "Session",
    "SessionState",
    "SessionStore",
]


class SessionState(StrEnum):
    """One chat session."""

    ACTIVE = "active"
    """Live: the current session of its key."""
    ENDED = "ended"
    """Terminal: ended with a reason (``"compression"``: continued in its successor)."""


_A, _E = SessionState.ACTIVE, SessionState.ENDED

SESSION: Lifecycle[SessionState] = Lifecycle(
    "session",
    SessionState,
    initial=_A,
    terminal=(_E,),
    description="One chat session, from start to its end (compression links a successor).",
    transitions=(
        Transition("start", None, _A),
        # The resume flag changes on a live session only; the move is audited like any other.
        Transition("flag", _A, _A),
        # Every end carries a reason; compression is an end that links the successor.
        Transition("end", _A, _E),
        Transition("prune", _E, None),
    ),
)
"""The session lifecycle: start -> active (flag) -> end -> ended -> prune."""

SESSION_KIND: EntityKind[SessionState] = EntityKind(
    "session",
    SESSION,
    table="gateway_sessions",
    id_field="session_id",
    fields=(
        Field("session_key", str, nullable=False, immutable=True),
        Field("started_at", float, nullable=False, immutable=True),
        Field("ended_at", float),
        Field("end_reason", str),
        Field("successor_id", str),
        Field("resume_pending", bool, nullable=False, default=False),
        Field("platform", str, immutable=True),
        Field("chat_id", str, immutable=True),
    ),
    indexes=(
        # current(key): the one active session of a key.
        Index(("session_key",), states=frozenset({_A})),
        # Pruning: ended sessions by age.
        Index(("ended_at",), states=frozenset({_E})),
    ),
)
"""The persisted shape of :data:`SESSION` entities (table ``gateway_sessions``)."""


@attrs.frozen
class Session:
    """One session as stored (a snapshot: re-read it to see later changes)."""

    session_id: str
    session_key: str
    state: SessionState
    started_at: float
    ended_at: float | None
    end_reason: str | None
    successor_id: str | None
    resume_pending: bool
    platform: str | None = None
    chat_id: str | None = None
    fence: int = 0

    @property
    def ended(self) -> bool:
        """True once the session has ended (whatever the reason)."""
        return self.state is SessionState.ENDED

    @classmethod
    def from_row(cls, row: Row[SessionState]) -> Session:
        """Build the record from a store row of :data:`SESSION_KIND`."""
        v: Any = row.values
        return cls(
            session_id=row.id,
            session_key=v["session_key"],
            state=row.state,
            started_at=v["started_at"],
            ended_at=v["ended_at"],
            end_reason=v["end_reason"],
            successor_id=v["successor_id"],
            resume_pending=bool(v["resume_pending"]),
            platform=v["platform"],
            chat_id=v["chat_id"],
            fence=row.fence,
        )


_K = SESSION_KIND


class SessionStore:
    """Sessions persisted in ``store`` (the same store as the ledger, typically).

    ``SessionStore(store, *, clock=None)``.  Synchronous and safe to use from several threads;
    :meth:`clear_resume_pending` is the one ``async`` method (the gateway awaits it on the event
    loop and it runs the store work on a worker thread).  From asyncio code, await every other
    method through :attr:`aio` (``await sessions.aio.start(key)``): the same calls, each run on
    a worker thread.
    """

    def __init__(self, store: Store, *, clock: Clock | None = None) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        store.register(_K)
        self.aio = AsyncSessions(self)
        """The same methods as coroutine functions run on a worker thread."""

    # -- changes -----------------------------------------------------------------------------

    def start(
        self,
        session_key: str,
        *,
        session_id: str | None = None,
        platform: str | None = None,
        chat_id: str | int | None = None,
    ) -> Session:
        """Start a new active session for ``session_key`` and return it.

        If the key already has an active session, that one is ended with reason
        ``"new_session"`` in the same transaction, so a key never has two.  Idempotent for an
        explicit ``session_id`` that already exists: the stored session is returned and nothing
        is ended.  Raises ``TypeError``/``ValueError`` for a bad key, id, platform or chat id
        (nothing is written).
        """
        require_text("session_key", session_key)
        if session_id is not None:
            require_text("session_id", session_id)
        if platform is not None:
            require_text("platform", platform)
        chat = platform_id("chat_id", chat_id)
        new_id = session_id or uuid.uuid4().hex
        now = self.clock.now()
        with self.store.atomic():
            if session_id is not None:
                existing = self.store.get(_K, session_id)
                if existing is not None:
                    return Session.from_row(existing)
            for row in self._active_rows(session_key):
                self._end(row.id, "new_session", now, fence=row.fence)
            row, _ = self.store.insert(
                _K,
                new_id,
                {
                    "session_key": session_key,
                    "started_at": now,
                    "resume_pending": False,
                    "platform": platform,
                    "chat_id": chat,
                },
                event="start",
                audit=Audit(now),
            )
        return Session.from_row(row)

    def end(self, session_id: str, reason: str) -> Session:
        """End an active session with ``reason``; its resume flag is cleared.

        ``reason`` is a non-empty str; user-boundary reasons make late results for this session
        drop, others retarget them to the key's current session.  Compression is not an end
        reason here: use :meth:`compress`, which links the successor.  Raises
        :class:`InvalidTransition` if the session has already ended, :class:`UnknownEntity`
        for an unknown id, ``TypeError``/``ValueError`` for a bad reason.
        """
        require_text("session_id", session_id)
        require_text("reason", reason)
        if reason == COMPRESSION_END_REASON:
            raise ValueError(
                "end a session by compression with compress(), which links a successor"
            )
        # No read precedes this write: the state guard (active) is the whole condition.
        return Session.from_row(self._end(session_id, reason, self.clock.now()))

    def compress(self, session_id: str, *, successor_id: str | None = None) -> Session:
        """End an active session by compression and start its successor; return the successor.

        In one transaction: the session ends with reason ``"compression"`` and
        ``successor_id`` set, and the successor starts under the same key (inheriting platform,
        chat and the resume flag: the conversation continues there).  Raises
        :class:`InvalidTransition` if the session has ended, :class:`UnknownEntity` for an
        unknown id, :class:`StaleState` if it changed concurrently; nothing is written then.
        """
        require_text("session_id", session_id)
        if successor_id is not None:
            require_text("successor_id", successor_id)
        new_id = successor_id or uuid.uuid4().hex
        now = self.clock.now()
        with self.store.atomic():
            row = self._row(session_id)
            self._end(session_id, COMPRESSION_END_REASON, now, fence=row.fence, successor_id=new_id)
            successor, created = self.store.insert(
                _K,
                new_id,
                {
                    "session_key": row["session_key"],
                    "started_at": now,
                    "resume_pending": row["resume_pending"],
                    "platform": row["platform"],
                    "chat_id": row["chat_id"],
                },
                event="start",
                audit=Audit(now, reason=f"compression of {session_id}"),
            )
            if not created:
                raise ValueError(f"successor id {new_id!r} is already taken")
        return Session.from_row(successor)

    def set_resume_pending(self, session_key: str, flag: bool) -> Session | None:
        """Set the resume flag of the key's current session; return it (None: no active session,
        nothing written).  Writes nothing when the flag already has that value.

        Raises ``TypeError`` for a non-bool flag or a non-text key.
        """
        require_text("session_key", session_key)
        if not isinstance(flag, bool):
            raise TypeError(f"flag must be a bool, not {type(flag).__name__}")
        with self.store.atomic():
            rows = self._active_rows(session_key)
            if not rows:
                return None
            row = rows[-1]
            if bool(row["resume_pending"]) is not flag:
                now = self.clock.now()
                row = self.store.transition(
                    _K,
                    row.id,
                    "flag",
                    audit=Audit(now, reason="resume pending" if flag else "resume cleared"),
                    fence=row.fence,
                    changes={"resume_pending": flag},
                )
        return Session.from_row(row)

    async def clear_resume_pending(self, session_key: str) -> Session | None:
        """Clear the resume flag of the key's current session, off the event loop.

        The gateway awaits this before any redelivery send for the key.  Returns as
        :meth:`set_resume_pending`; raises what it raises, and ``StoreError`` when the store
        fails (nothing was written then).
        """
        return await asyncio.to_thread(self.set_resume_pending, session_key, False)

    def prune(self, *, retention: float = 604_800.0, now: float | None = None) -> int:
        """Delete sessions that ended more than ``retention`` seconds ago; return how many.

        Active sessions are never deleted.  A completion pinned to a pruned session is no
        longer deliverable (its route is terminal).
        """
        when = self.clock.now() if now is None else now
        return self.store.prune(_K, "prune", where={"ended_at": lt(when - retention)})

    # -- reads -------------------------------------------------------------------------------

    def get(self, session_id: str) -> Session | None:
        """The session, or None if it never existed (or was pruned)."""
        require_text("session_id", session_id)
        row = self.store.get(_K, session_id)
        return None if row is None else Session.from_row(row)

    def current(self, session_key: str) -> Session | None:
        """The key's active session, or None when it has none."""
        require_text("session_key", session_key)
        rows = self._active_rows(session_key)
        return Session.from_row(rows[-1]) if rows else None

    def compression_successor(self, session_id: str) -> Session | None:
        """Where a compression-ended session's conversation continues now.

        Follows ``successor_id`` links past successors that were themselves compressed and
        returns the first session that is live or ended otherwise; None when the session was
        not ended by compression or a link leads nowhere (a pruned successor).
        """
        session = self.get(session_id)
        if session is None or session.end_reason != COMPRESSION_END_REASON:
            return None
        seen = {session_id}
        while session.successor_id is not None and session.successor_id not in seen:
            seen.add(session.successor_id)
            found = self.get(session.successor_id)
            if found is None:
                return None
            session = found
            if session.end_reason != COMPRESSION_END_REASON:
                return session
        # A compressed successor whose own link cannot be followed: the caller sees a
        # compression without a successor, and retries.
        return None if len(seen) == 1 else session

    def history(self, session_id: str) -> list[TransitionRecord]:
        """Every transition of the session, oldest first (start, flags, end)."""
        return self.store.history(_K, session_id)

    @staticmethod
    def is_user_boundary(reason: object) -> bool:
        """True for a user-boundary end reason (see
        :func:`statecore.gateway.routing.is_user_boundary`)."""
        return is_user_boundary(reason)

    # -- internals ---------------------------------------------------------------------------

    def _row(self, session_id: str) -> Row[SessionState]:
        row = self.store.get(_K, session_id)
        if row is None:
            raise UnknownEntity(_K.name, session_id)
        return row

    def _active_rows(self, session_key: str) -> list[Row[SessionState]]:
        return self.store.select(
            _K, states=(_A,), where={"session_key": session_key}, order_by="started_at"
        )

    def _end(
        self,
        session_id: str,
        reason: str,
        now: float,
        *,
        fence: int | None = None,
        successor_id: str | None = None,
    ) -> Row[SessionState]:
        """The one end write: an ended session never stays flagged for a resumed reply."""
        changes: dict[str, object] = {
            "ended_at": now,
            "end_reason": reason,
            "resume_pending": False,
        }
        if successor_id is not None:
            changes["successor_id"] = successor_id
        return self.store.transition(
            _K, session_id, "end", audit=Audit(now, reason=reason), fence=fence, changes=changes
        )


class AsyncSessions:
    """:class:`SessionStore`'s methods for asyncio code: each runs the synchronous method on a
    worker thread, with the same arguments, result and errors (``SessionStore.aio``)."""

    def __init__(self, sessions: SessionStore) -> None:
        self.sessions = sessions
        """The synchronous store these methods run."""
        self.start = off_loop(sessions.start)
        """:meth:`SessionStore.start`, off the event loop."""
        self.end = off_loop(sessions.end)
        """:meth:`SessionStore.end`, off the event loop."""
        self.compress = off_loop(sessions.compress)
        """:meth:`SessionStore.compress`, off the event loop."""
        self.set_resume_pending = off_loop(sessions.set_resume_pending)
        """:meth:`SessionStore.set_resume_pending`, off the event loop."""
        self.clear_resume_pending = sessions.clear_resume_pending
        """:meth:`SessionStore.clear_resume_pending` (already a coroutine function)."""
        self.prune = off_loop(sessions.prune)
        """:meth:`SessionStore.prune`, off the event loop."""
        self.get = off_loop(sessions.get)
        """:meth:`SessionStore.get`, off the event loop."""
        self.current = off_loop(sessions.current)
        """:meth:`SessionStore.current`, off the event loop."""
        self.compression_successor = off_loop(sessions.compression_successor)
        """:meth:`SessionStore.compression_successor`, off the event loop."""
        self.history = off_loop(sessions.history)
        """:meth:`SessionStore.history`, off the event loop."""

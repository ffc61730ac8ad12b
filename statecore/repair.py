"""An operator's repairs of the delivery ledger: abandon a stuck obligation, retry an abandoned
one, prune settled ones.

Functions over any :class:`~statecore.store.Store`, shared by the ``statecore`` command line
and any dashboard.  Every repair is one guarded write with its audit entry naming who did it
(``"<via>:<operator>"``, e.g. ``cli:alice``) and why; a refused repair writes nothing.

A terminal row is never revived: :func:`retry_abandoned` records a **new** obligation (same
chat, same content) whose creation entry names the abandoned one, so the history of both stays
true.  Its id is derived from the abandoned one's (:func:`retry_id`), so retrying the same row
twice cannot owe the reply twice.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence

from statecore.checks import require_positive, require_text
from statecore.clock import Clock, SystemClock
from statecore.errors import InvalidTransition, UnknownEntity
from statecore.ids import OBLIGATION_ID_LENGTH
from statecore.lifecycles import OBLIGATION, ObligationState
from statecore.obligation import OBLIGATION_KIND, Obligation
from statecore.store import Audit, Row, Store, TransitionRecord, lt

__all__ = [
    "PRUNE_CHUNK",
    "abandon",
    "prune_settled",
    "retried_from",
    "retry_abandoned",
    "retry_id",
]

log = logging.getLogger(__name__)

_S = ObligationState
_K = OBLIGATION_KIND
_OWED = frozenset(OBLIGATION.states) - OBLIGATION.terminal
_RETRY_DOMAIN = b"statecore/retry/v1\x00"
_RETRY_PREFIX = "retry of "
_SEND_EVENTS = frozenset({"attempt", "claim"})
"""Events that begin a send: a row that went through one may have reached the user."""
PRUNE_CHUNK = 500
"""Rows deleted per transaction by :func:`prune_settled` (its progress is reported per chunk)."""


def retry_id(obligation_id: str) -> str:
    """The id of the obligation that retries ``obligation_id``: 24 lowercase hex characters,
    always the same for the same id, so a second retry of one row finds the first."""
    require_text("obligation_id", obligation_id)
    digest = hashlib.sha256(_RETRY_DOMAIN + obligation_id.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:OBLIGATION_ID_LENGTH]


def abandon(
    store: Store,
    obligation_id: str,
    *,
    by: str,
    reason: str,
    via: str = "cli",
    clock: Clock | None = None,
) -> Obligation:
    """Give up on an owed obligation (pending, attempting or failed): it moves to
    ``abandoned`` with an audit entry owned by ``"<via>:<by>"`` whose reason reads
    ``"abandoned by <by>: <reason>"``.  Returns the abandoned obligation.

    The write is fenced by the row as read, so a row a gateway changed meanwhile is not
    touched.  A process still sending it finds its later settle refused.  Raises
    :class:`UnknownEntity` for an unknown id, :class:`InvalidTransition` for a row already
    delivered or abandoned, :class:`StaleState` if the row changed between the read and the
    write (read it again), ``TypeError``/``ValueError`` for empty arguments; nothing is written
    then.
    """
    _check_actor(by, reason, via)
    row = _read(store, obligation_id)
    now = (clock or SystemClock()).now()
    if row.state not in _OWED:
        raise InvalidTransition(
            OBLIGATION.name, row.state, "abandon", "only an owed obligation can be abandoned"
        )
    written = store.transition(
        _K,
        obligation_id,
        "abandon",
        audit=Audit(now, f"{via}:{by}", row["attempts"], f"abandoned by {by}: {reason}"),
        fence=row.fence,
        changes={"updated_at": now},
    )
    log.info(
        "obligation %s abandoned by %s: %s",
        obligation_id,
        by,
        reason,
        extra={"obligation_id": obligation_id, "operator": by, "via": via, "reason": reason},
    )
    return Obligation.from_row(written)


def retry_abandoned(
    store: Store,
    obligation_id: str,
    *,
    by: str,
    reason: str,
    via: str = "cli",
    clock: Clock | None = None,
) -> Obligation:
    """Owe an abandoned reply again: record a new obligation (id :func:`retry_id`) with the same
    session, chat, thread, reply-to, content and adapter profile, ``pending`` and without an
    owner, so a running gateway claims it at its next recover tick (or the next gateway to
    start, in its startup sweep) and sends it.  Its
    creation entry is owned by ``"<via>:<by>"`` and its reason reads ``"retry of <id> by <by>:
    <reason>"``; the abandoned row is not written.  Returns the new obligation.

    When a send of the abandoned row ever began (its history has an ``attempt`` or ``claim``:
    it may have reached the user), the new row starts at one attempt, so the sweep labels its
    send as a possible repeat; otherwise at none, and it is sent plain.

    Raises :class:`UnknownEntity` for an unknown id, :class:`InvalidTransition` for a row that
    is not abandoned or was already retried (the message names the retry; retry that one if it
    was abandoned in turn), ``TypeError``/``ValueError`` for empty arguments; nothing is
    written then.
    """
    _check_actor(by, reason, via)
    row = _read(store, obligation_id)
    if row.state is not _S.ABANDONED:
        raise InvalidTransition(
            OBLIGATION.name, row.state, "retry", "only an abandoned obligation can be retried"
        )
    new_id = retry_id(obligation_id)
    now = (clock or SystemClock()).now()
    sent = row["attempts"] > 0 or any(
        r.event in _SEND_EVENTS for r in store.history(_K, obligation_id)
    )
    attempts = 1 if sent else 0
    values = {
        name: row[name]
        for name in (
            "session_key",
            "platform",
            "chat_id",
            "thread_id",
            "reply_to",
            "content",
            "adapter_profile",
        )
    }
    values.update(attempts=attempts, created_at=now, updated_at=now)
    audit = Audit(now, f"{via}:{by}", attempts, f"{_RETRY_PREFIX}{obligation_id} by {by}: {reason}")
    written, created = store.insert(_K, new_id, values, event="record", audit=audit)
    if not created:
        raise InvalidTransition(
            OBLIGATION.name,
            row.state,
            "retry",
            f"already retried as {new_id}, which is {written.state.value}",
        )
    log.info(
        "obligation %s retried as %s by %s: %s",
        obligation_id,
        new_id,
        by,
        reason,
        extra={
            "obligation_id": new_id,
            "retry_of": obligation_id,
            "operator": by,
            "via": via,
            "reason": reason,
        },
    )
    return Obligation.from_row(written)


def prune_settled(
    store: Store,
    *,
    older_than_s: float,
    clock: Clock | None = None,
    chunk: int = PRUNE_CHUNK,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Delete delivered and abandoned obligations unchanged for longer than ``older_than_s``
    seconds, with their history, ``chunk`` rows per transaction; return how many.

    Owed rows are never deleted, whatever their age.  ``progress(done, total)`` is called before
    the first chunk and after each one (``total`` is the count when pruning began).  Raises
    ``ValueError`` for a bad ``older_than_s`` or ``chunk``, ``StoreError`` when the store fails
    (the chunks already committed stay deleted).
    """
    require_positive("older_than_s", older_than_s)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, not {chunk!r}")
    store.register(_K)
    cutoff = (clock or SystemClock()).now() - older_than_s
    where = {"updated_at": lt(cutoff)}
    total = store.count(_K, states=OBLIGATION.terminal, where=where)
    done = 0
    if progress is not None:
        progress(done, total)
    while True:
        deleted = store.prune(_K, "prune", where=where, limit=chunk)
        done += deleted
        if progress is not None and deleted:
            progress(done, max(done, total))
        if deleted < chunk:
            break
    log.info("pruned %d settled obligations", done, extra={"pruned": done, "cutoff": cutoff})
    return done


def retried_from(history: Sequence[TransitionRecord]) -> str | None:
    """The id of the obligation an operator's retry was recorded for, read from the new
    obligation's creation entry in ``history`` (see :func:`retry_abandoned`); None for an
    obligation recorded otherwise."""
    if not history or history[0].event != "record":
        return None
    reason = history[0].reason or ""
    if not reason.startswith(_RETRY_PREFIX) or " by " not in reason:
        return None
    return reason[len(_RETRY_PREFIX) :].split(" by ", 1)[0] or None


def _check_actor(by: str, reason: str, via: str) -> None:
    require_text("by", by)
    require_text("reason", reason)
    require_text("via", via)


def _read(store: Store, obligation_id: str) -> Row[ObligationState]:
    require_text("obligation_id", obligation_id)
    store.register(_K)
    row = store.get(_K, obligation_id)
    if row is None:
        raise UnknownEntity(_K.name, obligation_id)
    return row

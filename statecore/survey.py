"""The ledger as an operator reads it: rows per state, the oldest owed row, stuck rows and
whether their owners still live.

Plain reads over any :class:`~statecore.store.Store`, for the ``statecore`` command line and any
dashboard: nothing here writes.  Each function registers the obligation kind with the store
first (idempotent), so it works on a store nothing has opened a ledger on yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

import attrs

from statecore.checks import require_positive
from statecore.failures import stored_kind
from statecore.leases import OWNER_KIND, OwnerLeases
from statecore.lifecycles import OBLIGATION, ObligationState
from statecore.obligation import OBLIGATION_KIND, Obligation, Owner
from statecore.ownership import LivenessCache, ProcessProbe, PsutilProbe, host_identity
from statecore.policy import ErrorKind, LedgerPolicy
from statecore.store import Store, lt

__all__ = [
    "OWED_STATES",
    "SETTLED_STATES",
    "FailingRow",
    "LedgerStats",
    "OwnerStatus",
    "StuckRow",
    "failing_rows",
    "ledger_stats",
    "list_obligations",
    "owner_status",
    "stuck_rows",
]

_S = ObligationState
_K = OBLIGATION_KIND
SETTLED_STATES: frozenset[ObligationState] = OBLIGATION.terminal
"""Delivered and abandoned: nothing more is owed (from the declaration)."""
OWED_STATES: frozenset[ObligationState] = frozenset(OBLIGATION.states) - SETTLED_STATES
"""Pending, attempting and failed: a reply still owed (from the declaration)."""
_UNSETTLED_SEND = frozenset({_S.PENDING, _S.ATTEMPTING})


class OwnerStatus(StrEnum):
    """What can be said about the process recorded as a row's owner, from this host."""

    ALIVE = "alive"
    """A process of this host with the recorded pid and start time runs now."""
    DEAD = "dead"
    """Gone (its pid is free or now another process's), or on another host with an expired
    lease: the next gateway's startup sweep claims its owed rows."""
    REMOTE = "remote"
    """On another host and its lease has not expired (its heartbeat's, or the row's when it
    never beat): it cannot be probed from here."""
    UNOWNED = "unowned"
    """No owner is recorded (an operator's retry): any gateway's startup sweep claims it."""


def owner_status(
    owner: Owner,
    lease_expires_at: float | None,
    *,
    now: float,
    liveness: LivenessCache,
    host: str | None = None,
    leases: OwnerLeases | None = None,
) -> OwnerStatus:
    """The liveness of a row's recorded ``owner`` (with its lease), seen from ``host``
    (default: this host's identity), each owner probed once per ``liveness`` cache; with
    ``leases``, an owner on another host is judged by its heartbeat when it has one, as the
    sweeps judge it.  Never raises, but for ``StoreError`` when ``leases`` cannot be read."""
    if owner.pid is None and owner.token is None and owner.host is None:
        return OwnerStatus.UNOWNED
    here = host_identity() if host is None else host
    if owner.host is not None and owner.host != here:
        beating = (
            None if leases is None or owner.token is None else leases.beating(owner.token, now)
        )
        if beating is not None:
            return OwnerStatus.REMOTE if beating else OwnerStatus.DEAD
        lease = lease_expires_at
        return OwnerStatus.REMOTE if lease is None or lease > now else OwnerStatus.DEAD
    alive = liveness.alive(owner.pid, owner.started_at)
    return OwnerStatus.ALIVE if alive else OwnerStatus.DEAD


@attrs.frozen
class LedgerStats:
    """How many obligations are in each state, and the oldest one still owed."""

    counts: Mapping[ObligationState, int]
    """Every declared state, with 0 for an empty one, in declaration order."""
    oldest_owed: Obligation | None
    """The owed obligation recorded first, or None when nothing is owed."""
    now: float
    """When the counts were read (seconds since the epoch)."""

    @property
    def total(self) -> int:
        """Every stored obligation."""
        return sum(self.counts.values())

    @property
    def owed(self) -> int:
        """Obligations still owed (pending, attempting, failed)."""
        return sum(n for state, n in self.counts.items() if state in OWED_STATES)

    @property
    def oldest_owed_age_s(self) -> float | None:
        """Seconds since the oldest owed obligation was recorded (None: nothing owed); a value
        that keeps growing means nothing is delivering."""
        if self.oldest_owed is None:
            return None
        return max(0.0, self.now - self.oldest_owed.created_at)


def ledger_stats(store: Store, *, now: float) -> LedgerStats:
    """Count the obligations of ``store`` per state and find the oldest owed one, as of
    ``now``.  Raises ``StoreError`` when the store cannot be read."""
    store.register(_K)
    counts = {state: store.count(_K, states=(state,)) for state in OBLIGATION.states}
    oldest = store.select(_K, states=OWED_STATES, order_by="created_at", limit=1)
    return LedgerStats(counts, Obligation.from_row(oldest[0]) if oldest else None, now)


def list_obligations(
    store: Store,
    *,
    states: Iterable[ObligationState] | None = None,
    platform: str | None = None,
    limit: int | None = None,
) -> tuple[list[Obligation], int]:
    """The obligations in ``states`` (all when None) of ``platform`` (any when None), oldest
    first, at most ``limit``; and how many match without the limit.  Raises ``StoreError``
    when the store cannot be read, ``ValueError`` for a negative limit."""
    store.register(_K)
    chosen = None if states is None else frozenset(states)
    where: Mapping[str, object] | None = None if platform is None else {"platform": platform}
    rows = store.select(_K, states=chosen, where=where, order_by="created_at", limit=limit)
    total = len(rows) if limit is None else store.count(_K, states=chosen, where=where)
    return [Obligation.from_row(r) for r in rows], total


@attrs.frozen
class StuckRow:
    """An obligation left pending or attempting for too long, with its owner's liveness."""

    obligation: Obligation
    stuck_for_s: float
    """Seconds since the row last changed."""
    owner: OwnerStatus


def stuck_rows(
    store: Store,
    *,
    older_than_s: float,
    now: float,
    probe: ProcessProbe | None = None,
    limit: int | None = None,
) -> list[StuckRow]:
    """Obligations ``pending`` or ``attempting`` that have not changed for longer than
    ``older_than_s`` seconds (as of ``now``), oldest first, at most ``limit``, each with its
    owner's liveness asked through ``probe`` (default: :class:`PsutilProbe`).

    A stuck row of a dead owner waits for the next gateway's startup sweep; one of a live owner
    is a send that process lost track of.  Raises ``ValueError`` for an ``older_than_s`` that is
    not a positive finite number, ``StoreError`` when the store cannot be read.
    """
    require_positive("older_than_s", older_than_s)
    store.register(_K)
    store.register(OWNER_KIND)
    rows = store.select(
        _K,
        states=_UNSETTLED_SEND,
        where={"updated_at": lt(now - older_than_s)},
        order_by="updated_at",
        limit=limit,
    )
    liveness = LivenessCache(probe or PsutilProbe())
    here = host_identity()
    leases = OwnerLeases(store)
    found = []
    for row in rows:
        obligation = Obligation.from_row(row)
        status = owner_status(
            obligation.owner,
            obligation.lease_expires_at,
            now=now,
            liveness=liveness,
            host=here,
            leases=leases,
        )
        found.append(StuckRow(obligation, max(0.0, now - obligation.updated_at), status))
    return found


@attrs.frozen
class FailingRow:
    """An owed obligation whose send failed, with what happens to it next."""

    obligation: Obligation
    kind: ErrorKind
    """What the failure says about retrying (stored with it, else read from its text)."""
    retry_at: float | None
    """When the running gateway retries it (None: not by a timer, see :attr:`waits_for`)."""

    @property
    def keeps_failing(self) -> bool:
        """True when no retry of the running gateway will deliver it: the refusal is
        permanent, it failed again after a retry, or its in-process retries are spent."""
        if self.kind is ErrorKind.PERMANENT or self.obligation.attempts > 0:
            return True
        return self.kind is not ErrorKind.RECONNECT and self.retry_at is None

    @property
    def waits_for(self) -> str:
        """What it waits for, in words."""
        if self.kind is ErrorKind.PERMANENT:
            # Never retried in-process; the next gateway to start claims it again.
            return "an operator: refused, never retried in-process (fix it and restart, or abandon)"
        if self.kind is ErrorKind.RECONNECT:
            return "the platform's connection: resent when the gateway reconnects"
        if self.retry_at is None:
            return "a restart: in-process retries are spent"
        return "a retry by the running gateway"


def failing_rows(
    store: Store, *, policy: LedgerPolicy | None = None, limit: int | None = None
) -> list[FailingRow]:
    """The obligations in ``failed`` (owed, their last send refused or lost), oldest first, at
    most ``limit``, each with its kind under ``policy`` (default :class:`LedgerPolicy`) and its
    next timed retry.  Raises ``StoreError`` when the store cannot be read, ``ValueError`` for
    a negative limit."""
    store.register(_K)
    rules = policy or LedgerPolicy()
    rows = store.select(_K, states=(_S.FAILED,), order_by="created_at", limit=limit)
    return [
        FailingRow(Obligation.from_row(row), stored_kind(rules, row), row["next_attempt_at"])
        for row in rows
    ]

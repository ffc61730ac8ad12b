"""Owner leases across hosts: a heartbeat record per owner, renewed while it runs.

An owner on another host cannot be probed; it is judged by a lease.  A row's own
``lease_expires_at`` is written when the row is recorded or claimed and never renewed (renewing
it would bump the row's fence and make the owner's own in-flight settle stale), so a
long-lived owner would look dead after ``lease_s``.  Instead each ledger that runs keeps one
**owner record** (:data:`OWNER_KIND`) and renews its lease with a *beat*:

* ``join`` creates the record (alive) with ``lease_expires_at = now + lease_s``; ``beat``
  (alive -> alive) moves the lease on; ``leave`` (alive -> gone) ends it on a clean stop, so
  peers may reclaim at once; ``expire`` (alive -> gone) is housekeeping's, for records whose
  lease ended long ago; ``prune`` deletes gone records past the retention.
* A record belongs to one ledger (its id is the owner token plus a random suffix): several
  ledgers of one process incarnation share the token, and the owner is alive while **any** of
  its records is alive with an unexpired lease.
* The sweeps judge an owner on another host by its records (:func:`judged_alive`): alive iff
  one of them is alive and its lease has not expired; an owner with no record at all (it never
  beat) by the row's own lease, as before.  Owners on this host are still judged by the process
  probe at once.

Judging only decides which rows a sweep *considers*: every claim is one guarded write under the
fence the row was read with, and every settle is guarded by the owner token and the fence, so a
paused owner that resumes after its rows were re-claimed cannot settle them, whatever its lease
said.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from statecore.entity import EntityKind, Field, Index
from statecore.errors import InvalidTransition, StaleState, UnknownEntity
from statecore.lifecycle import Lifecycle, Transition
from statecore.ownership import Incarnation, LivenessCache, recorded_owner_alive
from statecore.store import Audit, Store, lt

__all__ = [
    "OWNER",
    "OWNER_KIND",
    "Heartbeat",
    "OwnerLeases",
    "OwnerState",
    "judged_alive",
    "prune_owner_records",
]

log = logging.getLogger("statecore.ledger")


class OwnerState(StrEnum):
    """The owner record of one running ledger."""

    ALIVE = "alive"
    """Running: alive to its peers while its lease lasts."""
    GONE = "gone"
    """Terminal: stopped cleanly (or expired by housekeeping): its rows may be reclaimed."""


_A, _G = OwnerState.ALIVE, OwnerState.GONE

OWNER: Lifecycle[OwnerState] = Lifecycle(
    "owner",
    OwnerState,
    initial=_A,
    terminal=(_G,),
    description="The heartbeat of one running ledger: its lease, renewed while it runs.",
    transitions=(
        Transition("join", None, _A),
        # Renewal: only the lease moves (the owner's rows are never touched to renew).
        Transition("beat", _A, _A),
        # A clean stop: peers may reclaim the owner's rows at once.
        Transition("leave", _A, _G),
        # Housekeeping: a record whose lease ended long ago (its owner died without leaving).
        Transition("expire", _A, _G),
        Transition("prune", _G, None),
    ),
)

OWNER_KIND: EntityKind[OwnerState] = EntityKind(
    "owner",
    OWNER,
    table="statecore_owners",
    id_field="record_id",
    fields=(
        Field("owner_token", str, nullable=False, immutable=True),
        Field("owner_host", str, immutable=True),
        Field("owner_pid", int, immutable=True),
        Field("owner_started_at", int, immutable=True),
        Field("created_at", float, nullable=False, immutable=True),
        Field("updated_at", float, nullable=False),
        Field("lease_expires_at", float, nullable=False),
    ),
    indexes=(Index(("owner_token",)),),
)
"""The persisted owner records (one per running ledger), keyed by ``record_id``."""

_ROTATE_AFTER = 1000
"""Beats after which a record is replaced by a new one (the old one leaves): every beat adds
an audit entry, and a record's history is deleted only with the record."""


class Heartbeat:
    """The owner record of one ledger: :meth:`beat` joins or renews it, :meth:`leave` ends it.

    ``Heartbeat(store, incarnation, *, lease_s, label)``; ``store`` must have
    :data:`OWNER_KIND` registered.  Safe to use from several threads.
    """

    def __init__(self, store: Store, incarnation: Incarnation, *, lease_s: float, label: str):
        self._store = store
        self._me = incarnation
        self._lease_s = lease_s
        self._label = label
        self._lock = threading.Lock()
        self._record: str | None = None  # this ledger's alive record, once joined

    @property
    def record_id(self) -> str | None:
        """The id of this ledger's alive owner record (None before the first beat or after
        :meth:`leave`)."""
        return self._record

    def beat(self, now: float) -> float:
        """Renew the lease to ``now + lease_s`` (joining with a new record on the first beat,
        after :meth:`leave`, or when a peer's housekeeping ended the record); returns the new
        expiry.  Call again well before it (the gateway beats every ``lease_s / 3``).  Raises
        ``StoreError`` when the store fails (the lease is then unchanged)."""
        expires = now + self._lease_s
        with self._lock:
            record = self._record
            if record is not None:
                try:
                    row = self._store.transition(
                        OWNER_KIND,
                        record,
                        "beat",
                        audit=Audit(now, self._label),
                        changes={"updated_at": now, "lease_expires_at": expires},
                    )
                except (InvalidTransition, StaleState, UnknownEntity):
                    # Ended by housekeeping while this process was paused past its lease:
                    # peers may have reclaimed rows (their writes fence ours out); join anew.
                    log.warning(
                        "owner record %s was ended while this process was not beating "
                        "(paused past its lease?); joining again",
                        record,
                        extra={"owner_record": record},
                    )
                    self._record = None
                else:
                    if row.fence < _ROTATE_AFTER:
                        return expires
                    self._record = None
                    self._join(now, expires)
                    self._end(record, now, "rotated")
                    return expires
            self._join(now, expires)
            return expires

    def leave(self, now: float) -> bool:
        """End this ledger's record (alive -> gone) so that peers on other hosts may reclaim
        its owner's rows at once (when no other record of the owner is alive).  Returns
        whether a record was ended.  Call when the ledger stops for good; a later
        :meth:`beat` joins again.  Raises ``StoreError`` when the store fails."""
        with self._lock:
            record, self._record = self._record, None
            return record is not None and self._end(record, now, "stopped")

    def _join(self, now: float, expires: float) -> None:
        me = self._me
        # The token names the owner; the suffix tells apart the ledgers that share it.
        record = f"{me.token}.{secrets.token_hex(4)}"
        self._store.insert(
            OWNER_KIND,
            record,
            {
                "owner_token": me.token,
                "owner_host": me.host,
                "owner_pid": me.pid,
                "owner_started_at": me.started_at,
                "created_at": now,
                "updated_at": now,
                "lease_expires_at": expires,
            },
            event="join",
            audit=Audit(now, self._label),
        )
        self._record = record

    def _end(self, record: str, now: float, why: str) -> bool:
        try:
            self._store.transition(
                OWNER_KIND,
                record,
                "leave",
                audit=Audit(now, self._label, reason=why),
                changes={"updated_at": now},
            )
        except (InvalidTransition, StaleState, UnknownEntity):
            return False  # ended already (expired by housekeeping, or pruned)
        return True


class OwnerLeases:
    """What the owner records say about owner tokens, each token read once per instance.

    Create one per sweep: answers are not refreshed.
    """

    __slots__ = ("_answers", "_store", "reads")

    def __init__(self, store: Store) -> None:
        self._store = store
        self._answers: dict[tuple[str, float], bool | None] = {}
        self.reads = 0
        """How many tokens were actually read."""

    def beating(self, token: str, now: float) -> bool | None:
        """True when a record of ``token`` is alive with a lease past ``now``; False when it
        has records and none is; None when it has none (it never beat, or they were pruned).
        Raises ``StoreError`` when the store cannot be read."""
        key = (token, now)
        if key in self._answers:
            return self._answers[key]
        self.reads += 1
        records = self._store.select(OWNER_KIND, where={"owner_token": token})
        answer = (
            None
            if not records
            else any(r.state is _A and r["lease_expires_at"] > now for r in records)
        )
        self._answers[key] = answer
        return answer


def judged_alive(
    owner: Mapping[str, Any],
    me: Incarnation,
    liveness: LivenessCache,
    leases: OwnerLeases,
    now: float,
) -> bool:
    """Whether the owner recorded in a row's ``owner_*`` / ``lease_expires_at`` columns lives.

    This incarnation is alive by definition; an owner on another host is alive while a record
    of its token beats (:meth:`OwnerLeases.beating`), or -- when it has no record -- while the
    row's own lease lasts; an owner on this host is judged by the process probe, at once
    (:func:`~statecore.ownership.recorded_owner_alive`).  Raises ``StoreError`` when the owner
    records cannot be read.
    """
    token = owner["owner_token"]
    host = owner["owner_host"]
    if token is not None and token != me.token and host is not None and host != me.host:
        beating = leases.beating(token, now)
        if beating is not None:
            return beating
    return recorded_owner_alive(owner, me, liveness, now)


def prune_owner_records(store: Store, *, now: float, retention: float, label: str) -> int:
    """Housekeeping of the owner records: expire alive records whose lease ended more than
    ``retention`` ago (their owners died without leaving), then delete gone records last
    written more than ``retention`` ago, with their history.  Returns how many were deleted.

    A record deleted no longer speaks for its token: rows of that owner fall back to their own
    leases, which ended long before when ``retention`` is at least ``lease_s`` (otherwise they
    could briefly delay a reclaim, never hasten one).  Raises ``StoreError`` when the store
    fails.
    """
    cutoff = now - retention
    for row in store.select(OWNER_KIND, states=(_A,), where={"lease_expires_at": lt(cutoff)}):
        try:
            # Under the fence it was read with: a beat in between wins.
            store.transition(
                OWNER_KIND,
                row.id,
                "expire",
                audit=Audit(now, label, reason="lease ended long ago"),
                fence=row.fence,
                changes={"updated_at": now},
            )
        except (InvalidTransition, StaleState, UnknownEntity):
            continue
    return store.prune(OWNER_KIND, "prune", where={"updated_at": lt(cutoff)})

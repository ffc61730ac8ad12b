"""Egress provenance: the chats and users a gateway may address when no tenants table is set.

Without a tenants table the connector cannot know which chats belong to which gateway, so the
safe default is provenance: a gateway may send to a chat (or a user) only after the connector
delivered -- live or into the buffer -- an inbound event from it to that gateway.  The pairs are
remembered durably, so a connector restart does not lock a gateway out of its own chats, and
kept in memory as a set, so the guard costs one lookup per outbound action.  A store write
happens only the first time a (gateway, platform, target) is seen.  A target an operator made
the connector forget is deleted by the connector's housekeeping once it was forgotten longer
ago than the retention (:meth:`Provenance.prune`); a known target is never deleted.  A
forgotten target the gateway receives from again is learned again (its old row is replaced).

Connector nodes sharing the store (a cluster): a node that does not hold a target asks the store
before it declines (:meth:`Provenance.recheck`), and a forget on one node reaches every other:
it is announced in the forget's transaction (:attr:`Provenance.announce_forget`), each peer then
reads that row again (:meth:`Provenance.reread`), and the sweep re-reads the forgotten rows a
page at a time (:meth:`Provenance.reread_forgotten`) for a notice that was lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from enum import StrEnum

from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind, Field, Index
from statecore.ids import composite_id
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit, Row, Store, gt, lt

__all__ = ["PROVENANCE", "PROVENANCE_KIND", "Provenance", "ProvenanceState"]


class ProvenanceState(StrEnum):
    """One target (chat or user id) a gateway received inbound from."""

    KNOWN = "known"
    """The gateway may address this target."""
    FORGOTTEN = "forgotten"
    """Terminal: an operator withdrew it; the gateway must receive from it again first."""


_P = ProvenanceState

PROVENANCE: Lifecycle[ProvenanceState] = Lifecycle(
    "provenance",
    ProvenanceState,
    initial=_P.KNOWN,
    terminal=(_P.FORGOTTEN,),
    description="A chat or user a gateway received inbound from, so it may answer there.",
    transitions=(
        Transition("learn", None, _P.KNOWN),
        Transition("forget", _P.KNOWN, _P.FORGOTTEN),
        Transition("prune", _P.FORGOTTEN, None),
    ),
)

PROVENANCE_KIND: EntityKind[ProvenanceState] = EntityKind(
    "egress_provenance",
    PROVENANCE,
    table="relay_egress_provenance",
    id_field="provenance_id",
    fields=(
        Field("gateway_id", str, nullable=False, immutable=True),
        Field("platform", str, nullable=False, immutable=True),
        Field("target", str, nullable=False, immutable=True),
        Field("first_seen", float, nullable=False, immutable=True),
        # When an operator withdrew it (None: known, or forgotten before this field existed).
        Field("forgotten_at", float),
    ),
    indexes=(Index(("gateway_id",)),),
)


class Provenance:
    """The durable provenance memory over any Store.

    :meth:`allows` and :meth:`unknown` are cheap in-memory reads safe on the event loop;
    :meth:`learn` and :meth:`forget` write the store, the re-reads read it (call them off the
    loop).

    ``announce_forget`` (None: a lone connector) is called as ``announce_forget(gateway_id,
    platform, target)`` inside the transaction of every forget, so that a cluster node can tell
    its peers (sent on commit); it must not raise but for a ``StoreError``.
    """

    def __init__(self, store: Store, *, clock: Clock | None = None) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        store.register(PROVENANCE_KIND)
        # Held by every change of memory; a re-read holds it from its read to its last change,
        # so a read that began before a learn of this process can never undo that learn.
        self._lock = threading.Lock()
        self.announce_forget: Callable[[str, str, str], None] | None = None
        self._known: set[tuple[str, str, str]] = {
            (row["gateway_id"], row["platform"], row["target"])
            for row in store.select(PROVENANCE_KIND, states=(_P.KNOWN,))
        }

    def allows(self, gateway_id: str, platform: str, target: str) -> bool:
        """True when ``gateway_id`` received inbound from ``target`` (a chat or user id) on
        ``platform``."""
        return (gateway_id, platform, target) in self._known

    def unknown(self, gateway_id: str, platform: str, targets: Iterable[str | None]) -> list[str]:
        """The ``targets`` (None skipped) not yet known for ``gateway_id`` on ``platform``."""
        known = self._known
        return [t for t in dict.fromkeys(targets) if t and (gateway_id, platform, t) not in known]

    def recheck(self, gateway_id: str, platform: str, target: str) -> bool:
        """Read the store for one target this memory does not hold (learned by another
        connector sharing the store, a cluster node) and remember it when it is known there;
        return whether it is allowed now.  Off the loop (a store read); raises ``StoreError``
        when the store cannot be read."""
        if self.allows(gateway_id, platform, target):
            return True
        row = self.store.get(PROVENANCE_KIND, _key(gateway_id, platform, target))
        if row is None or row.state is not _P.KNOWN:
            return False
        with self._lock:
            self._known.add((gateway_id, platform, target))
        return True

    def learn(self, gateway_id: str, platform: str, targets: Iterable[str]) -> int:
        """Remember ``targets`` for ``gateway_id`` on ``platform`` (idempotent); return how many
        were new.  Raises ``StoreError`` when the store cannot record them (nothing is then
        remembered in memory either, so the guard never allows what the store does not hold)."""
        fresh = self.unknown(gateway_id, platform, targets)
        if not fresh:
            return 0
        now = self.clock.now()
        with self.store.atomic():
            for target in fresh:
                values = {
                    "gateway_id": gateway_id,
                    "platform": platform,
                    "target": target,
                    "first_seen": now,
                }
                key = _key(gateway_id, platform, target)
                audit = Audit(now, gateway_id)
                row, created = self.store.insert(
                    PROVENANCE_KIND, key, values, event="learn", audit=audit
                )
                if not created and row.state is _P.FORGOTTEN:
                    # Forgotten once, received from again: it starts over (prune, learn).
                    where = {"gateway_id": gateway_id, "platform": platform, "target": target}
                    self.store.prune(PROVENANCE_KIND, "prune", where=where)
                    self.store.insert(PROVENANCE_KIND, key, values, event="learn", audit=audit)
        with self._lock:
            self._known.update((gateway_id, platform, t) for t in fresh)
        return len(fresh)

    def forget(self, gateway_id: str, platform: str, target: str) -> None:
        """Withdraw one target from ``gateway_id`` (every node of a cluster stops allowing it:
        see ``announce_forget``).  Raises ``InvalidTransition`` when it is not known,
        ``StoreError`` when the store fails (memory is then left as it was)."""
        now = self.clock.now()
        with self.store.atomic():
            self.store.transition(
                PROVENANCE_KIND,
                _key(gateway_id, platform, target),
                "forget",
                audit=Audit(now, gateway_id),
                changes={"forgotten_at": now},
            )
            if self.announce_forget is not None:
                self.announce_forget(gateway_id, platform, target)
        with self._lock:
            self._known.discard((gateway_id, platform, target))

    def reread(self, gateway_id: str, platform: str, target: str) -> bool:
        """Read one target's row into memory (a peer may have learned or forgotten it) and
        return whether it is allowed now.  Off the loop; raises ``StoreError`` when the store
        cannot be read (memory is then left as it was)."""
        with self._lock:
            row = self.store.get(PROVENANCE_KIND, _key(gateway_id, platform, target))
            self._apply(row, (gateway_id, platform, target))
            return (gateway_id, platform, target) in self._known

    def reread_forgotten(self, after: str, *, limit: int = 1000) -> str:
        """Drop from memory the forgotten targets among up to ``limit`` forgotten rows, in id
        order after the id ``after`` ("" from the start); return the id to pass next, "" once
        the end was reached (passing back what it returned re-reads them all, page by page).
        Off the loop; raises ``StoreError`` (memory is then left as it was)."""
        where = {PROVENANCE_KIND.id_field: gt(after)} if after else None
        with self._lock:
            rows = self.store.select(
                PROVENANCE_KIND, states=(_P.FORGOTTEN,), where=where, limit=limit
            )
            for row in rows:
                self._apply(row, (row["gateway_id"], row["platform"], row["target"]))
        return rows[-1].id if len(rows) == limit else ""

    def _apply(self, row: Row[ProvenanceState] | None, known: tuple[str, str, str]) -> None:
        """Make memory say what ``row`` (as just read) says; the caller holds the lock."""
        if row is not None and row.state is _P.KNOWN:
            self._known.add(known)
        else:
            self._known.discard(known)

    def prune(self, *, older_than_s: float) -> int:
        """Delete the targets forgotten more than ``older_than_s`` ago, with their history;
        return how many.  A known target is never deleted."""
        cutoff = self.clock.now() - older_than_s
        return self.store.prune(PROVENANCE_KIND, "prune", where={"forgotten_at": lt(cutoff)})


def _key(gateway_id: str, platform: str, target: str) -> str:
    return composite_id(gateway_id, platform, target)

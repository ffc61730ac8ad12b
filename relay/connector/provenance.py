"""Egress provenance: the chats and users a gateway may address when no tenants table is set.

Without a tenants table the connector cannot know which chats belong to which gateway, so the
safe default is provenance: a gateway may send to a chat (or a user) only after the connector
delivered -- live or into the buffer -- an inbound event from it to that gateway.  The pairs are
remembered durably, so a connector restart does not lock a gateway out of its own chats, and
kept in memory as a set, so the guard costs one lookup per outbound action.  A store write
happens only the first time a (gateway, platform, target) is seen.  A target an operator made
the connector forget is deleted by the connector's housekeeping once it was forgotten longer
ago than the retention (:meth:`Provenance.prune`); a known target is never deleted.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from enum import StrEnum

from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind, Field, Index
from statecore.ids import composite_id
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit, Store, lt

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
    :meth:`learn` and :meth:`forget` write the store (call them off the loop).
    """

    def __init__(self, store: Store, *, clock: Clock | None = None) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        store.register(PROVENANCE_KIND)
        self._lock = threading.Lock()
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
                self.store.insert(
                    PROVENANCE_KIND,
                    _key(gateway_id, platform, target),
                    {
                        "gateway_id": gateway_id,
                        "platform": platform,
                        "target": target,
                        "first_seen": now,
                    },
                    event="learn",
                    audit=Audit(now, gateway_id),
                )
        with self._lock:
            self._known.update((gateway_id, platform, t) for t in fresh)
        return len(fresh)

    def forget(self, gateway_id: str, platform: str, target: str) -> None:
        """Withdraw one target from ``gateway_id``.  Raises ``InvalidTransition`` when it is not
        known."""
        now = self.clock.now()
        self.store.transition(
            PROVENANCE_KIND,
            _key(gateway_id, platform, target),
            "forget",
            audit=Audit(now, gateway_id),
            changes={"forgotten_at": now},
        )
        with self._lock:
            self._known.discard((gateway_id, platform, target))

    def prune(self, *, older_than_s: float) -> int:
        """Delete the targets forgotten more than ``older_than_s`` ago, with their history;
        return how many.  A known target is never deleted."""
        cutoff = self.clock.now() - older_than_s
        return self.store.prune(PROVENANCE_KIND, "prune", where={"forgotten_at": lt(cutoff)})


def _key(gateway_id: str, platform: str, target: str) -> str:
    return composite_id(gateway_id, platform, target)

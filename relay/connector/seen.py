"""The connector's durable inbound dedupe: the platform event ids it has already taken.

A platform redelivers an event whose cursor a driver had not moved yet (a crash, a late ack,
a webhook retry).  The connector takes each event with a ``message_id`` under the key
``(platform, message_id)``, written in the same store transaction as the event's buffer
appends (or its hold), so a crash can never leave a key without its event nor let a second
copy be routed.  A copy whose key is already taken is not routed again.

Keys are kept for a retention longer than the platform's longest redelivery window, then
forgotten and deleted by the connector's housekeeping (:meth:`SeenKeys.prune`).  The store is
the truth: an in-memory cache of the keys this process took recently only lets the hot path
skip a copy without queueing any store work; a key not in the cache is checked by its insert
inside the write transaction (no read of its own).
"""

from __future__ import annotations

import collections
import threading
from enum import StrEnum

from relay.wire.frames import InboundEvent
from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind, Field, Index
from statecore.ids import composite_id
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit, Store, lt

__all__ = ["CACHE_MAX", "SEEN", "SEEN_KIND", "SeenKeys", "SeenState"]

CACHE_MAX = 100_000
"""Keys the in-memory cache holds at most (the most recently taken); older ones are still
recognised, by the store."""


class SeenState(StrEnum):
    """One platform event id the connector took."""

    TAKEN = "taken"
    """Taken, with the event's buffer appends or hold: a copy is not routed again."""
    FORGOTTEN = "forgotten"
    """Terminal: older than the retention (no platform redelivers it any more)."""


_S = SeenState

SEEN: Lifecycle[SeenState] = Lifecycle(
    "inbound_seen",
    SeenState,
    initial=_S.TAKEN,
    terminal=(_S.FORGOTTEN,),
    description="A platform event id the connector took, so a redelivered copy is not routed.",
    transitions=(
        Transition("take", None, _S.TAKEN),
        Transition("forget", _S.TAKEN, _S.FORGOTTEN),
        Transition("prune", _S.FORGOTTEN, None),
    ),
)

SEEN_KIND: EntityKind[SeenState] = EntityKind(
    "inbound_seen",
    SEEN,
    table="relay_inbound_seen",
    id_field="seen_key",
    fields=(
        Field("platform", str, nullable=False, immutable=True),
        Field("event_id", str, nullable=False, immutable=True),
        Field("taken_at", float, nullable=False, immutable=True),
    ),
    indexes=(Index(("taken_at",)),),
)


class SeenKeys:
    """The taken keys over any Store (see the module docs).

    :meth:`key` and :meth:`cached` are in-memory, safe on the event loop; :meth:`take` runs
    inside the store thread's write transaction, :meth:`remember` once it committed, and
    :meth:`prune` in the housekeeping round.
    """

    def __init__(self, store: Store, *, clock: Clock | None = None) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        store.register(SEEN_KIND)
        self._lock = threading.Lock()
        # The keys this process took, oldest first; bounded by CACHE_MAX.
        self._cache: collections.OrderedDict[str, None] = collections.OrderedDict()

    @staticmethod
    def key(platform: str, event: InboundEvent) -> str | None:
        """The dedupe key of ``event`` (None: it has no message id and is not deduped)."""
        if not event.message_id:
            return None
        return composite_id(platform, event.message_id)

    def cached(self, key: str) -> bool:
        """True when this process took ``key`` recently (a False is no proof it is new)."""
        return key in self._cache

    def known(self, key: str) -> bool:
        """True when ``key`` is stored (taken, or forgotten and not yet deleted).  Raises
        ``StoreError``."""
        return self.store.get(SEEN_KIND, key) is not None

    def take(self, key: str, platform: str, event_id: str) -> bool:
        """Take ``key`` in the caller's transaction; True when it is new, False when it was
        taken before (the event is a copy: route nothing for it).  Raises ``StoreError``."""
        now = self.clock.now()
        _, created = self.store.insert(
            SEEN_KIND,
            key,
            {"platform": platform, "event_id": event_id, "taken_at": now},
            event="take",
            audit=Audit(now, platform),
        )
        return created

    def remember(self, keys: list[str]) -> None:
        """Put keys whose transaction committed into the cache (never before: the cache must
        not hold what the store does not)."""
        if not keys:
            return
        with self._lock:
            cache = self._cache
            for key in keys:
                cache[key] = None
                cache.move_to_end(key)
            while len(cache) > CACHE_MAX:
                cache.popitem(last=False)

    def count(self) -> int:
        """Keys taken and not yet forgotten."""
        return self.store.count(SEEN_KIND, states=(_S.TAKEN,))

    def prune(self, *, older_than_s: float) -> int:
        """Forget and delete the keys taken more than ``older_than_s`` ago, in one
        transaction; return how many were deleted.  Raises ``StoreError``."""
        cutoff = self.clock.now() - older_than_s
        stale = self.store.select(SEEN_KIND, states=(_S.TAKEN,), where={"taken_at": lt(cutoff)})
        now = self.clock.now()
        with self.store.atomic():
            if stale:
                self.store.transition_many(
                    SEEN_KIND,
                    [row.id for row in stale],
                    "forget",
                    audit=Audit(now, reason=f"older than {older_than_s:g} s"),
                )
            pruned = self.store.prune(SEEN_KIND, "prune", where={"taken_at": lt(cutoff)})
        with self._lock:
            for row in stale:
                self._cache.pop(row.id, None)
        return pruned

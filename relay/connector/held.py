"""Inbound events no gateway listens to yet, held durably until one says hello.

Behind a real platform an event for which no gateway is subscribed is not a loss: a restarted
connector reads the platform's backlog before any gateway said hello.  Such an event is
``held`` here (bounded by the connector's ``max_held``: when the hold is full the intake
refuses the event and the platform keeps it).  When a gateway says hello for the platform,
every held event of that platform whose audience now includes it is appended to its buffer,
in the order the events were held, and ``released`` in the same transaction, before the
gateway's replay starts.  An event held longer than the buffer's retention ``expired``
(counted, logged at WARNING).  Released and expired entries are deleted by the housekeeping
once settled longer ago than ``buffer_retention_s``.  The lifecycle is declared once
(:data:`HOLD`) and enforced by the store like every other.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Sequence
from enum import StrEnum

import attrs

from relay.wire.codec import decode_event, encode_event
from relay.wire.frames import InboundEvent
from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind, Field, Index
from statecore.errors import InvalidTransition, StaleState
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit, Row, Store, ge, lt

__all__ = ["HOLD", "HOLD_KIND", "HeldEvent", "HeldEvents", "HeldState"]

log = logging.getLogger(__name__)


class HeldState(StrEnum):
    """One inbound event held for a gateway that has not said hello yet."""

    HELD = "held"
    """No gateway listened to its platform (or its scope) when it arrived."""
    RELEASED = "released"
    """Terminal: copied into the buffer of the first gateway of its audience that said hello."""
    EXPIRED = "expired"
    """Terminal: held longer than the buffer's retention (counted and logged)."""


_H = HeldState

HOLD: Lifecycle[HeldState] = Lifecycle(
    "held_inbound",
    HeldState,
    initial=_H.HELD,
    terminal=(_H.RELEASED, _H.EXPIRED),
    description="An inbound event no gateway listened to, held until one says hello.",
    transitions=(
        Transition("hold", None, _H.HELD),
        Transition("release", _H.HELD, _H.RELEASED),
        Transition("expire", _H.HELD, _H.EXPIRED),
        Transition("prune", (_H.RELEASED, _H.EXPIRED), None),
    ),
)

HOLD_KIND: EntityKind[HeldState] = EntityKind(
    "held_inbound",
    HOLD,
    table="relay_held_inbound",
    id_field="held_id",
    fields=(
        Field("platform", str, nullable=False, immutable=True),
        Field("seq", int, nullable=False, immutable=True),
        Field("event_json", str, nullable=False, immutable=True),
        Field("created_at", float, nullable=False, immutable=True),
        Field("updated_at", float, nullable=False),
        # The gateway whose buffer it went to (None until released).
        Field("gateway_id", str),
    ),
    indexes=(
        Index(("platform", "seq"), states=frozenset({_H.HELD})),
        Index(("updated_at",), states=HOLD.terminal),
    ),
)


@attrs.frozen
class HeldEvent:
    """One held event, as a release reads it."""

    held_id: str
    platform: str
    seq: int
    event: InboundEvent
    created_at: float


class HeldEvents:
    """The hold over any Store (synchronous: the connector calls it on its store thread)."""

    def __init__(self, store: Store, *, clock: Clock | None = None) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        store.register(HOLD_KIND)
        self.expired_total = 0
        """Entries expired by this process (also logged at WARNING)."""
        self._lock = threading.Lock()
        self._prefix = secrets.token_hex(3)
        self._seq: int | None = None

    def _next_seq(self) -> int:
        """Hold order: strictly increasing in the process, never below the clock's time in
        nanoseconds, and above every seq already stored (see ``InboundBuffer._next_seq``)."""
        with self._lock:
            now_ns = int(self.clock.now() * 1e9)
            if self._seq is None:
                rows = self.store.select(HOLD_KIND, where={"seq": ge(now_ns)}, order_by="seq")
                self._seq = int(rows[-1]["seq"]) if rows else now_ns - 1
            self._seq = max(self._seq + 1, now_ns)
            return self._seq

    def hold(self, platform: str, event: InboundEvent) -> str:
        """Hold ``event`` of ``platform`` (in the caller's transaction); return its id.
        The caller checks the bound first (:meth:`count`).  Raises ``StoreError``."""
        seq = self._next_seq()
        held_id = f"{self._prefix}-{seq:x}"
        now = self.clock.now()
        self.store.insert(
            HOLD_KIND,
            held_id,
            {
                "platform": platform,
                "seq": seq,
                "event_json": encode_event(event.to_wire()),
                "created_at": now,
                "updated_at": now,
            },
            event="hold",
            audit=Audit(now, platform),
        )
        return held_id

    def count(self, platform: str | None = None) -> int:
        """Entries held (of ``platform``; None: of every platform)."""
        where = None if platform is None else {"platform": platform}
        return self.store.count(HOLD_KIND, states=(_H.HELD,), where=where)

    def waiting(self, platform: str) -> list[HeldEvent]:
        """Every entry held for ``platform``, in the order they were held."""
        rows = self.store.select(
            HOLD_KIND, states=(_H.HELD,), where={"platform": platform}, order_by="seq"
        )
        return [_held(row) for row in rows]

    def release(self, held_ids: Sequence[str], gateway_id: str) -> list[str]:
        """Record these entries as released to ``gateway_id`` (in the caller's transaction,
        with the buffer appends); return the ids released, in order -- one released or
        expired meanwhile (another node) is skipped."""
        if not held_ids:
            return []
        now = self.clock.now()
        rows = self.store.transition_many(
            HOLD_KIND,
            list(held_ids),
            "release",
            audit=Audit(now, gateway_id),
            changes={"updated_at": now, "gateway_id": gateway_id},
        )
        return [row.id for row in rows]

    def expire(self, *, older_than_s: float) -> dict[str, int]:
        """Expire the entries held more than ``older_than_s`` ago; return how many of each
        platform (logged at WARNING: no gateway said hello for them in time)."""
        now = self.clock.now()
        stale = self.store.select(
            HOLD_KIND, states=(_H.HELD,), where={"created_at": lt(now - older_than_s)}
        )
        expired = 0
        platforms: dict[str, int] = {}
        with self.store.atomic():
            for row in stale:
                try:
                    self.store.transition(
                        HOLD_KIND,
                        row.id,
                        "expire",
                        audit=Audit(now, None, reason=f"held longer than {older_than_s:g} s"),
                        fence=row.fence,
                        changes={"updated_at": now},
                    )
                    expired += 1
                    platforms[row["platform"]] = platforms.get(row["platform"], 0) + 1
                except (InvalidTransition, StaleState):
                    continue
        if expired:
            self.expired_total += expired
            log.warning(
                "held inbound: %d events expired, no gateway said hello for them within %g s",
                expired,
                older_than_s,
                extra={"expired": expired},
            )
        return platforms

    def prune(self, *, older_than_s: float) -> int:
        """Delete released and expired entries settled more than ``older_than_s`` ago; a held
        one is never deleted (it expires first)."""
        cutoff = self.clock.now() - older_than_s
        return self.store.prune(HOLD_KIND, "prune", where={"updated_at": lt(cutoff)})


def _held(row: Row[HeldState]) -> HeldEvent:
    return HeldEvent(
        held_id=row.id,
        platform=row["platform"],
        seq=row["seq"],
        event=decode_event(row["event_json"]),
        created_at=row["created_at"],
    )

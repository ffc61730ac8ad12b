"""Inbound events a driver could not map, recorded for operators instead of dropped.

A driver that receives something it cannot turn into an :class:`~relay.wire.frames.InboundEvent`
(an unknown event type, a malformed payload) calls ``intake.reject(platform, raw, reason,
event_id=...)``: the raw form (cut to :data:`MAX_REJECTED_RAW_CHARS`), the reason and the
platform's id for it are recorded here, and the driver moves on (its cursor too: the record
is the event's durable trace).  A record with an event id is written once however often the
platform redelivers it.  An operator lists them (``statecore buffer rejected``) and dismisses
them; dismissed records are deleted by the housekeeping once dismissed longer ago than
``buffer_retention_s``.  The lifecycle is :data:`REJECTED`.
"""

from __future__ import annotations

import secrets
from enum import StrEnum

import attrs

from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind, Field, Index
from statecore.ids import composite_id
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit, Store, lt

__all__ = [
    "MAX_REJECTED_RAW_CHARS",
    "MAX_REJECTED_REASON_CHARS",
    "REJECTED",
    "REJECTED_KIND",
    "RejectedEvent",
    "RejectedEvents",
    "RejectedState",
]

MAX_REJECTED_RAW_CHARS = 16_384
"""The longest raw form kept for a rejected event; a longer one is kept cut, with its length."""
MAX_REJECTED_REASON_CHARS = 1000
"""The longest reason kept."""
_MAX_EVENT_ID = 512


class RejectedState(StrEnum):
    """An inbound event a driver could not map, kept for an operator."""

    RECORDED = "recorded"
    """Recorded; waiting for an operator."""
    DISMISSED = "dismissed"
    """Terminal: an operator has seen it."""


_R = RejectedState

REJECTED: Lifecycle[RejectedState] = Lifecycle(
    "rejected_inbound",
    RejectedState,
    initial=_R.RECORDED,
    terminal=(_R.DISMISSED,),
    description="An inbound event a platform driver could not map, kept for an operator.",
    transitions=(
        Transition("record", None, _R.RECORDED),
        Transition("dismiss", _R.RECORDED, _R.DISMISSED),
        Transition("prune", _R.DISMISSED, None),
    ),
)

REJECTED_KIND: EntityKind[RejectedState] = EntityKind(
    "rejected_inbound",
    REJECTED,
    table="relay_rejected_inbound",
    id_field="record_id",
    fields=(
        Field("platform", str, nullable=False, immutable=True),
        Field("event_id", str, immutable=True),
        Field("reason", str, nullable=False, immutable=True),
        Field("raw", str, nullable=False, immutable=True),
        # The raw form's length as received (``raw`` may be cut).
        Field("raw_chars", int, nullable=False, immutable=True),
        Field("recorded_at", float, nullable=False, immutable=True),
        Field("dismissed_at", float),
    ),
    indexes=(Index(("recorded_at",)),),
)


@attrs.frozen
class RejectedEvent:
    """One rejected event as recorded."""

    record_id: str
    platform: str
    event_id: str | None
    reason: str
    raw: str
    """The raw form as received, cut to :data:`MAX_REJECTED_RAW_CHARS`."""
    raw_chars: int
    recorded_at: float
    state: RejectedState


class RejectedEvents:
    """The rejected records over any Store (synchronous: call it off the event loop)."""

    def __init__(self, store: Store, *, clock: Clock | None = None) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        store.register(REJECTED_KIND)

    @staticmethod
    def check(platform: object, raw: object, reason: object, event_id: object) -> None:
        """Refuse bad input before anything is written: ``TypeError`` for a value of the
        wrong kind, ``ValueError`` for an empty platform or reason or an event id longer than
        512 characters."""
        for name, value in (("platform", platform), ("raw", raw), ("reason", reason)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, not {type(value).__name__}")
        if event_id is not None and not isinstance(event_id, str):
            raise TypeError(f"event_id must be a str or None, not {type(event_id).__name__}")
        if not platform or not reason:
            raise ValueError("platform and reason must not be empty")
        if event_id is not None and not 0 < len(event_id) <= _MAX_EVENT_ID:
            raise ValueError(f"event_id must be 1 to {_MAX_EVENT_ID} characters")

    def record(self, platform: str, raw: str, reason: str, event_id: str | None = None) -> bool:
        """Record one rejected event; True when written, False when the same platform event
        id was recorded before (a redelivery).  Raises as :meth:`check`, and ``StoreError``
        when the store cannot record it."""
        self.check(platform, raw, reason, event_id)
        now = self.clock.now()
        record_id = (
            composite_id(platform, event_id)
            if event_id is not None
            else f"{platform[:64]}~{secrets.token_hex(8)}"
        )
        cut_reason = reason[:MAX_REJECTED_REASON_CHARS]
        _, created = self.store.insert(
            REJECTED_KIND,
            record_id,
            {
                "platform": platform,
                "event_id": event_id,
                "reason": cut_reason,
                "raw": raw[:MAX_REJECTED_RAW_CHARS],
                "raw_chars": len(raw),
                "recorded_at": now,
            },
            event="record",
            audit=Audit(now, platform, reason=cut_reason),
        )
        return created

    def records(
        self, *, platform: str | None = None, include_dismissed: bool = False
    ) -> list[RejectedEvent]:
        """The records, oldest first (dismissed ones only with ``include_dismissed``)."""
        states = tuple(RejectedState) if include_dismissed else (_R.RECORDED,)
        where = None if platform is None else {"platform": platform}
        rows = self.store.select(REJECTED_KIND, states=states, where=where, order_by="recorded_at")
        return [
            RejectedEvent(
                record_id=row.id,
                platform=row["platform"],
                event_id=row["event_id"],
                reason=row["reason"],
                raw=row["raw"],
                raw_chars=row["raw_chars"],
                recorded_at=row["recorded_at"],
                state=row.state,
            )
            for row in rows
        ]

    def count(self) -> int:
        """Records not dismissed."""
        return self.store.count(REJECTED_KIND, states=(_R.RECORDED,))

    def dismiss(self, record_id: str) -> None:
        """Mark one record as seen by an operator.  Raises ``UnknownEntity`` or
        ``InvalidTransition`` when it is unknown or already dismissed."""
        now = self.clock.now()
        self.store.transition(
            REJECTED_KIND,
            record_id,
            "dismiss",
            audit=Audit(now),
            changes={"dismissed_at": now},
        )

    def prune(self, *, older_than_s: float) -> int:
        """Delete the records dismissed more than ``older_than_s`` ago; a record nobody
        dismissed is never deleted."""
        cutoff = self.clock.now() - older_than_s
        return self.store.prune(REJECTED_KIND, "prune", where={"dismissed_at": lt(cutoff)})

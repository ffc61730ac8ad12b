"""The connector's durable inbound buffer: what a sleeping gateway instance has not seen yet.

While an instance is dormant, disconnected or flipped to buffered-only, every inbound event for
it is appended here (``buffered``).  On its next handshake the backlog is replayed in order; a
replayed entry that is still unacked a short grace after it was sent, or when its connection
ends, is recorded as ``sent`` (with its replay count), while one acked promptly goes straight to
``acked``.  Only the instance's ``inbound_ack`` retires an entry.  An instance that dies
mid-replay receives exactly the unacked tail again.  Entries older than the retention are
``expired``: counted and logged, never dropped silently.  The lifecycle is declared once
(:data:`BUFFER`) and enforced by the store like every other.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Iterable, Sequence
from enum import StrEnum

import attrs

from relay.wire.codec import buffered_inbound_line, decode_event, encode_event
from relay.wire.frames import InboundEvent
from statecore.batch import BatchStore, Creation
from statecore.batching import has_batch, transition_many
from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind, Field, Index
from statecore.errors import InvalidTransition, StaleState
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit, Row, Store, ge, gt, lt

__all__ = ["BUFFER", "BUFFER_KIND", "BufferEntry", "BufferState", "InboundBuffer"]

log = logging.getLogger(__name__)


class BufferState(StrEnum):
    """One buffered inbound event for one gateway instance."""

    BUFFERED = "buffered"
    """Appended while the instance was not receiving live traffic, or (for a gateway that announced
    ``acked_live``) appended before its live delivery."""
    SENT = "sent"
    """Replayed, or delivered live to an ``acked_live`` gateway, and not acked within the
    connector's grace (or before its connection ended); waiting for the instance's ack (replayed
    again if none)."""
    ACKED = "acked"
    """Terminal: the instance handled it."""
    EXPIRED = "expired"
    """Terminal: older than the retention before it was acked (counted and logged)."""


_B = BufferState

BUFFER: Lifecycle[BufferState] = Lifecycle(
    "buffer",
    BufferState,
    initial=_B.BUFFERED,
    terminal=(_B.ACKED, _B.EXPIRED),
    description="One inbound event held for a sleeping gateway instance until it acks it.",
    transitions=(
        Transition("append", None, _B.BUFFERED),
        # A replay the instance did not ack promptly; it is replayed again on the next handshake.
        Transition("send", (_B.BUFFERED, _B.SENT), _B.SENT),
        Transition("ack", (_B.BUFFERED, _B.SENT), _B.ACKED),
        Transition("expire", (_B.BUFFERED, _B.SENT), _B.EXPIRED),
        Transition("prune", (_B.ACKED, _B.EXPIRED), None),
    ),
)

_UNACKED = BUFFER.sources("ack")
"""What an ack may retire, from the declaration: the entries still owed to their instance."""

BUFFER_KIND: EntityKind[BufferState] = EntityKind(
    "buffer_entry",
    BUFFER,
    table="relay_inbound_buffer",
    id_field="buffer_id",
    fields=(
        Field("gateway_id", str, nullable=False, immutable=True),
        Field("platform", str, nullable=False, immutable=True),
        Field("seq", int, nullable=False, immutable=True),
        Field("event_json", str, nullable=False, immutable=True),
        Field("created_at", float, nullable=False, immutable=True),
        Field("updated_at", float, nullable=False),
        # Replays recorded as ``sent``: those the instance did not ack promptly.
        Field("replays", int, nullable=False, default=0),
    ),
    indexes=(
        # Replay: one instance's unacked entries, in order; settled rows stay out of it.
        Index(("gateway_id", "seq"), states=_UNACKED),
        Index(("updated_at",), states=BUFFER.terminal),
    ),
)


_FOREIGN_PAGE = 2000
"""Rows one read of :meth:`InboundBuffer.foreign_lines` takes."""


@attrs.frozen
class BufferEntry:
    """One unacked entry, ready to replay."""

    buffer_id: str
    gateway_id: str
    platform: str
    seq: int
    event: InboundEvent
    created_at: float
    replays: int


class InboundBuffer:
    """The buffer over any Store (synchronous: the connector calls it off the event loop).

    ``retention_s`` bounds how long an unacked entry is kept before it expires; ``origin``
    (default: random) prefixes the bufferIds it hands out (see :attr:`origin`).
    """

    def __init__(
        self,
        store: Store,
        *,
        retention_s: float = 86_400.0,
        clock: Clock | None = None,
        origin: str | None = None,
    ) -> None:
        if not retention_s > 0:
            raise ValueError(f"retention_s must be positive, not {retention_s!r}")
        if origin is not None and not (
            isinstance(origin, str) and origin.isalnum() and origin.isascii()
        ):
            raise ValueError(f"origin must be ASCII letters and digits, not {origin!r}")
        self.store = store
        self.retention_s = float(retention_s)
        self.clock: Clock = clock or SystemClock()
        self.expired_total = 0
        """Entries expired by this process (also logged at WARNING)."""
        store.register(BUFFER_KIND)
        # Decided once: whether the store's class runs multi-row inserts itself (a wrapper that
        # only delegates gets single writes, which its own overrides then see).
        self._batch = has_batch(store, "insert_each")
        self._lock = threading.Lock()
        # Random unless given (a simulation replaying a seed needs the same ids every run).
        self._prefix = secrets.token_hex(3) if origin is None else origin
        # The last seq handed out; None until the first append reads the store for a floor.
        self._seq: int | None = None

    def _next_seq(self) -> int:
        """The next entry's seq: replay order.

        Strictly increasing within the process, and never below the clock's time in
        nanoseconds (seqs of buffers sharing a store interleave by time).  The first one is
        also above every seq already stored, so that the entries of a buffer reopened on the
        same store replay after the earlier ones even when the clock stands still or went back.
        """
        with self._lock:
            now_ns = int(self.clock.now() * 1e9)
            if self._seq is None:
                self._seq = self._highest_stored_from(now_ns)
            self._seq = max(self._seq + 1, now_ns)
            return self._seq

    def _highest_stored_from(self, floor: int) -> int:
        """The highest seq stored, when it is ``floor`` or more; else ``floor - 1``.

        Normally nothing is stored above the clock's time and this reads no row; only entries
        stamped ahead of it (a clock that went back, a fake one) are read, once per buffer.
        """
        rows = self.store.select(BUFFER_KIND, where={"seq": ge(floor)}, order_by="seq")
        return int(rows[-1].values["seq"]) if rows else floor - 1

    def append(self, gateway_id: str, platform: str, event: InboundEvent) -> str:
        """Buffer ``event`` for ``gateway_id``; return its bufferId."""
        seq = self._next_seq()
        buffer_id = f"{self._prefix}-{seq:x}"
        now = self.clock.now()
        self.store.insert(
            BUFFER_KIND,
            buffer_id,
            {
                "gateway_id": gateway_id,
                "platform": platform,
                "seq": seq,
                "event_json": encode_event(event.to_wire()),
                "created_at": now,
                "updated_at": now,
            },
            event="append",
            audit=Audit(now, gateway_id),
        )
        return buffer_id

    def append_many(
        self, items: Sequence[tuple[str, str, InboundEvent]]
    ) -> list[tuple[str, int, str]]:
        """Buffer many ``(gateway_id, platform, event)`` in one transaction, in order; return
        each one's ``(bufferId, seq, line)`` -- the line ready to send (as :meth:`replay_lines`
        gives it).  Nothing is written when it raises (``StoreError``)."""
        if not items:
            return []
        now = self.clock.now()
        creations: list[tuple[str, dict[str, object], str]] = []
        out: list[tuple[str, int, str]] = []
        for gateway_id, platform, event in items:
            seq = self._next_seq()
            buffer_id = f"{self._prefix}-{seq:x}"
            event_json = encode_event(event.to_wire())
            creations.append(
                (
                    buffer_id,
                    {
                        "gateway_id": gateway_id,
                        "platform": platform,
                        "seq": seq,
                        "event_json": event_json,
                        "created_at": now,
                        "updated_at": now,
                    },
                    gateway_id,
                )
            )
            out.append((buffer_id, seq, buffered_inbound_line(buffer_id, event_json)))
        if self._batch:  # one multi-row statement where the store can
            assert isinstance(self.store, BatchStore)
            outcomes = self.store.insert_each(
                BUFFER_KIND,
                [Creation(i, v, "append", Audit(now, g)) for i, v, g in creations],
            )
            for outcome in outcomes:
                if isinstance(outcome, Exception):
                    raise outcome
        else:
            with self.store.atomic():
                for buffer_id, values, gateway_id in creations:
                    self.store.insert(
                        BUFFER_KIND, buffer_id, values, event="append", audit=Audit(now, gateway_id)
                    )
        return out

    def backlog(
        self, gateway_id: str, *, limit: int | None = None, after_seq: int | None = None
    ) -> list[BufferEntry]:
        """The instance's unacked entries in order, after ``after_seq`` when given (the first
        call of a replay also expires the entries past retention)."""
        return [_entry(row) for row in self._unacked(gateway_id, limit, after_seq)]

    def _unacked(
        self, gateway_id: str, limit: int | None, after_seq: int | None
    ) -> list[Row[BufferState]]:
        where: dict[str, object] = {"gateway_id": gateway_id}
        if after_seq is None:
            self.expire(gateway_id)
        else:
            where["seq"] = gt(after_seq)
        return self.store.select(
            BUFFER_KIND, states=_UNACKED, where=where, order_by="seq", limit=limit
        )

    def replay_lines(
        self, gateway_id: str, *, limit: int, after_seq: int | None = None
    ) -> list[tuple[str, int, str]]:
        """The next unacked entries as ready-to-send wire lines: ``(bufferId, seq, line)``.

        The event was validated and serialised when it was appended; replay reuses that JSON
        instead of parsing and re-encoding every event.  The first call of a replay (no
        ``after_seq``) also expires the entries past retention.
        """
        rows = self._unacked(gateway_id, limit, after_seq)
        return [
            (row.id, row.values["seq"], buffered_inbound_line(row.id, row.values["event_json"]))
            for row in rows
        ]

    @property
    def origin(self) -> str:
        """The prefix of the bufferIds this buffer hands out (``<origin>-<seq>``): random per
        buffer, so that connectors sharing a store tell their own entries from the others'."""
        return self._prefix

    def foreign_lines(self, gateway_id: str, *, limit: int) -> list[tuple[str, int, str]]:
        """Up to ``limit`` of ``gateway_id``'s never-sent (``buffered``) entries appended by
        OTHER buffers on the same store (connectors of a cluster), in seq order, as wire lines
        ``(bufferId, seq, line)``.

        A connector serving the gateway delivers these when a peer announces them; its own
        entries it delivers itself (live, or by a replay).  Reads page by page past the own
        entries, so ``limit`` bounds what is returned, not what is read.
        """
        out: list[tuple[str, int, str]] = []
        after: int | None = None
        own = f"{self._prefix}-"
        while len(out) < limit:
            where: dict[str, object] = {"gateway_id": gateway_id}
            if after is not None:
                where["seq"] = gt(after)
            rows = self.store.select(
                BUFFER_KIND,
                states=(_B.BUFFERED,),
                where=where,
                order_by="seq",
                limit=_FOREIGN_PAGE,
            )
            for row in rows:
                if not row.id.startswith(own):
                    line = buffered_inbound_line(row.id, row.values["event_json"])
                    out.append((row.id, row.values["seq"], line))
            if len(rows) < _FOREIGN_PAGE:
                break
            after = rows[-1].values["seq"]
        return out[:limit]

    def mark_sent_ids(self, gateway_id: str, buffer_ids: list[str]) -> None:
        """Record that these entries of ``gateway_id`` were replayed (one bulk write)."""
        if not buffer_ids:
            return
        now = self.clock.now()
        transition_many(
            self.store,
            BUFFER_KIND,
            buffer_ids,
            "send",
            audit=Audit(now, gateway_id),
            expect={"gateway_id": gateway_id},
            changes={"updated_at": now},
            increments={"replays": 1},
        )

    def mark_sent(self, entries: Iterable[BufferEntry]) -> None:
        """Record that ``entries`` (of one instance) were replayed: one guarded bulk write;
        entries acked or expired meanwhile are left as they are."""
        batch = list(entries)
        if batch:
            self.mark_sent_ids(batch[0].gateway_id, [entry.buffer_id for entry in batch])

    def ack(self, gateway_id: str, buffer_ids: Iterable[str]) -> int:
        """Retire the entries the instance acked; return how many were retired.

        Only the owning instance's unacked entries are touched: an ack for an unknown, foreign
        or already settled bufferId changes nothing.  The caller compares the count with what it
        asked for and reports the difference (rate-limited: a peer controls how many there are).
        """
        wanted = list(dict.fromkeys(buffer_ids))
        if not wanted:
            return 0
        now = self.clock.now()
        retired = transition_many(
            self.store,
            BUFFER_KIND,
            wanted,
            "ack",
            audit=Audit(now, gateway_id),
            expect={"gateway_id": gateway_id},
            changes={"updated_at": now},
        )
        return len(retired)

    def expire(self, gateway_id: str | None = None) -> int:
        """Expire unacked entries older than the retention; return how many (logged)."""
        now = self.clock.now()
        where: dict[str, object] = {"created_at": lt(now - self.retention_s)}
        if gateway_id is not None:
            where["gateway_id"] = gateway_id
        stale = self.store.select(BUFFER_KIND, states=_UNACKED, where=where)
        expired = 0
        with self.store.atomic():
            for row in stale:
                try:
                    self.store.transition(
                        BUFFER_KIND,
                        row.id,
                        "expire",
                        audit=Audit(now, None, reason=f"older than {self.retention_s:g} s"),
                        fence=row.fence,
                        changes={"updated_at": now},
                    )
                    expired += 1
                except (InvalidTransition, StaleState):
                    continue
        if expired:
            self.expired_total += expired
            log.warning(
                "inbound buffer: %d unacked entries expired (retention %g s)",
                expired,
                self.retention_s,
            )
        return expired

    def count(self, gateway_id: str) -> int:
        """Unacked entries of ``gateway_id``."""
        return self.store.count(BUFFER_KIND, states=_UNACKED, where={"gateway_id": gateway_id})

    def backlog_stats(self, gateway_id: str | None = None) -> tuple[int, float | None]:
        """The unacked entries of ``gateway_id`` (None: of every gateway): how many, and when
        the oldest of them was appended (wall clock; None when there is none)."""
        where = None if gateway_id is None else {"gateway_id": gateway_id}
        depth = self.store.count(BUFFER_KIND, states=_UNACKED, where=where)
        if not depth:
            return 0, None
        oldest = self.store.select(
            BUFFER_KIND, states=_UNACKED, where=where, order_by="seq", limit=1
        )
        return depth, (float(oldest[0].values["created_at"]) if oldest else None)

    def prune(self, *, older_than_s: float) -> int:
        """Delete acked and expired entries settled more than ``older_than_s`` ago; an unacked
        entry is never deleted (it expires first, see :meth:`expire`)."""
        cutoff = self.clock.now() - older_than_s
        return self.store.prune(BUFFER_KIND, "prune", where={"updated_at": lt(cutoff)})


def _entry(row: Row[BufferState]) -> BufferEntry:
    values = row.values
    return BufferEntry(
        buffer_id=row.id,
        gateway_id=values["gateway_id"],
        platform=values["platform"],
        seq=values["seq"],
        event=decode_event(values["event_json"]),
        created_at=values["created_at"],
        replays=values["replays"],
    )

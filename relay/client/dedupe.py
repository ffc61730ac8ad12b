"""The gateway's durable memory of handled buffered deliveries, and of undeliverable ones.

A buffered inbound event is acked only after its handler returned; if the gateway dies between
the handler and the ack, the connector replays it.  Remembering each handled bufferId durably
(before the ack) lets the transport ack such a replay without handling it a second time, even
after a restart.  The keys are persisted entities like any other, with a lifecycle of their own.

A buffered delivery that can never be handled (a *poison* event: no usable ``chat_id``, or an
original-contract frame nobody handles) is recorded here as :class:`Undeliverable` -- the raw
line as received and the reason -- before it is acked, so a buffer never stalls behind it and
an operator can still see (:meth:`StoreBufferDedupe.undeliverable`) what was not delivered.

Both tables are pruned by the gateway's housekeeping: :meth:`StoreBufferDedupe.housekeeping`
names the two jobs (``dedupe``: keys handled longer ago than the retention, which must exceed
the connector's buffer retention; ``undeliverable``: records an operator dismissed longer ago
than the retention).  A record nobody dismissed is never pruned.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Awaitable, Callable
from enum import StrEnum

import attrs

from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind, Field, Index
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit, Store, lt

__all__ = [
    "DEDUPE",
    "DEDUPE_KIND",
    "MAX_RAW_LINE_CHARS",
    "UNDELIVERABLE",
    "UNDELIVERABLE_KIND",
    "DedupeState",
    "StoreBufferDedupe",
    "Undeliverable",
    "UndeliverableState",
]

MAX_RAW_LINE_CHARS = 65_536
"""The longest raw line kept for an undeliverable delivery; a longer one is kept truncated."""


class DedupeState(StrEnum):
    """One handled buffered delivery, as the gateway remembers it."""

    HANDLED = "handled"
    """Handled (and about to be, or already, acked)."""
    FORGOTTEN = "forgotten"
    """Terminal: older than the memory's horizon; the connector cannot replay it any more."""


_D = DedupeState

DEDUPE: Lifecycle[DedupeState] = Lifecycle(
    "dedupe",
    DedupeState,
    initial=_D.HANDLED,
    terminal=(_D.FORGOTTEN,),
    description="A handled bufferId, remembered so a replay is not handled twice.",
    transitions=(
        Transition("handle", None, _D.HANDLED),
        Transition("forget", _D.HANDLED, _D.FORGOTTEN),
        Transition("prune", _D.FORGOTTEN, None),
    ),
)

DEDUPE_KIND: EntityKind[DedupeState] = EntityKind(
    "inbound_dedupe",
    DEDUPE,
    table="relay_inbound_dedupe",
    id_field="buffer_id",
    fields=(Field("handled_at", float, nullable=False, immutable=True),),
    indexes=(Index(("handled_at",)),),
)


class UndeliverableState(StrEnum):
    """A buffered delivery the gateway could never handle, kept for an operator."""

    RECORDED = "recorded"
    """Recorded (and acked, so the connector's buffer moved on); waiting for an operator."""
    DISMISSED = "dismissed"
    """Terminal: an operator has seen it."""


_U = UndeliverableState

UNDELIVERABLE: Lifecycle[UndeliverableState] = Lifecycle(
    "undeliverable",
    UndeliverableState,
    initial=_U.RECORDED,
    terminal=(_U.DISMISSED,),
    description="A buffered delivery that could not be handled, recorded before it was acked.",
    transitions=(
        Transition("record", None, _U.RECORDED),
        Transition("dismiss", _U.RECORDED, _U.DISMISSED),
        Transition("prune", _U.DISMISSED, None),
    ),
)

UNDELIVERABLE_KIND: EntityKind[UndeliverableState] = EntityKind(
    "undeliverable_inbound",
    UNDELIVERABLE,
    table="relay_undeliverable",
    id_field="buffer_id",
    fields=(
        Field("frame_type", str, nullable=False, immutable=True),
        Field("reason", str, nullable=False, immutable=True),
        Field("raw_line", str, nullable=False, immutable=True),
        Field("recorded_at", float, nullable=False, immutable=True),
        # When an operator dismissed it (None: not dismissed, or dismissed before this field).
        Field("dismissed_at", float),
    ),
    indexes=(Index(("recorded_at",)),),
)


@attrs.frozen
class Undeliverable:
    """One buffered delivery that was recorded as undeliverable (and then acked)."""

    buffer_id: str
    frame_type: str
    """``inbound``, ``interrupt_inbound`` or ``passthrough_forward``."""
    reason: str
    """Why it could not be handled (e.g. ``field 'event.source.chat_id' is required``)."""
    raw_line: str
    """The line exactly as received (truncated to :data:`MAX_RAW_LINE_CHARS`)."""
    recorded_at: float
    state: UndeliverableState


class StoreBufferDedupe:
    """:class:`relay.client.transport.BufferDedupe` over any Store; store work runs off the loop.

    Pass it to ``WebSocketRelayTransport(..., dedupe=StoreBufferDedupe(store))``.  Lookups and
    remembers go through one worker thread that takes whatever is queued at once: the lookups
    are answered one after another, the remembers are written in one transaction (the chats a
    gateway handles concurrently share the commits).

    ``threads=False`` starts no worker: what is queued within one turn of the event loop is
    answered and written at the end of that turn, on the loop's own thread (for a deterministic
    simulation, :mod:`relay.sim.loop`).
    """

    def __init__(self, store: Store, *, clock: Clock | None = None, threads: bool = True) -> None:
        if not isinstance(threads, bool):
            raise TypeError(f"threads must be a bool, not {threads!r}")
        self._threads = threads
        self.store = store
        self.clock: Clock = clock or SystemClock()
        store.register(DEDUPE_KIND)
        store.register(UNDELIVERABLE_KIND)
        self._ops: queue.SimpleQueue[_DedupeOp] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._worker_lock = threading.Lock()

    async def seen(self, buffer_id: str) -> bool:
        """True when ``buffer_id`` was handled before (by this gateway, in any run).  Raises
        ``StoreError`` when the store cannot answer."""
        return bool(await self._submit("seen", buffer_id))

    async def remember(self, buffer_id: str) -> None:
        """Record ``buffer_id`` as handled (idempotent); the caller may ack it once this
        returned.  Raises ``StoreError`` when the store cannot record it (then do not ack)."""
        await self._submit("remember", buffer_id)

    async def _submit(self, kind: str, buffer_id: str) -> object:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()
        # Without threads the first operation queued in a turn schedules the round (on the
        # loop) that takes it and every one queued behind it.
        schedule_round = not self._threads and self._ops.empty()
        self._ops.put((kind, buffer_id, loop, future))
        if schedule_round:
            loop.call_soon(self._round, [])
        elif self._threads and self._worker is None:
            with self._worker_lock:
                if self._worker is None:
                    self._worker = threading.Thread(
                        target=self._work, name="relay-dedupe", daemon=True
                    )
                    self._worker.start()
        return await future

    def _work(self) -> None:
        """The worker: each round takes every queued operation; lookups first see the store as
        the earlier rounds left it, remembers of one round commit together."""
        while True:
            self._round([self._ops.get()])

    def _round(self, batch: list[_DedupeOp]) -> None:
        """One round: ``batch`` and everything queued behind it (see :meth:`_work`)."""
        while True:
            try:
                batch.append(self._ops.get_nowait())
            except queue.Empty:
                break
        outcomes: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[object], object]] = []
        remembers: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[object], str]] = []
        for kind, buffer_id, loop, future in batch:
            if kind == "remember":
                remembers.append((loop, future, buffer_id))
                continue
            try:
                # Remembered earlier in this round counts as seen (it commits below).
                outcome: object = any(r[2] == buffer_id for r in remembers) or (
                    self.store.get(DEDUPE_KIND, buffer_id) is not None
                )
            except Exception as exc:
                outcome = exc
            outcomes.append((loop, future, outcome))
        if remembers:
            now = self.clock.now()
            try:
                with self.store.atomic():
                    for _, _, buffer_id in remembers:
                        self.store.insert(
                            DEDUPE_KIND,
                            buffer_id,
                            {"handled_at": now},
                            event="handle",
                            audit=Audit(now),
                        )
                written: object = None
            except Exception as exc:
                written = exc
            outcomes.extend((loop, future, written) for loop, future, _ in remembers)
        for loop, future, outcome in outcomes:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, future, outcome)

    async def record_undeliverable(
        self, buffer_id: str, *, frame_type: str, reason: str, raw_line: str
    ) -> None:
        """Record a delivery that can never be handled, and remember it as handled, in one
        transaction (idempotent: a replay of it changes nothing).  Ack it only after this
        returned.  Raises ``StoreError`` when the store cannot record it (then do not ack)."""
        now = self.clock.now()
        await asyncio.to_thread(
            self._record_undeliverable, buffer_id, frame_type, reason, raw_line, now
        )

    def _record_undeliverable(
        self, buffer_id: str, frame_type: str, reason: str, raw_line: str, now: float
    ) -> None:
        with self.store.atomic():
            self.store.insert(
                UNDELIVERABLE_KIND,
                buffer_id,
                {
                    "frame_type": frame_type,
                    "reason": reason,
                    "raw_line": raw_line[:MAX_RAW_LINE_CHARS],
                    "recorded_at": now,
                },
                event="record",
                audit=Audit(now, reason=reason),
            )
            self.store.insert(
                DEDUPE_KIND, buffer_id, {"handled_at": now}, event="handle", audit=Audit(now)
            )

    def undeliverable(self, *, include_dismissed: bool = False) -> list[Undeliverable]:
        """Every delivery recorded as undeliverable, oldest first (dismissed ones only when
        ``include_dismissed``).  Synchronous: call it off the event loop in a server."""
        states = tuple(UndeliverableState) if include_dismissed else (_U.RECORDED,)
        rows = self.store.select(UNDELIVERABLE_KIND, states=states, order_by="recorded_at")
        return [
            Undeliverable(
                buffer_id=row.id,
                frame_type=row["frame_type"],
                reason=row["reason"],
                raw_line=row["raw_line"],
                recorded_at=row["recorded_at"],
                state=row.state,
            )
            for row in rows
        ]

    def dismiss(self, buffer_id: str) -> None:
        """Mark one undeliverable record as seen by an operator.  Raises ``InvalidTransition``
        when it is unknown or already dismissed."""
        now = self.clock.now()
        self.store.transition(
            UNDELIVERABLE_KIND,
            buffer_id,
            "dismiss",
            audit=Audit(now),
            changes={"dismissed_at": now},
        )

    def prune_dismissed(self, older_than_s: float) -> int:
        """Delete undeliverable records dismissed more than ``older_than_s`` seconds ago, with
        their history; return how many.  A record not dismissed is never deleted."""
        cutoff = self.clock.now() - older_than_s
        return self.store.prune(UNDELIVERABLE_KIND, "prune", where={"dismissed_at": lt(cutoff)})

    def housekeeping(self, retention_s: float) -> dict[str, Callable[[], Awaitable[int]]]:
        """The gateway's housekeeping jobs for this memory (see the module docs): ``dedupe``
        forgets keys handled more than ``retention_s`` ago, ``undeliverable`` deletes records
        dismissed more than ``retention_s`` ago; each runs on a worker thread and returns how
        many rows it deleted.  ``retention_s`` must exceed the connector's buffer retention
        (``ValueError`` when it is not positive)."""
        if isinstance(retention_s, bool) or not retention_s > 0:
            raise ValueError(f"retention_s must be positive, not {retention_s!r}")

        async def dedupe() -> int:
            return await asyncio.to_thread(self.forget_older_than, retention_s)

        async def undeliverable() -> int:
            return await asyncio.to_thread(self.prune_dismissed, retention_s)

        return {"dedupe": dedupe, "undeliverable": undeliverable}

    def forget_older_than(self, seconds: float) -> int:
        """Drop keys handled more than ``seconds`` ago (longer than the connector's buffer
        retention, so no replay can still carry them); returns how many were dropped."""
        cutoff = self.clock.now() - seconds
        stale = self.store.select(
            DEDUPE_KIND, states=(_D.HANDLED,), where={"handled_at": lt(cutoff)}
        )
        now = self.clock.now()
        with self.store.atomic():
            for row in stale:
                self.store.transition(
                    DEDUPE_KIND, row.id, "forget", audit=Audit(now), fence=row.fence
                )
        return self.store.prune(DEDUPE_KIND, "prune")


_DedupeOp = tuple[str, str, asyncio.AbstractEventLoop, "asyncio.Future[object]"]


def _settle(future: asyncio.Future[object], outcome: object) -> None:
    if future.done():
        return
    if isinstance(outcome, Exception):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)

"""The connector's store thread: every store call runs there, in submission order, never on the
event loop; the intake's writes (an event's dedupe key with its buffer appends, or its hold)
and acks share write rounds (group commit).  After a round that retired acks, the depth and
age of each acking gateway's backlog go to the metrics hook (``metrics.buffer``), when one is
set; after a round that held events, the hold's depth of each such platform
(``metrics.held``, where the hook reports it)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from relay.connector._instance import Instance
from relay.connector._log import limited
from relay.connector._settings import StoreSettings
from relay.connector.intake import IntakeFull
from relay.wire.frames import InboundEvent
from relay.wire.logtext import peer_text
from statecore.metrics import NO_METRICS, IntakeMetrics

__all__ = ["StoreThread"]

# Every part of the connector logs to the one logger docs/configuration.md names.
log = logging.getLogger("relay.connector.server")

T = TypeVar("T")

_Line = tuple[str, int, str]
"""A buffered event as delivered: ``(bufferId, seq, line)``."""

_Taken = list[_Line] | None
"""What taking one event wrote: its buffer entries, one per gateway in the order asked
(none for a hold, or a key alone); None when its key was taken before (a copy)."""


class _Take:
    """One event queued for a write round: its key, the gateways whose buffers get it, or its
    hold; ``future`` gets the outcome on the loop."""

    __slots__ = ("event", "future", "gateways", "hold", "key", "platform")

    def __init__(
        self,
        *,
        platform: str,
        event: InboundEvent,
        gateways: list[str],
        key: str | None,
        hold: bool,
        future: asyncio.Future[_Taken],
    ) -> None:
        self.platform = platform
        self.event = event
        self.gateways = gateways
        self.key = key
        self.hold = hold
        self.future = future


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    # One thread: store work is ordered by submission (a read sees every write queued before it).
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="connector-store")


class StoreThread:
    """The one thread the connector's store work runs on, with its write rounds.

    Appends and acks are queued, and one write round at a time on the store thread carries
    every queued append and ack in one transaction.  The buffer is the connector's
    (``connector.buffer``).  With ``threads=False`` there is no thread: the same work, in the
    same order, runs in turns of the event loop (for a deterministic simulation).
    """

    def __init__(self, connector: StoreSettings, *, threads: bool = True) -> None:
        self._connector = connector
        self._threads = threads
        self._executor = _executor()
        # Guards the queues and ``_drain_pending``: the loop queues, the store thread takes.
        self._write_lock = threading.Lock()
        self._append_queue: list[_Take] = []
        self._ack_queue: list[tuple[Instance, list[str]]] = []
        # True while a write round is queued on the store thread and has not taken the queues
        # yet: a new append or ack then joins it instead of queueing another.
        self._drain_pending = False
        self.on_appended: Callable[[list[str]], None] | None = None
        """Called on the store thread inside each write round's transaction with the gateway
        ids it appends for (a cluster node announces them; see relay.connector._cluster)."""

    async def run(self, fn: Callable[[], T]) -> T:
        """Run store work on the store thread (ordered, off the event loop)."""
        if self._threads:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        def work() -> None:
            if future.cancelled():
                return
            try:
                result = fn()
            except BaseException as exc:
                # Handed to the caller whatever it is, as the thread's executor does; one that
                # must stop the loop (SystemExit, KeyboardInterrupt) goes on from here too.
                if not future.done():
                    future.set_exception(exc)
                if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                    raise
            else:
                if not future.done():
                    future.set_result(result)

        self._submit(work)
        return await future

    def _submit(self, fn: Callable[..., object], *args: Any) -> None:
        """Queue ``fn(*args)`` behind the store work already queued (in a turn of the loop
        when there is no thread); raises ``RuntimeError`` once the thread is shut down."""
        if self._threads:
            self._executor.submit(fn, *args)
        else:
            asyncio.get_running_loop().call_soon(fn, *args)

    async def append(self, gateway_id: str, platform: str, event: InboundEvent) -> _Line:
        """Buffer one event durably for one gateway (no dedupe key: the event's key, if it has
        one, was taken already); return its ``(bufferId, seq, line)``."""
        lines = await self.take(platform, event, [gateway_id], key=None)
        assert lines is not None  # without a key it is never a copy
        return lines[0]

    async def take(
        self,
        platform: str,
        event: InboundEvent,
        gateways: list[str],
        *,
        key: str | None,
        hold: bool = False,
    ) -> _Taken:
        """Take one event durably in one transaction: its dedupe ``key`` (None: not deduped)
        with its appends to the buffers of ``gateways`` -- or, with ``hold``, its hold.

        Returns each append's ``(bufferId, seq, line)`` in the order of ``gateways`` (empty for
        a hold or a key alone), or None when ``key`` was taken before: the event is a copy and
        nothing was written.  Raises :class:`IntakeFull` for a hold while the hold has no room,
        ``StoreError`` when the round failed; either way nothing of it was written.

        Writes are grouped (see :meth:`_drain_writes`): the event joins the write round that is
        queued on the store thread, or queues one, so it keeps its place among the store work
        submitted around it (a replay's read submitted after it sees it).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Taken] = loop.create_future()
        with self._write_lock:
            self._append_queue.append(
                _Take(
                    platform=platform,
                    event=event,
                    gateways=gateways,
                    key=key,
                    hold=hold,
                    future=future,
                )
            )
            submit = not self._drain_pending
            self._drain_pending = True
        if submit:
            self._submit(self._drain_writes, loop)
        return await future

    def ack(self, instance: Instance, buffer_ids: list[str]) -> None:
        """Queue acked bufferIds of ``instance`` for retirement by the next write round (acks
        that retire nothing are reported on the loop, rate-limited)."""
        with self._write_lock:
            self._ack_queue.append((instance, buffer_ids))
            submit = not self._drain_pending
            self._drain_pending = True
        if submit:
            self._submit(self._drain_writes, asyncio.get_running_loop())

    def _drain_writes(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the store thread: one write round -- every queued event and ack -- in one
        transaction (group commit: under load one commit carries many events).

        An event's key is written in the same transaction as its appends or its hold, so no
        crash leaves one without the other.  A round that fails writes nothing: its events fail
        to their callers (who have not delivered them), its acks are not retired (those entries
        are delivered again).
        """
        with self._write_lock:
            appends, self._append_queue = self._append_queue, []
            acks, self._ack_queue = self._ack_queue, []
            self._drain_pending = False  # from now on a new write queues a new round
        if not appends and not acks:
            return
        by_instance: dict[Instance, list[str]] = {}
        for instance, ids in acks:
            by_instance.setdefault(instance, []).extend(ids)
        ignored: list[tuple[Instance, int]] = []
        connector = self._connector
        buffer = connector.buffer
        try:
            with buffer.store.atomic():
                outcomes, keys, held = self._take_all(appends)
                for instance, ids in by_instance.items():
                    retired = buffer.ack(instance.gateway_id, ids)
                    if retired < len(set(ids)):
                        ignored.append((instance, len(set(ids)) - retired))
        except Exception as exc:
            if acks:
                log.warning(
                    "connector: retiring acks failed (%s); they will be replayed",
                    peer_text(str(exc)),
                )
            loop.call_soon_threadsafe(_fail_all, [take.future for take in appends], exc)
            return
        if keys:  # committed: only now may the cache say these keys are taken
            connector.seen.remember(keys)
        loop.call_soon_threadsafe(_resolve_all, [take.future for take in appends], outcomes)
        for instance, count in ignored:
            loop.call_soon_threadsafe(_ignored_acks, instance, count)
        for platform in sorted(held):
            self.report_held(platform)
        if by_instance and connector.metrics is not NO_METRICS:
            for gateway_id in sorted({instance.gateway_id for instance in by_instance}):
                self.report_backlog(gateway_id)

    def _take_all(self, takes: list[_Take]) -> tuple[list[_Taken | Exception], list[str], set[str]]:
        """Inside the round's transaction: each event's key, then its hold or its appends (all
        appends of the round in one batch); return each event's outcome, the keys written and
        the platforms that held."""
        connector = self._connector
        outcomes: list[_Taken | Exception] = []
        spans: list[tuple[int, int] | None] = []
        items: list[tuple[str, str, InboundEvent]] = []
        keys: list[str] = []
        held: set[str] = set()
        room: int | None = None
        for take in takes:
            spans.append(None)
            if take.hold:
                if room is None:
                    room = connector.max_held - connector.hold.count()
                if room <= 0:
                    # A copy of an event taken before is still a copy, full or not.
                    copy = take.key is not None and connector.seen.known(take.key)
                    outcomes.append(None if copy else IntakeFull(_full(connector.max_held)))
                    continue
            if take.key is not None:
                assert take.event.message_id is not None  # a key is made of it
                if not connector.seen.take(take.key, take.platform, take.event.message_id):
                    outcomes.append(None)  # taken before: route nothing for it
                    continue
                keys.append(take.key)
            if take.hold:
                connector.hold.hold(take.platform, take.event)
                held.add(take.platform)
                room = (room or 0) - 1
                outcomes.append([])
                continue
            spans[-1] = (len(items), len(items) + len(take.gateways))
            items.extend((gateway_id, take.platform, take.event) for gateway_id in take.gateways)
            outcomes.append([])
        lines = connector.buffer.append_many(items)
        if items and self.on_appended is not None:
            self.on_appended([gateway_id for gateway_id, _, _ in items])
        for index, span in enumerate(spans):
            if span is not None:
                outcomes[index] = lines[span[0] : span[1]]
        return outcomes, keys, held

    def report_held(self, platform: str) -> None:
        """On the store thread: report the hold's depth of ``platform`` to the metrics hook,
        when it reports one; a store that cannot say is logged, never raised."""
        metrics = self._connector.metrics
        if not isinstance(metrics, IntakeMetrics):
            return
        try:
            depth = self._connector.hold.count(platform)
        except Exception:
            log.debug("connector: reading the hold of %s failed", platform, exc_info=True)
            return
        metrics.held(platform, depth)

    def report_backlog(self, gateway_id: str) -> None:
        """On the store thread: report ``gateway_id``'s backlog (unacked entries, the oldest
        one's age) to the metrics hook; a store that cannot say is logged, never raised."""
        connector = self._connector
        try:
            depth, oldest = connector.buffer.backlog_stats(gateway_id)
        except Exception:
            log.debug("connector: reading the backlog of %s failed", gateway_id, exc_info=True)
            return
        lag = None if oldest is None else max(0.0, connector.clock.now() - oldest)
        connector.metrics.buffer(gateway_id, depth, lag)

    def record_sent(self, gateway_id: str, buffer_ids: list[str]) -> None:
        """Record these entries of ``gateway_id`` as replayed (``sent``), without waiting.

        Submitted, not awaited (:meth:`stop` waits for the store thread): the write must not be
        lost to a task cancelled as the connector stops.  Once the thread is shut down it is
        logged as not recorded.
        """
        try:
            self._submit(self._mark_sent_logged, gateway_id, buffer_ids)
        except RuntimeError:  # the store thread is already shut down
            log.warning(
                "connector: %d replays of %s not recorded (stopping)", len(buffer_ids), gateway_id
            )

    def _mark_sent_logged(self, gateway_id: str, buffer_ids: list[str]) -> None:
        """On the store thread: record replays, logging (not raising) a failure."""
        try:
            self._connector.buffer.mark_sent_ids(gateway_id, buffer_ids)
        except Exception:
            log.warning(
                "connector: recording %d replays of %s failed",
                len(buffer_ids),
                gateway_id,
                exc_info=True,
            )

    async def stop(self) -> None:
        """Wait for the store work already submitted, then stand up a fresh store thread (a
        stopped connector may start again).  Without a thread: wait for a marker queued behind
        that work in the loop's turns (the work runs in submission order, so it ran first)."""
        loop = asyncio.get_running_loop()
        if not self._threads:
            done = loop.create_future()
            self._submit(_settle_marker, done)
            await done
            return
        await loop.run_in_executor(None, self._executor.shutdown, True)
        self._executor = _executor()


def _ignored_acks(instance: Instance, ignored: int) -> None:
    """On the loop: report acks that retired nothing (a peer decides how many there are:
    one line per round, rate-limited)."""
    more = limited(instance.log_limit, "ignored-ack reports", logging.INFO)
    if more is not None:
        log.info(
            "connector: ignored %d acks from %s of bufferIds that are not its unacked entries%s",
            ignored,
            instance.gateway_id,
            more,
            extra={"gateway_id": instance.gateway_id, "ignored": ignored},
        )


def _settle_marker(done: asyncio.Future[None]) -> None:
    """Without a thread: the marker :meth:`StoreThread.stop` waits for."""
    if not done.done():
        done.set_result(None)


def _full(max_held: int) -> str:
    return (
        f"the hold for events no gateway listens to is full ({max_held} events): "
        "offer it again later"
    )


def _resolve_all(futures: list[asyncio.Future[_Taken]], outcomes: list[_Taken | Exception]) -> None:
    for future, outcome in zip(futures, outcomes, strict=True):
        if future.done():
            continue
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


def _fail_all(futures: list[asyncio.Future[_Taken]], error: Exception) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(error)

"""Delivering buffered inbound to a served connection: the replay of its backlog, the windowed
live pump (a gateway that acks live deliveries), its acks, and the record of what it was shown.

Both paths send the line the buffer made, with its bufferId, in seq order; ``last_sent_seq``
is the one cursor they share, so that no line goes out twice on one connection.  A replay that
sent anything is logged once at INFO with its count and duration (``extra``: ``gateway_id``,
``replayed``, ``duration_s``); as it starts, the backlog's depth and age go to the metrics hook.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping

from websockets.exceptions import ConnectionClosed

from relay.connector._instance import Instance
from relay.connector._settings import BufferSettings
from relay.connector._store_thread import StoreThread
from relay.connector._tasks import Tasks
from statecore.metrics import NO_METRICS

__all__ = ["Delivery"]

# Every part of the connector logs to the one logger docs/configuration.md names.
log = logging.getLogger("relay.connector.server")

_OUTBOX_MAX = 1000
"""Lines waiting for one gateway's socket before it counts as behind (then it is served from the
durable buffer instead, and the connector's memory stays bounded)."""
_REPLAY_FIRST_CHUNK = 1000
_REPLAY_CHUNK = 5000
_SEND_LINES = 64
_SEND_BYTES = 32_768
"""A replay (and the live pump) puts at most this many lines, of at most about this many
characters together, in one WebSocket message."""
_SENT_GRACE_S = 1.0
"""A replayed entry still unacked this long after it was sent is recorded as ``sent``."""


class Delivery:
    """Replay, live pump, acks, a cluster's catch-up and replay records for the connector's
    served connections.

    The class is long because its paths share one connection's delivery state (the cursor,
    the window, the replays not yet recorded, the other nodes' entries queued): each rule of
    "never the same line twice on one connection" is checked where every path can see it.

    ``served`` is the connector's table of served connections (gateway id → connection), read
    to tell whether a replaying connection was replaced meanwhile.
    """

    def __init__(
        self,
        connector: BufferSettings,
        *,
        served: Mapping[str, Instance],
        store: StoreThread,
        tasks: Tasks,
    ) -> None:
        self._connector = connector
        self._served = served
        self._store = store
        self._tasks = tasks

    # -- live delivery -------------------------------------------------------------------------

    def offer(self, instance: Instance, buffer_id: str, seq: int, line: str) -> None:
        """Hand one buffered line to the instance's pump (live delivery with a bufferId)."""
        if not instance.live or (
            instance.last_sent_seq is not None and seq <= instance.last_sent_seq
        ):
            return  # a replay (behind, or a new connection) delivers it from the buffer
        if len(instance.outbox) >= _OUTBOX_MAX:
            # Not keeping up: stop holding lines for it in memory; the buffer has them all.
            log.info(
                "connector: %s is not keeping up; delivering from the buffer until it catches up",
                instance.gateway_id,
                extra={"gateway_id": instance.gateway_id},
            )
            instance.outbox.clear()
            if instance.foreign_queued:
                # Other nodes' entries dropped from the outbox: caught up again after the replay.
                instance.foreign_queued.clear()
                instance.catch_up_due = True
            instance.machine.fire("fall_behind")
            self._tasks.spawn(self.replay(instance, after=instance.last_sent_seq))
            return
        instance.outbox.append((buffer_id, seq, line))
        instance.wake.set()
        if instance.pump is None or instance.pump.done():
            instance.pump = self._tasks.spawn(self._pump(instance))

    async def _window(self, instance: Instance) -> None:
        """Wait until the instance's window has room (an ack came back) or it closed."""
        instance.window_open.clear()
        if len(instance.unacked) < instance.window or instance.is_closed():
            return
        await instance.window_open.wait()

    async def _pump(self, instance: Instance) -> None:
        """Send the instance's live lines in order; a send that blocks (the gateway stopped
        reading) blocks only this instance.

        The lines queued when the pump runs go out together, several to a message (as a
        replay sends them: the framing lets a sender batch lines, and every receiver must
        accept it), never more unacked than the window.
        """
        outbox, send, unrecorded = instance.outbox, instance.ws.send, instance.unrecorded
        unacked, foreign = instance.unacked, instance.foreign_queued
        clock = self._connector.clock
        while not instance.is_closed():
            if not outbox or not instance.live:
                if instance.catch_up_due and instance.live:
                    self.catch_up(instance)  # other nodes' entries left for a drained outbox
                instance.wake.clear()
                await instance.wake.wait()
                continue
            if len(unacked) >= instance.window:
                await self._window(instance)  # the gateway holds a full window: wait for acks
                continue
            batch: list[str] = []
            size = 0
            now = clock.monotonic()
            while (
                outbox
                and len(unacked) < instance.window
                and len(batch) < _SEND_LINES
                and size < _SEND_BYTES
            ):
                buffer_id, seq, line = outbox.popleft()
                if buffer_id in foreign:
                    # Another node's entry (a cluster): its seq says nothing of this node's order.
                    foreign.discard(buffer_id)
                else:
                    # Claimed before the send: a replay starting meanwhile reads after it.
                    instance.last_sent_seq = seq
                if buffer_id in unacked:
                    continue  # already sent on this connection (a replay, or queued twice)
                # Registered before the send, so that its ack always finds it.
                unacked.add(buffer_id)
                unrecorded[buffer_id] = now
                batch.append(line)
                size += len(line)
            if not batch:
                continue
            try:
                await send("".join(batch))
            except ConnectionClosed:
                return  # unacked: replayed on the next connection
            self._record_sent_later(instance)

    # -- replay --------------------------------------------------------------------------------

    async def replay(self, instance: Instance, after: int | None = None) -> None:
        """Send the instance's backlog in order with bufferIds, then switch it to live.

        ``after``: the seq of the last line already sent on this connection (a gateway that
        fell behind); None replays the whole unacked backlog (a new connection), expiring the
        entries past retention first.
        """
        gateway_id = instance.gateway_id
        windowed = instance.acked_live  # a gateway that acks live traffic announced a window
        # A small first chunk starts the replay quickly; larger ones then keep the store calls
        # (and, on a store without an ordered index, the scans) few.
        limit = _REPLAY_FIRST_CHUNK
        began, replayed = self._connector.clock.monotonic(), 0
        if self._connector.metrics is not NO_METRICS:
            # Reported from the store thread; the replay does not wait for it.
            self._tasks.spawn(
                self._store.run(functools.partial(self._store.report_backlog, gateway_id))
            )
        try:
            while instance.is_replaying():  # going_idle or a close ends the replay
                instance.appended = 0
                chunk = await self._store.run(
                    functools.partial(
                        self._connector.buffer.replay_lines,
                        gateway_id,
                        limit=limit,
                        after_seq=after,
                    )
                )
                if not chunk:
                    if instance.appended == 0 and instance.machine.can("caught_up"):
                        instance.machine.fire("caught_up")  # nothing slipped in: go live
                        if instance.catch_up_due:
                            # Peers announced entries meanwhile; their seqs may lie behind this
                            # replay's cursor (a cluster's nodes commit out of seq order).
                            self.catch_up(instance)
                        return
                    continue
                after, limit = chunk[-1][1], _REPLAY_CHUNK
                try:
                    sent, going = await self._send_chunk(instance, chunk, windowed)
                    replayed += sent
                    if not going:
                        return  # closed, idle or gone: the unacked tail is replayed next time
                finally:
                    # Recording the replay is left to the grace timer: the next chunk is read
                    # at once, with no store write queued ahead of it.
                    self._record_sent_later(instance)
        finally:
            if self._served.get(gateway_id) is not instance and instance.machine.can("close"):
                instance.machine.fire("close")  # replaced while replaying: this one is done
            if replayed:
                took = self._connector.clock.monotonic() - began
                log.info(
                    "connector: replayed %d buffered entries to %s in %.3f s%s",
                    replayed,
                    gateway_id,
                    took,
                    "" if instance.live else " (interrupted)",
                    extra={"gateway_id": gateway_id, "replayed": replayed, "duration_s": took},
                )

    async def _send_chunk(
        self, instance: Instance, chunk: list[tuple[str, int, str]], windowed: bool
    ) -> tuple[int, bool]:
        """Send one chunk of a replay in order, several lines to a message (the framing lets a
        sender batch lines, and every receiver must accept it: one frame and one syscall per
        batch), never more unacked than the window; return how many lines went out and
        whether the replay goes on (False: closed or idle meanwhile, or the connection is
        gone -- what was not sent stays buffered)."""
        send, unrecorded = instance.ws.send, instance.unrecorded
        now = self._connector.clock.monotonic()
        batch: list[str] = []
        batch_ids: list[str] = []
        size = sent = 0
        try:
            for buffer_id, seq, line in chunk:
                if buffer_id in instance.unacked or buffer_id in unrecorded:
                    continue  # already sent on this connection (a cluster's catch-up)
                if windowed and len(instance.unacked) >= instance.window:
                    if batch:  # what the window holds must be out before it can drain
                        await send("".join(batch))
                        sent += len(batch)
                        batch, batch_ids, size = [], [], 0
                    while len(instance.unacked) >= instance.window:
                        await self._window(instance)  # a full window: wait for acks
                        if not instance.is_replaying():
                            return sent, False
                # Registered before its send, so that its ack always finds it.
                unrecorded[buffer_id] = now
                instance.last_sent_seq = seq
                if windowed:
                    instance.unacked.add(buffer_id)
                batch.append(line)
                batch_ids.append(buffer_id)
                size += len(line)
                if len(batch) >= _SEND_LINES or size >= _SEND_BYTES:
                    await send("".join(batch))
                    sent += len(batch)
                    batch, batch_ids, size = [], [], 0
            if batch:
                await send("".join(batch))
                sent += len(batch)
        except ConnectionClosed:
            for buffer_id in batch_ids:
                unrecorded.pop(buffer_id, None)  # these never went out
            return sent, False
        return sent, True

    # -- a cluster's catch-up ------------------------------------------------------------------

    def catch_up(self, instance: Instance) -> None:
        """Deliver the entries other connector nodes appended for ``instance``'s gateway (a
        peer announced some, or the cluster's sweep asks).  One catch-up runs at a time per
        connection; a request while one runs makes it read again.  While the connection
        replays, the replay's end runs it; a connection that is not live (asleep, buffered-only,
        closed) is served by its next replay instead."""
        instance.catch_up_due = True
        if instance.live and (instance.catch_up_task is None or instance.catch_up_task.done()):
            instance.catch_up_task = self._tasks.spawn(self._catch_up(instance))

    async def _catch_up(self, instance: Instance) -> None:
        buffer = self._connector.buffer
        while instance.catch_up_due and instance.is_live():
            instance.catch_up_due = False
            left: set[str] = set()
            instance.left_during_read = left
            try:
                lines = await self._store.run(
                    functools.partial(
                        buffer.foreign_lines, instance.gateway_id, limit=_REPLAY_CHUNK
                    )
                )
            finally:
                instance.left_during_read = None
            if left:
                lines = [entry for entry in lines if entry[0] not in left]
            if len(lines) == _REPLAY_CHUNK:
                instance.catch_up_due = True  # more than one read's worth: read again
            if instance.acked_live:
                self._queue_foreign(instance, lines)
                return  # the pump sends them, and asks again if more are due
            unrecorded = instance.unrecorded
            try:
                for buffer_id, _seq, line in lines:
                    if not instance.is_live():
                        instance.catch_up_due = True  # the next replay or catch-up sends it
                        return
                    if buffer_id in unrecorded or buffer_id in instance.unacked:
                        continue  # sent on this connection already
                    unrecorded[buffer_id] = self._connector.clock.monotonic()
                    try:
                        await instance.ws.send(line)
                    except ConnectionClosed:
                        unrecorded.pop(buffer_id, None)  # never went out: replayed next time
                        return
            finally:
                self._record_sent_later(instance)

    def _queue_foreign(self, instance: Instance, lines: list[tuple[str, int, str]]) -> None:
        """Hand other nodes' entries to the windowed pump of a gateway that acks live
        deliveries (the window and the order of sends stay the pump's)."""
        queued = instance.foreign_queued
        fresh = [
            entry
            for entry in lines
            if entry[0] not in queued
            and entry[0] not in instance.unacked
            and entry[0] not in instance.unrecorded
        ]
        room = max(0, _OUTBOX_MAX - len(instance.outbox))
        if len(fresh) > room:
            # Memory stays bounded: the pump asks for the rest once its outbox has drained.
            fresh = fresh[:room]
            instance.catch_up_due = True
        if not fresh:
            return
        queued.update(entry[0] for entry in fresh)
        instance.outbox.extend(fresh)
        instance.wake.set()
        if instance.pump is None or instance.pump.done():
            instance.pump = self._tasks.spawn(self._pump(instance))

    # -- acks and the end of a connection ------------------------------------------------------

    def acked(self, instance: Instance, buffer_ids: list[str]) -> None:
        """The gateway acked these bufferIds: they leave its window and its unrecorded replays
        at once, and are retired by the next write round on the store thread."""
        if instance.is_standby():
            return  # it was shown nothing: what it acks is not its to retire
        if instance.left_during_read is not None:
            instance.left_during_read.update(buffer_ids)
        unrecorded = instance.unrecorded
        if unrecorded:
            for buffer_id in buffer_ids:
                unrecorded.pop(buffer_id, None)  # acked: its replay needs no separate record
        unacked = instance.unacked
        if unacked:
            unacked.difference_update(buffer_ids)
            if len(unacked) < instance.window:
                instance.window_open.set()
        self._store.ack(instance, buffer_ids)

    def closed(self, instance: Instance) -> None:
        """The connection ended (its machine is closed): end its pump and any replay waiting
        for the window, and record what it was shown and did not ack."""
        instance.outbox.clear()
        instance.foreign_queued.clear()
        instance.wake.set()  # the pump sees the connection closed and ends
        instance.window_open.set()  # and so does a replay waiting for the window
        self._record_sent(instance, True)

    # -- recording replays ---------------------------------------------------------------------

    def _record_sent_later(self, instance: Instance) -> None:
        """Arm the timer that records the replayed entries still unacked after the grace."""
        if instance.record_timer is None and instance.unrecorded:
            instance.record_timer = asyncio.ensure_future(self._record_after_grace(instance))

    async def _record_after_grace(self, instance: Instance) -> None:
        await self._connector.clock.sleep(_SENT_GRACE_S)
        instance.record_timer = None  # this timer is done: _record_sent must not cancel it
        self._record_sent(instance, False)

    def _record_sent(self, instance: Instance, everything: bool) -> None:
        """Record as ``sent`` the replayed entries of ``instance`` that are still unacked: those
        past the grace (all of them when ``everything``, as the connection ends).

        An entry acked within the grace goes straight from ``buffered`` to ``acked`` (the
        lifecycle allows it), so a prompt replay costs one write per entry, not two.  Only an
        ack retires an entry either way: recording ``sent`` is bookkeeping (the replay count,
        and which entries a gateway was shown but did not ack), never a condition of delivery.
        """
        if instance.record_timer is not None:
            instance.record_timer.cancel()
            instance.record_timer = None
        pending = instance.unrecorded
        due: list[str] = []
        if everything:
            due = list(pending)
            pending.clear()
        else:
            cutoff = self._connector.clock.monotonic() - _SENT_GRACE_S
            for buffer_id, at in pending.items():  # in send order, so oldest first
                if at > cutoff:
                    break
                due.append(buffer_id)
            for buffer_id in due:
                del pending[buffer_id]
            self._record_sent_later(instance)
        if due:
            if instance.left_during_read is not None:
                instance.left_during_read.update(due)
            self._store.record_sent(instance.gateway_id, due)

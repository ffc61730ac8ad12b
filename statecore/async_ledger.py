"""The ledger for asyncio: the same API, ``async``, never blocking the event loop.

Every write (record, mark, release, sweep, prune) is handed to one dedicated writer thread.  The
writer takes everything that has queued up since its last transaction and runs it in **one**
transaction (group commit): a hundred concurrent senders share one commit (and one fsync at
``synchronous=FULL``) instead of paying for a hundred.  Each operation's result -- or its error
-- is still its own: a refused operation (``InvalidTransition``, ``StaleState``, bad input)
writes nothing, so it never undoes another caller's write.
Only a failure of the transaction itself (the disk, a lock held past the busy timeout) fails the
whole batch, with :class:`~statecore.errors.StoreError`, and then nothing in it was written.
Writes run in submission order.

Reads (``get``, ``history``, ``owed``, ``abandoned``) never join a write transaction: they run
on a small pool of reader threads, directly on the store's plain reads.  On SQLite (WAL) a write
lock held by another process, or a batch of this ledger in progress, neither fails nor delays
them; the in-memory store, guarded by one lock, makes a read wait for a batch in progress.  A
read sees every write whose call has returned -- a caller that awaited its write reads it -- but
it is not ordered after writes that are still queued.

Given ``metrics``, the ledger reports what it writes exactly as :class:`Ledger` does, batched
writes one per row; the writer holds what a transaction reports until it commits, so a rolled
back write is never counted as done (see :class:`~statecore.metrics.HeldMetrics`).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, TypeVar

from statecore.batch import REFUSALS
from statecore.checks import require_positive
from statecore.clock import Clock
from statecore.errors import StoreError
from statecore.ledger import Ledger
from statecore.metrics import NO_METRICS, HeldMetrics, Metrics
from statecore.obligation import Claim, Obligation
from statecore.ownership import Incarnation, ProcessProbe
from statecore.policy import ErrorKind, LedgerPolicy
from statecore.store import Store, TransitionRecord

__all__ = ["AsyncLedger"]

T = TypeVar("T")

log = logging.getLogger(__name__)

_Op = tuple[Callable[[], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]", str | None, Any]
"""(the call, the caller's loop, its future, the batch key or None, the batch payload)."""
_STOP = object()
_READERS = 4
"""Reader threads per ledger (each holds its own store connection once it has read)."""


class _Threads(NamedTuple):
    """The threads of a ledger built with ``threads=True``: the writer and the readers."""

    writer: threading.Thread
    readers: ThreadPoolExecutor


class AsyncLedger:
    """:class:`~statecore.ledger.Ledger` for asyncio, with group commit on a writer thread and
    reads on reader threads outside any write transaction (see the module docs).

    ``AsyncLedger(store, *, policy=None, clock=None, incarnation=None, probe=None,
    metrics=NO_METRICS, max_batch=512, threads=True)``.  ``metrics`` is passed to the ledger,
    its reports held by the writer until their transaction commits.  Close it with
    :meth:`aclose` (or ``async with``): queued operations finish first.  A caller cancelled
    before the writer reaches its operation has it skipped (nothing written); once the writer
    has started the operation it runs to the end (its outcome is then visible in the store).

    ``threads=False`` starts no thread: reads run inline and the writes queued within one turn
    of the event loop commit together at the end of that turn, on the loop's own thread (which
    they block meanwhile).  That is for a deterministic simulation, where the loop alone decides
    what runs when (:mod:`relay.sim.loop`); callers must then all use one loop.

    The class is long because it mirrors every public method of the ledger, each a few lines
    that hand the call to the writer or a reader thread; the group commit itself is a few
    private methods.
    """

    def __init__(
        self,
        store: Store,
        *,
        policy: LedgerPolicy | None = None,
        clock: Clock | None = None,
        incarnation: Incarnation | None = None,
        probe: ProcessProbe | None = None,
        metrics: Metrics = NO_METRICS,
        max_batch: int = 512,
        threads: bool = True,
    ) -> None:
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive int, not {max_batch!r}")
        if not isinstance(threads, bool):
            raise TypeError(f"threads must be a bool, not {threads!r}")
        # What the writer's transactions report waits here for their commit (None: nothing
        # is reported, and the writer pays nothing for it).
        self._held = None if metrics is NO_METRICS else HeldMetrics(metrics)
        self.ledger = Ledger(
            store,
            policy=policy,
            clock=clock,
            incarnation=incarnation,
            probe=probe,
            metrics=metrics if self._held is None else self._held,
        )
        self.store = store
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[_Op | object] = queue.SimpleQueue()
        self._closed = False
        self._close_lock = threading.Lock()
        self.batches = 0
        """Transactions committed so far (for observing group commit)."""
        self.operations = 0
        """Operations executed so far."""
        # Without threads: what was submitted since the loop last ran the writer's turn.
        self._inline: list[_Op] = []
        # The one record of the mode: None without threads (nothing is built, nothing started).
        self._threads: _Threads | None = None
        if threads:
            writer = threading.Thread(target=self._run, name="statecore-ledger", daemon=True)
            writer.start()
            readers = ThreadPoolExecutor(_READERS, thread_name_prefix="statecore-ledger-read")
            self._threads = _Threads(writer, readers)

    @property
    def policy(self) -> LedgerPolicy:
        """The ledger's policy."""
        return self.ledger.policy

    @property
    def incarnation(self) -> Incarnation:
        """The owner identity this ledger records and claims rows as."""
        return self.ledger.incarnation

    # -- the ledger API, async ---------------------------------------------------------------

    async def record(
        self,
        *,
        session_key: str,
        platform: str,
        chat_id: str | int,
        content: str,
        message_ref: str | int | None = None,
        obligation_id: str | None = None,
        thread_id: str | int | None = None,
        reply_to: str | int | None = None,
        adapter_profile: str | None = None,
        trace: str | None = None,
    ) -> Obligation:
        """:meth:`Ledger.record`, off the event loop."""
        request: dict[str, Any] = {
            "session_key": session_key,
            "platform": platform,
            "chat_id": chat_id,
            "content": content,
            "message_ref": message_ref,
            "obligation_id": obligation_id,
            "thread_id": thread_id,
            "reply_to": reply_to,
            "adapter_profile": adapter_profile,
        }
        if trace is not None:  # kept in the creation audit entry (statecore.tracing)
            request["trace"] = trace
        return await self._submit(lambda: self.ledger.record(**request), "record", request)

    async def mark_attempting(self, obligation_id: str) -> Obligation:
        """:meth:`Ledger.mark_attempting`, off the event loop."""
        return await self._submit(
            lambda: self.ledger.mark_attempting(obligation_id), "settle", (obligation_id, "attempt")
        )

    async def mark_delivered(self, obligation_id: str) -> Obligation:
        """:meth:`Ledger.mark_delivered`, off the event loop."""
        return await self._submit(
            lambda: self.ledger.mark_delivered(obligation_id), "settle", (obligation_id, "deliver")
        )

    async def mark_failed(
        self,
        obligation_id: str,
        error: str,
        *,
        kind: ErrorKind | None = None,
        ambiguous: bool = False,
    ) -> Obligation:
        """:meth:`Ledger.mark_failed`, off the event loop."""
        return await self._submit(
            lambda: self.ledger.mark_failed(obligation_id, error, kind=kind, ambiguous=ambiguous)
        )

    async def release(
        self, obligation_id: str, error: str | None = None, *, kind: ErrorKind | None = None
    ) -> Obligation:
        """:meth:`Ledger.release`, off the event loop."""
        return await self._submit(lambda: self.ledger.release(obligation_id, error, kind=kind))

    async def sweep_recoverable(
        self,
        *,
        deliverable_platforms: Collection[str] | None = None,
        deliverable_targets: Collection[tuple[str, str]] | None = None,
        now: float | None = None,
    ) -> list[Claim]:
        """:meth:`Ledger.sweep_recoverable`, off the event loop."""
        return await self._submit(
            lambda: self.ledger.sweep_recoverable(
                deliverable_platforms=deliverable_platforms,
                deliverable_targets=deliverable_targets,
                now=now,
            )
        )

    async def sweep_failed_for_runtime(
        self, platform: str, *, profile: str | None = None, now: float | None = None
    ) -> list[Claim]:
        """:meth:`Ledger.sweep_failed_for_runtime`, off the event loop."""
        return await self._submit(
            lambda: self.ledger.sweep_failed_for_runtime(platform, profile=profile, now=now)
        )

    async def sweep_stuck_own(
        self,
        *,
        older_than_s: float,
        exclude: Collection[str] = frozenset(),
        deliverable_targets: Collection[tuple[str, str]] | None = None,
        now: float | None = None,
    ) -> list[Claim]:
        """:meth:`Ledger.sweep_stuck_own`, off the event loop.

        The candidates are read first, outside any write transaction: when nothing is stuck
        (the usual case on a timer) no write transaction is begun at all, so a write lock held
        elsewhere costs nothing.  ``exclude`` is copied when this is called: ids added to the
        caller's set afterwards are not excluded (a row that just became in-flight was just
        written, so it is not stuck anyway).  Raises as the sync method does.
        """
        require_positive("older_than_s", older_than_s)
        when = self.ledger.clock.now() if now is None else now
        skip = frozenset(exclude)
        targets = None if deliverable_targets is None else frozenset(deliverable_targets)
        candidates = await self._read(lambda: self.ledger._stuck_rows(older_than_s, when))
        if all(row.id in skip for row in candidates):
            return []
        return await self._submit(
            lambda: self.ledger.sweep_stuck_own(
                older_than_s=older_than_s, exclude=skip, deliverable_targets=targets, now=when
            )
        )

    async def prune(self, *, now: float | None = None) -> int:
        """:meth:`Ledger.prune`, off the event loop."""
        return await self._submit(lambda: self.ledger.prune(now=now))

    async def heartbeat(self, *, now: float | None = None) -> float:
        """:meth:`Ledger.heartbeat`, off the event loop."""
        return await self._submit(lambda: self.ledger.heartbeat(now=now))

    async def leave(self, *, now: float | None = None) -> bool:
        """:meth:`Ledger.leave`, off the event loop."""
        return await self._submit(lambda: self.ledger.leave(now=now))

    async def prune_owners(self, *, now: float | None = None) -> int:
        """:meth:`Ledger.prune_owners`, off the event loop."""
        return await self._submit(lambda: self.ledger.prune_owners(now=now))

    async def check(self) -> None:
        """:meth:`Ledger.check`, on a reader thread (not the writer: its own write transaction
        is the check).  Raises ``StoreError`` naming the problem, or when the ledger is closed.
        """
        await self._read(self.ledger.check)

    # -- reads: on reader threads, outside any write transaction ---------------------------------

    async def get(self, obligation_id: str) -> Obligation | None:
        """:meth:`Ledger.get`, off the event loop and outside any write transaction: it sees
        every write whose call has returned, not writes still queued.  Raises ``StoreError``
        when the store cannot be read or the ledger is closed."""
        return await self._read(lambda: self.ledger.get(obligation_id))

    async def history(self, obligation_id: str) -> list[TransitionRecord]:
        """:meth:`Ledger.history`, read as :meth:`get` reads (outside any write transaction)."""
        return await self._read(lambda: self.ledger.history(obligation_id))

    async def owed(self, *, limit: int | None = None) -> list[Obligation]:
        """:meth:`Ledger.owed`, read as :meth:`get` reads (outside any write transaction)."""
        return await self._read(lambda: self.ledger.owed(limit=limit))

    async def abandoned(self, *, limit: int | None = None) -> list[Obligation]:
        """:meth:`Ledger.abandoned`, read as :meth:`get` reads (outside any write transaction)."""
        return await self._read(lambda: self.ledger.abandoned(limit=limit))

    # -- closing -----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Finish queued operations and running reads, stop the writer and reader threads.
        Idempotent; later calls raise ``StoreError``."""
        self._stop()
        if self._threads is None:
            self._run_inline()
            return
        await asyncio.to_thread(self._threads.writer.join)
        await asyncio.to_thread(self._threads.readers.shutdown)

    def close(self, timeout: float | None = None) -> None:
        """Synchronous :meth:`aclose` for code without a running loop (waits at most
        ``timeout`` for the writer; running reads finish on their own)."""
        self._stop()
        if self._threads is None:
            self._run_inline()
            return
        self._threads.writer.join(timeout)
        self._threads.readers.shutdown(wait=False)

    async def __aenter__(self) -> AsyncLedger:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    def _stop(self) -> None:
        with self._close_lock:
            if not self._closed:
                self._closed = True
                if self._threads is not None:  # without threads nobody reads the queue
                    self._queue.put(_STOP)

    # -- the writer --------------------------------------------------------------------------

    async def _submit(self, fn: Callable[[], T], key: str | None = None, payload: Any = None) -> T:
        """Queue ``fn`` for the writer; ``key``/``payload`` let consecutive operations of one
        kind run as one store batch (``fn`` is their one-by-one equivalent)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._close_lock:
            if self._closed:
                raise StoreError("the ledger is closed")
            if self._threads is None:
                if not self._inline:
                    loop.call_soon(self._run_inline)
                self._inline.append((fn, loop, future, key, payload))
            else:
                self._queue.put((fn, loop, future, key, payload))
        return await future

    async def _read(self, fn: Callable[[], T]) -> T:
        """Run the read ``fn`` on a reader thread; raises ``StoreError`` once closed."""
        loop = asyncio.get_running_loop()
        with self._close_lock:
            if self._closed:
                raise StoreError("the ledger is closed")
            if self._threads is None:
                return fn()
            future = loop.run_in_executor(self._threads.readers, fn)
        return await future

    def _run_inline(self) -> None:
        """Without threads: the writer's turn, on the loop (everything submitted since)."""
        while self._inline:
            batch, self._inline = self._inline[: self._max_batch], self._inline[self._max_batch :]
            self._execute(batch)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            batch: list[_Op] = []
            item: object = first
            while True:
                if item is _STOP:
                    stopping = True
                else:
                    batch.append(item)  # type: ignore[arg-type]
                if len(batch) >= self._max_batch:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._execute(batch)

    def _execute(self, batch: list[_Op]) -> None:
        """Run a batch in one transaction and hand every caller its own outcome.

        Consecutive records, and consecutive attempt/deliver marks, run as one store batch
        (:class:`~statecore.batch.BatchStore`): fewer statements, the same outcomes as one by
        one.  A refusal (``InvalidTransition``, ``StaleState``, ``UnknownEntity``, bad input)
        writes nothing, so it is returned to its caller while the batch goes on.  Any other
        exception may have struck after a write: the whole transaction is rolled back and the
        batch replayed -- one operation at a time if the failure came from a store batch, so
        that the operation that failed is found, fails alone, and the rest go on in a new
        transaction.  A failure of the transaction itself fails every operation in it with
        ``StoreError``.
        """
        pending = batch
        grouped = True
        held = self._held
        while pending:
            if held is not None:
                held.hold()
            try:
                outcomes = self._attempt(pending, grouped=grouped)
                self.batches += 1
                self.operations += len(pending)
            except _Rollback as rollback:
                # Nothing of this attempt was committed: the fences the ledger remembered from
                # it are not the store's, so forget them all (ownership still guards).
                self.ledger.forget_fences()
                if held is not None:
                    # Replayed: its reports come again, but for the failed operation's own.
                    held.rollback(keep_errors=rollback.index is not None)
                if rollback.index is None:
                    grouped = False  # find the failing operation one by one
                    continue
                _deliver([pending[rollback.index]], [(False, rollback.failure)])
                pending = pending[: rollback.index] + pending[rollback.index + 1 :]
                continue
            except Exception as exc:
                self.ledger.forget_fences()
                if held is not None:
                    held.fail()
                error = (
                    exc
                    if isinstance(exc, StoreError)
                    else StoreError(f"group commit failed: {exc}")
                )
                if error is not exc:
                    error.__cause__ = exc
                outcomes = [(False, error)] * len(pending)
            else:
                if held is not None:
                    held.commit()
            _deliver(pending, outcomes)
            return

    def _attempt(self, pending: list[_Op], *, grouped: bool) -> list[tuple[bool, Any]]:
        """One transaction over ``pending``: every operation's outcome, or :class:`_Rollback`
        (nothing committed) naming the operation that failed unexpectedly (None: a group)."""
        outcomes: list[tuple[bool, Any]] = []
        with self.store.atomic():
            index = 0
            while index < len(pending):
                fn, _, future, key, _ = pending[index]
                if grouped and key is not None:
                    end = index + 1
                    while end < len(pending) and pending[end][3] == key:
                        end += 1
                    try:
                        outcomes.extend(self._run_group(key, pending[index:end]))
                    except StoreError:
                        raise  # the transaction itself is in doubt: fail the whole batch
                    except Exception as exc:
                        raise _Rollback(None, exc) from exc
                    index = end
                    continue
                if future.cancelled():
                    outcomes.append((False, None))
                else:
                    try:
                        outcomes.append((True, fn()))
                    except StoreError:
                        raise  # the transaction itself is in doubt: fail the whole batch
                    except REFUSALS as exc:
                        outcomes.append((False, exc))
                    except Exception as exc:
                        raise _Rollback(index, exc) from exc
                index += 1
        return outcomes

    def _run_group(self, key: str, group: list[_Op]) -> list[tuple[bool, Any]]:
        """Run consecutive operations of one kind as one store batch (cancelled ones skipped)."""
        live = [i for i, op in enumerate(group) if not op[2].cancelled()]
        payloads = [group[i][4] for i in live]
        if key == "record":
            results = self.ledger._record_each(payloads)
        else:
            results = self.ledger._settle_each(payloads)
        outcomes: list[tuple[bool, Any]] = [(False, None)] * len(group)
        for i, result in zip(live, results, strict=True):
            outcomes[i] = (False, result) if isinstance(result, Exception) else (True, result)
        return outcomes


class _Rollback(Exception):
    """Aborts a batch's transaction so an operation that failed after writing leaves no trace.

    ``index`` is the failed operation's place in the batch, None when it failed inside a
    store batch of several operations; ``failure`` what it raised.
    """

    def __init__(self, index: int | None, failure: BaseException) -> None:
        super().__init__(index, failure)
        self.index = index
        self.failure = failure


def _deliver(ops: list[_Op], outcomes: list[tuple[bool, Any]]) -> None:
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
    for (_, loop, future, _, _), (ok, value) in zip(ops, outcomes, strict=True):
        by_loop.setdefault(loop, []).append((future, ok, value))
    for loop, settled in by_loop.items():
        try:
            # One wake-up per loop per batch, not one per operation.
            loop.call_soon_threadsafe(_settle_all, settled)
        except RuntimeError:
            log.warning("ledger results dropped: their event loop is closed")


def _settle_all(settled: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for future, ok, value in settled:
        if future.done():
            continue
        if ok:
            future.set_result(value)
        elif value is not None:
            future.set_exception(value)

"""statecore against the libraries a user would pick instead, side by side in one run.

Run: ``.venv/bin/python benchmarks/bench_peers.py`` (``--check`` exits 1 if a target is
missed; ``--only NAME`` runs one part; ``--quick`` shrinks every size for a smoke run).  Needs
the peers in the venv: ``litequeue``, ``persist-queue``, ``python-statemachine`` and
``transitions``.

Parts and targets:

* ``normal``: 1,500 items, each enqueue -> claim -> settle with a commit per step, on SQLite WAL
  + synchronous NORMAL.  ``Ledger(SQLiteStore)`` (record -> mark_attempting -> mark_delivered,
  audit rows included) >= 1.25x ``litequeue`` (put -> pop -> done); below 0.8x is also flagged.
* ``full``: the same at synchronous FULL.  ``Ledger(SQLiteStore(synchronous="FULL"))`` >= 1.25x
  ``persistqueue.SQLiteAckQueue`` (put -> get -> ack), its connection set to FULL; and >= 0.8x
  the disk's floor, measured in the same turns: three raw durable commits per item, each a
  256-byte write at the next offset of a preallocated file then ``os.fdatasync`` (what a commit
  of one small record costs on this file system at the least: no SQL, no page, no file growth).
* ``async``: ``AsyncLedger`` with 100 concurrent senders, each running the same lifecycle,
  >= 2.5x the sequential ``Ledger`` at NORMAL and >= 6x at FULL.
* ``lifecycle``: one event fired on a ``Lifecycle.track`` machine >= 50x faster than on a
  ``transitions`` model and than on a ``python-statemachine`` machine (the same 4-state
  lifecycle); heap per tracked object (tracemalloc over many objects) <= 128 bytes, printed
  next to the peers'.

Every workload runs in a fresh temporary directory.  In ``normal``, ``full`` and ``async`` every
side is open at once in every round and the sides take turns (the order rotating per round), so
that a slow spell of the machine falls on all of them: turns of 50 items in ``normal`` and
``full`` (5 rounds); in ``async`` a turn is every sender running 3 lifecycles at once (300
items) against the sequential ledger's 300 (9 rounds).
Rates printed are medians over the rounds and the ratio checked is the median of the rounds' own
ratios.  The pragmas in effect are read back from each side's connection, and SQL statements,
commits and WAL frames per item are counted (trace callback) on a separate, untimed run.
Absolute numbers drift between runs, ratios hold.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import timeit
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, cast

import litequeue  # type: ignore[import-untyped]
import persistqueue
import statemachine
import transitions
from bench_ledger import _async_senders, _fresh_db, _paired
from ledger_sql import PAYLOAD

from statecore import AsyncLedger, Ledger, Lifecycle, Transition
from stores import SQLiteStore

# -- results and the final table ----------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One line of the final table: our figure, the peer's, their ratio and its target."""

    part: str
    measure: str
    ours: str
    ours_value: float
    peer: str
    peer_value: float
    ratio: float | None
    target: str
    ok: bool


RESULTS: list[Row] = []
PRAGMAS: list[tuple[str, str]] = []
COUNTS: list[tuple[str, str]] = []


def _figure(value: float, measure: str) -> str:
    if measure.startswith("ns"):
        return f"{value:,.0f} ns"
    if measure.startswith("bytes"):
        return f"{value:,.0f} B"
    return f"{value:,.0f}/s"


def report(row: Row) -> None:
    """Record one comparison and print its ratio against the target."""
    RESULTS.append(row)
    ratio = "" if row.ratio is None else f"{row.ratio:8.2f}x"
    print(f"  {row.part} {row.measure} vs {row.peer}: {ratio}  target {row.target}  {_mark(row)}")


def _mark(row: Row) -> str:
    return "ok" if row.ok else "MISSED"


def print_table() -> None:
    """Every comparison side by side: ours, the peer, the ratio and the target."""
    head = ("part", "measure", "statecore", "", "peer", "", "ratio", "target", "")
    lines = [head]
    for r in RESULTS:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        lines.append(
            (
                r.part,
                r.measure,
                r.ours,
                _figure(r.ours_value, r.measure),
                r.peer,
                _figure(r.peer_value, r.measure),
                ratio,
                r.target,
                _mark(r),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    right = {3, 5, 6}
    for line in lines:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(line)
        ]
        print("  " + "  ".join(cells).rstrip())
    if PRAGMAS:
        print(
            "pragmas read back from each side's connection "
            "(journal_mode, synchronous, page_size, wal_autocheckpoint):"
        )
        for who, pragmas in PRAGMAS:
            print(f"  {who:<48} {pragmas}")
    if COUNTS:
        print("per item, counted with a trace callback on an untimed run:")
        for who, counts in COUNTS:
            print(f"  {who:<48} {counts}")


# -- shared helpers -------------------------------------------------------------------------------

_SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


@contextlib.contextmanager
def _fresh_dir(name: str) -> Iterator[Path]:
    """A new temporary directory for one workload, deleted afterwards."""
    with tempfile.TemporaryDirectory(prefix=f"statecore-peers-{name}-") as tmp:
        yield Path(tmp)


def _pragmas(conn: sqlite3.Connection) -> str:
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    checkpoint = conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
    return f"{mode}, {_SYNC_NAMES.get(sync, str(sync))}, {page}, {checkpoint}"


def _store_connections(store: SQLiteStore) -> list[sqlite3.Connection]:
    """The store's open connections (private: read only to print pragmas and trace)."""
    conns = getattr(getattr(store, "_db", None), "_connections", None)
    return list(conns) if isinstance(conns, list) else []


def _store_pragmas(store: SQLiteStore) -> str:
    conns = _store_connections(store)
    if not conns:
        return "could not read (no connection reachable)"
    return "; ".join(sorted({_pragmas(c) for c in conns}))


def _note_pragmas(who: str, pragmas: str) -> None:
    if (who, pragmas) not in PRAGMAS:
        PRAGMAS.append((who, pragmas))
        print(f"  pragmas {who}: {pragmas}")


class _Tracer:
    """Counts statements and commits seen by ``sqlite3`` trace callbacks: a commit is a
    ``COMMIT``/``END``/outermost ``RELEASE``, or a write statement run outside an explicit
    transaction.  The callback reports a trigger's steps with the text of the statement that
    fired them, so an entry repeating the previous one is counted as a trigger callback."""

    _WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")

    def __init__(self) -> None:
        self.statements = 0
        self.trigger_calls = 0
        self.commits = 0
        self._open = False
        self._savepoints = 0  # > 0: the transaction was opened by a SAVEPOINT
        self._last = ""

    def __call__(self, sql: str) -> None:
        if sql == self._last:
            self.trigger_calls += 1
            return
        self._last = sql
        self.statements += 1
        words = sql.split(None, 1)
        head = words[0].upper() if words else ""
        if head == "BEGIN":
            self._open = True
        elif head == "SAVEPOINT" and (self._savepoints or not self._open):
            self._open = True
            self._savepoints += 1
        elif head == "RELEASE" and self._savepoints:
            self._savepoints -= 1
            if not self._savepoints:
                self.commits += 1
                self._open = False
        elif head in ("COMMIT", "END"):
            self.commits += self._open
            self._open = False
            self._savepoints = 0
        elif head == "ROLLBACK" and len(words) == 1:
            self._open = False
            self._savepoints = 0
        elif head in self._WRITES and not self._open:
            self.commits += 1

    def per_item(self, n: int) -> str:
        triggers = (
            f" (+{self.trigger_calls / n:.1f} trigger callbacks)" if self.trigger_calls else ""
        )
        return f"{self.statements / n:.1f} statements{triggers}, {self.commits / n:.1f} commits"


def _count(who: str, conns: list[sqlite3.Connection], run: Callable[[], None], n: int) -> None:
    """Run ``n`` items with every statement traced and the WAL kept whole (no automatic
    checkpoint), then print statements, commits and WAL frames (pages written) per item."""
    tracer = _Tracer()
    conns[0].execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for conn in conns:
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.set_trace_callback(tracer)
    run()
    for conn in conns:
        conn.set_trace_callback(None)
    frames = conns[0].execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
    counts = f"{tracer.per_item(n)}, {frames / n:.1f} WAL frames"
    COUNTS.append((who, counts))
    print(f"  {who}: {counts} per item")


# -- the ledger's lifecycle ------------------------------------------------------------------------


def _ledger_items(ledger: Ledger, n: int, first: int = 0) -> None:
    for i in range(first, first + n):
        ob = ledger.record(**PAYLOAD, obligation_id=f"ob-{i}")
        ledger.mark_attempting(ob.obligation_id)
        ledger.mark_delivered(ob.obligation_id)


def _ledger_store(tmp: Path, sync: str) -> SQLiteStore:
    """A store on a new file with the obligation table made (as the peers make theirs when
    constructed, before the clock starts)."""
    return _fresh_db(tmp, "ledger", sync)[1]


def _count_ledger(sync: str, n: int) -> None:
    with _fresh_dir("ledger-trace") as tmp:
        store = _ledger_store(tmp, sync)
        ledger = Ledger(store)
        _ledger_items(ledger, 1)  # opens what the first item opens
        conns = _store_connections(store)
        if conns:
            _count(f"Ledger(SQLiteStore), {sync}", conns, lambda: _ledger_items(ledger, n, 1), n)
        else:
            COUNTS.append((f"Ledger(SQLiteStore), {sync}", "could not reach its connection"))
        store.close()


# -- normal: litequeue ----------------------------------------------------------------------------


def _litequeue_items(queue: Any, n: int) -> None:
    for _ in range(n):
        queue.put(json.dumps(PAYLOAD))
        message = queue.pop()
        assert message is not None
        queue.done(message.message_id)


class _LiteQueue:
    """litequeue as shipped (it sets WAL and NORMAL itself)."""

    def __init__(self, tmp: Path) -> None:
        self.queue = litequeue.LiteQueue(str(tmp / "queue.db"))

    def run(self, first: int, n: int) -> None:
        _litequeue_items(self.queue, n)

    def pragmas(self) -> str:
        return _pragmas(self.queue.conn)

    def close(self) -> None:
        self.queue.close()


def _count_litequeue(n: int) -> None:
    with _fresh_dir("litequeue-trace") as tmp:
        queue = litequeue.LiteQueue(str(tmp / "queue.db"))
        _count("litequeue, NORMAL", [queue.conn], lambda: _litequeue_items(queue, n), n)
        queue.close()


def bench_normal(n: int, rounds: int) -> None:
    """Ledger vs litequeue, a commit per step, WAL + synchronous NORMAL."""
    _versus_queue(
        Versus("normal", "NORMAL", "litequeue", "litequeue put -> pop -> done"),
        "litequeue.LiteQueue, normal",
        _LiteQueue,
        _count_litequeue,
        n=n,
        rounds=rounds,
        floor=0.8,
    )


# -- full: persist-queue --------------------------------------------------------------------------


def _persist_queue(tmp: Path) -> persistqueue.SQLiteAckQueue:
    """A SQLiteAckQueue committing every step (its only mode), its connection set to FULL."""
    queue = persistqueue.SQLiteAckQueue(str(tmp / "queue"), auto_commit=True, multithreading=False)
    # The queue opens one connection (putter and getter are the same object without
    # multithreading); it sets WAL but leaves synchronous at SQLite's default.
    _persist_conn(queue).execute("PRAGMA synchronous = FULL")
    return queue


def _persist_conn(queue: persistqueue.SQLiteAckQueue) -> sqlite3.Connection:
    """The queue's connection (private; its type hints declare it None)."""
    assert queue._putter is queue._getter
    return cast(sqlite3.Connection, queue._putter)


def _persist_items(queue: persistqueue.SQLiteAckQueue, n: int) -> None:
    for _ in range(n):
        queue.put(PAYLOAD)
        item = queue.get(block=False, raw=True)
        queue.ack(id=item["pqid"])


class _PersistQueue:
    """persist-queue's SQLiteAckQueue, its connection set to FULL."""

    def __init__(self, tmp: Path) -> None:
        self.queue = _persist_queue(tmp)

    def run(self, first: int, n: int) -> None:
        _persist_items(self.queue, n)

    def pragmas(self) -> str:
        return _pragmas(_persist_conn(self.queue))

    def close(self) -> None:
        self.queue.close()


def _count_persist(n: int) -> None:
    with _fresh_dir("persistqueue-trace") as tmp:
        queue = _persist_queue(tmp)
        conn = _persist_conn(queue)
        _count("persistqueue.SQLiteAckQueue, FULL", [conn], lambda: _persist_items(queue, n), n)
        queue.close()


FLOOR_RECORD = 256
"""Bytes of one raw durable commit of the disk floor (an item's step, about what the ledger's
row change and audit entry hold)."""
FLOOR_FILE = 1 << 22
"""The floor's preallocated file: its commits overwrite it in a ring, so none grows the file."""


class _DiskFloor:
    """The disk's floor: three durable commits per item, each one ``FLOOR_RECORD``-byte write
    at the next offset of a preallocated, already synced file, then ``os.fdatasync`` -- the
    least a durable commit of a small record costs on this file system."""

    def __init__(self, tmp: Path) -> None:
        self.fd = os.open(tmp / "floor", os.O_RDWR | os.O_CREAT, 0o600)
        os.write(self.fd, b"\0" * FLOOR_FILE)
        os.fsync(self.fd)
        self.offset = 0
        self.record = (json.dumps(PAYLOAD).encode() + b" " * FLOOR_RECORD)[:FLOOR_RECORD]

    def run(self, first: int, n: int) -> None:
        fd, record, size = self.fd, self.record, FLOOR_FILE
        for _ in range(3 * n):
            os.pwrite(fd, record, self.offset)
            os.fdatasync(fd)
            self.offset = (self.offset + FLOOR_RECORD) % size

    def pragmas(self) -> str:
        return "plain file, os.pwrite + os.fdatasync"

    def close(self) -> None:
        os.close(self.fd)


def bench_full(n: int, rounds: int) -> None:
    """Ledger vs persist-queue's SQLiteAckQueue, a commit per step, WAL + synchronous FULL,
    and vs the disk's floor in the same turns."""
    _versus_queue(
        Versus("full", "FULL", "persist-queue SQLiteAckQueue", "SQLiteAckQueue put -> get -> ack"),
        "persistqueue.SQLiteAckQueue, full",
        _PersistQueue,
        _count_persist,
        n=n,
        rounds=rounds,
        floor=None,
        disk_floor=True,
    )


@dataclass(frozen=True)
class Versus:
    """One sequential part: its name, the durability, the peer and what the peer runs."""

    part: str
    sync: str
    peer: str
    peer_steps: str


class _Contender(Protocol):
    """One side of a sequential part, on its own new file."""

    def run(self, first: int, n: int) -> None: ...
    def pragmas(self) -> str: ...
    def close(self) -> None: ...


class _LedgerSide:
    """``Ledger(SQLiteStore)`` at one durability."""

    def __init__(self, tmp: Path, sync: str) -> None:
        self.store = _ledger_store(tmp, sync)
        self.ledger = Ledger(self.store)

    def run(self, first: int, n: int) -> None:
        _ledger_items(self.ledger, n, first)

    def pragmas(self) -> str:
        return _store_pragmas(self.store)

    def close(self) -> None:
        self.store.close()


TURN = 50
"""Items per turn in the sequential parts: the sides alternate this often within a round."""


def _turns(
    makers: list[Callable[[Path], _Contender]], n: int, r: int, *, turn: int = TURN
) -> list[tuple[float, str]]:
    """One round: every side on a new file, warmed by a few items, then taking turns of
    ``turn`` items (the order rotating per round) until each has run ``n``; each side's rate
    over its own turns and its pragmas.  A slow spell of the machine falls on every side."""
    with contextlib.ExitStack() as stack:
        sides: list[_Contender] = []
        for i, make in enumerate(makers):
            side = make(stack.enter_context(_fresh_dir(f"side{i}")))
            stack.callback(side.close)
            side.run(0, 10)  # opens what the first item opens
            sides.append(side)
        spent = [0.0] * len(sides)
        gc.collect()
        for t in range(max(1, n // turn)):
            for j in range(len(sides)):
                k = (j + t + r) % len(sides)
                start = time.perf_counter()
                sides[k].run(10 + t * turn, turn)
                spent[k] += time.perf_counter() - start
        done = max(1, n // turn) * turn
        return [(done / t, side.pragmas()) for t, side in zip(spent, sides, strict=True)]


def _versus_queue(
    versus: Versus,
    peer_pragmas_label: str,
    make_peer: Callable[[Path], _Contender],
    count_peer: Callable[[int], None],
    *,
    n: int,
    rounds: int,
    floor: float | None,
    disk_floor: bool = False,
) -> None:
    """The Ledger against one queue at one durability, a commit per step, the sides taking
    turns within each round; reports the median of the rounds' ratios against the >= 1.25x
    target (and ``floor``); with ``disk_floor``, also against :class:`_DiskFloor` (>= 0.8x),
    which takes its turns in the same rounds."""
    sync = versus.sync
    print(
        f"{versus.part}: enqueue -> claim -> settle "
        f"(n={n}, {rounds} rounds, turns of {TURN}, WAL, synchronous={sync})"
    )
    ours: list[float] = []
    peer: list[float] = []
    disk: list[float] = []
    our_pragmas: list[str] = []
    peer_pragmas: list[str] = []
    makers: list[Callable[[Path], _Contender]] = [lambda tmp: _LedgerSide(tmp, sync), make_peer]
    if disk_floor:
        makers.append(_DiskFloor)
    for r in range(rounds):
        measured = _turns(makers, n, r)
        (our_rate, our_pragma), (peer_rate, peer_pragma) = measured[:2]
        ours.append(our_rate)
        peer.append(peer_rate)
        if disk_floor:
            disk.append(measured[2][0])
        our_pragmas.append(our_pragma)
        peer_pragmas.append(peer_pragma)
    our, their = statistics.median(ours), statistics.median(peer)
    print(f"  {versus.peer_steps:<50} {their:10.0f} items/s")
    if disk_floor:
        floor_rate = statistics.median(disk)
        print(f"  {'disk floor: 3 x (pwrite 256 B + fdatasync)':<50} {floor_rate:10.0f} items/s")
    print(f"  {'Ledger record -> mark_attempting -> mark_delivered':<50} {our:10.0f} items/s")
    store = "SQLiteStore()" if sync == "NORMAL" else 'SQLiteStore(synchronous="FULL")'
    _note_pragmas(f"Ledger({store}), {versus.part}", "; ".join(sorted(set(our_pragmas))))
    _note_pragmas(peer_pragmas_label, "; ".join(sorted(set(peer_pragmas))))
    traced = min(n, 300 if sync == "NORMAL" else 100)
    _count_ledger(sync, traced)
    count_peer(traced)
    ratio = _paired(ours, peer)
    target = ">= 1.25" if floor is None else f">= 1.25 (floor {floor:g})"
    report(
        Row(
            versus.part,
            f"items/s, {sync}",
            "Ledger",
            our,
            versus.peer,
            their,
            ratio,
            target,
            ratio >= 1.25,
        )
    )
    if floor is not None and ratio < floor:
        print(f"  below the {floor:g}x floor as well ({ratio:.2f}x)")
    if disk_floor:
        to_disk = _paired(ours, disk)
        report(
            Row(
                versus.part,
                f"items/s, {sync}",
                "Ledger",
                our,
                "disk floor (3 fdatasyncs/item)",
                statistics.median(disk),
                to_disk,
                ">= 0.8",
                to_disk >= 0.8,
            )
        )


# -- async: group commit against the sequential ledger --------------------------------------------


ASYNC_SENDERS = 100
ASYNC_TURN = 3
"""Lifecycles per sender in one turn of the ``async`` part (all senders at once)."""


async def _async_turn(ledger: AsyncLedger, senders: int, per_sender: int, first: int) -> None:
    """Every sender runs ``per_sender`` lifecycles at once (``bench_ledger._async_senders``'s
    workload: a chat and session per sender, no thread), ids from ``first`` on."""
    await _async_senders(ledger, senders, per_sender, first)


class _AsyncSide:
    """``AsyncLedger(SQLiteStore)`` with ``ASYNC_SENDERS`` concurrent senders, on an event loop
    of its own kept across its turns; a turn of ``n`` items is every sender running
    ``n // ASYNC_SENDERS`` lifecycles at once."""

    def __init__(self, tmp: Path, sync: str) -> None:
        self.store = _ledger_store(tmp, sync)
        self.ledger = AsyncLedger(self.store)
        self.loop = asyncio.new_event_loop()

    def run(self, first: int, n: int) -> None:
        per = max(1, n // ASYNC_SENDERS)
        self.loop.run_until_complete(_async_turn(self.ledger, ASYNC_SENDERS, per, first))

    def pragmas(self) -> str:
        return _store_pragmas(self.store)

    def close(self) -> None:
        self.ledger.close()
        self.loop.close()
        self.store.close()


def _async_at(sync: str, target: float, n: int, rounds: int) -> None:
    turn = ASYNC_SENDERS * ASYNC_TURN
    print(
        f"async: {ASYNC_SENDERS} senders x {ASYNC_TURN} lifecycles a turn vs the sequential "
        f"Ledger's {turn}, turns in turn, {n} items each a round, {rounds} rounds, "
        f"synchronous={sync}"
    )
    ours: list[float] = []
    seq: list[float] = []
    sides: list[_AsyncSide] = []

    def make_async(tmp: Path) -> _AsyncSide:
        side = _AsyncSide(tmp, sync)
        sides.append(side)
        return side

    batches = ops = 0
    for r in range(rounds):
        (our_rate, pragmas), (seq_rate, _) = _turns(
            [make_async, lambda tmp: _LedgerSide(tmp, sync)], n, r, turn=turn
        )
        ours.append(our_rate)
        seq.append(seq_rate)
        batches += sides[-1].ledger.batches
        ops += sides[-1].ledger.operations
    _note_pragmas(f"AsyncLedger(SQLiteStore), {sync}", pragmas)
    our, base = statistics.median(ours), statistics.median(seq)
    print(f"  {'Ledger, sequential':<50} {base:10.0f} items/s")
    print(
        f"  {f'AsyncLedger, {ASYNC_SENDERS} senders':<50} {our:10.0f} items/s "
        f"({ops / max(1, batches):.0f} operations per commit)"
    )
    ratio = _paired(ours, seq)
    report(
        Row(
            "async",
            f"items/s, {sync}",
            f"AsyncLedger x{ASYNC_SENDERS}",
            our,
            "sequential Ledger",
            base,
            ratio,
            f">= {target:g}",
            ratio >= target,
        )
    )


def bench_async(n: int, rounds: int) -> None:
    """AsyncLedger, 100 concurrent senders, vs the sequential Ledger, NORMAL and FULL, taking
    turns."""
    _async_at("NORMAL", 2.5, n, rounds)
    _async_at("FULL", 6.0, n, max(3, rounds // 2))


# -- lifecycle: the in-memory machine against transitions and python-statemachine ---------------


class Reply(StrEnum):
    """The 4-state lifecycle every contender declares."""

    PENDING = "pending"
    ATTEMPTING = "attempting"
    FAILED = "failed"
    DELIVERED = "delivered"


REPLY: Lifecycle[Reply] = Lifecycle(
    "reply",
    Reply,
    initial=Reply.PENDING,
    terminal=(Reply.DELIVERED,),
    transitions=(
        Transition("attempt", Reply.PENDING, Reply.ATTEMPTING),
        Transition("deliver", Reply.ATTEMPTING, Reply.DELIVERED),
        Transition("fail", Reply.ATTEMPTING, Reply.FAILED),
        Transition("retry", Reply.FAILED, Reply.ATTEMPTING),
    ),
)

_MOVES = [
    {"trigger": t.event, "source": list(t.sources), "dest": t.target} for t in REPLY.transitions
]


class ReplyFlow(statemachine.StateMachine):
    """The same lifecycle as a python-statemachine class."""

    pending = statemachine.State(initial=True)
    attempting = statemachine.State()
    failed = statemachine.State()
    delivered = statemachine.State(final=True)

    attempt = pending.to(attempting)
    deliver = attempting.to(delivered)
    fail = attempting.to(failed)
    retry = failed.to(attempting)


class _Model:
    """A plain object a ``transitions`` machine decorates."""


def _transitions_machine(models: list[_Model] | None) -> transitions.Machine:
    return transitions.Machine(
        model=models,
        states=Reply,
        transitions=_MOVES,
        initial=Reply.PENDING,
        auto_transitions=False,
    )


def _event_loops(number: int) -> dict[str, tuple[timeit.Timer, int]]:
    """Per contender: a timer firing ``fail`` then ``retry`` (two real moves, so every loop
    fires the same events without resetting), and its loop count."""
    ours = REPLY.track()
    ours.fire("attempt")
    model = _Model()
    _transitions_machine([model])
    model.trigger("attempt")  # type: ignore[attr-defined]
    flow = ReplyFlow()
    flow.send("attempt")
    stmt = "fire('fail'); fire('retry')"
    return {
        "ours": (timeit.Timer(stmt, globals={"fire": ours.fire}), number),
        "transitions": (
            timeit.Timer(stmt, globals={"fire": model.trigger}),  # type: ignore[attr-defined]
            max(1, number // 20),
        ),
        "python-statemachine": (
            timeit.Timer(stmt, globals={"fire": flow.send}),
            max(1, number // 200),
        ),
    }


def _heap_per_object(make: Callable[[], object], n: int) -> float:
    """Heap bytes per object kept alive, over ``n`` objects (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = [make() for _ in range(n)]
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return (after - before) / n


def _memory(n: int) -> dict[str, float]:
    shared = _transitions_machine(None)

    def transitions_model() -> object:
        model = _Model()
        shared.add_model(model)
        return model

    return {
        "ours": _heap_per_object(REPLY.track, n),
        "transitions": _heap_per_object(transitions_model, max(100, n // 4)),
        "python-statemachine": _heap_per_object(ReplyFlow, max(100, n // 10)),
        "bare model": _heap_per_object(_Model, n),
    }


def bench_lifecycle(number: int, rounds: int, objects: int) -> None:
    """Per-event time and heap per tracked object: ours vs transitions and python-statemachine."""
    print(f"lifecycle: one event on a tracked machine ({rounds} interleaved rounds)")
    loops = _event_loops(number)
    samples: dict[str, list[float]] = {name: [] for name in loops}
    for r in range(rounds):
        names = list(loops)
        for i in range(len(names)):
            name = names[(i + r) % len(names)]
            timer, count = loops[name]
            samples[name].append(timer.timeit(count) / (2 * count))
    per = {name: statistics.median(values) for name, values in samples.items()}
    for name, seconds in per.items():
        print(f"  {name:<50} {seconds * 1e9:10.0f} ns/event")
    heap = _memory(objects)
    print(f"heap per tracked object ({objects} of ours; tracemalloc)")
    for name in ("ours", "transitions", "python-statemachine"):
        print(f"  {name:<50} {heap[name]:10.0f} bytes")
    print(
        f"  (transitions: a plain model object added to one shared Machine, the object "
        f"itself included; a bare instance of it: {heap['bare model']:.0f} bytes)"
    )
    for peer in ("transitions", "python-statemachine"):
        ratio = _paired(samples[peer], samples["ours"])
        report(
            Row(
                "lifecycle",
                "ns/event",
                "Lifecycle.track",
                per["ours"] * 1e9,
                peer,
                per[peer] * 1e9,
                ratio,
                ">= 50 (peer/ours)",
                ratio >= 50,
            )
        )
    for peer in ("transitions", "python-statemachine"):
        report(
            Row(
                "lifecycle",
                "bytes/object",
                "Lifecycle.track",
                heap["ours"],
                peer,
                heap[peer],
                heap[peer] / heap["ours"],
                "ours <= 128 B",
                heap["ours"] <= 128,
            )
        )


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the selected parts; with ``--check`` return 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("normal", "full", "async", "lifecycle"))
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    quick = args.quick
    began = time.perf_counter()
    parts: dict[str, Callable[[], None]] = {
        "normal": lambda: bench_normal(300 if quick else 1500, 3 if quick else 5),
        "full": lambda: bench_full(150 if quick else 1500, 3 if quick else 5),
        "async": lambda: bench_async(600 if quick else 1500, 3 if quick else 9),
        "lifecycle": lambda: bench_lifecycle(
            20_000 if quick else 100_000, 3 if quick else 7, 2_000 if quick else 20_000
        ),
    }
    for name, run in parts.items():
        if args.only in (None, name):
            run()
            print()
    print("side by side (rates and times: medians over rounds; ratio: median of per-round ratios)")
    print_table()
    missed = [r for r in RESULTS if not r.ok]
    print(f"{len(RESULTS) - len(missed)} of {len(RESULTS)} targets met")
    print(f"took {time.perf_counter() - began:.1f} s")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())

"""What the ledger's lifecycle costs on SQLite, piece by piece: the ledger's own statements run
raw, then the same with one cost taken away, against litequeue, finely interleaved.

Each item is one lifecycle (create -> claim -> settle), three commits, at WAL + synchronous
NORMAL, as in ``bench_peers.py --only normal`` (``--synchronous FULL``: every contender at FULL,
litequeue's connection set to it after its constructor sets NORMAL).  The contenders:

* ``Ledger``: the real thing, ``Ledger(SQLiteStore(path))``.
* ``ledger SQL``: the very statements the ledger executes (their text from the store's SQL
  seam, ``stores._sqlite_sql``), bound and run with plain ``sqlite3`` on a file the store
  created: the store's SQLite work with no Python of statecore around it.
* ``- settled-row index``: the same, on a file without the index pruning reads.
* ``- RETURNING but fence``: the same statements returning only the new fence.
* ``- RETURNING``: the moves return nothing (the row count tells whether the guard held).
* ``- RETURNING, row guarded``: the same, each move also comparing every column it leaves
  (what a writer would need to prove the row it kept from its last write is the current one).
* ``- secondary indexes``: no index besides the primary key (the sweeps and pruning would scan).
* ``litequeue``: put -> pop -> done.

None of the variants is a design the framework could ship as it is (each loses a read the
framework relies on); they measure what each piece costs, so that a design can be weighed
before it is built.  Every round makes fresh files; within a round the contenders take turns of
50 items (the order rotates), so that a slow spell of the machine falls on all of them alike.
Printed: the median rate over the rounds and the median of the rounds' ratios to litequeue and
to ``ledger SQL``.  Informational: no target, ``--check`` never fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import litequeue  # type: ignore[import-untyped]
from bench_peers import PAYLOAD

import stores._sqlite_sql as sql
from statecore import OBLIGATION_KIND, Audit, Ledger, ObligationState
from statecore.store import plan_transition
from stores import SQLiteStore
from stores._sqlite_conn import default_checkpoint_pages
from stores._sqlite_shortcuts import audit_values

TURN = 50
"""Items per turn of one contender."""

_GUARDED = (
    "session_key", "platform", "chat_id", "thread_id", "reply_to", "content", "attempts",
    "created_at", "owner_host", "owner_pid", "owner_started_at", "lease_expires_at",
    "last_error", "error_kind", "next_attempt_at", "adapter_profile",
)  # fmt: skip
"""The columns a move leaves as they were (all but ``updated_at``, which it sets, and the owner
token, which it compares already), compared by ``- RETURNING, row guarded``."""

_K = OBLIGATION_KIND


class _Raw:
    """The ledger's statements on a file the store made, run with plain sqlite3."""

    def __init__(self, path: str, variant: str, synchronous: str) -> None:
        store = SQLiteStore(path)
        ledger = Ledger(store)
        me = ledger.incarnation
        self.label = me.label
        self.owner = (me.host, me.pid, me.started_at, me.token)
        store.close()
        self.conn = sqlite3.connect(path, isolation_level=None, cached_statements=256)
        self.conn.execute(f"PRAGMA synchronous = {synchronous}")
        # As the store's connections: the file's page size is the store's already.
        self.conn.execute(sql.autocheckpoint_sql(default_checkpoint_pages(synchronous)))
        names = [
            r[0]
            for r in self.conn.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'index' AND sql IS NOT NULL"
            )
        ]
        for name in names:
            if variant == "noindex" or (variant == "nosettled" and "in_abandoned" in name):
                self.conn.execute(f"DROP INDEX {name}")
        left = tuple(f.name for f in _K.fields if f.name not in ("updated_at", "owner_token"))
        if left != _GUARDED:
            raise AssertionError("the obligation's fields changed: update this benchmark")
        self.insert = sql.insert_sql(_K)
        self.members = sql.member_values(_K, ObligationState.PENDING)
        self.moves: list[tuple[str, str, int]] = []
        for event, fence in (("attempt", 0), ("deliver", 1)):
            plan = plan_transition(
                _K,
                "ob-x",
                event,
                fence=fence,
                expect={"owner_token": me.token},
                changes={"updated_at": 1.0},
            )
            audit = audit_values(event, Audit(1.0, self.label, 0, None))
            # The loop below binds exactly what the seam binds, in its order.
            if sql.update_params(plan, audit) != [1.0, *audit, "ob-x", fence, me.token]:
                raise AssertionError("update_params changed: update this benchmark")
            text = sql.update_sql(plan)
            head, _, _ = text.partition(" RETURNING ")
            if variant == "fence":
                text = head + " RETURNING fence"
            elif variant == "noreturn":
                text = head
            elif variant == "guarded":
                text = head + "".join(f" AND {name} IS ?" for name in _GUARDED)
            self.moves.append((text, event, fence))
        self.returns = variant not in ("noreturn", "guarded")
        self.guarded = variant == "guarded"

    def run(self, first: int, n: int) -> None:
        conn, label, members = self.conn, self.label, self.members
        host, pid, started, token = self.owner
        for i in range(first, first + n):
            oid = f"ob-{i}"
            now = time.time()
            conn.execute(
                self.insert,
                (
                    oid,
                    "pending",
                    0,
                    PAYLOAD["session_key"],
                    "slack",
                    "C1",
                    "171.001",
                    None,
                    PAYLOAD["content"],
                    0,
                    now,
                    now,
                    host,
                    pid,
                    started,
                    token,
                    now + 300.0,
                    None,
                    None,
                    None,
                    "default",
                    "record",
                    now,
                    label,
                    0,
                    None,
                    *members,
                ),
            )
            for text, event, fence in self.moves:
                params: tuple[Any, ...] = (now, event, now, label, 0, None, oid, fence, token)
                if self.guarded:  # every column the move leaves, in _GUARDED's order
                    params += (
                        PAYLOAD["session_key"], "slack", "C1", "171.001", None,
                        PAYLOAD["content"], 0, now, host, pid, started, now + 300.0,
                        None, None, None, "default",
                    )  # fmt: skip
                # A statement still open (a RETURNING not read to its end) would keep its
                # transaction open: each is read, then its cursor dropped, as the store does.
                cursor = conn.execute(text, params)
                missed = cursor.fetchone() is None if self.returns else cursor.rowcount != 1
                del cursor
                if missed:
                    raise AssertionError(f"{event} of {oid} missed")

    def close(self) -> None:
        self.conn.close()


class _Ledger:
    def __init__(self, path: str, synchronous: str) -> None:
        self.store = SQLiteStore(path, synchronous="FULL" if synchronous == "FULL" else "NORMAL")
        self.ledger = Ledger(self.store)

    def run(self, first: int, n: int) -> None:
        ledger = self.ledger
        for i in range(first, first + n):
            ob = ledger.record(**PAYLOAD, obligation_id=f"ob-{i}")
            ledger.mark_attempting(ob.obligation_id)
            ledger.mark_delivered(ob.obligation_id)

    def close(self) -> None:
        self.store.close()


class _LiteQueue:
    def __init__(self, path: str, synchronous: str) -> None:
        self.queue = litequeue.LiteQueue(path)  # sets NORMAL itself
        self.queue.conn.execute(f"PRAGMA synchronous = {synchronous}")

    def run(self, first: int, n: int) -> None:
        queue = self.queue
        for _ in range(n):
            queue.put(json.dumps(PAYLOAD))
            message = queue.pop()
            queue.done(message.message_id)

    def close(self) -> None:
        self.queue.conn.close()


CONTENDERS: dict[str, Callable[[str, str], Any]] = {
    "Ledger": _Ledger,
    "ledger SQL": lambda path, sync: _Raw(path, "as is", sync),
    "- settled-row index": lambda path, sync: _Raw(path, "nosettled", sync),
    "- RETURNING but fence": lambda path, sync: _Raw(path, "fence", sync),
    "- RETURNING": lambda path, sync: _Raw(path, "noreturn", sync),
    "- RETURNING, row guarded": lambda path, sync: _Raw(path, "guarded", sync),
    "- secondary indexes": lambda path, sync: _Raw(path, "noindex", sync),
    "litequeue": _LiteQueue,
}


def measure(n: int, rounds: int, synchronous: str) -> dict[str, list[float]]:
    """Items/s of every contender in every round."""
    rates: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    for r in range(rounds):
        tmp = tempfile.mkdtemp(prefix="statecore-layouts-")
        try:
            made = {
                name: make(os.path.join(tmp, f"{i}.db"), synchronous)
                for i, (name, make) in enumerate(CONTENDERS.items())
            }
            for contender in made.values():
                contender.run(0, 10)  # opens what the first item opens
            spent = dict.fromkeys(made, 0.0)
            order = list(made)
            for turn in range(n // TURN):
                shift = (turn + r) % len(order)
                for name in order[shift:] + order[:shift]:
                    start = time.perf_counter()
                    made[name].run(10 + turn * TURN, TURN)
                    spent[name] += time.perf_counter() - start
            for name, contender in made.items():
                rates[name].append((n // TURN) * TURN / spent[name])
                contender.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return rates


def main(argv: list[str] | None = None) -> int:
    """Print every contender's rate and ratios; informational (always returns 0)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--check", action="store_true", help="accepted; nothing is checked")
    parser.add_argument(
        "--synchronous",
        choices=("NORMAL", "FULL"),
        default="NORMAL",
        help="every contender's durability (FULL: 600 items, 3 rounds: each commit waits)",
    )
    args = parser.parse_args(argv)
    full = args.synchronous == "FULL"
    n, rounds = (300, 2) if args.quick else (600, 3) if full else (1500, 7)
    began = time.perf_counter()
    print(
        f"layouts: one lifecycle per item, 3 commits, WAL + {args.synchronous} "
        f"({n} items, {rounds} rounds)"
    )
    rates = measure(n, rounds, args.synchronous)

    def ratio(name: str, base: str) -> float:
        return statistics.median(a / b for a, b in zip(rates[name], rates[base], strict=True))

    print(f"  {'':<24} {'items/s':>9} {'/ litequeue':>12} {'/ ledger SQL':>13}")
    for name in CONTENDERS:
        print(
            f"  {name:<24} {statistics.median(rates[name]):9.0f} "
            f"{ratio(name, 'litequeue'):11.2f}x {ratio(name, 'ledger SQL'):12.2f}x"
        )
    print(f"took {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

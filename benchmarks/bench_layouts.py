"""What the ledger's lifecycle costs on SQLite, piece by piece: the ledger's own statements run
raw, then the same with one cost taken away, against litequeue, finely interleaved.

Each item is one lifecycle (create -> claim -> settle), three commits, at WAL + synchronous
NORMAL, as in ``bench_peers.py --only normal`` (``--synchronous FULL``: every contender at FULL,
litequeue's connection set to it after its constructor sets NORMAL).  The contenders:

* ``Ledger``: the real thing, ``Ledger(SQLiteStore(path))``.
* ``ledger SQL``: the very statements the ledger executes (their text from the store's SQL
  seam, ``stores._sqlite_sql``), bound and run with plain ``sqlite3`` on a file the store
  created (``ledger_sql.RawLedger``): the store's SQLite work with no Python of statecore
  around it.  Each mark is a proved move, as the store runs it for a row it wrote last.
* ``+ RETURNING, no proof``: each mark returns the row it wrote instead, as the store runs it
  for a row it does not know.
* ``- settled-row index``: the proved moves on a file without the index pruning reads.
* ``- RETURNING but fence``, ``- RETURNING``, ``- RETURNING but head, head guarded``: the
  returning moves returning only the new fence; nothing (the row count tells whether the guard
  held); only the row's new ``audit_head``, each move also comparing the previous one.
* ``- secondary indexes``: the proved moves without any index besides the primary key (the
  sweeps and pruning would scan).
* ``4096-byte pages``: the store's statements on a file of SQLite's usual page size instead of
  the store's 2048 bytes.
* ``checkpoints swapped``: the store's statements with the WAL checkpointed every 1000 pages
  (SQLite's default) at NORMAL and every 4000 at FULL: the store's defaults swapped.
* ``litequeue``: put -> pop -> done.

None of the ``-`` variants is a design the framework could ship as it is (each loses a read
the framework relies on); they measure what each piece costs, so that a design can be weighed
before it is built.  The page and checkpoint variants measure the store's own choices.
Every round makes fresh files; within a round the contenders take turns of 50 items (the order
rotates), so that a slow spell of the machine falls on all of them alike.  Printed: the median
rate over the rounds and the median of the rounds' ratios to litequeue and to ``ledger SQL``.
Informational: no target, ``--check`` never fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import litequeue  # type: ignore[import-untyped]
from ledger_sql import PAYLOAD, RawLedger

from statecore import Ledger
from stores import SQLiteStore

TURN = 50
"""Items per turn of one contender."""


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
    "ledger SQL": lambda path, sync: RawLedger(path, sync, "as is"),
    "+ RETURNING, no proof": lambda path, sync: RawLedger(path, sync, "returning"),
    "- settled-row index": lambda path, sync: RawLedger(path, sync, "nosettled"),
    "- RETURNING but fence": lambda path, sync: RawLedger(path, sync, "fence"),
    "- RETURNING": lambda path, sync: RawLedger(path, sync, "noreturn"),
    "- RETURNING but head, head guarded": lambda path, sync: RawLedger(path, sync, "head"),
    "- secondary indexes": lambda path, sync: RawLedger(path, sync, "noindex"),
    "4096-byte pages": lambda path, sync: RawLedger(path, sync, page_size=4096),
    "checkpoints swapped": lambda path, sync: RawLedger(
        path, sync, checkpoint_pages=1000 if sync == "NORMAL" else 4000
    ),
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

    print(f"  {'':<36} {'items/s':>9} {'/ litequeue':>12} {'/ ledger SQL':>13}")
    for name in CONTENDERS:
        print(
            f"  {name:<36} {statistics.median(rates[name]):9.0f} "
            f"{ratio(name, 'litequeue'):11.2f}x {ratio(name, 'ledger SQL'):12.2f}x"
        )
    print(f"took {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

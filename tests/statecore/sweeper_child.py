"""Child process for tests/statecore/test_multiprocess_sweep.py (run as a script, never collected).

Every mode opens ``SQLiteStore(db)`` and a ``Ledger`` with this process's real incarnation and
the real psutil probe, and talks to the parent in JSON lines on stdout.

``sweep DB GO_FILE ROUNDS CHUNK``
    Print ``{"ready": pid}``, wait (bounded) for GO_FILE to exist, run ``sweep_recoverable()``
    ROUNDS times with ``sweep_chunk=CHUNK``, print ``{"pid", "started_at", "token", "claimed"}``,
    then stay alive until stdin is closed, so no row this process claimed is seen with a dead
    owner by a sibling that is still sweeping.
``crash DB OBLIGATION_ID STATE``
    Record the obligation (and with STATE ``attempting`` mark it attempting), print
    ``{"pid", "id"}`` and block on stdin until the parent kills this process.
"""

from __future__ import annotations

import json
import os
import sys
import time

from statecore import Ledger, LedgerPolicy
from stores.sqlite import SQLiteStore

GO_TIMEOUT_S = 30.0
"""How long a sweeper waits for the start signal before giving up."""


def _say(payload: object) -> None:
    print(json.dumps(payload), flush=True)


def _sweep(db: str, go_file: str, rounds: int, chunk: int) -> int:
    store = SQLiteStore(db)
    ledger = Ledger(store, policy=LedgerPolicy(sweep_chunk=chunk))
    _say({"ready": os.getpid()})
    deadline = time.monotonic() + GO_TIMEOUT_S
    while not os.path.exists(go_file):
        if time.monotonic() > deadline:
            print(f"no start signal within {GO_TIMEOUT_S} s", file=sys.stderr)
            return 3
        time.sleep(0.001)
    claimed: list[str] = []
    for _ in range(rounds):
        claimed.extend(claim.obligation_id for claim in ledger.sweep_recoverable())
    me = ledger.incarnation
    _say({"pid": me.pid, "started_at": me.started_at, "token": me.token, "claimed": claimed})
    sys.stdin.read()  # stay alive (owning the claimed rows) until the parent says so
    store.close()
    return 0


def _crash(db: str, obligation_id: str, state: str) -> int:
    store = SQLiteStore(db)
    ledger = Ledger(store)
    ledger.record(
        session_key="agent:main:slack:channel:C1",
        platform="slack",
        chat_id="C1",
        content="the answer the user waited for",
        obligation_id=obligation_id,
    )
    if state == "attempting":
        ledger.mark_attempting(obligation_id)
    _say({"pid": os.getpid(), "id": obligation_id})
    sys.stdin.read()  # the parent SIGKILLs this process while it blocks here
    store.close()
    return 0


def main(argv: list[str]) -> int:
    mode, *args = argv
    if mode == "sweep":
        db, go_file, rounds, chunk = args
        return _sweep(db, go_file, int(rounds), int(chunk))
    if mode == "crash":
        db, obligation_id, state = args
        return _crash(db, obligation_id, state)
    print(f"unknown mode {mode!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

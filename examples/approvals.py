"""A lifecycle of your own, with time in it: multi-step approvals with reminders and expiry.

Not a chat.  A purchase request needs a manager's and then finance's approval.  If an
approver does nothing for ``remind_after_s`` the request is marked *reminded* and a reminder
is written to the application's own ``reminders`` table -- in the same transaction as the
move, so there is never a reminder without its move or a move without its reminder.  If a
reminded step still waits ``expire_after_s``, the request expires.  Both are **durable
timers** declared on the transitions (``after="remind_after_s"``): rows of the store, not
tasks of a process.

Run it (about ten seconds)::

    python examples/approvals.py

It files requests into one SQLite file, starts two timer workers (this same file,
``worker`` mode) on it, approves some requests itself, and SIGKILLs the first worker while
timers are falling due.  The second worker fires everything anyway, each timer once; the
script then checks every request's audited history and the reminders table, and prints them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path

from statecore import (
    AsyncTimers,
    Audit,
    EntityKind,
    Field,
    Fired,
    Lifecycle,
    Transition,
)
from stores import SQLiteStore


class Approval(StrEnum):
    """Where one purchase request stands."""

    AWAITING_MANAGER = "awaiting_manager"
    MANAGER_REMINDED = "manager_reminded"
    AWAITING_FINANCE = "awaiting_finance"
    FINANCE_REMINDED = "finance_reminded"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"


A = Approval
_WAITING = (A.AWAITING_MANAGER, A.MANAGER_REMINDED, A.AWAITING_FINANCE, A.FINANCE_REMINDED)

APPROVAL = Lifecycle(
    "approval",
    Approval,
    initial=A.AWAITING_MANAGER,
    terminal=(A.APPROVED, A.REJECTED, A.EXPIRED),
    description="A purchase request: manager, then finance; reminded, then expired if idle.",
    transitions=(
        Transition("request", None, A.AWAITING_MANAGER),
        Transition(
            "remind_manager", A.AWAITING_MANAGER, A.MANAGER_REMINDED, after="remind_after_s"
        ),
        Transition(
            "manager_approves", (A.AWAITING_MANAGER, A.MANAGER_REMINDED), A.AWAITING_FINANCE
        ),
        Transition(
            "remind_finance", A.AWAITING_FINANCE, A.FINANCE_REMINDED, after="remind_after_s"
        ),
        Transition("finance_approves", (A.AWAITING_FINANCE, A.FINANCE_REMINDED), A.APPROVED),
        Transition("reject", _WAITING, A.REJECTED),
        Transition(
            "expire", (A.MANAGER_REMINDED, A.FINANCE_REMINDED), A.EXPIRED, after="expire_after_s"
        ),
        Transition("archive", (A.APPROVED, A.REJECTED, A.EXPIRED), None),
    ),
)

APPROVAL_KIND = EntityKind(
    "approval",
    APPROVAL,
    table="approvals",
    id_field="approval_id",
    fields=(
        Field("title", str, nullable=False, immutable=True),
        Field("amount", float, nullable=False, immutable=True),
        Field("remind_after_s", float, nullable=False, default=3600.0),
        Field("expire_after_s", float, nullable=False, default=86400.0),
    ),
)

KINDS = (APPROVAL_KIND,)
"""For the ``statecore.kinds`` entry point of a package that ships this lifecycle."""

REMINDERS_TABLE = (
    "CREATE TABLE IF NOT EXISTS reminders ("
    "approval_id TEXT NOT NULL, step TEXT NOT NULL, sent_at REAL NOT NULL, "
    "PRIMARY KEY (approval_id, step))"
)


def open_store(path: Path) -> SQLiteStore:
    """The approvals' store, with the application's own table beside the lifecycle's."""
    store = SQLiteStore(path)
    store.register(APPROVAL_KIND)
    with store.atomic():
        store.connection().execute(REMINDERS_TABLE)
    return store


def reminder_writer(store: SQLiteStore) -> Callable[[Fired], None]:
    """The ``on_fire`` hook: a reminder firing writes its row to ``reminders`` through the
    store's connection, inside the firing's own transaction (a second row for the same step
    would violate the primary key: it cannot happen, each timer fires once)."""

    def on_fire(fired: Fired) -> None:
        if fired.event.startswith("remind_"):
            store.connection().execute(
                "INSERT INTO reminders VALUES (?, ?, ?)",
                (fired.entity_id, fired.event.removeprefix("remind_"), fired.fired_at),
            )
        print(f"  [worker {os.getpid()}] {fired.entity_id}: {fired.event}", flush=True)

    return on_fire


async def worker(path: Path) -> None:
    """Fire the approvals' timers until killed."""
    store = open_store(path)
    service = AsyncTimers(
        store, KINDS, poll_s=0.1, owner=f"worker-{os.getpid()}", on_fire=reminder_writer(store)
    )
    print(f"  [worker {os.getpid()}] firing timers", flush=True)
    await service.run()


def file_requests(store: SQLiteStore, count: int) -> None:
    """File ``count`` requests, each reminding after 0.6 s and expiring 0.8 s later."""
    now = time.time()
    for n in range(count):
        store.insert(
            APPROVAL_KIND,
            f"req-{n:02}",
            {
                "title": f"purchase {n}",
                "amount": 100.0 + n,
                "remind_after_s": 0.6,
                "expire_after_s": 0.8,
            },
            event="request",
            audit=Audit(at=now, owner="requester"),
        )


def check(store: SQLiteStore, count: int) -> int:
    """Every request finished, every timer fired at most once, one reminder row per reminder
    firing.  Returns the number of problems found (printed)."""
    problems = 0
    with store.atomic():
        sent = store.connection().execute("SELECT approval_id, step FROM reminders").fetchall()
    reminders = Counter((a, s) for a, s in sent)
    for n in range(count):
        rid = f"req-{n:02}"
        row = store.get(APPROVAL_KIND, rid)
        history = store.history(APPROVAL_KIND, rid)
        events = [h.event for h in history]
        fired = Counter(h.event for h in history if (h.reason or "").startswith("fired by timer"))
        if row is None or not APPROVAL.is_terminal(row.state):
            problems += 1
            print(f"  PROBLEM {rid}: not finished ({row and row.state.value})")
        if any(c > 1 for c in fired.values()):
            problems += 1
            print(f"  PROBLEM {rid}: a timer fired twice: {events}")
        for step in ("manager", "finance"):
            if fired[f"remind_{step}"] != reminders[(rid, step)]:
                problems += 1
                print(f"  PROBLEM {rid}: {step} reminder rows do not match its firings")
        times = [h.at for h in history]
        if times != sorted(times):
            problems += 1
            print(f"  PROBLEM {rid}: history out of order")
        print(f"  {rid}: {' -> '.join(events)}  ({row and row.state.value})")
    return problems


def main() -> int:
    """File requests, run two timer workers, kill one, check the histories."""
    count = 12
    with tempfile.TemporaryDirectory(prefix="statecore-approvals-") as tmp:
        path = Path(tmp) / "approvals.sqlite3"
        store = open_store(path)
        file_requests(store, count)
        print(f"filed {count} requests in {path.name}; starting two timer workers")
        workers = [
            subprocess.Popen([sys.executable, __file__, "worker", str(path)]) for _ in range(2)
        ]
        try:
            # The people: a manager approves the even requests at once, finance every fourth.
            at = time.time()
            for n in range(0, count, 2):
                store.transition(
                    APPROVAL_KIND,
                    f"req-{n:02}",
                    "manager_approves",
                    audit=Audit(at=at, owner="manager"),
                )
            for n in range(0, count, 4):
                store.transition(
                    APPROVAL_KIND,
                    f"req-{n:02}",
                    "finance_approves",
                    audit=Audit(at=at, owner="finance"),
                )
            time.sleep(0.7)  # the first reminders fall due now
            os.kill(workers[0].pid, signal.SIGKILL)
            print(f"SIGKILLed worker {workers[0].pid} while reminders were falling due")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                owed = store.count(APPROVAL_KIND, states=_WAITING)
                if owed == 0:
                    break
                time.sleep(0.1)
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
                w.wait()
        print("histories (each row's audit, oldest first):")
        problems = check(store, count)
        states = Counter(r.state.value for r in store.select(APPROVAL_KIND))
        print("final states:", ", ".join(f"{k} {v}" for k, v in sorted(states.items())))
        store.close()
        if problems:
            print(f"{problems} problems")
            return 1
        print("every timer fired once, every reminder written with its move: 0 problems")
        return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        asyncio.run(worker(Path(sys.argv[2])))
    else:
        sys.exit(main())

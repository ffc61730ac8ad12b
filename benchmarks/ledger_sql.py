"""The SQLite store's own statements for one obligation lifecycle, run with plain ``sqlite3``.

The raw baseline of ``bench_ledger.py`` and ``bench_layouts.py``: the statement texts come from
the store's SQL seam (``stores._sqlite_sql``) and the bound values are laid out as the seam lays
them out (checked against it when a :class:`RawLedger` is built), so a baseline never drifts from
what the store runs.  One lifecycle is three statements, each committed on its own: the
``INSERT`` that records (its trigger appends the audit entry), then the guarded ``UPDATE`` of
``attempt`` and of ``deliver`` (their triggers likewise), each proving the row it moves is the
one the previous statement wrote, as the store does for a row it knows
(:func:`stores._sqlite_sql.proved_update_sql`).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import stores._sqlite_pragmas as pragmas
import stores._sqlite_sql as sql
from statecore import OBLIGATION_KIND, Audit, Incarnation, Ledger, ObligationState
from statecore.store import plan_transition
from stores import SQLiteStore
from stores._sqlite_conn import default_checkpoint_pages
from stores._sqlite_shortcuts import audit_values

__all__ = ["PAYLOAD", "VARIANTS", "RawLedger", "creation_values"]

PAYLOAD: dict[str, str] = {
    "session_key": "agent:main:slack:channel:C1",
    "platform": "slack",
    "chat_id": "C1",
    "thread_id": "171.001",
    "content": "x" * 100,
}
"""What every item carries, in every ledger and peer benchmark."""

_K = OBLIGATION_KIND

COMPARED = (
    "session_key", "platform", "chat_id", "thread_id", "reply_to", "content", "attempts",
    "created_at", "owner_host", "owner_pid", "owner_started_at", "owner_token",
    "lease_expires_at", "last_error", "error_kind", "next_attempt_at", "adapter_profile",
)  # fmt: skip
"""The fields a mark leaves as they were (all but ``updated_at``, which it sets): what a proved
move compares."""

VARIANTS = ("as is", "returning", "nosettled", "fence", "noreturn", "head", "noindex")
"""``as is``: the store's statements for rows it knows (proved moves); ``returning``: its
statements for other rows (each move returns the row it wrote); ``nosettled`` and ``noindex``:
the proved moves without some indexes; ``fence``, ``noreturn`` and ``head``: the returning moves
returning less (see bench_layouts.py)."""


def creation_values(
    oid: str, state: ObligationState, me: Incarnation, label: str, now: float
) -> list[Any]:
    """The bound values of the store's ``INSERT`` (:func:`stores._sqlite_sql.insert_sql`) for an
    obligation carrying :data:`PAYLOAD`, in ``state``, owned by ``me``, recorded at ``now``."""
    return [
        oid,
        state.value,
        0,
        PAYLOAD["session_key"],
        PAYLOAD["platform"],
        PAYLOAD["chat_id"],
        PAYLOAD["thread_id"],
        None,  # reply_to
        PAYLOAD["content"],
        0,  # attempts
        now,  # created_at
        now,  # updated_at
        me.host,
        me.pid,
        me.started_at,
        me.token,
        now + 300.0,  # lease_expires_at
        None,  # last_error
        None,  # error_kind
        None,  # next_attempt_at
        "default",  # adapter_profile
        *audit_values("record", Audit(now, label, 0, None)),
        *sql.member_values(_K, state),
    ]


class RawLedger:
    """The ledger's statements on a file the store made (its layout, page size and triggers),
    run with plain sqlite3 on one connection set up as the store's are."""

    def __init__(
        self,
        path: str,
        synchronous: str = "NORMAL",
        variant: str = "as is",
        *,
        page_size: int | None = None,
        checkpoint_pages: int | None = None,
    ) -> None:
        """``page_size`` and ``checkpoint_pages`` as ``SQLiteStore`` takes them (None: its
        defaults)."""
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}")
        store = SQLiteStore(path) if page_size is None else SQLiteStore(path, page_size=page_size)
        ledger = Ledger(store)
        self.me = ledger.incarnation
        self.label = self.me.label
        store.close()
        self.path = path
        self.synchronous = synchronous
        self.checkpoint_pages = (
            default_checkpoint_pages(synchronous) if checkpoint_pages is None else checkpoint_pages
        )
        self.conn = self.connect()
        names = [
            r[0]
            for r in self.conn.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'index' AND sql IS NOT NULL"
            )
        ]
        for name in names:
            if variant == "noindex" or (variant == "nosettled" and "in_abandoned" in name):
                self.conn.execute(f"DROP INDEX {name}")
        left = tuple(f.name for f in _K.fields if f.name != "updated_at")
        if left != COMPARED:
            raise AssertionError("the obligation's fields changed: update ledger_sql.py")
        self.insert = sql.insert_sql(_K)
        if variant == "head":
            self.insert += " RETURNING audit_head"
        self.moves: list[tuple[str, str, int]] = []
        for event, fence in (("attempt", 0), ("deliver", 1)):
            plan = plan_transition(
                _K,
                "ob-x",
                event,
                fence=fence,
                expect={"owner_token": self.me.token},
                changes={"updated_at": 1.0},
            )
            audit = audit_values(event, Audit(1.0, self.label, 0, None))
            # steps() binds exactly what the seam binds, in its order.
            if sql.update_params(plan, audit) != [1.0, *audit, "ob-x", fence, self.me.token]:
                raise AssertionError("update_params changed: update ledger_sql.py")
            text = sql.update_sql(plan)
            head, _, _ = text.partition(" RETURNING ")
            if variant in ("as is", "nosettled", "noindex"):
                text = sql.proved_update_sql(plan, COMPARED)
            elif variant == "fence":
                text = head + " RETURNING fence"
            elif variant == "noreturn":
                text = head
            elif variant == "head":
                text = head + " AND audit_head = ? RETURNING audit_head"
            self.moves.append((text, event, fence))
        self.proved = variant in ("as is", "nosettled", "noindex")
        self.returns = variant not in ("noreturn", "as is", "nosettled", "noindex")
        self.variant = variant

    def connect(self) -> sqlite3.Connection:
        """A new connection to the file, set up as the store sets up its own."""
        conn = sqlite3.connect(self.path, isolation_level=None, cached_statements=256)
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        conn.execute(pragmas.autocheckpoint_sql(self.checkpoint_pages))
        return conn

    def steps(self, oid: str, now: float) -> Iterator[tuple[str, tuple[Any, ...], bool]]:
        """The lifecycle of ``oid``: each statement's text, its bound values and whether it
        returns a row to read."""
        me, label = self.me, self.label
        record = creation_values(oid, ObligationState.PENDING, me, label, now)
        yield self.insert, tuple(record), False
        # The row as the insert wrote it: each proved move compares it (its fields but
        # updated_at, which the moves set, then state and fence), as the store does.
        kept = tuple(
            v for f, v in zip(_K.fields, record[3:], strict=False) if f.name != "updated_at"
        )
        for (text, event, fence), state in zip(self.moves, ("pending", "attempting"), strict=True):
            params: tuple[Any, ...] = (now, event, now, label, 0, None, oid, fence, me.token)
            if self.proved:
                params += (state, fence, *kept)
            yield text, params, self.returns

    def run(self, first: int, n: int, conn: sqlite3.Connection | None = None) -> None:
        """Lifecycles of ids ``ob-<first>`` onwards, each statement committed on its own."""
        conn = conn or self.conn
        if self.variant == "head":
            self._run_head(conn, first, n)
            return
        for i in range(first, first + n):
            oid = f"ob-{i}"
            for text, params, returns in self.steps(oid, time.time()):
                execute(conn, text, params, returns, oid)

    def _run_head(self, conn: sqlite3.Connection, first: int, n: int) -> None:
        """The ``head`` variant: each write returns only the row's new audit head, and each move
        is guarded by the head the previous write returned (what a writer keeping its rows would
        need, were audit seqs never reused)."""
        me, label = self.me, self.label
        for i in range(first, first + n):
            oid = f"ob-{i}"
            now = time.time()
            record = creation_values(oid, ObligationState.PENDING, me, label, now)
            cursor = conn.execute(self.insert, record)
            row = cursor.fetchone()
            del cursor
            for text, event, fence in self.moves:
                if row is None:
                    raise AssertionError(f"a step of {oid} missed before {event}")
                params = (now, event, now, label, 0, None, oid, fence, me.token, row[0])
                cursor = conn.execute(text, params)
                row = cursor.fetchone()
                del cursor
            if row is None:
                raise AssertionError(f"the last step of {oid} missed")

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


def execute(
    conn: sqlite3.Connection, text: str, params: tuple[Any, ...], returns: bool, oid: str
) -> None:
    """Run one statement of a lifecycle; raise if its guard missed."""
    # A statement still open (a RETURNING not read to its end) would keep its transaction open:
    # each is read, then its cursor dropped, as the store does.
    cursor = conn.execute(text, params)
    missed = cursor.fetchone() is None if returns else cursor.rowcount != 1
    del cursor
    if missed:
        raise AssertionError(f"a step of {oid} missed: {text[:40]}...")

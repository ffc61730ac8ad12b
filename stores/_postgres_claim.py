"""A claim's locking read, bounded: it never waits longer than ``claim_lock_timeout_s``.

A claim is ``SELECT ... FOR UPDATE SKIP LOCKED`` (``stores._postgres_sql.claim_sql``): a row
another transaction holds is skipped, never waited for.  PostgreSQL can still make it wait, on
another transaction's *id* (``pg_locks`` lock type ``transactionid``, ``pg_stat_activity``
wait event ``transactionid``), under load from several claimers of the same rows:

* the claim's snapshot shows a row's old version, which another claimer was moving; by the
  time the server tries the lock, that claimer committed -- so SKIP LOCKED's "is it held?"
  finds nothing held -- and the server follows the row's update chain to its newest version to
  lock that one (``FOR UPDATE`` locks every newer version of a row it locks).  That following
  (``heap_lock_updated_tuple``) waits for whichever transaction holds the newer version --
  a third claimer that locked it for its own re-check, or the new owner's next write -- and
  does not heed SKIP LOCKED.  The wait lasts as long as that transaction: a whole claim block
  of another process, or longer.  It is rare (a race of three) but unbounded.
* a claim also queues behind a table lock (an ``ALTER TABLE`` of a migration waiting for its
  turn, a ``LOCK TABLE``) like any statement.

The bound: the claim runs in a savepoint with ``SET LOCAL lock_timeout``; when the server gives
up waiting (``lock_not_available``), the savepoint is rolled back -- that claim locked nothing
-- and the claim returns no rows: nothing claimed this round, the caller's block goes on and
its next sweep tries again.  Nothing is raised: a row another process is busy with is exactly
a row the claim should have skipped.  After a claim that returned, its locks are kept (the
savepoint is released, not rolled back) and ``lock_timeout`` goes back to the session's value.
Two extra round trips per claim; the benchmark ``benchmarks/bench_pg_claims.py`` measures the
cost.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.errors

if TYPE_CHECKING:
    from stores._postgres_options import Options

__all__ = ["bounded_claim"]

log = logging.getLogger("statecore.stores.postgres")

_SAVEPOINT = "statecore_claim"


def bounded_claim(
    conn: psycopg.Connection[Any], text: str, params: list[Any], options: Options
) -> list[Any]:
    """The rows of the locking read ``text``, or ``[]`` when it would wait for a lock longer
    than ``options.claim_lock_timeout_s`` (see the module docs).  Call it inside the caller's
    transaction.  Raises ``psycopg.Error`` for any other failure (the caller translates it)."""
    millis = max(1, round(options.claim_lock_timeout_s * 1000))
    # One round trip: the savepoint and the bound (both without parameters).
    conn.execute(f"SAVEPOINT {_SAVEPOINT}; SET LOCAL lock_timeout = {millis}")
    try:
        rows = conn.execute(text, params).fetchall()
    except psycopg.errors.LockNotAvailable:
        # Rolling back to the savepoint undoes the bound too, and locks nothing was granted.
        conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}; RELEASE SAVEPOINT {_SAVEPOINT}")
        log.info(
            "a claim waited %g s for a lock another transaction holds: nothing claimed this round",
            options.claim_lock_timeout_s,
        )
        return []
    except BaseException:
        if not conn.broken:
            with contextlib.suppress(psycopg.Error):  # the block is rolled back anyway
                conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}; RELEASE SAVEPOINT {_SAVEPOINT}")
        raise
    # Released, the savepoint's row locks stay with the transaction; so would SET LOCAL.
    conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}; SET LOCAL lock_timeout = DEFAULT")
    return rows

"""Connections and transactions of the PostgreSQL store.

* :class:`Target` -- where the store connects, parsed once from a URL or a ``key=value``
  conninfo: what error messages and ``repr`` show (host, port, database, user), never the
  password, which :meth:`Target.scrub` removes from any text that might carry it.
* :func:`open_schema` -- the one connection a store opens first (bounded retries): the schema's
  shared tables created, its layout version checked and recorded, the cluster's system
  identifier recorded or checked (``stores._postgres_identity``).
* :class:`Connections` -- a ``psycopg_pool.ConnectionPool`` of autocommit connections, each new
  one checked to be on the recorded cluster.  A call outside an :meth:`Connections.atomic`
  block checks a connection out for its own short transaction (BEGIN, its transaction id and
  its first statement in one round trip, pipeline mode; COMMIT in one more); a block checks one
  out for the
  calling thread until the outermost block ends, and every call on that thread inside it uses
  that connection.  Nested blocks are savepoints.
* Serialization failures and deadlocks of a call's own transaction are retried, a bounded number
  of times with a short jittered backoff; inside a block they cannot be (the block's earlier work
  is gone) and raise ``StoreError``.  A connection found dead when a call starts (the server
  restarted, an idle connection was terminated) is replaced and the call runs again, with the
  options' backoff: nothing was sent on it.  A server that cannot be reached raises
  ``StoreUnreachable`` once the pool's bounded wait ends (the pool keeps reconnecting: a server
  that comes back is used again); a statement cancelled at its bound raises ``StoreTimeout``;
  a commit lost in flight is resolved or raises ``StoreOutcomeUnknown`` (:meth:`Connections.write`).
  Any other driver error raises ``StoreError`` naming the server and database.
"""

from __future__ import annotations

import contextlib
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

import stores._postgres_sql as sql
from statecore.claims import NoTransaction
from statecore.errors import (
    StaleVersion,
    StatecoreError,
    StoreError,
    StoreOutcomeUnknown,
    StoreTimeout,
    StoreUnreachable,
)
from stores._postgres_claim import bounded_claim
from stores._postgres_faults import classify, commit_outcome, connect, retrying_connections
from stores._postgres_identity import Identity, record_identity
from stores._postgres_logged import XACT_ID
from stores._postgres_options import Options
from stores._postgres_target import Target

__all__ = ["RETRIES", "Connections", "Target", "Txn", "open_schema"]

T = TypeVar("T")

RETRIES = 5
"""Attempts of one call's transaction when the server aborts it as a serialization failure or a
deadlock victim (the first included)."""
_CHECKED = re.compile(r"statecore_states_v(\d+)")
"""The name of a kind's version constraint (``stores._postgres_versions.CONSTRAINT``)."""
_RETRYABLE = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)


def open_schema(target: Target, kwargs: dict[str, Any], options: Options, version: int) -> int:
    """Connect once (bounded retries, :func:`stores._postgres_faults.connect`): refuse what
    cannot work (an unreachable server, a refused login, a layout newer than this code, data
    written on another cluster), create the schema's shared tables (version, audit, catalog,
    meta) if absent, record the layout version and the cluster's system identifier -- under
    the schema's advisory lock, so concurrent openers take turns.  Returns the identifier.
    Raises ``StoreUnreachable``, ``StoreIdentityChanged`` or ``StoreError`` naming the server,
    never the password."""
    schema = options.schema
    conn = connect(target, kwargs, options)
    try:
        with conn.transaction():
            conn.execute(sql.lock_sql(), (schema or "",))  # first: concurrent openers wait
            if schema is not None:
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {sql.quote(schema)}")
            conn.execute(sql.version_schema_sql())
            found = conn.execute(sql.READ_VERSION).fetchone()
            stored = None if found is None else found[0]
            if stored is not None and stored > version:
                raise StoreError(
                    f"{target}: schema version {stored} is newer than this code "
                    f"understands ({version}); upgrade statecore"
                )
            identifier = record_identity(conn, str(target), options.adopt_system_identifier)
            for statement in (*sql.audit_schema_sql(), sql.kinds_schema_sql()):
                conn.execute(statement)
            if stored != version:
                for statement in sql.write_version_sql(version):
                    conn.execute(statement)
    except psycopg.Error as exc:
        raise classify(target, exc, "opening") from exc
    finally:
        conn.close()
    return identifier


class _Local(threading.local):
    conn: psycopg.Connection[Any] | None = None
    lease: AbstractContextManager[psycopg.Connection[Any]] | None = None
    depth = 0


class Connections:
    """The pool of one store, the calling thread's block connection, the identity check of
    every new connection, and the translation of driver errors into typed ``StoreError``s
    naming the server and database."""

    def __init__(
        self, target: Target, kwargs: dict[str, Any], options: Options, identity: Identity
    ) -> None:
        self.target = target
        self.kwargs = kwargs
        self.options = options
        self.identity = identity
        self.timeout_s = options.pool_timeout_s
        self.closed = False
        self.local = _Local()
        self.versions: dict[str, tuple[str, int]] = {}  # table -> lifecycle name, our version
        self.pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            target.conninfo,
            kwargs=kwargs,
            min_size=1,
            max_size=options.pool_size,
            open=True,
            timeout=self.timeout_s,
            num_workers=2,
            name="statecore",
            configure=identity.check,  # a connection to another cluster is never handed out
            reconnect_timeout=self.timeout_s,  # then the next call tries again at once
            # Each pooled connection attempt makes the bounded tries itself (short waits), ahead
            # of the pool's own one-second-doubling backoff: back soon after a server restart.
            connection_class=retrying_connections(options.delays()),
        )

    # -- errors -----------------------------------------------------------------------------

    def error(self, exc: BaseException, what: str) -> StoreError:
        """The StoreError for a driver failure during ``what`` (chain it with ``from``)."""
        if self.identity.changed is not None:
            return self.identity.changed
        if isinstance(exc, PoolClosed) or self.closed:
            return StoreError(f"{self.target}: the store is closed")
        if isinstance(exc, PoolTimeout):
            stats = self.pool.get_stats()
            if stats.get("pool_size", 0) >= self.pool.max_size:
                return StoreTimeout(
                    f"{self.target}: no connection within {self.timeout_s:g} s during {what}: "
                    f"all {self.pool.max_size} connections in use"
                )
            return StoreUnreachable(
                f"{self.target}: no connection within {self.timeout_s:g} s during {what} "
                f"(the server cannot be reached; {self.options.connect_retries} tries per "
                "connection): nothing was written; the store keeps trying to reconnect"
            )
        if isinstance(exc, psycopg.errors.CheckViolation):
            refused = self._refused(exc, what)
            if refused is not None:
                return refused
        if isinstance(exc, _RETRYABLE):
            detail = self.target.scrub(str(exc).strip() or type(exc).__name__)
            return StoreError(
                f"{self.target}: {what} aborted by the server ({detail}); "
                "nothing of the transaction was kept: run it again"
            )
        return classify(self.target, exc, what)

    def _refused(self, exc: psycopg.errors.CheckViolation, what: str) -> StoreError | None:
        """A write refused by a kind's version constraint (stores._postgres_versions): this
        process runs an older declaration (``StaleVersion``) or another one of that version."""
        found = _CHECKED.fullmatch(exc.diag.constraint_name or "")
        table = exc.diag.table_name or ""
        if found is None:
            return None
        stored = int(found.group(1))
        lifecycle, ours = self.versions.get(table, ("of table " + table, 0))
        detail = f"{what} set a state version {stored} does not declare; nothing was written"
        if ours < stored:
            return StaleVersion(lifecycle, ours, stored, f"{self.target}: {detail}")
        return StoreError(f"{self.target}: lifecycle {lifecycle!r}: {detail}")

    @contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Translate driver errors into StoreError; let statecore's own through."""
        try:
            yield
        except StatecoreError:
            raise
        except (psycopg.Error, PoolTimeout, PoolClosed) as exc:
            raise self.error(exc, what) from exc

    # -- calls ------------------------------------------------------------------------------

    def _lease(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        if self.closed:
            raise StoreError(f"{self.target}: the store is closed")
        if self.identity.changed is not None:
            raise self.identity.changed  # refused until an operator decides
        return self.pool.connection()

    def _dead(self, conn: psycopg.Connection[Any], attempt: int) -> bool:
        """After an OperationalError before anything of the call was sent: whether to try
        again (the connection was dead: the server restarted, an idle connection was ended),
        after replacing the pool's dead connections and the attempt's backoff."""
        delays = self.options.delays()
        if not conn.broken or attempt > len(delays):
            return False
        self.pool.check()
        time.sleep(delays[attempt - 1] if attempt > 1 else 0.0)
        return True

    def read(self, what: str, call: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``call(conn)`` on the thread's block connection, or on a pooled connection in
        autocommit (one statement: its own snapshot), tried again on a dead connection with
        the options' bounded backoff.  Raises ``StoreError``."""
        conn = self.local.conn
        if conn is not None:
            with self.guard(what):
                return call(conn)
        attempt = 0
        while True:
            attempt += 1
            with self.guard(what), self._lease() as conn:
                try:
                    return call(conn)
                except psycopg.OperationalError:
                    if not self._dead(conn, attempt):
                        raise

    def held(self, what: str, call: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``call(conn)`` on the thread's block connection, for work whose effect (a lock) only
        lasts as long as the block.  Raises ``NoTransaction`` outside a block (nothing done),
        ``StoreError`` when the server fails."""
        conn = self.local.conn
        if conn is None:
            raise NoTransaction(f"{what} must be called inside store.atomic()")
        with self.guard(what):
            return call(conn)

    def claim(self, what: str, text: str, params: list[Any]) -> list[Any]:
        """The locking read ``text`` on the thread's block connection, waiting at most the
        options' ``claim_lock_timeout_s`` for any lock (see ``stores._postgres_claim``): on
        that bound, nothing is claimed this round (``[]``) and the block goes on.  Raises
        ``NoTransaction`` outside a block, ``StoreError`` when the server fails."""
        return self.held(what, lambda conn: bounded_claim(conn, text, params, self.options))

    def write(self, what: str, call: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``call(conn)`` in a transaction: the thread's block (joined, no savepoint: a single
        write matches or changes nothing) or a transaction of its own, committed, and retried
        on a serialization failure or deadlock, or a dead connection before anything was sent.
        A commit whose reply was lost is resolved by asking the server
        (:func:`~stores._postgres_faults.commit_outcome`): committed, the result is returned;
        rolled back, the write runs again (bounded); unknown, ``StoreOutcomeUnknown`` -- never
        retried blindly.  Raises ``StoreError`` or what ``call`` raises (then nothing of it was
        kept)."""
        conn = self.local.conn
        if conn is not None:
            with self.guard(what):
                return call(conn)
        attempt = 0
        while True:
            attempt += 1
            with self.guard(what), self._lease() as conn:
                begun: psycopg.Cursor[Any] | None = None
                xid: str | None = None  # known before the COMMIT is sent
                try:
                    # Pipeline mode: BEGIN, the transaction id and the call's first statement
                    # go in one round trip (the call's first fetch sends them); the COMMIT and
                    # the pipeline's Sync in one more.  The id is known before COMMIT is sent.
                    with _pipeline(conn):
                        conn.execute(sql.BEGIN)
                        begun = conn.execute(XACT_ID)
                        result = call(conn)
                        xid = str(begun.fetchone()[0])  # type: ignore[index]
                        conn.execute(sql.COMMIT)
                    return result
                except _RETRYABLE:
                    _rollback(conn)
                    if xid is not None or attempt >= RETRIES:
                        raise  # a COMMIT refused (not lost) is not retried blindly
                    time.sleep(random.uniform(0.001, 0.005 * 2**attempt))
                    continue
                except psycopg.OperationalError as exc:
                    if xid is not None and conn.broken:
                        lost_commit = exc  # the COMMIT was in flight: resolved below
                    else:
                        # Nothing answered on a connection found dead: nothing was kept (no
                        # COMMIT was sent), so it is replaced and the call runs again.
                        answered = begun is not None and begun.pgresult is not None
                        if answered or not self._dead(conn, attempt):
                            _rollback(conn)
                            raise
                        continue
                except BaseException:
                    _rollback(conn)
                    raise
            # The connection broke while the COMMIT was in flight: ask what became of it.
            outcome = commit_outcome(
                self.target, self.kwargs, self.options, xid, self.identity.check
            )
            if outcome == "committed":
                return result
            if outcome is None:
                raise StoreOutcomeUnknown(
                    f"{self.target}: {what}",
                    f"transaction {xid}: re-read the entity before trying again",
                ) from lost_commit
            if attempt >= RETRIES:  # rolled back each time: nothing was kept
                raise self.error(lost_commit, what) from lost_commit

    def atomic(self, what: str) -> Txn:
        """A (possibly nested) transaction on the calling thread (see :class:`Txn`)."""
        return Txn(self, what)

    def close(self) -> None:
        """Close the pool; later calls raise ``StoreError``.  Idempotent."""
        self.closed = True
        with contextlib.suppress(Exception):  # closing is best effort
            self.pool.close(timeout=5.0)


_PIPELINES = psycopg.Pipeline.is_supported()
"""Whether the driver's libpq has pipeline mode (14 and later); without it every statement of a
write is a round trip of its own, with the same semantics."""


def _pipeline(conn: psycopg.Connection[Any]) -> AbstractContextManager[Any]:
    return conn.pipeline() if _PIPELINES else contextlib.nullcontext()


def _rollback(conn: psycopg.Connection[Any]) -> None:
    if conn.broken or conn.closed:
        return
    with contextlib.suppress(psycopg.Error):
        conn.execute(sql.ROLLBACK)


class Txn:
    """One (possibly nested) ``atomic()`` block on the calling thread.

    The outermost block checks a connection out of the pool and begins; inner blocks are
    savepoints: an exception escaping one undoes only its work.  Driver errors are translated to
    ``StoreError`` after the rollback; the connection goes back to the pool (a broken one is
    discarded by it) when the outermost block ends.
    """

    __slots__ = ("db", "depth", "what")

    def __init__(self, db: Connections, what: str) -> None:
        self.db = db
        self.what = what

    def __enter__(self) -> None:
        db, local = self.db, self.db.local
        depth = local.depth
        with db.guard(f"{self.what} (begin)"):
            if depth == 0:
                lease = db._lease()
                conn = lease.__enter__()
                try:
                    conn.execute(sql.BEGIN)
                except BaseException as exc:
                    lease.__exit__(type(exc), exc, exc.__traceback__)
                    raise
                local.conn, local.lease = conn, lease
            else:
                assert local.conn is not None
                local.conn.execute(sql.savepoint_sql(depth))
        self.depth = depth
        local.depth = depth + 1

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        db, depth, local = self.db, self.depth, self.db.local
        conn = local.conn
        assert conn is not None
        local.depth = depth
        try:
            if kind is None:
                try:
                    conn.execute(sql.COMMIT if depth == 0 else sql.release_sql(depth))
                    return
                except psycopg.Error as error:
                    self._rollback(conn)
                    if depth == 0 and conn.broken and db.identity.changed is None:
                        # Lost in flight: the server may have committed it.  A block gives no
                        # transaction id to ask about (taking one would make every read-only
                        # block write a commit record): the caller must re-read.
                        raise StoreOutcomeUnknown(
                            f"{db.target}: {self.what}",
                            "re-read what the block wrote before running it again",
                        ) from error
                    raise db.error(error, f"{self.what} (commit)") from error
            self._rollback(conn)
            if isinstance(exc, psycopg.Error):
                raise db.error(exc, self.what) from exc
        finally:
            if depth == 0:
                lease, local.conn, local.lease = local.lease, None, None
                assert lease is not None
                with contextlib.suppress(Exception):
                    lease.__exit__(None, None, None)

    def _rollback(self, conn: psycopg.Connection[Any]) -> None:
        if conn.broken or conn.closed:
            return
        with contextlib.suppress(psycopg.Error):
            if self.depth == 0:
                conn.execute(sql.ROLLBACK)
            else:
                conn.execute(sql.rollback_to_sql(self.depth))
                conn.execute(sql.release_sql(self.depth))

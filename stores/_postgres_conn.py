"""Connections and transactions of the PostgreSQL store.

* :class:`Target` -- where the store connects, parsed once from a URL or a ``key=value``
  conninfo: what error messages and ``repr`` show (host, port, database, user), never the
  password, which :meth:`Target.scrub` removes from any text that might carry it.
* :func:`open_schema` -- the one connection a store opens first: the schema's shared tables
  created, its layout version checked and recorded.
* :class:`Connections` -- a ``psycopg_pool.ConnectionPool`` of autocommit connections.  A call
  outside an :meth:`Connections.atomic` block checks a connection out for its own short
  transaction; a block checks one out for the calling thread until the outermost block ends, and
  every call on that thread inside it uses that connection.  Nested blocks are savepoints.
* Serialization failures and deadlocks of a call's own transaction are retried, a bounded number
  of times with a short jittered backoff; inside a block they cannot be (the block's earlier work
  is gone) and raise ``StoreError``.  A connection found dead when a call starts (the server
  restarted, an idle connection was terminated) is replaced and the call runs again: nothing was
  sent on it.  Any other driver error raises ``StoreError`` naming the server and database.
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
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

import stores._postgres_sql as sql
from statecore.claims import NoTransaction
from statecore.errors import StaleVersion, StatecoreError, StoreError

__all__ = ["RETRIES", "Connections", "Target", "Txn", "open_schema"]

T = TypeVar("T")

RETRIES = 5
"""Attempts of one call's transaction when the server aborts it as a serialization failure or a
deadlock victim (the first included)."""
_CHECKED = re.compile(r"statecore_states_v(\d+)")
"""The name of a kind's version constraint (``stores._postgres_versions.CONSTRAINT``)."""
_RETRYABLE = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)


class Target:
    """The server, database and user a conninfo names (its password kept out of sight)."""

    def __init__(self, conninfo: str) -> None:
        try:
            params = conninfo_to_dict(conninfo)
        except psycopg.ProgrammingError as exc:
            # The message may quote the conninfo, password included: never pass it on.
            raise ValueError(
                f"not a PostgreSQL URL or conninfo string ({_scrub_any(str(exc), conninfo)})"
            ) from None
        self.conninfo = conninfo
        self.host = str(params.get("host") or params.get("hostaddr") or "localhost")
        self.port = str(params.get("port") or "5432")
        self.dbname = str(params.get("dbname") or params.get("user") or "(default)")
        self.user = None if params.get("user") is None else str(params["user"])
        self._password = None if params.get("password") is None else str(params["password"])

    def __str__(self) -> str:
        who = f"{self.user}@" if self.user else ""
        return f"postgresql://{who}{self.host}:{self.port}/{self.dbname}"

    def __repr__(self) -> str:
        return f"Target({str(self)!r})"

    def scrub(self, text: str) -> str:
        """``text`` with the password (if any) replaced by ``***``."""
        return _scrub_any(text, self._password)


def _scrub_any(text: str, secret: str | None) -> str:
    if secret:
        text = text.replace(secret, "***")
    return text


def open_schema(target: Target, kwargs: dict[str, Any], schema: str | None, version: int) -> None:
    """Connect once: refuse what cannot work (an unreachable server, a refused login, a layout
    newer than ``version``), create the schema's shared tables (version, audit, catalog) if
    absent and record ``version`` -- under the schema's advisory lock, so concurrent openers
    take turns.  Raises ``StoreError`` naming the server, never the password."""
    try:
        conn = psycopg.connect(target.conninfo, **kwargs)
    except psycopg.Error as exc:
        raise StoreError(
            f"cannot connect to PostgreSQL at {target.host}:{target.port}, database "
            f"{target.dbname!r}: {target.scrub(str(exc).strip())}"
        ) from None  # the driver's error may quote the conninfo
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
            for statement in (*sql.audit_schema_sql(), sql.kinds_schema_sql()):
                conn.execute(statement)
            if stored != version:
                for statement in sql.write_version_sql(version):
                    conn.execute(statement)
    except psycopg.Error as exc:
        raise StoreError(f"{target}: opening failed: {target.scrub(str(exc))}") from exc
    finally:
        conn.close()


class _Local(threading.local):
    conn: psycopg.Connection[Any] | None = None
    lease: AbstractContextManager[psycopg.Connection[Any]] | None = None
    depth = 0


class Connections:
    """The pool of one store, the calling thread's block connection, and the translation of
    driver errors into ``StoreError`` naming the server and database."""

    def __init__(
        self,
        target: Target,
        kwargs: dict[str, Any],
        *,
        pool_size: int,
        timeout_s: float,
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.closed = False
        self.local = _Local()
        self.versions: dict[str, tuple[str, int]] = {}  # table -> lifecycle name, our version
        self.pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            target.conninfo,
            kwargs=kwargs,
            min_size=1,
            max_size=pool_size,
            open=True,
            timeout=timeout_s,
            num_workers=2,
            name="statecore",
        )

    # -- errors -----------------------------------------------------------------------------

    def error(self, exc: BaseException, what: str) -> StoreError:
        """The StoreError for a driver failure during ``what`` (chain it with ``from``)."""
        if isinstance(exc, PoolClosed) or self.closed:
            return StoreError(f"{self.target}: the store is closed")
        if isinstance(exc, PoolTimeout):
            return StoreError(
                f"{self.target}: no connection within {self.timeout_s:g} s during {what} "
                f"(server unreachable, or all {self.pool.max_size} connections in use)"
            )
        detail = self.target.scrub(str(exc).strip() or type(exc).__name__)
        if isinstance(exc, psycopg.errors.CheckViolation):
            refused = self._refused(exc, what)
            if refused is not None:
                return refused
        if isinstance(exc, _RETRYABLE):
            return StoreError(
                f"{self.target}: {what} aborted by the server ({detail}); "
                "nothing of the transaction was kept: run it again"
            )
        return StoreError(f"{self.target}: {what} failed: {detail}")

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
        return self.pool.connection()

    def read(self, what: str, call: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``call(conn)`` on the thread's block connection, or on a pooled connection in
        autocommit (one statement: its own snapshot).  Raises ``StoreError``."""
        conn = self.local.conn
        if conn is not None:
            with self.guard(what):
                return call(conn)
        for attempt in range(2):
            with self.guard(what), self._lease() as conn:
                try:
                    return call(conn)
                except psycopg.OperationalError:
                    if attempt or not conn.broken:
                        raise
                    self.pool.check()  # a dead idle connection: replace them and read again
        raise AssertionError("unreachable")  # pragma: no cover

    def held(self, what: str, call: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``call(conn)`` on the thread's block connection, for work whose effect (a lock) only
        lasts as long as the block.  Raises ``NoTransaction`` outside a block (nothing done),
        ``StoreError`` when the server fails."""
        conn = self.local.conn
        if conn is None:
            raise NoTransaction(f"{what} must be called inside store.atomic()")
        with self.guard(what):
            return call(conn)

    def write(self, what: str, call: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``call(conn)`` in a transaction: the thread's block (joined, no savepoint: a single
        write matches or changes nothing) or a transaction of its own, committed, and retried
        on a serialization failure or deadlock.  Raises ``StoreError`` or what ``call`` raises
        (then nothing of it was kept)."""
        conn = self.local.conn
        if conn is not None:
            with self.guard(what):
                return call(conn)
        attempt = 0
        while True:
            attempt += 1
            with self.guard(what), self._lease() as conn:
                try:
                    conn.execute(sql.BEGIN)
                except psycopg.OperationalError:
                    if attempt > 1 or not conn.broken:
                        raise
                    self.pool.check()  # dead before anything was sent: another connection
                    continue
                try:
                    result = call(conn)
                    conn.execute(sql.COMMIT)
                    return result
                except _RETRYABLE:
                    _rollback(conn)
                    if attempt >= RETRIES:
                        raise
                except BaseException:
                    _rollback(conn)
                    raise
            time.sleep(random.uniform(0.001, 0.005 * 2**attempt))

    def atomic(self, what: str) -> Txn:
        """A (possibly nested) transaction on the calling thread (see :class:`Txn`)."""
        return Txn(self, what)

    def close(self) -> None:
        """Close the pool; later calls raise ``StoreError``.  Idempotent."""
        self.closed = True
        with contextlib.suppress(Exception):  # closing is best effort
            self.pool.close(timeout=5.0)


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

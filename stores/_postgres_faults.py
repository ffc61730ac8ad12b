"""A bad server, told apart: unreachable, slow, or gone while a commit was in flight.

* :func:`connect` -- one connection, tried again after each of the options' delays while the
  server cannot be reached (nothing listening, starting up, shutting down); a refusal that
  trying again cannot cure (a wrong password, an unknown database) is raised at once.  Raises
  ``StoreUnreachable`` after the last try, naming host, port and database, never the password.
* :func:`classify` -- the typed error for a driver failure: ``StoreTimeout`` for a statement
  the server cancelled at its bound (``statement_timeout``, ``lock_timeout``),
  ``StoreUnreachable`` for a connection lost or refused, else ``StoreError``.
* :func:`commit_outcome` -- after the connection broke while a transaction's ``COMMIT`` was in
  flight: ask the server (on a new connection) what became of the transaction id, by
  ``pg_xact_status``.  "committed" and "aborted" are the server's word; a transaction still
  "in progress" (its backend has not yet noticed the lost client) is asked about again, bounded;
  anything else is ``None``: unknown, and then the caller must never guess
  (``StoreOutcomeUnknown``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.errors

from statecore.errors import StoreError, StoreTimeout, StoreUnreachable

if TYPE_CHECKING:
    from stores._postgres_options import Options
    from stores._postgres_target import Target

__all__ = ["classify", "commit_outcome", "connect", "lost", "retrying_connections"]

_UNREACHABLE_STATES = frozenset({"57P01", "57P02", "57P03", "08000", "08001", "08003", "08006"})
"""Server states a later try may cure: admin/crash shutdown, cannot connect now (starting up,
shutting down, in recovery), connection exceptions."""
_TIMEOUTS = (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable)


_PASSING = ("the database system is", "too many clients", "remaining connection slots")
"""What a server says when it refuses a connection only for now (starting up, shutting down,
in recovery, full): worth another try, unlike a refused login or an unknown database."""


def lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the server could not be reached or the connection was lost (and
    not that the server refused it for good)."""
    if isinstance(exc, psycopg.errors.AdminShutdown | psycopg.errors.CannotConnectNow):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    if exc.sqlstate is not None:
        return exc.sqlstate in _UNREACHABLE_STATES
    # A failed connection carries no state: the server's own refusal is its FATAL text.
    text = str(exc)
    return "FATAL:" not in text or any(passing in text for passing in _PASSING)


def classify(target: Target, exc: BaseException, what: str) -> StoreError:
    """The typed error for the driver failure ``exc`` during ``what`` (chain it with ``from``)."""
    detail = target.scrub(str(exc).strip() or type(exc).__name__)
    if isinstance(exc, _TIMEOUTS):
        return StoreTimeout(
            f"{target}: {what} did not finish within the server's bound and was cancelled "
            f"({detail}); nothing of its transaction was kept"
        )
    if lost(exc):
        return StoreUnreachable(
            f"{target}: {what}: the server could not be reached or the connection was lost "
            f"({detail}); nothing of the transaction was kept"
        )
    return StoreError(f"{target}: {what} failed: {detail}")


def connect(
    target: Target,
    kwargs: dict[str, Any],
    options: Options,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> psycopg.Connection[Any]:
    """A new connection, with the options' bounded retries (see the module docs).  The caller
    must close it.  Raises ``StoreUnreachable`` or ``StoreError`` (a refusal)."""
    delays = options.delays()
    for attempt in range(len(delays) + 1):
        try:
            return psycopg.connect(target.conninfo, **kwargs)
        except psycopg.Error as exc:
            detail = target.scrub(str(exc).strip())  # the driver's text may quote the conninfo
            where = f"PostgreSQL at {target.host}:{target.port}, database {target.dbname!r}"
            if not lost(exc):
                raise StoreError(f"cannot connect to {where}: {detail}") from None
            if attempt == len(delays):
                raise StoreUnreachable(
                    f"cannot connect to {where} after {attempt + 1} tries: {detail}"
                ) from None
        sleep(delays[attempt])
    raise AssertionError("unreachable")  # pragma: no cover


def commit_outcome(
    target: Target,
    kwargs: dict[str, Any],
    options: Options,
    xid: str,
    check: Callable[[psycopg.Connection[Any]], None],
) -> str | None:
    """What the server says became of transaction ``xid``: "committed", "aborted", or None
    when it cannot tell within the options' bounds (see the module docs).  ``check`` is run
    on the new connection first (the identity check: another cluster's answer means nothing);
    it may raise, as may nothing else."""
    try:
        conn = connect(target, kwargs, options)
    except StoreError:
        return None
    try:
        check(conn)
        deadline = time.monotonic() + options.connect_timeout_s
        pause = 0.01
        while True:
            row = conn.execute("SELECT pg_xact_status(%s::xid8)", (xid,)).fetchone()
            status = None if row is None else row[0]
            if status in ("committed", "aborted"):
                return str(status)
            if status != "in progress" or time.monotonic() >= deadline:
                return None
            time.sleep(pause)  # its backend has not yet seen the client go: ask again
            pause = min(pause * 2, 0.2)
    except psycopg.Error:
        return None
    finally:
        with contextlib.suppress(psycopg.Error):
            conn.close()


def retrying_connections(
    delays: list[float], *, sleep: Callable[[float], None] = time.sleep
) -> type[psycopg.Connection[Any]]:
    """A connection class for the pool whose ``connect`` makes the bounded tries itself: a
    failure that says the server could not be reached (:func:`lost`) is tried again after each
    of ``delays``; a refusal (a wrong password, say) is raised at once.

    Why: the pool waits a second before its own next attempt and doubles the wait after each
    failure, so a server restarted in under a second left every process without connections
    for several seconds more.  With the tries inside one attempt, a pooled connection comes back
    within ``delays`` of the server (the pool's slower backoff only follows when all fail)."""
    waits = tuple(delays)

    class RetryingConnection(psycopg.Connection[Any]):
        @classmethod
        def connect(cls, *args: Any, **kwargs: Any) -> RetryingConnection:
            for wait in (*waits, None):
                try:
                    return super().connect(*args, **kwargs)
                except psycopg.Error as exc:
                    if wait is None or not lost(exc):
                        raise
                sleep(wait)
            raise AssertionError("unreachable")  # pragma: no cover

    return RetryingConnection

"""LISTEN subscriptions of the PostgreSQL store: a connection and a thread per subscription.

A :class:`Listener` opens a dedicated autocommit connection (not one of the pool's: it stays
subscribed for as long as the subscription lives), runs ``LISTEN`` on it before its
constructor returns -- so a notification committed after that is delivered -- and then waits on
it in a daemon thread, calling the callback with each payload.  The thread wakes at least every
``poll_s`` to see whether it was stopped, so :meth:`Listener.stop` returns within about that
(bounded by ``join_timeout_s`` when a callback hangs).  A lost connection is reopened with a
capped backoff; notifications sent meanwhile are lost (wake-ups are hints, not a queue).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg

import stores._postgres_sql as sql
from statecore.errors import StoreError
from stores._postgres_conn import Target

__all__ = ["Listener"]

log = logging.getLogger(__name__)

_BACKOFF_MAX_S = 5.0


class Listener:
    """One subscription to ``channel``: its connection, its thread and how to stop them."""

    def __init__(
        self,
        target: Target,
        kwargs: dict[str, Any],
        channel: str,
        callback: Callable[[str], object],
        *,
        poll_s: float = 0.1,
        join_timeout_s: float = 5.0,
        on_stop: Callable[[Listener], None] | None = None,
    ) -> None:
        """Subscribe now (raises ``StoreError`` naming the server when it cannot) and start
        delivering; the caller must :meth:`stop` it."""
        self.target = target
        self.channel = channel
        self._kwargs = {**kwargs, "autocommit": True, "application_name": "statecore-listen"}
        self._callback = callback
        self._poll_s = poll_s
        self._join_timeout_s = join_timeout_s
        self._on_stop = on_stop
        self._stopped = threading.Event()
        self._conn: psycopg.Connection[Any] | None = self._subscribe()
        self._thread = threading.Thread(
            target=self._run, name=f"statecore-listen-{channel}", daemon=True
        )
        self._thread.start()

    def __repr__(self) -> str:
        return f"Listener({str(self.target)!r}, {self.channel!r})"

    @property
    def alive(self) -> bool:
        """Whether the delivering thread still runs."""
        return self._thread.is_alive()

    def _subscribe(self) -> psycopg.Connection[Any]:
        target = self.target
        try:
            conn = psycopg.connect(target.conninfo, **self._kwargs)
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot listen on {self.channel!r}: cannot connect to PostgreSQL at "
                f"{target.host}:{target.port}, database {target.dbname!r}: "
                f"{target.scrub(str(exc).strip())}"
            ) from None  # the driver's error may quote the conninfo
        try:
            conn.execute(sql.listen_sql(self.channel))
        except psycopg.Error as exc:
            conn.close()
            raise StoreError(
                f"{target}: LISTEN {self.channel} failed: {target.scrub(str(exc))}"
            ) from None
        return conn

    def _run(self) -> None:
        backoff = self._poll_s
        conn: psycopg.Connection[Any] | None = self._conn
        try:
            while not self._stopped.is_set():
                if conn is None:  # lost: open a new one, backing off while the server is away
                    try:
                        conn = self._conn = self._subscribe()
                        backoff = self._poll_s
                        log.info("%s: listening on %r again", self.target, self.channel)
                    except StoreError as exc:
                        log.warning("%s (retrying in %.1f s)", exc, backoff)
                        self._stopped.wait(backoff)
                        backoff = min(backoff * 2, _BACKOFF_MAX_S)
                        continue
                try:
                    for note in conn.notifies(timeout=self._poll_s):
                        if self._stopped.is_set():
                            break
                        self._deliver(note.payload)
                except psycopg.Error as exc:
                    log.warning(
                        "%s: the connection listening on %r was lost (%s); reconnecting",
                        self.target,
                        self.channel,
                        self.target.scrub(str(exc).strip()),
                    )
                    with contextlib.suppress(Exception):
                        conn.close()
                    conn = self._conn = None
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()

    def _deliver(self, payload: str) -> None:
        try:
            self._callback(payload)
        except Exception:
            log.exception("the listener callback of channel %r failed", self.channel)

    def stop(self) -> None:
        """Stop delivering and close the connection; idempotent, callable from any thread (the
        callback included).  Waits for the thread at most ``join_timeout_s`` (a callback that
        hangs is logged and left behind: its thread is a daemon and closes the connection when
        the callback returns)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._on_stop is not None:
            self._on_stop(self)
        if threading.current_thread() is self._thread:
            return  # unsubscribed from the callback: the loop ends when it returns
        self._thread.join(self._join_timeout_s)
        if self._thread.is_alive():
            log.warning(
                "the listener of %r did not stop within %.1f s (its callback is still running)",
                self.channel,
                self._join_timeout_s,
            )

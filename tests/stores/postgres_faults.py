"""PostgreSQL faults for the tests (imported, never collected): a throwaway cluster that can
be stopped and started again on its data directory at any port, and a TCP proxy that can lose a
``COMMIT``'s answer, drop the ``COMMIT`` itself, refuse connections, or send new connections to
another server (another cluster answering at the same address)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from stores.testing.postgres_server import (
    PASSWORD,
    USER,
    TestServer,
    _binaries,
    _run_as,
    start_server,
)

BOUND_S = 20.0
"""Every wait of these helpers ends within this (a server start or stop, a thread's end)."""


class Cluster:
    """One throwaway cluster (its own ``initdb``) that can be stopped and started again on the
    same data directory, on any port."""

    def __init__(self) -> None:
        server = start_server()
        self._server = server
        self.root = server.root
        self.port = server.port
        self.process: subprocess.Popen[bytes] | None = server.process

    def url(self, port: int | None = None, database: str = "postgres") -> str:
        """The superuser's URL of ``database`` on this cluster at ``port`` (default: its own)."""
        return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{port or self.port}/{database}"

    def stop(self) -> None:
        """Fast shutdown (bounded, then SIGKILL); the data directory is kept."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGINT)
        try:
            process.wait(BOUND_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(BOUND_S)

    def start(self, port: int | None = None) -> None:
        """Start the server on its data directory at ``port`` (default: its own); return once
        it accepts connections (bounded)."""
        assert self.process is None
        port = port or self.port
        as_root = hasattr(os, "geteuid") and os.geteuid() == 0
        with open(self.root / "server.log", "ab") as out:
            self.process = subprocess.Popen(
                [
                    *_run_as(as_root),
                    str(_binaries() / "postgres"),
                    "-D", str(self.root / "data"), "-p", str(port),
                    "-c", "listen_addresses=127.0.0.1",
                    "-c", f"unix_socket_directories={self.root}",
                    "-c", "fsync=off", "-c", "max_connections=100",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:
            try:
                psycopg.connect(self.url(port), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                time.sleep(0.05)
        raise AssertionError(f"the cluster did not start on port {port} within {BOUND_S} s")

    def identifier(self) -> int:
        """The running cluster's system identifier."""
        return self.identifier_at(self.url())

    @staticmethod
    def identifier_at(url: str) -> int:
        """The system identifier of the cluster ``url`` names."""
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone()
        assert row is not None
        return int(row[0])

    def remove(self) -> None:
        """Stop it and remove its directory."""
        self.stop()
        TestServer(self.root, self._server.process, self.port).stop()


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream`` (host, port), a thread per direction
    of each connection.  ``arm(mode)`` acts on the next client chunk holding ``COMMIT``:
    ``"swallow"`` forwards it and drops the server's answer, closing the client's side;
    ``"drop"`` closes both sides without forwarding it.  ``refuse`` closes new connections at
    once.  :meth:`close` ends every connection (bounded)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.mode: str | None = None
        self.refuse = False
        self.fired = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self._spawn(self._accept)

    def arm(self, mode: str) -> None:
        """Act on the next ``COMMIT`` (see the class docs)."""
        self.fired.clear()
        self.mode = mode

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refuse:
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            cut = threading.Event()  # set: the server's answers are no longer passed on
            self._spawn(self._pump_up, client, server, cut)
            self._spawn(self._pump_down, server, client, cut)

    def _pump_up(self, client: socket.socket, server: socket.socket, cut: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while chunk := client.recv(65536):
                if self.mode is not None and b"COMMIT" in chunk:
                    mode, self.mode = self.mode, None
                    if mode == "swallow":
                        cut.set()
                        server.sendall(chunk)
                    else:  # drop: the server sees the client go, without its COMMIT
                        _end(server)
                    _end(client)
                    self.fired.set()
                    return
                server.sendall(chunk)
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_WR)

    def _pump_down(
        self, server: socket.socket, client: socket.socket, cut: threading.Event
    ) -> None:
        with contextlib.suppress(OSError):
            while chunk := server.recv(65536):
                if cut.is_set():
                    continue  # swallowed: the server committed, the client never hears it
                client.sendall(chunk)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)

    def retarget(self, upstream: tuple[str, int]) -> None:
        """Forward new connections to ``upstream`` and end every current one (another server
        answering at the same address)."""
        self.upstream = upstream
        with self._lock:
            ended, self._sockets = self._sockets, []
        for sock in ended:
            _end(sock)

    def close(self) -> None:
        """Stop accepting, end every connection, join the threads (bounded)."""
        self._closed = True
        _end(self._listener)
        with self._lock:
            for sock in self._sockets:
                _end(sock)
        for thread in self._threads:
            thread.join(BOUND_S)


def _end(sock: socket.socket) -> None:
    """Shut ``sock`` down (which wakes a thread blocked on it and tells the peer) and close it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def proxied(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    return make_conninfo(url, host="127.0.0.1", port=str(port))


def upstream_of(url: str) -> tuple[str, int]:
    """The host and port ``url`` names."""
    params = conninfo_to_dict(url)
    return str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)

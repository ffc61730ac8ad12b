"""A write whose ``COMMIT`` is lost in flight, on a real server behind a small TCP proxy that
can swallow the server's answer to the next ``COMMIT``, or drop that ``COMMIT`` before the
server sees it: the store asks the server what became of the transaction and never guesses --
committed, the write's row is returned (written once); rolled back, the write runs again
(written once); when the server cannot be asked, ``StoreOutcomeUnknown``, and the caller is
told to re-read.  The proxy also stands for another cluster answering at the same address."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from statecore.errors import StoreOutcomeUnknown
from statecore.store import Audit
from stores.postgres import PostgresStore
from stores.testing import TICKET_KIND
from stores.testing._kit import TS, file_ticket

BOUND_S = 20.0
"""Every wait of these tests ends within this."""
FAST = {"connect_timeout_s": 1.0, "connect_retries": 2, "retry_backoff_s": 0.05}


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


@pytest.fixture
def proxy(postgres_url: str) -> Iterator[Proxy]:
    """A proxy in front of the session's server; closed afterwards."""
    made = Proxy(upstream_of(postgres_url))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def store(postgres_url: str, proxy: Proxy) -> Iterator[PostgresStore]:
    """A one-connection store through the proxy, tickets registered, ticket t1 filed."""
    opened = PostgresStore(
        proxied(postgres_url, proxy.port), schema=f"l_{uuid.uuid4().hex[:12]}", pool_size=1, **FAST
    )
    try:
        opened.register(TICKET_KIND)
        file_ticket(opened, "t1")
        yield opened
    finally:
        opened.close()


def _holds(url: str, schema: str | None, entity_id: str) -> int:
    """How many ``hold`` audit entries ``entity_id`` has (read directly, not through the proxy)."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {schema}.statecore_audit "
            "WHERE entity_id = %s AND event = 'hold'",
            (entity_id,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _hold(store: PostgresStore) -> Any:
    return store.transition(TICKET_KIND, "t1", "hold", audit=Audit(2.0, "w"), fence=0)


def test_a_commit_whose_answer_is_lost_is_found_committed(
    store: PostgresStore, proxy: Proxy, postgres_url: str
) -> None:
    """The server commits, its answer never arrives: the store asks, learns it committed, and
    returns the row -- written once, not retried, not reported as failed."""
    proxy.arm("swallow")
    row = _hold(store)
    assert proxy.fired.is_set()  # the cut happened
    assert (row.state, row.fence) == (TS.HELD, 1)
    assert _holds(postgres_url, store.schema, "t1") == 1


def test_a_commit_lost_before_the_server_saw_it_is_run_again_once(
    store: PostgresStore, proxy: Proxy, postgres_url: str
) -> None:
    """The connection drops before the server got the COMMIT: the server rolled it back, the
    store learns so, and runs the write again -- written once."""
    proxy.arm("drop")
    row = _hold(store)
    assert proxy.fired.is_set()
    assert (row.state, row.fence) == (TS.HELD, 1)
    assert _holds(postgres_url, store.schema, "t1") == 1


def test_a_commit_that_cannot_be_resolved_is_reported_unknown_never_as_failed(
    store: PostgresStore, proxy: Proxy, postgres_url: str
) -> None:
    """The answer is lost and the server cannot be asked (the proxy refuses new connections):
    StoreOutcomeUnknown telling the caller to re-read -- and the write did commit, so a caller
    that took it for a failure and wrote again would have been wrong."""
    proxy.arm("swallow")
    proxy.refuse = True
    with pytest.raises(StoreOutcomeUnknown, match="re-read the entity") as info:
        _hold(store)
    assert proxy.fired.is_set()
    assert info.value.what.endswith("transition")
    proxy.refuse = False
    _eventually_held(store, postgres_url)  # it had committed


def test_a_block_whose_commit_is_lost_is_reported_unknown(
    store: PostgresStore, proxy: Proxy, postgres_url: str
) -> None:
    """An atomic() block has no transaction id to ask about: a lost COMMIT raises
    StoreOutcomeUnknown (never a plain failure)."""
    proxy.arm("swallow")
    with pytest.raises(StoreOutcomeUnknown, match="re-read"), store.atomic():
        _hold(store)
    _eventually_held(store, postgres_url)


def _eventually_held(store: PostgresStore, postgres_url: str) -> None:
    """The server got the COMMIT: it commits, maybe after the store stopped asking; re-read
    (what the caller of an unknown outcome must do) shows the write, once."""
    deadline = time.monotonic() + BOUND_S
    while _holds(postgres_url, store.schema, "t1") == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert _holds(postgres_url, store.schema, "t1") == 1
    row = store.get(TICKET_KIND, "t1")
    assert row is not None
    assert (row.state, row.fence) == (TS.HELD, 1)

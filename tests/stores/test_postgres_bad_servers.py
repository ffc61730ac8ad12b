"""PostgresStore against bad servers, on a real throwaway cluster started and stopped here:
nothing listening, a server stopped and started again on the same data directory, a statement
that cannot finish in time, and another cluster (the session's server: another ``initdb``,
another system identifier) at the store's address or holding a copy of its data.  Each is a
typed error that writes nothing; a server that comes back is used again by the same store."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from statecore.errors import StoreError, StoreIdentityChanged, StoreTimeout, StoreUnreachable
from statecore.store import Audit
from stores.postgres import PostgresStore
from stores.testing import TICKET_KIND
from stores.testing._kit import TS, file_ticket
from stores.testing.postgres_server import (
    PASSWORD,
    USER,
    _binaries,
    _free_port,
)
from tests.stores.postgres_faults import Cluster, Proxy, proxied, upstream_of

BOUND_S = 20.0
"""Every wait of these tests ends within this (a server start, a reconnection)."""
FAST = {"connect_timeout_s": 1.0, "connect_retries": 3, "retry_backoff_s": 0.05}
"""Small bounds, so that an unreachable server is reported within about 3 s."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A cluster of this module's own (the session's server is the other one); removed at
    the end."""
    made = Cluster()
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture
def primary(cluster: Cluster) -> Cluster:
    """The module's cluster, started again if a test left it stopped."""
    if cluster.process is not None and cluster.process.poll() is not None:
        cluster.process = None  # it died
    if cluster.process is None:
        cluster.start()
    return cluster


def _schema() -> str:
    return f"b_{uuid.uuid4().hex[:12]}"


def _count(url: str, sql: str, *params: Any) -> int:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(sql, params).fetchone()
    assert row is not None
    return int(row[0])


def _audit_count(url: str, schema: str, entity_id: str) -> int:
    return _count(
        url, f"SELECT count(*) FROM {schema}.statecore_audit WHERE entity_id = %s", entity_id
    )


# -- nothing listening --------------------------------------------------------------------------


def test_opening_with_nothing_listening_raises_unreachable_after_bounded_retries() -> None:
    """No server at the port: StoreUnreachable after the three tries, naming host, port and
    database, never the password; within the bound."""
    port = _free_port()
    started = time.monotonic()
    with pytest.raises(
        StoreUnreachable, match=rf"127\.0\.0\.1:{port}.*'postgres'.*3 tries"
    ) as info:
        PostgresStore(f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{port}/postgres", **FAST)
    elapsed = time.monotonic() - started
    assert PASSWORD not in str(info.value)
    assert 0.05 + 0.1 <= elapsed < BOUND_S  # the backoff was waited, and the bound held


def test_a_server_that_never_answers_raises_unreachable_within_the_connect_bound() -> None:
    """Something listens but never speaks (a hung server, a black-holed route): each try ends
    at the connect timeout, and after the bounded tries StoreUnreachable -- never a hang."""
    silent = socket.create_server(("127.0.0.1", 0), backlog=8)  # the kernel accepts; no one reads
    port = int(silent.getsockname()[1])
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnreachable, match="2 tries"):
            PostgresStore(
                f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{port}/postgres",
                connect_timeout_s=1.0,
                connect_retries=2,
                retry_backoff_s=0.05,
            )
        assert 1.0 <= time.monotonic() - started < BOUND_S
    finally:
        silent.close()


def test_a_refused_login_is_not_retried(primary: Cluster) -> None:
    """A wrong password is a refusal trying again cannot cure: StoreError at once, not
    StoreUnreachable."""
    url = primary.url().replace(PASSWORD, "wrong-password")
    with pytest.raises(StoreError) as info:
        PostgresStore(url, retry_backoff_s=5.0)  # a retry would show as a 5 s wait
    assert not isinstance(info.value, StoreUnreachable)
    assert "wrong-password" not in str(info.value)


def test_bad_bounds_are_refused_before_connecting() -> None:
    """Out-of-range bounds: ValueError naming the option; nothing is opened."""
    url = f"postgresql://{USER}@127.0.0.1:1/postgres"
    for options in (
        {"connect_retries": 0},
        {"retry_backoff_s": -1.0},
        {"statement_timeout_s": 0},
        {"claim_lock_timeout_s": float("inf")},
        {"adopt_system_identifier": "7"},
    ):
        with pytest.raises(ValueError, match=next(iter(options))):
            PostgresStore(url, **options)  # type: ignore[arg-type]


# -- a server stopped, then started again -------------------------------------------------------


def test_a_stopped_server_raises_unreachable_and_is_used_again_once_back(primary: Cluster) -> None:
    """While the server is down, reads and writes raise StoreUnreachable (bounded) and write
    nothing; once it is back on the same data directory the same store works again, and the
    write asked for while it was down was not kept."""
    schema = _schema()
    store = PostgresStore(primary.url(), schema=schema, **{**FAST, "connect_retries": 2})
    try:
        store.register(TICKET_KIND)
        file_ticket(store, "t1")
        primary.stop()
        for call in (
            lambda: store.get(TICKET_KIND, "t1"),
            lambda: store.transition(TICKET_KIND, "t1", "hold", audit=Audit(2.0, "x"), fence=0),
        ):
            started = time.monotonic()
            with pytest.raises(StoreUnreachable) as info:
                call()
            assert time.monotonic() - started < BOUND_S
            assert PASSWORD not in str(info.value)
        primary.start()
        deadline = time.monotonic() + BOUND_S
        while True:  # the pool reconnects on the next call after its bounded wait gave up
            try:
                row = store.get(TICKET_KIND, "t1")
                break
            except StoreUnreachable:
                assert time.monotonic() < deadline, "the store never used the server again"
        assert row is not None
        assert (row.state, row.fence) == (TS.OPEN, 0)
        moved = store.transition(TICKET_KIND, "t1", "hold", audit=Audit(3.0, "y"), fence=0)
        assert moved.state is TS.HELD
        assert _audit_count(primary.url(), schema, "t1") == 2  # filed, held once
    finally:
        store.close()


# -- a server that answers slowly ---------------------------------------------------------------


def test_a_statement_past_its_timeout_raises_a_timeout_and_writes_nothing(primary: Cluster) -> None:
    """Another session holds the row (``SELECT ... FOR UPDATE`` in an open transaction): the
    store's transition waits, the server cancels it at ``statement_timeout_s`` and the store
    raises StoreTimeout; nothing was written.  Once the other session ends, the same write
    succeeds once."""
    schema = _schema()
    store = PostgresStore(primary.url(), schema=schema, statement_timeout_s=0.3, **FAST)
    holder = psycopg.connect(primary.url(), connect_timeout=5)
    try:
        store.register(TICKET_KIND)
        file_ticket(store, "t1")
        holder.execute(f"SELECT * FROM {schema}.kit_tickets WHERE ticket_id = 't1' FOR UPDATE")
        started = time.monotonic()
        with pytest.raises(StoreTimeout, match="nothing of its transaction was kept"):
            store.transition(TICKET_KIND, "t1", "hold", audit=Audit(2.0, "x"), fence=0)
        assert 0.3 <= time.monotonic() - started < BOUND_S
        holder.rollback()
        row = store.get(TICKET_KIND, "t1")
        assert row is not None
        assert (row.state, row.fence) == (TS.OPEN, 0)
        assert _audit_count(primary.url(), schema, "t1") == 1
        store.transition(TICKET_KIND, "t1", "hold", audit=Audit(3.0, "y"), fence=0)
        assert _audit_count(primary.url(), schema, "t1") == 2
    finally:
        holder.close()
        store.close()


# -- another cluster ----------------------------------------------------------------------------


def test_the_store_records_its_cluster_identifier(primary: Cluster) -> None:
    """The identifier is recorded in the schema at first open, and is the server's."""
    schema = _schema()
    with PostgresStore(primary.url(), schema=schema, **FAST) as store:
        assert store.system_identifier == primary.identifier()
    recorded = _count(
        primary.url(),
        f"SELECT value::bigint FROM {schema}.statecore_meta WHERE key = 'system_identifier'",
    )
    assert recorded == primary.identifier()


def test_another_cluster_at_the_address_is_refused_and_nothing_is_written(
    primary: Cluster, postgres_url: str
) -> None:
    """The store wrote on one cluster; then another cluster answers at the same address (a
    proxy in front, switched to the session's server): every call raises StoreIdentityChanged
    naming both identifiers and the override, and nothing is written on the other cluster (its
    database never gets the schema)."""
    other = Cluster.identifier_at(postgres_url)
    ours = primary.identifier()
    assert ours != other  # two initdb's
    schema = _schema()
    proxy = Proxy(upstream_of(primary.url()))
    store = PostgresStore(proxied(primary.url(), proxy.port), schema=schema, **FAST)
    try:
        store.register(TICKET_KIND)
        file_ticket(store, "t1")
        proxy.retarget(upstream_of(postgres_url))  # another cluster at the store's address
        with pytest.raises(StoreIdentityChanged) as info:
            store.transition(TICKET_KIND, "t1", "hold", audit=Audit(2.0, "x"), fence=0)
        message = str(info.value)
        assert str(ours) in message
        assert str(other) in message
        assert f"adopt_system_identifier={other}" in message
        assert (info.value.recorded, info.value.found) == (ours, other)
        for call in (  # and from then on, every call, at once
            lambda: store.get(TICKET_KIND, "t1"),
            lambda: file_ticket(store, "t2"),
            lambda: store.notify("ch"),
        ):
            started = time.monotonic()
            with pytest.raises(StoreIdentityChanged):
                call()
            assert time.monotonic() - started < 0.5
        namespaces = "SELECT count(*) FROM pg_namespace WHERE nspname = %s"
        assert _count(postgres_url, namespaces, schema) == 0
        row = PostgresStore(primary.url(), schema=schema, **FAST)  # the first still holds it
        row.register(TICKET_KIND)
        assert _state(row, "t1") is TS.OPEN
        row.close()
    finally:
        store.close()
        proxy.close()


def _state(store: PostgresStore, entity_id: str) -> TS | None:
    found = store.get(TICKET_KIND, entity_id)
    return None if found is None else found.state


def _copy_schema(source: str, target: str, schema: str, root: Path) -> None:
    """``pg_dump`` of ``schema`` on ``source`` restored with ``psql`` on ``target``."""
    dump = root / f"{schema}.sql"
    env = {**os.environ, "PGCONNECT_TIMEOUT": "5"}
    binaries = _binaries()
    subprocess.run(
        [str(binaries / "pg_dump"), "-n", schema, "-f", str(dump), "-d", source],
        check=True, capture_output=True, timeout=BOUND_S, env=env,
    )  # fmt: skip
    subprocess.run(
        [str(binaries / "psql"), "-q", "-v", "ON_ERROR_STOP=1", "-f", str(dump), "-d", target],
        check=True, capture_output=True, timeout=BOUND_S, env=env,
    )  # fmt: skip


def test_a_copy_on_another_cluster_is_refused_until_an_operator_adopts_it(
    primary: Cluster, postgres_url: str, tmp_path: Path
) -> None:
    """A schema dumped from one cluster and restored on another (the session's: a restored
    backup): opening it raises StoreIdentityChanged and writes nothing (the restored rows and
    the recorded identifier unchanged); adopting a wrong identifier is refused; adopting the
    server's records it, and the store then opens without the override."""
    schema = _schema()
    with PostgresStore(primary.url(), schema=schema, **FAST) as store:
        store.register(TICKET_KIND)
        file_ticket(store, "t1")
        file_ticket(store, "t2")
    _copy_schema(primary.url(), postgres_url, schema, tmp_path)
    other = Cluster.identifier_at(postgres_url)
    recorded = f"SELECT value::bigint FROM {schema}.statecore_meta WHERE key = 'system_identifier'"
    audits = f"SELECT count(*) FROM {schema}.statecore_audit"
    before = (_count(postgres_url, recorded), _count(postgres_url, audits))
    assert before == (primary.identifier(), 2)
    with pytest.raises(StoreIdentityChanged, match=str(other)):
        PostgresStore(postgres_url, schema=schema, **FAST)
    with pytest.raises(StoreError, match="not this server's system identifier"):
        PostgresStore(postgres_url, schema=schema, adopt_system_identifier=12345, **FAST)
    assert (_count(postgres_url, recorded), _count(postgres_url, audits)) == before
    PostgresStore(postgres_url, schema=schema, adopt_system_identifier=other, **FAST).close()
    assert _count(postgres_url, recorded) == other
    with PostgresStore(postgres_url, schema=schema, **FAST) as store:
        store.register(TICKET_KIND)
        assert [r.id for r in store.select(TICKET_KIND)] == ["t1", "t2"]


def test_the_identifier_is_checked_on_each_new_connection_while_threads_work(
    primary: Cluster,
) -> None:
    """Several threads reading while the server restarts on the same data directory: the same
    cluster, so no StoreIdentityChanged, only StoreUnreachable while it is down."""
    schema = _schema()
    store = PostgresStore(primary.url(), schema=schema, pool_size=4, **FAST)
    seen: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                store.get(TICKET_KIND, "t1")
            except StoreError as exc:
                seen.append(exc)
                time.sleep(0.05)

    threads = [threading.Thread(target=reader, daemon=True) for _ in range(3)]

    try:
        store.register(TICKET_KIND)
        file_ticket(store, "t1")
        for thread in threads:
            thread.start()
        primary.stop()
        primary.start()
        deadline = time.monotonic() + BOUND_S
        while True:
            try:
                store.get(TICKET_KIND, "t1")
                break
            except StoreUnreachable:
                assert time.monotonic() < deadline
    finally:
        stop.set()
        for thread in threads:
            if thread.ident is not None:
                thread.join(BOUND_S)
        store.close()
    assert not [e for e in seen if not isinstance(e, StoreUnreachable)]

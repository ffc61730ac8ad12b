"""``Connector(store_threads=...)`` is checked like the connector's other options: anything but
a bool is refused (``TypeError``) before anything is built, as the ledger and the dedupe refuse
it for their own ``threads``."""

from __future__ import annotations

import pytest

from relay.connector.chat_tenants import CHAT_TENANT_KIND
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from statecore.errors import StoreError
from stores.memory import InMemoryStore


@pytest.mark.parametrize("value", ["no", 0, 1, None])
def test_store_threads_must_be_a_bool(value: object) -> None:
    store = InMemoryStore()
    drivers = {"loopback": LoopbackPlatform()}
    with pytest.raises(TypeError, match="store_threads must be a bool"):
        Connector(store, secrets={"gw-a": ["s"]}, drivers=drivers, store_threads=value)  # type: ignore[arg-type]
    with pytest.raises(StoreError):  # refused before anything was built: no table registered
        store.select(CHAT_TENANT_KIND)


@pytest.mark.parametrize("value", [True, False])
def test_store_threads_accepts_a_bool(value: bool) -> None:
    drivers = {"loopback": LoopbackPlatform()}
    Connector(InMemoryStore(), secrets={"gw-a": ["s"]}, drivers=drivers, store_threads=value)

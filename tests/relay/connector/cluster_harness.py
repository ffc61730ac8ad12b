"""The cluster harness the cluster tests share: connector nodes on one schema of the session's
real PostgreSQL, each with its own ``PostgresStore`` and loopback platform, gateways on chosen
nodes, and raw gateway sockets.  Everything it opens is closed by :meth:`Cluster.close`."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from relay.client.transport import WebSocketRelayTransport
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from stores import PostgresStore
from tests.relay.connector.connector_harness import (
    BOUND,
    SECRETS,
    Harness,
    eventually,
    is_live,
    raw_hello,
    recv_frame,
    send_line,
)


class Cluster:
    """Connector nodes on one schema, each with its own store and loopback platform."""

    def __init__(self, postgres_url: str) -> None:
        self.url = postgres_url
        self.schema = f"c_{uuid.uuid4().hex[:16]}"
        self.stores: list[PostgresStore] = []
        self.nodes: list[Connector] = []
        self.platforms: list[LoopbackPlatform] = []
        self.transports: list[WebSocketRelayTransport] = []
        self.harness_sockets: list[Any] = []

    async def node(self, port: int = 0, **options: Any) -> Connector:
        store = PostgresStore(self.url, schema=self.schema, pool_size=4)
        self.stores.append(store)
        platform = LoopbackPlatform()
        self.platforms.append(platform)
        options.setdefault("open_egress", True)
        node = Connector(
            store, secrets=SECRETS, drivers={"loopback": platform}, cluster=True, **options
        )
        self.nodes.append(node)
        await node.start(port=port, reuse_port=port != 0)
        return node

    async def gateway(
        self, node: Connector, gateway_id: str, handler: Any, **options: Any
    ) -> WebSocketRelayTransport:
        options.setdefault("reconnect", False)
        transport = WebSocketRelayTransport(
            node.url,
            "loopback",
            f"bot-{gateway_id}",
            gateway_id=gateway_id,
            secret=SECRETS[gateway_id][0],
            **options,
        )
        self.transports.append(transport)
        transport.set_inbound_handler(handler)
        await asyncio.wait_for(transport.connect(), BOUND)
        await transport.handshake(BOUND)
        # Nodes sharing a port: the kernel picks which one the connection reaches.
        await eventually(
            lambda: any(is_live(n, gateway_id) for n in self.nodes), f"{gateway_id} live"
        )
        await self.heard_everywhere(gateway_id)
        return transport

    async def heard_everywhere(self, gateway_id: str) -> None:
        """Wait until every node heard of the gateway's subscription (a notice takes a few
        milliseconds to travel; an event a node accepts before can only reach the gateways
        that node already knew)."""
        await eventually(
            lambda: all(
                "loopback" in node._subscriptions.get(gateway_id, ()) for node in self.nodes
            ),
            f"every node knows {gateway_id}",
        )

    async def close(self) -> None:
        for transport in self.transports:
            await transport.disconnect(budget_s=2)
        for ws in self.harness_sockets:
            await asyncio.wait_for(ws.close(), BOUND)
        for node in self.nodes:
            await asyncio.wait_for(node.stop(), BOUND)
        for store in self.stores:
            store.close()


@pytest_asyncio.fixture
async def cluster(postgres_url: str) -> AsyncIterator[Cluster]:
    """A cluster of no nodes yet on a fresh schema, closed after the test."""
    c = Cluster(postgres_url)
    try:
        yield c
    finally:
        await c.close()


async def raw_gateway(cluster: Cluster, node: Connector, gateway_id: str, replayed: int = 0) -> Any:
    """A raw (original-contract) gateway connection on ``node``: said hello, its ``replayed``
    buffered events received and acked, live there and known to every node."""
    raw = await Harness(cluster.stores[-1]).raw(node, gateway_id, announce=False)
    cluster.harness_sockets.append(raw)
    await raw_hello(raw)
    for _ in range(replayed):
        frame = await recv_frame(raw)
        assert frame["type"] == "inbound", frame
        await send_line(raw, {"type": "inbound_ack", "bufferId": frame["bufferId"]})
    await eventually(lambda: is_live(node, gateway_id), f"{gateway_id} live")
    await cluster.heard_everywhere(gateway_id)
    return raw


async def deafen(node: Connector) -> None:
    """Make ``node`` stop hearing its peers' notices (as a listener that lost its connection
    does); it serves, and sweeps, on."""
    assert node._cluster is not None
    unsubscribe, node._cluster._unsubscribe = node._cluster._unsubscribe, None
    assert unsubscribe is not None
    await asyncio.to_thread(unsubscribe)

"""Provenance forgets across the nodes of a connector cluster (real PostgreSQL, real sockets):
a target an operator forgets on one node stops being allowed on every node -- through the
notice, or the sweep when the notice was lost -- and the gateway may address it again only
once it received from it again (a forgotten target is learned afresh)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from relay.connector.provenance import PROVENANCE_KIND, ProvenanceState
from tests.relay.connector.cluster_harness import Cluster, cluster, deafen, raw_gateway
from tests.relay.connector.connector_harness import (
    eventually,
    raw_request,
    recv_frame,
    send_action,
    send_line,
)

__all__ = ["cluster"]  # the fixture, used by name


async def _receive(raw: Any, text: str) -> None:
    """The next frame is the inbound ``text``: ack it."""
    frame = await recv_frame(raw)
    assert (frame["type"], frame["event"]["text"]) == ("inbound", text), frame
    await send_line(raw, {"type": "inbound_ack", "bufferId": frame["bufferId"]})


async def _send(raw: Any, request_id: str, chat_id: str) -> dict[str, Any]:
    return await raw_request(raw, request_id, send_action(chat_id, f"to {chat_id}"))


@pytest.mark.asyncio
async def test_a_target_forgotten_on_one_node_is_declined_on_every_node(
    cluster: Cluster,
) -> None:
    """gw-a's socket is on node B; chats learned from events node A accepted are allowed on B.
    A's operator forgets c1: B stops allowing it through the notice (no restart), c2 stays
    allowed; an event from c1 again makes it allowed again on both."""
    a = await cluster.node(open_egress=False)
    b = await cluster.node(open_egress=False)
    raw = await raw_gateway(cluster, b, "gw-a")
    for chat in ("c1", "c2"):
        await cluster.platforms[0].inject(chat, f"from {chat}")
        await _receive(raw, f"from {chat}")
        assert (await _send(raw, f"first-{chat}", chat))["success"] is True
    assert b.provenance.allows("gw-a", "loopback", "c1")

    await asyncio.to_thread(a.provenance.forget, "gw-a", "loopback", "c1")
    await eventually(lambda: not b.provenance.allows("gw-a", "loopback", "c1"), "forgotten on B")
    declined = await _send(raw, "after-forget", "c1")
    assert (declined["success"], declined["code"]) == (False, "egress_declined"), declined
    assert (await _send(raw, "still-known", "c2"))["success"] is True

    await cluster.platforms[0].inject("c1", "back again")
    await _receive(raw, "back again")
    assert (await _send(raw, "learned-again", "c1"))["success"] is True
    rows = {row["target"]: row.state for row in cluster.stores[0].select(PROVENANCE_KIND)}
    assert rows == {"c1": ProvenanceState.KNOWN, "c2": ProvenanceState.KNOWN}
    assert cluster.platforms[1].texts("c1") == ["to c1", "to c1"]


@pytest.mark.asyncio
async def test_a_forget_whose_notice_was_lost_is_seen_by_the_sweep(cluster: Cluster) -> None:
    """Node B no longer hears notices but sweeps: a target A's operator forgets is dropped
    from B's memory within a sweep, and B declines it."""
    a = await cluster.node(open_egress=False)
    b = await cluster.node(open_egress=False, cluster_sweep_s=0.2)
    raw = await raw_gateway(cluster, b, "gw-a")
    await cluster.platforms[0].inject("c9", "from c9")
    await _receive(raw, "from c9")
    assert (await _send(raw, "first", "c9"))["success"] is True
    await deafen(b)  # deaf to notices from now on, but still sweeping
    await asyncio.to_thread(a.provenance.forget, "gw-a", "loopback", "c9")
    await eventually(lambda: not b.provenance.allows("gw-a", "loopback", "c9"), "the sweep")
    declined = await _send(raw, "after-forget", "c9")
    assert declined["code"] == "egress_declined", declined


@pytest.mark.asyncio
async def test_a_hostile_forget_notice_only_makes_a_node_read_the_store(
    cluster: Cluster,
) -> None:
    """A notice claiming a forget that never happened makes the node read the row: the target
    stays allowed."""
    from relay.connector._cluster import CHANNEL  # noqa: PLC0415

    await cluster.node(open_egress=False)
    b = await cluster.node(open_egress=False)
    raw = await raw_gateway(cluster, b, "gw-a")
    await cluster.platforms[0].inject("c5", "from c5")
    await _receive(raw, "from c5")
    assert (await _send(raw, "first", "c5"))["success"] is True
    assert b._cluster is not None
    before = b._cluster.notices
    cluster.stores[0].notify(CHANNEL, '{"o": "intruder", "f": ["gw-a", "loopback", "c5"]}')
    await eventually(lambda: b._cluster is not None and b._cluster.notices > before, "read")
    assert b.provenance.allows("gw-a", "loopback", "c5")
    assert (await _send(raw, "still", "c5"))["success"] is True

"""Connector nodes sharing one PostgreSQL store (a cluster): an event accepted by any node
reaches the gateway whose socket another node holds, acks retire it whichever node took them,
subscriptions and provenance learned by one node hold on the others, and a node that goes away
mid-replay hands exactly the unacked tail to the next one.  Real connectors, each on its own
``PostgresStore`` of one schema of the session's real server; real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from relay.client.dedupe import StoreBufferDedupe
from relay.connector._cluster import CHANNEL
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from relay.wire.frames import InboundEvent
from statecore.errors import StoreError
from stores import InMemoryStore, PostgresStore
from tests.relay.connector.cluster_harness import Cluster, cluster
from tests.relay.connector.connector_harness import (
    SECRETS,
    Recorder,
    eventually,
    is_live,
    raw_hello,
    raw_request,
    recv_frame,
    send_action,
    send_line,
)

__all__ = ["cluster"]  # the fixture, used by name


def unacked(node: Connector, gateway_id: str) -> int:
    return node.buffered(gateway_id)


@pytest.mark.asyncio
async def test_an_event_accepted_by_one_node_reaches_the_gateway_on_another(
    cluster: Cluster,
) -> None:
    """Node A accepts the events; the gateway's socket is on node B (it said hello there only,
    after A started): every event arrives once, in order, and its ack on B retires it in the
    shared buffer."""
    a = await cluster.node()
    b = await cluster.node()
    seen = Recorder()
    await cluster.gateway(b, "gw-a", seen)
    for n in range(20):
        await cluster.platforms[0].inject("c1", f"m{n}")
    await eventually(lambda: len(seen.texts) == 20, "all delivered through node B")
    assert seen.texts == [f"m{n}" for n in range(20)]
    await eventually(lambda: unacked(a, "gw-a") == 0, "retired by the acks B took")
    assert a.undeliverable == 0


@pytest.mark.asyncio
async def test_events_accepted_by_both_nodes_arrive_exactly_once(cluster: Cluster) -> None:
    """Users write through both nodes at once: the gateway on node B gets each event exactly
    once (B's own live, A's through the catch-up), and nothing stays unacked."""
    await cluster.node()
    b = await cluster.node()
    seen = Recorder()
    await cluster.gateway(b, "gw-a", seen)
    injections = [cluster.platforms[n % 2].inject(f"c{n % 3}", f"m{n}") for n in range(60)]
    await asyncio.gather(*injections)
    await eventually(lambda: len(seen.texts) >= 60, "all delivered")
    await asyncio.sleep(0.3)  # a duplicate would arrive within this
    assert sorted(seen.texts) == sorted(f"m{n}" for n in range(60))
    await eventually(lambda: unacked(b, "gw-a") == 0, "all retired")


@pytest.mark.asyncio
async def test_an_original_gateway_on_another_node_gets_buffered_lines_and_acks_them(
    cluster: Cluster,
) -> None:
    """An original-contract gateway (announces nothing, acks only what carries a bufferId) on
    node B: an event node A accepted reaches it as a buffered line, its ack retires it."""
    from tests.relay.connector.connector_harness import Harness  # noqa: PLC0415

    a = await cluster.node()
    b = await cluster.node()
    raw = await Harness(cluster.stores[1]).raw(b, "gw-a", announce=False)
    cluster.harness_sockets.append(raw)
    await raw_hello(raw)
    await eventually(lambda: is_live(b, "gw-a"), "live on B")
    await cluster.heard_everywhere("gw-a")
    await cluster.platforms[0].inject("c9", "from A")
    frame = await recv_frame(raw)
    assert (frame["type"], frame["event"]["text"]) == ("inbound", "from A"), frame
    buffer_id = frame["bufferId"]
    assert unacked(a, "gw-a") == 1
    await send_line(raw, {"type": "inbound_ack", "bufferId": buffer_id})
    await eventually(lambda: unacked(a, "gw-a") == 0, "the ack on B retired it")


@pytest.mark.asyncio
async def test_provenance_learned_on_one_node_allows_egress_through_another(
    cluster: Cluster,
) -> None:
    """Without a tenants table a gateway may write only to chats it received inbound from: a
    chat learned from an event node A accepted is allowed through node B; a chat no node ever
    saw is still declined."""
    await cluster.node(open_egress=False)
    b = await cluster.node(open_egress=False)
    raw = await _raw_live(cluster, b)
    await cluster.platforms[0].inject("learned-on-a", "hi")
    frame = await recv_frame(raw)
    await send_line(raw, {"type": "inbound_ack", "bufferId": frame["bufferId"]})
    allowed = await raw_request(raw, "r1", send_action("learned-on-a", "answer"))
    assert allowed["success"] is True, allowed
    declined = await raw_request(raw, "r2", send_action("never-seen", "answer"))
    assert declined["success"] is False
    assert declined["code"] == "egress_declined"
    assert cluster.platforms[1].texts("learned-on-a") == ["answer"]
    assert cluster.platforms[1].texts("never-seen") == []


async def _raw_live(cluster: Cluster, node: Connector) -> Any:
    from tests.relay.connector.connector_harness import Harness  # noqa: PLC0415

    raw = await Harness(cluster.stores[-1]).raw(node, "gw-a", announce=False)
    cluster.harness_sockets.append(raw)
    await raw_hello(raw)
    await eventually(lambda: is_live(node, "gw-a"), "live")
    await cluster.heard_everywhere("gw-a")
    return raw


@pytest.mark.asyncio
async def test_a_node_gone_mid_replay_hands_the_unacked_tail_to_the_next(
    cluster: Cluster,
) -> None:
    """Two nodes listen on ONE port.  The gateway sleeps while 40 events are buffered; it
    connects (to whichever node the kernel picks) and handles part of the replay, slowly; that
    node goes away mid-replay.  The gateway redials the same URL, reaches the other node and
    receives exactly what it had not acked: every event handled, none twice, nothing left."""
    first = await cluster.node()
    port = int(first.url.rsplit(":", 1)[1])
    await first.stop()
    cluster.nodes.remove(first)
    a = await cluster.node(port=port)
    b = await cluster.node(port=port)
    for n in range(40):
        await cluster.platforms[n % 2].inject("c1", f"m{n}")
    assert unacked(a, "gw-a") == 0  # nobody said hello yet: undeliverable, nothing buffered
    # Say hello once (the subscription), then sleep: the events of the test are buffered.
    hello_seen = Recorder()
    await cluster.gateway(a, "gw-a", hello_seen, reconnect=True, reconnect_backoff_s=0.05)
    await cluster.transports.pop().disconnect(budget_s=2)
    await eventually(lambda: not a.connected("gw-a") and not b.connected("gw-a"), "asleep")
    for n in range(40):
        await cluster.platforms[n % 2].inject("c1", f"e{n}")
    assert unacked(a, "gw-a") == 40
    handled: list[str] = []
    release = asyncio.Event()

    async def slow(event: InboundEvent) -> None:
        if len(handled) == 10:
            await release.wait()  # holds the replay while its node goes away
        handled.append(event.text)

    # The gateway remembers the bufferIds it handled (as a real one does, in its store): what
    # its first connection received and could not ack is handled once, not again on the next.
    dedupe = StoreBufferDedupe(InMemoryStore())
    await cluster.gateway(a, "gw-a", slow, reconnect=True, reconnect_backoff_s=0.05, dedupe=dedupe)
    await eventually(lambda: len(handled) == 10, "part of the replay handled")
    holder = a if a.connected("gw-a") else b
    other = b if holder is a else a
    await holder.stop()  # its node goes away mid-replay
    release.set()
    await eventually(lambda: other.connected("gw-a"), "redialled onto the other node")
    await eventually(lambda: unacked(other, "gw-a") == 0, "the tail handled and acked")
    assert sorted(handled) == sorted(f"e{n}" for n in range(40))
    assert len(handled) == len(set(handled)), "an event handled twice"


@pytest.mark.asyncio
async def test_the_sweep_delivers_what_a_lost_notice_announced(cluster: Cluster) -> None:
    """Notices are hints: a node that stopped hearing them (its listener lost, say) still
    delivers the events other nodes accepted, on its next sweep."""
    await cluster.node()
    b = await cluster.node(cluster_sweep_s=0.2)
    seen = Recorder()
    await cluster.gateway(b, "gw-a", seen)
    assert b._cluster is not None
    await b._cluster.stop()  # deaf to notices from now on
    b._cluster._timer = asyncio.ensure_future(b._cluster._sweeps())  # but still sweeping
    await cluster.platforms[0].inject("c1", "heard by nobody")
    await eventually(lambda: seen.texts == ["heard by nobody"], "delivered by the sweep")
    b._cluster._timer.cancel()


@pytest.mark.asyncio
async def test_garbage_on_the_channel_is_ignored(cluster: Cluster) -> None:
    """Anything a database client sends on the cluster's channel that is not a notice changes
    nothing: the node keeps delivering."""
    await cluster.node()
    b = await cluster.node()
    seen = Recorder()
    await cluster.gateway(b, "gw-a", seen)
    store = cluster.stores[0]
    for payload in ("not json", "[]", json.dumps({"o": 1, "g": "gw-a"}), json.dumps({"g": "x"})):
        store.notify(CHANNEL, payload)
    store.notify(CHANNEL, json.dumps({"o": "someone", "g": "gw-unknown"}))
    await cluster.platforms[0].inject("c1", "still works")
    await eventually(lambda: seen.texts == ["still works"], "delivered")
    assert b._cluster is not None
    assert b._cluster.notices >= 1


def test_a_cluster_needs_a_store_that_notifies() -> None:
    """``cluster=True`` on a store that cannot carry notifications is refused at once, and so
    is a negative sweep interval."""
    with pytest.raises(TypeError, match="notifications"):
        Connector(InMemoryStore(), secrets=SECRETS, drivers={}, cluster=True)
    with pytest.raises(ValueError, match="cluster_sweep_s"):
        Connector(InMemoryStore(), secrets=SECRETS, drivers={}, cluster_sweep_s=-1)


@pytest.mark.asyncio
async def test_a_node_that_cannot_hear_its_peers_does_not_serve(postgres_url: str) -> None:
    """A cluster node whose store cannot listen (here: closed) refuses to start with a
    ``StoreError``, and listens on no port."""
    store = PostgresStore(postgres_url, schema=f"c_{uuid.uuid4().hex[:16]}")
    node = Connector(store, secrets=SECRETS, drivers={"loopback": LoopbackPlatform()}, cluster=True)
    store.close()
    with pytest.raises(StoreError):
        await node.start()
    assert node.url == ""
    await node.stop()

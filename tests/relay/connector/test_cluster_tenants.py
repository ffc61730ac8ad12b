"""Chat tenants across the nodes of a connector cluster (real PostgreSQL, real sockets): a node
that never held a chat reads its tenant from the store before the guard decides, so a
gateway's claim never outranks what another node learned; a chat another node moves or
forgets is seen through the notice, or the sweep when the notice is lost; a hit costs no read;
hostile notices only make a node read the store; forgotten rows are pruned by housekeeping
after the retention, a bounded batch a round."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable

import pytest

from relay.connector._cluster import CHANNEL
from relay.connector.chat_tenants import CHAT_TENANT_KIND, ChatTenants, ChatTenantState
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from statecore.clock import FakeClock
from stores import PostgresStore
from tests.relay.connector.cluster_harness import Cluster, cluster, deafen, raw_gateway
from tests.relay.connector.connector_harness import (
    SECRETS,
    eventually,
    raw_request,
    send_action,
)

__all__ = ["cluster"]  # the fixture, used by name

TENANTS = {"gw-a": {"scope-a"}, "gw-b": {"scope-b"}}


def _count_rereads(node: Connector) -> list[tuple[str, str]]:
    """Record every read-through of ``node``'s chat tenants (the store reads of the guard and
    of the notices)."""
    reads: list[tuple[str, str]] = []
    original: Callable[[str, str], str | None] = node.chat_tenants.reread

    def counted(platform: str, chat_id: str) -> str | None:
        reads.append((platform, chat_id))
        return original(platform, chat_id)

    node.chat_tenants.reread = counted  # type: ignore[method-assign]
    return reads


@pytest.mark.asyncio
async def test_a_chat_learned_on_another_node_decides_before_the_gateways_claim(
    cluster: Cluster,
) -> None:
    """Node A learns chat-x in scope-a after node B started, and B misses the notice; gw-b on
    node B claims scope-b for it: B reads the chat's tenant first and declines.  A chat A
    learned in scope-b is allowed on B with no claim at all (one read), and again without a
    read (a hit)."""
    await cluster.node(tenants=TENANTS, open_egress=False)
    b = await cluster.node(tenants=TENANTS, open_egress=False, cluster_sweep_s=0)
    await deafen(b)
    reads = _count_rereads(b)
    await cluster.platforms[0].inject("chat-x", "in a", scope_id="scope-a", chat_type="group")
    await cluster.platforms[0].inject("chat-y", "in b", scope_id="scope-b", chat_type="group")
    assert b.chat_tenants.get("loopback", "chat-x") is None  # B's memory never held it
    raw = await raw_gateway(cluster, b, "gw-b", replayed=1)  # chat-y's event

    claimed = await raw_request(raw, "r1", send_action("chat-x", "leak", scope_id="scope-b"))
    assert (claimed["success"], claimed["code"]) == (False, "egress_declined"), claimed
    assert cluster.platforms[1].texts("chat-x") == []
    assert b.chat_tenants.get("loopback", "chat-x") == "scope-a"

    first = await raw_request(raw, "r2", send_action("chat-y", "answer"))
    assert first["success"] is True, first
    reads_after_miss = len(reads)
    second = await raw_request(raw, "r3", send_action("chat-y", "again"))
    assert second["success"] is True, second
    assert len(reads) == reads_after_miss, "a hit that allows read the store"
    assert cluster.platforms[1].texts("chat-y") == ["answer", "again"]


@pytest.mark.asyncio
async def test_a_chat_moved_or_forgotten_on_another_node_is_seen_by_the_notice(
    cluster: Cluster,
) -> None:
    """B allows gw-b into chat-m (scope-b); the platform moves chat-m to scope-a through node
    A: B's memory follows the notice and gw-b is declined there.  A's operator forgets the
    chat: B forgets it too."""
    a = await cluster.node(tenants=TENANTS, open_egress=False)
    b = await cluster.node(tenants=TENANTS, open_egress=False)
    await cluster.platforms[0].inject("chat-m", "first", scope_id="scope-b", chat_type="group")
    raw = await raw_gateway(cluster, b, "gw-b", replayed=1)
    allowed = await raw_request(raw, "r1", send_action("chat-m", "answer"))
    assert allowed["success"] is True, allowed
    assert b.chat_tenants.get("loopback", "chat-m") == "scope-b"

    await cluster.platforms[0].inject("chat-m", "moved", scope_id="scope-a", chat_type="group")
    await eventually(lambda: b.chat_tenants.get("loopback", "chat-m") == "scope-a", "moved on B")
    declined = await raw_request(raw, "r2", send_action("chat-m", "stale"))
    assert (declined["success"], declined["code"]) == (False, "egress_declined"), declined
    assert cluster.platforms[1].texts("chat-m") == ["answer"]

    await asyncio.to_thread(a.chat_tenants.forget, "loopback", "chat-m")
    await eventually(lambda: b.chat_tenants.get("loopback", "chat-m") is None, "forgotten on B")


@pytest.mark.asyncio
async def test_a_move_whose_notice_was_lost_is_seen_by_the_sweep(cluster: Cluster) -> None:
    """Node B stops hearing notices (its listener gone) but keeps sweeping: a chat node A
    moves is seen on B within a sweep, and a chat A forgets is dropped."""
    a = await cluster.node(tenants=TENANTS, open_egress=False)
    b = await cluster.node(tenants=TENANTS, open_egress=False, cluster_sweep_s=0.2)
    for chat in ("chat-s", "chat-f"):
        await cluster.platforms[0].inject(chat, "first", scope_id="scope-b", chat_type="group")
    for chat in ("chat-s", "chat-f"):
        assert await asyncio.to_thread(b.chat_tenants.reread, "loopback", chat) == "scope-b"
    await deafen(b)  # deaf to notices from now on, but still sweeping
    await cluster.platforms[0].inject("chat-s", "moved", scope_id="scope-a", chat_type="group")
    await asyncio.to_thread(a.chat_tenants.forget, "loopback", "chat-f")
    await eventually(lambda: b.chat_tenants.get("loopback", "chat-s") == "scope-a", "the move")
    await eventually(lambda: b.chat_tenants.get("loopback", "chat-f") is None, "the forget")


@pytest.mark.asyncio
async def test_hostile_tenant_notices_only_make_a_node_read_the_store(cluster: Cluster) -> None:
    """Notices naming chats (real or not), or malformed, sent by any database client: the node
    reads those rows and its memory says what the store says, nothing else."""
    a = await cluster.node(tenants=TENANTS, open_egress=False)
    b = await cluster.node(tenants=TENANTS, open_egress=False)
    await cluster.platforms[0].inject("chat-h", "hi", scope_id="scope-a", chat_type="group")
    reads = _count_rereads(b)
    store = cluster.stores[0]
    for payload in (
        {"o": "intruder", "t": ["loopback", "chat-h"]},
        {"o": "intruder", "t": ["loopback", "no-such-chat"]},
        {"o": "intruder", "t": ["loopback"]},
        {"o": "intruder", "t": [1, 2]},
        {"o": "intruder", "t": "loopback/chat-h"},
        {"o": "intruder", "f": ["gw-a", "loopback"]},
    ):
        store.notify(CHANNEL, json.dumps(payload))
    await eventually(lambda: len(reads) == 2, "the two well-formed notices read")
    assert sorted(reads) == [("loopback", "chat-h"), ("loopback", "no-such-chat")]
    assert b.chat_tenants.get("loopback", "chat-h") == "scope-a"
    assert b.chat_tenants.get("loopback", "no-such-chat") is None
    assert a.chat_tenants.get("loopback", "chat-h") == "scope-a"


@pytest.mark.asyncio
async def test_housekeeping_prunes_forgotten_chat_tenants_after_the_retention(
    postgres_url: str,
) -> None:
    """On a FakeClock: chats forgotten longer ago than buffer_retention_s are deleted with
    their history; a chat forgotten recently and a known chat stay.  A round deletes at most
    its batch."""
    store = PostgresStore(postgres_url, schema=f"c_{uuid.uuid4().hex[:16]}", pool_size=2)
    clock = FakeClock()
    connector = Connector(
        store,
        secrets=SECRETS,
        drivers={"loopback": LoopbackPlatform()},
        tenants=TENANTS,
        clock=clock,
        buffer_retention_s=100.0,
        prune_interval_s=0,
    )
    try:
        tenants = connector.chat_tenants
        for n in range(5):
            tenants.learn("loopback", f"c{n}", "scope-a")
        for n in range(3):
            tenants.forget("loopback", f"c{n}")
        clock.advance(60.0)
        tenants.forget("loopback", "c3")  # forgotten 60 s after the others
        clock.advance(60.0)  # c0..c2 forgotten 120 s ago, c3 60 s ago

        assert tenants.prune(older_than_s=100.0, limit=2) == 2  # the batch bounds a round
        counts = await connector.housekeep()
        assert counts["chat_tenants"] == 1
        rows = {row.id: row.state for row in store.select(CHAT_TENANT_KIND)}
        assert sorted(rows.values()) == [ChatTenantState.FORGOTTEN, ChatTenantState.KNOWN]
        assert tenants.get("loopback", "c4") == "scope-a"
        assert (await connector.housekeep())["chat_tenants"] == 0
        clock.advance(60.0)  # c3 now forgotten 120 s ago
        assert (await connector.housekeep())["chat_tenants"] == 1
        assert [row["chat_id"] for row in store.select(CHAT_TENANT_KIND)] == ["c4"]
        # A pruned chat the platform shows again is learned afresh.
        assert tenants.learn("loopback", "c0", "scope-b")
        assert ChatTenants(store, clock=clock).get("loopback", "c0") == "scope-b"
    finally:
        await connector.stop()
        store.close()

"""The cluster-wide roster (real PostgreSQL, real sockets, a real node process): which gateways
are connected to which connector node, read from any node; a node killed with SIGKILL drops
out after the liveness bound, a node that stops cleanly at once; the command line reads the
same roster from the store alone."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from relay.client.transport import WebSocketRelayTransport
from relay.connector._cluster import MIN_BOUND_S
from relay.connector.nodes import MAX_BEATS, NODE_KIND, ClusterRoster, NodeState
from relay.connector.server import Connector
from statecore.cli import main as statecore_cli
from statecore.clock import FakeClock
from statecore.store import Audit
from stores import InMemoryStore
from stores.sqlite import SQLiteStore
from tests.relay.connector.cluster_harness import Cluster, cluster
from tests.relay.connector.connector_harness import BOUND, Recorder

__all__ = ["cluster"]  # the fixture, used by name

ROOT = Path(__file__).resolve().parents[3]

# One node of the cluster in its own process: prints its URL, serves until killed.
_NODE = textwrap.dedent(
    """
    import asyncio, sys
    from relay.connector.platform import LoopbackPlatform
    from relay.connector.server import Connector
    from stores import PostgresStore

    async def main() -> None:
        store = PostgresStore(sys.argv[1], schema=sys.argv[2], pool_size=2)
        node = Connector(
            store,
            secrets={"gw-rot": ["new-secret"]},
            drivers={"loopback": LoopbackPlatform()},
            cluster=True,
            open_egress=True,
            cluster_sweep_s=0.2,
        )
        await node.start()
        print(node.buffer.origin, node.url, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


async def _roster_becomes(
    node: Connector, expected: dict[str, list[str]], what: str, timeout: float = BOUND
) -> float:
    """Poll ``node.roster()`` until it is ``expected``; return the seconds it took."""
    began = time.monotonic()
    while (roster := await node.roster()) != expected:
        if time.monotonic() - began > timeout:
            raise AssertionError(f"timed out waiting for {what}: the roster is {roster}")
        await asyncio.sleep(0.02)
    return time.monotonic() - began


def _spawn_node(cluster: Cluster) -> subprocess.Popen[str]:
    """Node C in its own process, on the cluster's schema (made by a node already started)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", _NODE, cluster.url, cluster.schema],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


async def _serving(child: subprocess.Popen[str]) -> tuple[str, str]:
    """Node C's buffer origin and URL, once it serves."""
    assert child.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 30)
    origin, url = line.split()
    return origin, url


@pytest.mark.asyncio
async def test_every_node_lists_every_gateway_and_a_killed_node_drops_out(
    cluster: Cluster,
) -> None:
    """Nodes A and B in this process, node C in its own; gw-a on A, gw-b on B, gw-rot on C:
    the roster read from A and from B lists all three.  C is SIGKILLed: it is out of the
    roster of both once the bound passed (not before it could have missed a heartbeat).  B
    stops cleanly: out of A's roster at once."""
    a = await cluster.node(cluster_sweep_s=0.2)
    child = _spawn_node(cluster)  # it starts while B does
    transport: WebSocketRelayTransport | None = None
    try:
        b = await cluster.node(cluster_sweep_s=0.2)
        c_origin, c_url = await _serving(child)
        await cluster.gateway(a, "gw-a", Recorder())
        await cluster.gateway(b, "gw-b", Recorder())
        transport = WebSocketRelayTransport(
            c_url,
            "loopback",
            "bot-rot",
            gateway_id="gw-rot",
            secret="new-secret",
            reconnect=False,
        )
        transport.set_inbound_handler(Recorder())
        await asyncio.wait_for(transport.connect(), BOUND)
        await transport.handshake(BOUND)
        everyone = {
            a.buffer.origin: ["gw-a"],
            b.buffer.origin: ["gw-b"],
            c_origin: ["gw-rot"],
        }
        await _roster_becomes(a, everyone, "everyone, read from A")
        await _roster_becomes(b, everyone, "everyone, read from B")
        assert ClusterRoster(cluster.stores[0]).read() == everyone  # the command line's view

        child.send_signal(signal.SIGKILL)
        child.wait(BOUND)
        without_c = {a.buffer.origin: ["gw-a"], b.buffer.origin: ["gw-b"]}
        took = await _roster_becomes(a, without_c, "C out of A's roster", MIN_BOUND_S + BOUND)
        assert took >= MIN_BOUND_S - 0.5, f"C dropped out after {took:.2f} s, before the bound"
        await _roster_becomes(b, without_c, "C out of B's roster")

        await b.stop()
        await _roster_becomes(a, {a.buffer.origin: ["gw-a"]}, "B gone at once", 1.0)
        reader = ClusterRoster(cluster.stores[0], bound_s=MIN_BOUND_S)
        views = {v.node_id: v for v in reader.nodes()}
        assert set(views) == {a.buffer.origin, c_origin}  # B's row left, C's still live
        assert not views[c_origin].live
    finally:
        if transport is not None:
            await transport.disconnect(budget_s=1)
        if child.poll() is None:
            child.kill()
        child.wait(BOUND)
        if child.stdout is not None:
            child.stdout.close()


@pytest.mark.asyncio
async def test_gateways_coming_and_going_are_published_at_once(cluster: Cluster) -> None:
    """Heartbeats are slow (5 s) here: a gateway that connects to node B, and its going
    away, reach A's roster long before the next heartbeat."""
    a = await cluster.node(cluster_sweep_s=5.0)
    b = await cluster.node(cluster_sweep_s=5.0)
    await cluster.gateway(b, "gw-b", Recorder())
    await _roster_becomes(a, {a.buffer.origin: [], b.buffer.origin: ["gw-b"]}, "gw-b", 2.0)
    await cluster.transports.pop().disconnect(budget_s=2)
    await _roster_becomes(a, {a.buffer.origin: [], b.buffer.origin: []}, "gw-b gone", 2.0)


def test_the_stored_roster_bounds_liveness_and_prunes_silent_rows() -> None:
    """On a FakeClock: a node is listed while its heartbeat is within the bound, not after;
    a node silent longer than the retention is marked left and deleted; a node that was
    marked left and beats again joins again; bad rows and a reader's writes are refused."""
    store = InMemoryStore()
    clock = FakeClock()
    one = ClusterRoster(store, node_id="n1", bound_s=10.0, clock=clock)
    two = ClusterRoster(store, node_id="n2", bound_s=10.0, clock=clock)
    one.publish(["gw-b", "gw-a", "gw-a"], url="ws://x")
    two.publish([])
    assert one.read() == {"n1": ["gw-a", "gw-b"], "n2": []}
    clock.advance(8.0)
    one.publish(["gw-a"])
    clock.advance(5.0)  # n2 silent for 13 s, n1 for 5 s
    assert two.read() == {"n1": ["gw-a"]}
    assert one.prune(older_than_s=100.0) == 0
    clock.advance(200.0)
    assert one.prune(older_than_s=100.0) == 2  # both silent for longer than the retention
    assert store.select(NODE_KIND) == []
    two.publish(["gw-c"])
    assert one.read() == {"n2": ["gw-c"]}
    two.leave()
    two.leave()  # a second leave is a no-op
    assert store.select(NODE_KIND)[0].state is NodeState.LEFT
    two.publish(["gw-d"])  # a node marked left that beats again joins again
    assert one.read() == {"n2": ["gw-d"]}
    # A row whose gateways are not a JSON list of strings lists none of them.
    store.transition(
        NODE_KIND, "n2", "beat", audit=Audit(clock.now()), changes={"gateways": '{"x": 1}'}
    )
    assert one.read() == {"n2": []}
    # However long a node lives, its row's history stays bounded (started_at kept).
    started = store.get(NODE_KIND, "n2")
    assert started is not None
    for _ in range(MAX_BEATS + 5):
        clock.advance(1.0)
        two.publish(["gw-d"])
    assert len(store.history(NODE_KIND, "n2")) <= MAX_BEATS + 1
    rotated = store.get(NODE_KIND, "n2")
    assert rotated is not None
    assert rotated["started_at"] == started["started_at"]
    assert one.read() == {"n2": ["gw-d"]}
    with pytest.raises(ValueError, match="reads only"):
        ClusterRoster(store).publish(["gw-a"])
    with pytest.raises(ValueError, match="bound_s"):
        ClusterRoster(store, bound_s=0)


def _cli(*argv: str) -> tuple[int, str, str]:
    """``statecore argv...`` run in this process: (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    status = statecore_cli(list(argv), out=out, err=err, env={})
    return status, out.getvalue(), err.getvalue()


def test_the_command_line_shows_the_roster(tmp_path: Path) -> None:
    """``statecore buffer roster`` lists the live nodes with their gateways (``--all``: the
    silent ones too), from the store alone; a bound that is not positive is refused."""
    db = tmp_path / "connector.db"
    store = SQLiteStore(str(db))
    try:
        now = time.time()
        ClusterRoster(store, node_id="n1", clock=FakeClock(now)).publish(["gw-a"], url="ws://h:1")
        ClusterRoster(store, node_id="n2", clock=FakeClock(now - 60)).publish(["gw-b"])
    finally:
        store.close()
    store_url = f"sqlite:///{db}"
    status, out, err = _cli("--store", store_url, "buffer", "roster", "--json")
    assert (status, err) == (0, "")
    shown = json.loads(out)
    assert [(n["node_id"], n["gateways"], n["live"]) for n in shown["nodes"]] == [
        ("n1", ["gw-a"], True)
    ]
    status, out, _ = _cli("--store", store_url, "buffer", "roster", "--all", "--bound", "30")
    assert status == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == ["NODE", "n1", "n2"], out
    assert "gw-a" in lines[1]
    assert "ws://h:1" in lines[1]
    assert lines[2].split()[-2:] == ["no", "gw-b"], out
    status, _, err = _cli("--store", store_url, "buffer", "roster", "--bound", "0")
    assert status == 2
    assert "--bound" in err

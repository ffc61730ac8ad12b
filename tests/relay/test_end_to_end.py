"""End to end: the gateway's transport and adapter against the reference connector.

Real WebSockets on 127.0.0.1, the loopback platform as the chat, the connector's buffer on the
in-memory store and on SQLite.  Dormancy, wake, replay, acks, gateway and connector restarts,
tenant isolation and an echo bot; every handler call is counted per message id, so a loss or a
second handling fails the test.  Every wait is bounded and everything is torn down.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_asyncio

from relay.client.adapter import RelayAdapter
from relay.client.dedupe import StoreBufferDedupe
from relay.client.lifecycle import TransportState
from relay.client.transport import WebSocketRelayTransport
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import EGRESS_DECLINED_MESSAGE, Connector
from relay.wire.compat import OUR_FEATURES
from relay.wire.frames import InboundEvent
from statecore.clock import FakeClock
from statecore.store import Store
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from tests import waiting
from tests.relay.connector.connector_harness import is_live

BOUND = 10.0
"""Real seconds any single wait may take before the test fails."""
eventually = functools.partial(waiting.eventually, timeout=BOUND)
SECRETS: dict[str, list[str | bytes]] = {"gw-a": ["secret-a"], "gw-b": ["secret-b"]}

Handler = Callable[[InboundEvent], Awaitable[None]]


class Counter:
    """A bot's inbound handler that counts completed handlings per message id, in order."""

    def __init__(self, gate: Callable[[InboundEvent], Awaitable[None]] | None = None) -> None:
        self.order: list[str] = []
        self.counts: collections.Counter[str] = collections.Counter()
        self.gate = gate

    async def __call__(self, event: InboundEvent) -> None:
        if self.gate is not None:
            await self.gate(event)
        assert event.message_id is not None
        self.order.append(event.message_id)
        self.counts[event.message_id] += 1

    @property
    def twice(self) -> list[str]:
        return [m for m, n in self.counts.items() if n > 1]


class RecordingDedupe:
    """A StoreBufferDedupe that records what it was offered and what it remembered; with
    ``stall_after`` the gateway 'dies' right after durably remembering that many bufferIds
    (before their acks went out)."""

    def __init__(self, inner: StoreBufferDedupe, *, stall_after: int | None = None) -> None:
        self.inner = inner
        self.offered: list[str] = []
        self.remembered: list[str] = []
        self.stall_after = stall_after
        self.stalled = asyncio.Event()

    async def seen(self, buffer_id: str) -> bool:
        self.offered.append(buffer_id)
        return await self.inner.seen(buffer_id)

    async def remember(self, buffer_id: str) -> None:
        await self.inner.remember(buffer_id)
        self.remembered.append(buffer_id)
        if self.stall_after is not None and len(self.remembered) >= self.stall_after:
            self.stalled.set()
            await asyncio.Event().wait()  # cancelled by the teardown

    async def record_undeliverable(
        self, buffer_id: str, *, frame_type: str, reason: str, raw_line: str
    ) -> None:
        await self.inner.record_undeliverable(
            buffer_id, frame_type=frame_type, reason=reason, raw_line=raw_line
        )


class World:
    """Connectors, gateways (transport + adapter) and stores of one test; all closed at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.platform = LoopbackPlatform()
        self.connectors: list[Connector] = []
        self.transports: list[WebSocketRelayTransport] = []
        self.stores: list[Store] = []

    def open_store(self, kind: str, name: str = "connector.db") -> Store:
        store: Store = InMemoryStore() if kind == "memory" else SQLiteStore(self.tmp_path / name)
        self.stores.append(store)
        return store

    async def connector(self, store: Store, *, port: int = 0, **options: Any) -> Connector:
        options.setdefault("secrets", SECRETS)
        connector = Connector(store, drivers={"loopback": self.platform}, **options)
        self.connectors.append(connector)
        await connector.start(port=port)
        return connector

    def gateway(
        self, connector: Connector, gateway_id: str, handler: Handler | None = None, **options: Any
    ) -> tuple[WebSocketRelayTransport, RelayAdapter]:
        options.setdefault("secret", SECRETS[gateway_id][0])
        transport = WebSocketRelayTransport(
            connector.url, "loopback", f"bot-{gateway_id}", gateway_id=gateway_id, **options
        )
        self.transports.append(transport)
        adapter = RelayAdapter(transport)
        adapter.on_message(handler)
        return transport, adapter

    async def online(
        self, connector: Connector, gateway_id: str, handler: Handler | None = None, **options: Any
    ) -> tuple[WebSocketRelayTransport, RelayAdapter]:
        """A gateway connected through its adapter, with the connector delivering live."""
        transport, adapter = self.gateway(connector, gateway_id, handler, **options)
        assert await asyncio.wait_for(adapter.connect(), BOUND)
        await eventually(lambda: is_live(connector, gateway_id), f"{gateway_id} live")
        return transport, adapter

    async def subscribe(self, connector: Connector, gateway_id: str) -> None:
        """Let ``gateway_id`` say hello once and go dormant, so the connector buffers for it."""
        transport, adapter = await self.online(connector, gateway_id, dormant_redial_s=3600)
        assert await adapter.go_dormant()
        await transport.disconnect(budget_s=2)
        await eventually(lambda: not connector.connected(gateway_id), f"{gateway_id} gone")

    async def close(self) -> None:
        for transport in self.transports:
            await transport.disconnect(budget_s=2)
        for connector in self.connectors:
            await asyncio.wait_for(connector.stop(), BOUND)
        for store in self.stores:
            store.close()


@pytest_asyncio.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    """A World, torn down afterwards."""
    w = World(tmp_path)
    try:
        yield w
    finally:
        await w.close()


@pytest.fixture(params=["memory", "sqlite"])
def store_kind(request: pytest.FixtureRequest) -> str:
    """The connector's store kind."""
    kind: str = request.param
    return kind


def port_of(connector: Connector) -> int:
    return int(connector.url.rsplit(":", 1)[1])


async def backlog_ids(connector: Connector, gateway_id: str) -> list[str]:
    entries = await asyncio.to_thread(connector.buffer.backlog, gateway_id)
    return [e.buffer_id for e in entries]


@pytest.mark.asyncio
async def test_dormancy_buffer_wake_replay_ack(world: World, store_kind: str) -> None:
    """A dormant gateway's messages are buffered, the wake hook fires once, the transport
    re-dials on its dormant cadence and handles the backlog in order, acks it all, and then
    takes live traffic again: nothing lost, nothing handled twice."""
    woken: list[str] = []

    async def wake(gateway_id: str) -> None:
        woken.append(gateway_id)

    connector = await world.connector(world.open_store(store_kind), wake_hook=wake)
    clock = FakeClock(start=time.time())
    bot = Counter()
    transport, adapter = await world.online(connector, "gw-a", bot, clock=clock, dormant_redial_s=5)
    ids = [await world.platform.inject("c1", "live before")]
    await eventually(lambda: bot.order == ids, "live delivery")

    assert await adapter.go_dormant()
    assert transport.state is TransportState.DORMANT
    await eventually(lambda: not connector.connected("gw-a"), "socket closed")
    ids += [await world.platform.inject("c1", f"asleep {n}", user_id="u1") for n in range(25)]
    await eventually(lambda: connector.buffered("gw-a") == 25, "25 buffered")
    await eventually(lambda: woken == ["gw-a"], "one wake")
    assert bot.order == ids[:1]
    assert transport.state is TransportState.DORMANT  # nothing re-dialed before the cadence

    clock.advance(5)  # the dormant cadence: the transport re-dials and the backlog replays
    await eventually(lambda: bot.order == ids, "replay in order")
    await eventually(lambda: connector.buffered("gw-a") == 0, "all acked")
    assert transport.connections == 2
    assert transport.state.value == "connected"  # (a property: mypy narrowed it above)
    await eventually(lambda: is_live(connector, "gw-a"), "live again")
    ids.append(await world.platform.inject("c1", "live after"))
    await eventually(lambda: bot.order == ids, "live after replay")
    await asyncio.sleep(0.2)
    assert bot.order == ids
    assert bot.twice == []
    assert woken == ["gw-a"]


@pytest.mark.asyncio
async def test_gateway_restart_mid_replay_gets_exactly_the_unacked_tail(
    world: World, store_kind: str
) -> None:
    """A gateway that dies mid-replay after durably remembering what it handled is restarted
    (new transport, adapter and dedupe over the same SQLite file): it receives exactly the
    unacked tail, acks the remembered part without handling it, handles the rest; every
    message is handled once."""
    connector = await world.connector(world.open_store(store_kind))
    await world.subscribe(connector, "gw-a")
    total = 150
    ids = [await world.platform.inject("c1", f"m{n}") for n in range(total)]
    all_buffer_ids = await backlog_ids(connector, "gw-a")
    assert len(all_buffer_ids) == total

    first_store = SQLiteStore(world.tmp_path / "gateway.db")
    first_dedupe = RecordingDedupe(StoreBufferDedupe(first_store), stall_after=100)
    first_bot = Counter()
    try:
        first, first_adapter = world.gateway(
            connector, "gw-a", first_bot, dedupe=first_dedupe, reconnect=False
        )
        assert await asyncio.wait_for(first_adapter.connect(), BOUND)
        await asyncio.wait_for(first_dedupe.stalled.wait(), BOUND)
        await first.disconnect(budget_s=2)  # the gateway dies mid-replay
    finally:
        first_store.close()
    await eventually(lambda: not connector.connected("gw-a"), "first run gone")
    assert first_bot.order == ids[:100]
    assert first_dedupe.remembered == all_buffer_ids[:100]

    tail = await backlog_ids(connector, "gw-a")
    assert tail == all_buffer_ids[-len(tail) :], "the unacked entries are a suffix, in order"
    assert all_buffer_ids[99] in tail  # remembered but never acked: the gateway died first
    assert len(tail) < total  # acks that went out retired their entries

    second_store = world.open_store("sqlite", "gateway.db")
    second_dedupe = RecordingDedupe(StoreBufferDedupe(second_store))
    second_bot = Counter()
    await world.online(connector, "gw-a", second_bot, dedupe=second_dedupe, reconnect=False)
    await eventually(lambda: connector.buffered("gw-a") == 0, "the tail acked")
    assert second_dedupe.offered == tail
    assert second_bot.order == ids[100:]
    assert not set(first_dedupe.remembered) & set(second_dedupe.remembered)
    assert sorted(first_dedupe.remembered + second_dedupe.remembered) == sorted(all_buffer_ids)
    handled = first_bot.counts + second_bot.counts
    assert handled == collections.Counter(ids)


@pytest.mark.asyncio
async def test_connector_restart_mid_replay_still_delivers_the_backlog(world: World) -> None:
    """The connector is stopped while a gateway works through its replay and a new connector
    over the same SQLite file starts on the same port: the gateway reconnects and the rest of
    the backlog arrives, in order, each message handled once."""
    first_store = SQLiteStore(world.tmp_path / "connector.db")
    connector = await world.connector(first_store)
    port = port_of(connector)
    await world.subscribe(connector, "gw-a")
    total = 300
    ids = [await world.platform.inject("c1", f"m{n}") for n in range(total)]
    assert connector.buffered("gw-a") == total

    async def slow(_: InboundEvent) -> None:
        await asyncio.sleep(0.001)

    bot = Counter(gate=slow)
    memory = InMemoryStore()
    world.stores.append(memory)
    transport, adapter = world.gateway(
        connector,
        "gw-a",
        bot,
        dedupe=StoreBufferDedupe(memory),
        reconnect_backoff_s=0.05,
        reconnect_max_s=0.2,
    )
    assert await adapter.connect()
    await eventually(lambda: len(bot.order) >= 60, "replay under way")
    await asyncio.wait_for(connector.stop(), BOUND)
    first_store.close()
    assert len(bot.order) < total, "the restart must interrupt the replay"

    second_store = world.open_store("sqlite", "connector.db")
    restarted = await world.connector(second_store, port=port)
    assert restarted.url == connector.url
    await eventually(lambda: len(bot.order) == total, "the whole backlog", timeout=20)
    await eventually(lambda: restarted.buffered("gw-a") == 0, "all acked after the restart")
    assert bot.order == ids
    assert bot.twice == []
    assert transport.connections == 2
    await eventually(lambda: is_live(restarted, "gw-a"), "live on the new connector")
    ids.append(await world.platform.inject("c1", "after the restart"))
    await eventually(lambda: bot.order == ids, "live delivery after the restart")


@pytest.mark.asyncio
async def test_dormant_gateway_still_buffered_for_after_a_connector_restart(world: World) -> None:
    """After a connector restart, a message for a dormant gateway is buffered and wakes it."""
    woken: list[str] = []

    async def wake(gateway_id: str) -> None:
        woken.append(gateway_id)

    first_store = SQLiteStore(world.tmp_path / "connector.db")
    connector = await world.connector(first_store, wake_hook=wake)
    await world.subscribe(connector, "gw-a")
    await asyncio.wait_for(connector.stop(), BOUND)
    first_store.close()
    restarted = await world.connector(world.open_store("sqlite"), wake_hook=wake)
    await world.platform.inject("c1", "are you there?")
    await eventually(lambda: restarted.buffered("gw-a") == 1, "buffered after the restart")
    await eventually(lambda: woken == ["gw-a"], "the wake hook called")


@pytest.mark.asyncio
async def test_two_tenants_never_see_each_others_traffic_or_egress(
    world: World, store_kind: str
) -> None:
    """Two gateways of different tenants on one connector: each handles only its own tenant's
    messages (live and replayed from the buffer), its echo replies land only in its own chats,
    and its attempts to write into the other tenant's chat are declined definitely."""
    connector = await world.connector(
        world.open_store(store_kind), tenants={"gw-a": {"scope-a"}, "gw-b": {"scope-b"}}
    )
    adapters: dict[str, RelayAdapter] = {}
    seen: dict[str, list[str | None]] = {"gw-a": [], "gw-b": []}

    def echo(name: str) -> Handler:
        async def handle(event: InboundEvent) -> None:
            seen[name].append(event.source.scope_id)
            result = await adapters[name].send(event.source.chat_id, f"{name}: {event.text}")
            assert result.success, result

        return handle

    clock_b = FakeClock(start=time.time())
    _, adapters["gw-a"] = await world.online(connector, "gw-a", echo("gw-a"))
    transport_b, adapters["gw-b"] = await world.online(
        connector, "gw-b", echo("gw-b"), clock=clock_b, dormant_redial_s=5
    )
    for n in range(3):
        await world.platform.inject("chat-a", f"a{n}", user_id="ua", scope_id="scope-a")
        await world.platform.inject("chat-b", f"b{n}", user_id="ub", scope_id="scope-b")
    await eventually(
        lambda: len(world.platform.texts("chat-a")) == len(world.platform.texts("chat-b")) == 3,
        "echoes",
    )
    assert await adapters["gw-b"].go_dormant()
    for n in range(3, 5):
        await world.platform.inject("chat-a", f"a{n}", user_id="ua", scope_id="scope-a")
        await world.platform.inject("chat-b", f"b{n}", user_id="ub", scope_id="scope-b")
    await eventually(lambda: len(world.platform.texts("chat-a")) == 5, "A keeps going")
    assert connector.buffered("gw-b") == 2
    # A acks each message once its handler returned (just after the echo went out).
    await eventually(lambda: connector.buffered("gw-a") == 0, "A acked")
    clock_b.advance(5)  # B wakes and replays its own backlog only
    await eventually(lambda: len(world.platform.texts("chat-b")) == 5, "B's replay echoed")
    await eventually(lambda: connector.buffered("gw-b") == 0, "B acked")
    assert transport_b.connections == 2

    assert world.platform.texts("chat-a") == [f"gw-a: a{n}" for n in range(5)]
    assert world.platform.texts("chat-b") == [f"gw-b: b{n}" for n in range(5)]
    assert seen == {"gw-a": ["scope-a"] * 5, "gw-b": ["scope-b"] * 5}

    for target, metadata in (
        ("chat-b", None),
        ("chat-b", {"scope_id": "scope-a"}),
        ("chat-new", {"scope_id": "scope-b"}),
    ):
        refused = await adapters["gw-a"].send(target, "intrusion", metadata)
        assert (refused.success, refused.ambiguous) == (False, False)
        assert refused.error == EGRESS_DECLINED_MESSAGE
    refused = await adapters["gw-b"].send("chat-a", "intrusion")
    assert (refused.success, refused.error) == (False, EGRESS_DECLINED_MESSAGE)
    assert world.platform.texts("chat-b") == [f"gw-b: b{n}" for n in range(5)]
    assert world.platform.texts("chat-a") == [f"gw-a: a{n}" for n in range(5)]
    assert "chat-new" not in world.platform.transcript


@pytest.mark.asyncio
async def test_echo_bot_end_to_end(world: World, store_kind: str) -> None:
    """A bot that echoes through adapter.send answers every message in order, across a dormant
    spell, in threads where the user wrote in one."""
    connector = await world.connector(world.open_store(store_kind))
    adapter_ref: list[RelayAdapter] = []

    async def echo(event: InboundEvent) -> None:
        metadata = {"thread_id": event.source.thread_id, "reply_to": event.message_id}
        result = await adapter_ref[0].send(event.source.chat_id, f"echo: {event.text}", metadata)
        assert result.success, result

    clock = FakeClock(start=time.time())
    transport, adapter = await world.online(
        connector, "gw-a", echo, clock=clock, dormant_redial_s=2
    )
    adapter_ref.append(adapter)
    assert adapter.descriptor == attrs.evolve(world.platform.descriptor(), features=OUR_FEATURES)
    words = [f"w{n}" for n in range(9)]
    for word in words[:3]:
        await world.platform.inject("room", word, user_id="u1", thread_id="t1")
    await eventually(lambda: len(world.platform.texts("room")) == 3, "three live echoes")
    assert await adapter.go_dormant()
    for word in words[3:6]:
        await world.platform.inject("room", word, user_id="u1", thread_id="t1")
    await asyncio.sleep(0.05)
    assert len(world.platform.texts("room")) == 3  # asleep: nothing answered yet
    clock.advance(2)
    await eventually(lambda: len(world.platform.texts("room")) == 6, "echoes after waking")
    await eventually(lambda: is_live(connector, "gw-a"), "live again")
    for word in words[6:]:
        await world.platform.inject("room", word, user_id="u1")
    await eventually(lambda: len(world.platform.texts("room")) == 9, "all echoes")
    await asyncio.sleep(0.1)
    assert world.platform.texts("room") == [f"echo: {w}" for w in words]
    sends = [s for s in world.platform.sent if s.op == "send"]
    assert [s.thread_id for s in sends] == ["t1"] * 6 + [None] * 3
    assert all(s.reply_to is not None for s in sends)
    assert transport.connections == 2
    await eventually(lambda: connector.buffered("gw-a") == 0, "nothing left buffered")

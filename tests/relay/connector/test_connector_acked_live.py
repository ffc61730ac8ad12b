"""Tests for acked live delivery: a gateway that announced it gets every inbound event through
the connector's durable buffer, with a bufferId, and the event is retired only by its ack (after
the handler).  A gateway that dies while handling loses nothing; one that does not keep up is
served from the buffer, in order.  Real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection

from relay.client.adapter import RelayAdapter
from relay.connector import _delivery as delivery_module
from relay.connector.server import ConnectionState
from relay.wire.frames import InboundEvent
from tests.relay.connector.connector_harness import BOUND, Harness, Recorder, eventually, is_live


class Gate:
    """A handler that records events and holds each until released."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.done: list[str] = []
        self.open = asyncio.Event()

    async def __call__(self, event: InboundEvent) -> None:
        self.started.append(event.text)
        await self.open.wait()
        self.done.append(event.text)


@pytest.mark.asyncio
async def test_a_live_event_is_buffered_before_delivery_and_retired_by_the_ack(
    mh: Harness,
) -> None:
    """With acked live delivery the event is in the connector's buffer while the handler runs
    and is retired only once the handler returned (the transport acks it then)."""
    connector = await mh.start()
    gate = Gate()
    await mh.gateway(connector, "gw-a", gate)
    await mh.platform.inject("c1", "hello")
    await eventually(lambda: gate.started == ["hello"], "handler running")
    assert connector.buffered("gw-a") == 1
    gate.open.set()
    await eventually(lambda: connector.buffered("gw-a") == 0, "retired by the ack")
    assert gate.done == ["hello"]


@pytest.mark.asyncio
async def test_a_gateway_that_dies_while_handling_gets_the_event_again(mh: Harness) -> None:
    """The gateway's connection dies while its handler holds a live event (nothing acked): on
    its next connection the connector delivers the same event again, and it is retired once
    handled there."""
    connector = await mh.start()
    gate = Gate()
    first = await mh.gateway(connector, "gw-a", gate)
    await mh.platform.inject("c1", "do not lose me")
    await eventually(lambda: gate.started == ["do not lose me"], "first handler running")
    assert first._ws is not None
    first._ws.transport.abort()  # the process died: no ack, no close
    await eventually(lambda: not connector.connected("gw-a"), "first gone")
    assert connector.buffered("gw-a") == 1
    again = Recorder()
    await mh.gateway(connector, "gw-a", again)
    await eventually(lambda: again.texts == ["do not lose me"], "delivered again")
    await eventually(lambda: connector.buffered("gw-a") == 0, "retired")


@pytest.mark.asyncio
async def test_a_gateway_that_does_not_keep_up_is_served_from_the_buffer_in_order(
    mh: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the lines waiting for a gateway's socket pass the limit, the connector stops holding
    them in memory and serves that gateway from its durable buffer until it caught up: every
    event arrives once, in order, and live delivery resumes."""
    monkeypatch.setattr(delivery_module, "_OUTBOX_MAX", 3)
    connector = await mh.start()
    seen = Recorder()
    await mh.gateway(connector, "gw-a", seen)
    instance = connector._instances["gw-a"]
    blocked = asyncio.Event()
    send = instance.ws.send

    async def stuck_send(message: Any, *args: Any, **kwargs: Any) -> None:
        await blocked.wait()  # the gateway stopped reading: the socket pushes back
        await send(message, *args, **kwargs)

    instance.ws.send = stuck_send  # type: ignore[method-assign]
    for n in range(8):
        await mh.platform.inject("c1", f"m{n}")
    await eventually(lambda: instance.state is ConnectionState.REPLAYING, "fell behind")
    assert connector.buffered("gw-a") == 8
    blocked.set()
    await eventually(lambda: seen.texts == [f"m{n}" for n in range(8)], "all, in order")
    await eventually(lambda: is_live(connector, "gw-a"), "caught up: live again")
    await mh.platform.inject("c1", "after")
    await eventually(lambda: seen.texts[-1] == "after", "live delivery resumed")
    await eventually(lambda: connector.buffered("gw-a") == 0, "all retired")
    assert len(seen.texts) == 9


@pytest.mark.asyncio
async def test_a_slow_chat_does_not_hold_up_the_others(mh: Harness) -> None:
    """Handlers run concurrently across chats: a turn that blocks in one chat does not delay
    another chat's message, and the blocked chat's next message waits for its first."""
    connector = await mh.start()
    slow = asyncio.Event()
    handled: list[str] = []

    async def handler(event: InboundEvent) -> None:
        if event.text == "slow":
            await slow.wait()
        handled.append(event.text)

    await mh.gateway(connector, "gw-a", handler)
    await mh.platform.inject("c1", "slow")
    await mh.platform.inject("c1", "after slow, same chat")
    await mh.platform.inject("c2", "other chat")
    await eventually(lambda: handled == ["other chat"], "the other chat answered", BOUND)
    slow.set()
    await eventually(
        lambda: handled == ["other chat", "slow", "after slow, same chat"], "the slow chat"
    )


@pytest.mark.asyncio
async def test_the_connector_keeps_the_gateways_window(mh: Harness) -> None:
    """A gateway announces its window (max_in_flight): the connector never has more of its
    deliveries unacked at once, keeps the rest in the buffer, and sends more as acks return --
    all in order."""
    connector = await mh.start()
    gate = Gate()
    transport = await mh.gateway(connector, "gw-a", gate, max_in_flight=4)
    instance = connector._instances["gw-a"]
    assert instance.window == 4
    for n in range(20):
        await mh.platform.inject("c1", f"m{n}")
    await eventually(lambda: len(instance.unacked) == 4, "a full window")
    await asyncio.sleep(0.05)  # nothing more may go out while the window is full
    assert len(instance.unacked) == 4
    assert transport._inbound.in_flight <= 4
    assert connector.buffered("gw-a") == 20
    gate.open.set()
    await eventually(lambda: gate.done == [f"m{n}" for n in range(20)], "all, in order")
    await eventually(lambda: connector.buffered("gw-a") == 0, "all retired")
    assert transport._inbound.peak_in_flight <= 4


@pytest.mark.asyncio
async def test_handlers_that_reply_never_deadlock_past_the_window(mh: Harness) -> None:
    """More messages than the window, each answered by a reply whose result comes back on the
    same socket: the reader keeps reading (the window is the connector's to keep), so every
    reply's result arrives and every message is answered."""
    connector = await mh.start(open_egress=True)
    transport = mh.transport(connector, "gw-a", max_in_flight=8)
    adapter = RelayAdapter(transport)
    answered: list[str] = []

    async def handler(event: InboundEvent) -> None:
        result = await adapter.send(event.source.chat_id, f"re: {event.text}")
        assert result.success, result
        answered.append(event.text)

    adapter.on_message(handler)
    assert await adapter.connect()
    await eventually(lambda: is_live(connector, "gw-a"), "live")
    for n in range(100):
        await mh.platform.inject("c1", f"m{n}")
    await eventually(lambda: len(answered) == 100, "every message answered", timeout=BOUND * 2)
    assert answered == [f"m{n}" for n in range(100)]
    await eventually(lambda: connector.buffered("gw-a") == 0, "all retired")


@pytest.mark.asyncio
async def test_live_lines_queued_together_go_out_in_one_message_within_the_window(
    mh: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live events queued while the gateway's window is full go out several lines to a
    WebSocket message once acks return (as a replay sends them), never more lines in flight
    than the window, each event once and in order."""
    messages: list[list[str]] = []
    original_send = ServerConnection.send

    async def recording_send(self: ServerConnection, message: Any, *args: Any) -> None:
        if isinstance(message, str) and '"type":"inbound"' in message:
            messages.append(message.splitlines())
        await original_send(self, message, *args)

    monkeypatch.setattr(ServerConnection, "send", recording_send)
    connector = await mh.start()
    gate = Gate()
    await mh.gateway(connector, "gw-a", gate, max_in_flight=4)
    instance = connector._instances["gw-a"]
    for n in range(20):
        await mh.platform.inject("c1", f"m{n}")
    await eventually(lambda: len(instance.unacked) == 4, "a full window")
    await eventually(lambda: len(instance.outbox) == 16, "the rest queued behind it")
    gate.open.set()
    await eventually(lambda: gate.done == [f"m{n}" for n in range(20)], "all, in order")
    await eventually(lambda: connector.buffered("gw-a") == 0, "all retired")
    lines = [json.loads(line) for message in messages for line in message]
    assert [frame["event"]["text"] for frame in lines] == [f"m{n}" for n in range(20)]
    assert max(len(message) for message in messages) <= 4
    assert max(len(message) for message in messages) > 1
    assert len(messages) < 20

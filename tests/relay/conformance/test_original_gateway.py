"""Conformance: our connector against an original gateway.

The peer is :class:`OriginalGateway`, written from the contract alone: a hello without
``protocol``/``features``, ``content`` as the body field, one line per message, every buffered
delivery acked in its own message, any close but 4401 taken as a drop and redialed at once, an
early 4401 taken as a start-up race.  Each test names the defect it pins.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from relay import Connector, LoopbackPlatform
from relay.wire.frames import EGRESS_DECLINED, EventSource, InboundEvent
from statecore.clock import FakeClock
from stores.sqlite import SQLiteStore
from tests.relay.conformance.original_peers import (
    GATEWAY_ID,
    PLATFORM,
    SECRET,
    OriginalGateway,
    eventually,
    mint,
)

BOUND = 5.0
PROBE_S = 5.0
"""The connector's liveness probe time (its default)."""


class World:
    """Our connector (SQLite store, loopback platform named like the original's) and the
    original gateways dialing it; everything is stopped afterwards."""

    def __init__(self, tmp_path: Path) -> None:
        self.platform = LoopbackPlatform(PLATFORM)
        self.store = SQLiteStore(tmp_path / "connector.db")
        self.clock = FakeClock(time.time())  # the liveness probe's cadence; tokens stay valid
        self.connector = Connector(
            self.store,
            secrets={GATEWAY_ID: [SECRET]},
            drivers={PLATFORM: self.platform},
            clock=self.clock,
        )
        self.gateways: list[OriginalGateway] = []

    def gateway(self, **options: Any) -> OriginalGateway:
        gateway = OriginalGateway(self.connector.url, **options)
        self.gateways.append(gateway)
        return gateway

    async def online(self, **options: Any) -> OriginalGateway:
        gateway = self.gateway(**options)
        await gateway.start()
        await gateway.wait_connected(BOUND)
        await eventually(self.live, timeout=BOUND)
        return gateway

    def live(self) -> bool:
        served = self.connector._instances.get(GATEWAY_ID)
        return served is not None and served.live

    async def close(self) -> None:
        for gateway in self.gateways:
            await gateway.stop()
        await self.connector.stop()
        self.store.close()


@pytest_asyncio.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    """A running connector; stopped with every gateway afterwards."""
    made = World(tmp_path)
    await made.connector.start()
    try:
        yield made
    finally:
        await made.close()


def texts(gateway: OriginalGateway) -> list[str]:
    return [r.event.get("text", "") for r in gateway.received_events]


# -- 1. every reply failed: the body field is ``content`` --------------------------------------


@pytest.mark.asyncio
async def test_an_original_gateways_replies_are_performed(world: World) -> None:
    """Defect 1: an original gateway's send, edit and typing carry ``content``; our connector
    and its loopback platform perform them (they refused "text is required" before)."""
    gateway = await world.online()
    await world.platform.inject("c1", "hello bot", user_id="u1")
    await eventually(lambda: texts(gateway) == ["hello bot"], timeout=BOUND)
    sent = await gateway.send("c1", "hello human")
    assert sent["success"] is True, sent
    edit = {"op": "edit", "chat_id": "c1", "message_id": sent["message_id"], "content": "edited"}
    assert (await gateway.request(edit))["success"] is True
    assert (await gateway.request({"op": "typing", "chat_id": "c1"}))["success"] is True
    assert world.platform.texts("c1") == ["edited"]
    assert [a.op for a in world.platform.sent] == ["send", "edit", "typing"]


# -- 3. two connections of one gateway id fought -------------------------------------------------


@pytest.mark.asyncio
async def test_two_original_gateways_of_one_id_do_not_fight(world: World) -> None:
    """Defect 3: a second original gateway with the same id (a restart overlap) is held, not
    closed -- an original gateway redials at once after any close, and the pair closed each
    other 15 times in 3 s.  Each makes one dial; every event is delivered once; when the older
    one goes, the newer one is served without a new dial."""
    older = await world.online()
    newer = world.gateway()
    await newer.start()
    await eventually(lambda: newer._session is not None, timeout=BOUND)  # upgraded, said hello
    for n in range(3):
        await world.platform.inject("c1", f"m{n}")
    await eventually(lambda: texts(older) == ["m0", "m1", "m2"], timeout=BOUND)
    for _ in range(3):  # three liveness probes: the older answers each
        await asyncio.sleep(0)
        world.clock.advance(PROBE_S)
    await asyncio.sleep(0.3)  # a window in which a fight would show up as closes and dials
    assert (older.dials, newer.dials) == (1, 1)
    assert older.closes == []
    assert newer.closes == []
    assert newer.handshakes == 0
    await older.stop()
    await newer.wait_connected(BOUND)
    await eventually(world.live, timeout=BOUND)
    await world.platform.inject("c1", "m3")
    await eventually(lambda: texts(newer) == ["m3"], timeout=BOUND)
    assert texts(older) == ["m0", "m1", "m2"]
    assert newer.dials == 1


@pytest.mark.asyncio
async def test_a_dead_older_original_gateway_blocks_the_newer_for_the_probe_time_only(
    world: World,
) -> None:
    """A dead-but-unclosed older connection (it stopped reading) fails its ping; the newer one
    is served after that probe time, and the events buffered meanwhile are replayed to it."""
    older = await world.online()
    session = older._session
    assert session is not None
    session.ws.transport.pause_reading()
    newer = world.gateway()
    await newer.start()
    await eventually(lambda: newer._session is not None, timeout=BOUND)  # upgraded, said hello
    await eventually(lambda: world.clock.sleepers > 0, timeout=BOUND)  # the probe is waiting
    world.clock.advance(PROBE_S)
    await newer.wait_connected(BOUND)
    await world.platform.inject("c1", "for the newer one")
    await eventually(lambda: texts(newer) == ["for the newer one"], timeout=BOUND)
    assert newer.dials == 1


# -- 5. minor: only the original contract toward an original gateway ----------------------------


@pytest.mark.asyncio
async def test_an_original_gateway_gets_no_error_frames(world: World) -> None:
    """Defect 5: invalid lines from a gateway that announced nothing are logged only; it is
    never sent our ``error`` frame, and the connection survives."""
    gateway = await world.online()
    await gateway.send_raw("this is not json\n")
    await gateway.send_raw('{"type":"outbound","requestId":5,"action":{"op":"send"}}\n')
    await world.platform.inject("c1", "sync")
    await eventually(lambda: texts(gateway) == ["sync"], timeout=BOUND)
    assert (await gateway.send("c1", "still fine"))["success"] is True
    assert gateway.error_frames_received == 0
    assert [f for f in gateway.received_frames if f.get("type") == "error"] == []


@pytest.mark.asyncio
async def test_an_expired_token_is_closed_4401_expired_for_an_original_gateway(
    world: World,
) -> None:
    """Defect 5: an original gateway knows no 4419; its expired token is closed with 4401 and
    reason ``expired``, which it answers by redialing at once with a fresh token."""
    tokens = iter([mint(GATEWAY_ID, SECRET, ttl_s=1, now=time.time() - 3600)])

    def token() -> str:
        return next(tokens, None) or mint(GATEWAY_ID, SECRET)

    gateway = await world.online(token_factory=token)
    assert gateway.closes == [(4401, "expired")]
    assert gateway.dials == 2
    assert gateway.startup_races == 0


@pytest.mark.asyncio
async def test_a_hello_for_an_unfronted_platform_stops_an_original_gateway_waiting(
    world: World,
) -> None:
    """Defect 5: an original gateway that says hello for a platform the connector does not front
    is closed at once with a reason naming the platform (it waited out a 30 s handshake timeout
    before), with 4401, which it treats as a start-up race and backs off from."""
    gateway = world.gateway(platform="telegram", startup_retries=0, handshake_timeout_s=30.0)
    started = time.monotonic()
    await gateway.start()
    await eventually(lambda: gateway.stopped_reason is not None, timeout=BOUND)
    assert time.monotonic() - started < BOUND
    assert gateway.closes == [(4401, "unknown platform 'telegram'")]
    assert gateway.handshake_timeouts == 0


# -- egress default: provenance -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_original_gateway_may_answer_only_where_it_was_written_to(world: World) -> None:
    """The connector's default egress (no tenants table): an original gateway may answer the
    chat that wrote to it, and is declined (egress_declined) anywhere else."""
    gateway = await world.online()
    await world.platform.inject("c1", "hi", user_id="u1")
    await eventually(lambda: texts(gateway) == ["hi"], timeout=BOUND)
    assert (await gateway.send("c1", "answer"))["success"] is True
    elsewhere = await gateway.send("c-other", "spam")
    assert (elsewhere["success"], elsewhere.get("code")) == (False, EGRESS_DECLINED)
    assert world.platform.texts("c-other") == []


# -- buffered replay to an original gateway --------------------------------------------------------


@pytest.mark.asyncio
async def test_a_backlog_is_replayed_to_an_original_gateway_and_retired_by_its_acks(
    world: World,
) -> None:
    """Entries buffered while an original gateway was away are replayed in order with their
    bufferIds; its one-ack-per-message answers retire them all."""
    append: Callable[[int], str] = lambda n: world.connector.buffer.append(  # noqa: E731
        GATEWAY_ID,
        PLATFORM,
        InboundEvent(f"b{n}", source=EventSource(platform=PLATFORM, chat_id="c1", chat_type="dm")),
    )
    ids = [await asyncio.to_thread(append, n) for n in range(5)]
    gateway = await world.online()
    await eventually(lambda: world.connector.buffered(GATEWAY_ID) == 0, timeout=BOUND)
    assert [r.buffer_id for r in gateway.received_events] == ids
    assert texts(gateway) == [f"b{n}" for n in range(5)]


@pytest.mark.asyncio
async def test_too_many_original_gateways_of_one_id_are_turned_away_without_a_redial_loop(
    world: World,
) -> None:
    """Past the standby limit the oldest waiting original gateway is closed with an early 4401,
    which it backs off from, so six copies of one gateway make six dials, not a loop."""
    served = await world.online()
    copies = [world.gateway(startup_retry_s=30.0) for _ in range(5)]
    for copy in copies:
        await copy.start()
        await eventually(lambda c=copy: c._session is not None or bool(c.closes), timeout=BOUND)
    await eventually(lambda: copies[0].closes != [], timeout=BOUND)
    await asyncio.sleep(0.3)  # a window in which a redial loop would show up as more dials
    assert copies[0].closes == [(4401, "replaced by a newer connection")]
    assert copies[0].startup_races == 1
    assert sum(c.dials for c in copies) == 5
    assert served.closes == []

"""Tests for the connector's interoperability rules: two connections of one gateway never fight,
egress without a tenants table is limited to provenance, and hostile upgrades and floods are
refused plainly and logged boundedly.  Real sockets on 127.0.0.1; the connector's liveness
probe runs on a fake clock."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from relay.connector.provenance import PROVENANCE_KIND
from relay.connector.server import ConnectionState, Connector
from relay.wire.auth import mint_token
from relay.wire.compat import FEATURES_HEADER, OUR_FEATURES, features_header, parse_features
from relay.wire.frames import EGRESS_DECLINED
from statecore.clock import FakeClock
from stores.sqlite import SQLiteStore
from tests.relay.client.connector_stub import next_sleep
from tests.relay.connector.connector_harness import (
    BOUND,
    SECRETS,
    Harness,
    eventually,
    is_live,
    nothing_arrives,
    raw_hello,
    raw_request,
    recv_frame,
    send_action,
    send_line,
)


def state_of(connector: Connector, gateway_id: str) -> list[ConnectionState]:
    """The states of the served connection and the standbys of ``gateway_id``."""
    served = connector._instances.get(gateway_id)
    standbys = connector._standbys.get(gateway_id, [])
    return ([served.state] if served is not None else []) + [s.state for s in standbys]


# -- two connections of one gateway ----------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("announce", [True, False], ids=["announced", "original"])
async def test_a_second_connection_waits_while_the_served_one_answers(
    mh: Harness, announce: bool
) -> None:
    """A second connection of a served, live gateway is held unserved and not closed (an
    original gateway would redial at once after any close); the served one keeps every event;
    the moment it goes, the newer one gets its descriptor and the traffic."""
    clock = FakeClock(time.time())
    connector = await mh.start(clock=clock, liveness_probe_s=5.0)
    first = await mh.raw(connector, announce=announce)
    assert (await raw_hello(first))["type"] == "descriptor"
    await eventually(lambda: is_live(connector, "gw-a"), "first live")
    second = await mh.raw(connector, announce=announce)
    await send_line(second, {"type": "hello", "platform": "loopback", "botId": "b"})
    await eventually(
        lambda: state_of(connector, "gw-a") == [ConnectionState.LIVE, ConnectionState.STANDBY],
        "second on standby",
    )
    # Probed and alive, for several probe intervals: nobody is closed, nothing is replaced.
    for _ in range(3):
        await next_sleep(clock)
        clock.advance(5.0)
    await mh.platform.inject("c1", "to the served one")
    frame = await recv_frame(first)
    assert (frame["type"], frame["event"]["text"]) == ("inbound", "to the served one")
    assert await nothing_arrives(second)
    assert first.close_code is None
    assert second.close_code is None
    await first.close()
    descriptor = await recv_frame(second)
    assert descriptor["type"] == "descriptor"
    await eventually(lambda: is_live(connector, "gw-a"), "second live")
    await mh.platform.inject("c1", "to the newer one")
    frame = await recv_frame(second)
    assert (frame["type"], frame["event"]["text"]) == ("inbound", "to the newer one")


@pytest.mark.asyncio
async def test_a_dead_but_unclosed_served_connection_gives_way_within_the_probe_time(
    mh: Harness,
) -> None:
    """A served connection that stopped reading (dead, never closed) fails its ping within the
    probe time: it is cut and the waiting connection served, with the backlog replayed."""
    clock = FakeClock(time.time())
    connector = await mh.start(clock=clock, liveness_probe_s=5.0)
    first = await mh.raw(connector)
    assert (await raw_hello(first))["type"] == "descriptor"
    await eventually(lambda: is_live(connector, "gw-a"), "first live")
    first.transport.pause_reading()  # a dead peer: answers no ping, sends no close
    second = await mh.raw(connector)
    await send_line(second, {"type": "hello", "platform": "loopback", "botId": "b"})
    waited = await next_sleep(clock)
    assert waited == pytest.approx(5.0)
    assert await nothing_arrives(second)
    clock.advance(5.0)
    assert (await recv_frame(second))["type"] == "descriptor"
    await eventually(lambda: is_live(connector, "gw-a"), "second live")
    assert state_of(connector, "gw-a") == [ConnectionState.LIVE]
    await mh.platform.inject("c1", "after the switch")
    frame = await recv_frame(second)
    assert frame["event"]["text"] == "after the switch"


@pytest.mark.asyncio
async def test_a_replayed_token_cannot_displace_a_live_gateway(mh: Harness) -> None:
    """A second upgrade with the live gateway's own (captured) token only waits: the live
    gateway keeps being served and answered, and nothing is delivered to the copy."""
    connector = await mh.start(clock=FakeClock(time.time()))
    token = mint_token("gw-a", SECRETS["gw-a"][0])
    real = await mh.raw(connector, token=token)
    assert (await raw_hello(real))["type"] == "descriptor"
    await eventually(lambda: is_live(connector, "gw-a"), "real live")
    thief = await mh.raw(connector, token=token)
    await send_line(thief, {"type": "hello", "platform": "loopback", "botId": "b"})
    await send_line(
        thief, {"type": "outbound", "requestId": "t1", "action": send_action("c1", "x")}
    )
    await mh.platform.inject("c1", "secret")
    assert (await recv_frame(real))["event"]["text"] == "secret"
    assert await nothing_arrives(thief)
    assert mh.platform.texts("c1") == []
    assert (await raw_request(real, "r1", send_action("c1", "still mine")))["success"] is True


@pytest.mark.asyncio
async def test_excess_standbys_are_closed_oldest_first(mh: Harness) -> None:
    """At most four connections wait per gateway; a fifth closes the oldest waiting one, with
    4409 to a gateway that announced it and an early 4401 (a start-up race it backs off from,
    not a close it redials at once after) to an original one."""
    connector = await mh.start(clock=FakeClock(time.time()))
    served = await mh.raw(connector)
    await raw_hello(served)
    waiting = [await mh.raw(connector, announce=i != 0) for i in range(6)]
    await asyncio.wait_for(waiting[0].wait_closed(), BOUND)
    await asyncio.wait_for(waiting[1].wait_closed(), BOUND)
    assert waiting[0].close_code == 4401
    assert waiting[1].close_code == 4409
    assert all(ws.close_code is None for ws in waiting[2:])
    assert len(connector._standbys["gw-a"]) == 4


# -- egress without a tenants table: provenance -------------------------------------------------


@pytest.mark.asyncio
async def test_without_tenants_a_gateway_may_answer_only_where_it_received_from(
    mh: Harness,
) -> None:
    """With no tenants table and egress not opened, a chat (or user) the gateway never received
    inbound from is egress_declined; one it did receive from is served, also by user id."""
    connector = await mh.start(open_egress=False)
    ws = await mh.raw(connector)
    await raw_hello(ws)
    await eventually(lambda: is_live(connector, "gw-a"), "live")
    refused = await raw_request(ws, "r1", send_action("c-elsewhere", "hi"))
    assert (refused["success"], refused["code"]) == (False, EGRESS_DECLINED)
    await mh.platform.inject("c1", "hello bot", user_id="u7")
    assert (await recv_frame(ws))["event"]["text"] == "hello bot"
    assert (await raw_request(ws, "r2", send_action("c1", "hi there")))["success"] is True
    assert (await raw_request(ws, "r3", send_action("u7", "a DM")))["success"] is True
    follow = {"op": "follow_up", "session_key": "s", "kind": "k", "content": "later"}
    declined = await raw_request(ws, "r4", follow)
    assert declined["code"] == EGRESS_DECLINED  # names no chat: nothing to prove it may go there
    follow["metadata"] = {"chat_id": "c1"}
    assert (await raw_request(ws, "r5", follow))["success"] is True
    assert mh.platform.texts("c1") == ["hi there", "later"]
    assert mh.platform.texts("c-elsewhere") == []


@pytest.mark.asyncio
async def test_provenance_is_durable_and_per_gateway(tmp_path: Path) -> None:
    """What a gateway received from survives a connector restart (it is in the store), and one
    gateway's provenance never lets another gateway address that chat."""
    store = SQLiteStore(tmp_path / "connector.db")
    h = Harness(store)
    try:
        connector = await h.start(open_egress=False)
        ws = await h.raw(connector)
        await raw_hello(ws)
        await eventually(lambda: is_live(connector, "gw-a"), "live")
        await h.platform.inject("c1", "hi", user_id="u1")
        await recv_frame(ws)
        await connector.stop()
        rows = await asyncio.to_thread(store.select, PROVENANCE_KIND)
        assert sorted(r["target"] for r in rows) == ["c1", "u1"]
        again = await h.start(open_egress=False)
        a = await h.raw(again)
        await raw_hello(a)
        assert (await raw_request(a, "r1", send_action("c1", "after restart")))["success"]
        # gw-b said hello only after the message: it never received from c1.
        b = await h.raw(again, "gw-b")
        await raw_hello(b)
        other = await raw_request(b, "r2", send_action("c1", "not mine"))
        assert other["code"] == EGRESS_DECLINED
    finally:
        await h.close()
        store.close()


@pytest.mark.asyncio
async def test_open_egress_is_an_explicit_option(mh: Harness) -> None:
    """open_egress=True lets a gateway address any chat (the old behaviour, now opt-in)."""
    connector = await mh.start(open_egress=True)
    ws = await mh.raw(connector)
    await raw_hello(ws)
    assert (await raw_request(ws, "r1", send_action("anywhere", "hi")))["success"] is True


# -- hostile upgrades and floods ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_two_authorization_headers_are_a_plain_4401_refusal(
    mh: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """An upgrade with two Authorization headers is refused with 4401 and one WARNING line,
    never an unhandled error (no traceback, no 1011)."""
    connector = await mh.start()
    token = mint_token("gw-a", SECRETS["gw-a"][0])
    headers = [("Authorization", f"Bearer {token}"), ("Authorization", f"Bearer {token}")]
    with caplog.at_level(logging.DEBUG):
        ws = await connect(connector.url + "/relay", additional_headers=headers, proxy=None)
        await asyncio.wait_for(ws.wait_closed(), BOUND)
    assert ws.close_code == 4401
    assert not connector.connected("gw-a")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert [r.levelno for r in caplog.records if "refused an upgrade" in r.getMessage()] == [
        logging.WARNING
    ]


@pytest.mark.asyncio
async def test_a_token_with_an_excessive_lifetime_is_refused(mh: Harness) -> None:
    """A genuine token whose expiry lies far beyond the lifetime cap is refused (4401), so a
    captured long-lived token cannot be replayed for ever."""
    connector = await mh.start(max_token_ttl_s=600)
    forever = mint_token("gw-a", SECRETS["gw-a"][0], ttl_s=10**9)
    ws = await mh.raw(connector, token=forever)
    await asyncio.wait_for(ws.wait_closed(), BOUND)
    assert ws.close_code == 4401
    # The token is genuine: refused for its times, which the reason names for our gateways.
    assert ws.close_reason is not None
    assert ws.close_reason.startswith("malformed: clock skew? connector time ")
    original = await mh.raw(connector, token=forever, announce=False)
    await asyncio.wait_for(original.wait_closed(), BOUND)
    assert (original.close_code, original.close_reason) == (4401, "malformed")


@pytest.mark.asyncio
async def test_a_flood_of_junk_stops_at_the_limit_and_logs_a_handful(
    mh: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """One message of 10,000 junk lines closes the connection with 4400 after the limit: the
    rest of the message is not processed and only a handful of lines are logged."""
    connector = await mh.start()
    ws = await mh.raw(connector, announce=False)
    await raw_hello(ws)
    with caplog.at_level(logging.DEBUG, logger="relay.connector.server"):
        await ws.send("junk\n" * 10_000)
        await asyncio.wait_for(ws.wait_closed(), BOUND)
    assert ws.close_code == 4400
    lines = [r for r in caplog.records if r.name == "relay.connector.server"]
    assert 1 <= len(lines) <= 10
    invalid = [r for r in lines if "invalid frame (" in r.getMessage()]
    assert len(invalid) == 5  # the throttle's burst; the other 16 counted, not logged


@pytest.mark.asyncio
async def test_thousands_of_unknown_acks_log_a_handful_of_lines(
    mh: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """10,000 acks of unknown bufferIds (in 1,000 messages) change nothing and write a bounded
    number of log lines, each with its count."""
    connector = await mh.start()
    ws = await mh.raw(connector, announce=False)
    await raw_hello(ws)
    await eventually(lambda: is_live(connector, "gw-a"), "live")
    with caplog.at_level(logging.DEBUG, logger="relay.connector.server"):
        for batch in range(1000):
            lines = "".join(
                json.dumps({"type": "inbound_ack", "bufferId": f"nope-{batch}-{i}"}) + "\n"
                for i in range(10)
            )
            await ws.send(lines)
        assert (await raw_request(ws, "sync", send_action("c1", "sync")))["success"]
        # The report comes back from the store thread's write round: wait for it (bounded).
        await eventually(
            lambda: any("ignored" in r.getMessage() for r in caplog.records), "acks reported"
        )
    ack_lines = [r for r in caplog.records if "ignored" in r.getMessage()]
    assert 1 <= len(ack_lines) <= 5
    assert await asyncio.to_thread(connector.buffered, "gw-a") == 0
    assert connector.connected("gw-a")


def test_features_header_round_trips() -> None:
    """Our announcement header lists our features and reads back as the same set; a hostile
    value is bounded."""
    name, value = features_header(OUR_FEATURES)
    assert name == FEATURES_HEADER
    assert parse_features([value]) == frozenset(OUR_FEATURES)
    assert len(parse_features(["x," * 10_000])) == 1
    assert len(parse_features([",".join(f"f{i}" for i in range(100))])) <= 32
    with pytest.raises(ValueError, match="cannot be announced"):
        features_header(["bad,name"])


@pytest.mark.asyncio
async def test_two_of_our_gateways_with_one_id_make_a_few_dials_a_minute(mh: Harness) -> None:
    """Two of our transports with one gateway id on our connector: the first stays served; the
    second waits as a standby until its handshake timeout, then backs off and tries again -- a
    handful of dials in a minute, never a fight -- and it is served as soon as the first goes."""
    connector = await mh.start()
    first = await mh.gateway(connector, "gw-a")
    clock = FakeClock(time.time())
    second = mh.transport(
        connector,
        "gw-a",
        clock=clock,
        reconnect=True,
        handshake_timeout_s=10.0,
        reconnect_backoff_s=1.0,
        reconnect_max_s=30.0,
    )
    await asyncio.wait_for(second.connect(), BOUND)
    started = clock.monotonic()
    dials = 1
    handshake = asyncio.ensure_future(second.handshake())
    while True:
        delay = await next_sleep(clock)
        if clock.monotonic() + delay - started > 60.0:
            break
        before = second.state
        clock.advance(delay)
        if before.value == "reconnecting":
            await eventually(lambda: second.state.value == "handshaking", "the next dial")
            dials += 1
        else:
            await eventually(lambda: second.state.value == "reconnecting", "gave up waiting")
    with pytest.raises(Exception, match="no descriptor"):
        await handshake
    assert 2 <= dials <= 6
    assert first.state.value == "connected"
    await first.disconnect(budget_s=1.0)
    # The second is waiting as a standby (served at once) or in its backoff (served on its next
    # dial): either way it is served without a fight.
    for _ in range(3):
        if second.state.value == "connected":
            break
        if second.state.value == "reconnecting":
            clock.advance(await next_sleep(clock))
        with contextlib.suppress(AssertionError):
            await eventually(lambda: second.state.value == "connected", "served", timeout=1.0)
    assert second.state.value == "connected"
    await eventually(lambda: is_live(connector, "gw-a"), "live")


@pytest.mark.asyncio
@pytest.mark.parametrize("offset", [-400.0, 4000.0], ids=["behind", "ahead"])
async def test_a_gateway_with_a_wrong_clock_is_told_why_and_still_connects(
    mh: Harness, offset: float, caplog: pytest.LogCaptureFixture
) -> None:
    """A gateway whose clock is 400 s behind (its tokens arrive expired) or 4000 s ahead (beyond
    the lifetime cap) is refused with a reason naming the clocks and the connector's time; the
    transport logs the measured offset and mints on the connector's time, and connects."""
    connector = await mh.start()
    clock = FakeClock(time.time() + offset)
    transport = mh.transport(connector, "gw-a", clock=clock, reconnect=True)
    with caplog.at_level(logging.WARNING, logger="relay.client.transport"):
        await asyncio.wait_for(transport.connect(), BOUND)
        with contextlib.suppress(Exception):
            await transport.handshake(BOUND)  # refused: the first token was off the clock
        if transport.state.value == "reconnecting":  # an early 4401: the backoff, then a redial
            clock.advance(await next_sleep(clock))
        await eventually(lambda: transport.state.value == "connected", "connected")
    code, reason = transport.last_close
    assert code in (4401, 4419)
    assert reason is not None
    assert "clock skew" in reason
    assert "connector time" in reason
    assert transport.clock_offset_s == pytest.approx(-offset, abs=5)
    assert any("clock is" in r.getMessage() for r in caplog.records)

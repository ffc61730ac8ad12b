"""Tests for relay.connector.Connector: the reference relay server, over real WebSockets.

Gateways are real :class:`WebSocketRelayTransport` s or raw ``websockets`` clients (for frames a
transport would never send), all on 127.0.0.1.  Every wait is bounded; every connector,
transport and socket a test opens is closed by the harness.  Where the connector's store
matters the test runs over the in-memory store and the SQLite store.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_asyncio
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import InvalidStatus

from relay.client.lifecycle import TransportState
from relay.client.requests import RequestOutcome
from relay.connector import _delivery as delivery_module
from relay.connector.buffer import BUFFER_KIND, BufferState
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import EGRESS_DECLINED_MESSAGE, Connector
from relay.wire.auth import mint_token
from relay.wire.compat import OUR_FEATURES
from statecore.clock import FakeClock
from statecore.store import Store
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from tests.relay.connector.connector_harness import (
    BOUND,
    SECRETS,
    Harness,
    Recorder,
    close_code,
    eventually,
    is_live,
    make_event,
    no_errors,
    nothing_arrives,
    raw_hello,
    raw_request,
    recv_frame,
    send_action,
    send_line,
)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The connector's store, of each kind; closed after the harness."""
    db: Store = (
        InMemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "connector.db")
    )
    try:
        yield db
    finally:
        db.close()


@pytest_asyncio.fixture
async def harness(store: Store) -> AsyncIterator[Harness]:
    """A harness over each store kind."""
    h = Harness(store)
    try:
        yield h
    finally:
        await h.close()


# -- raw-client helpers ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_valid_token_is_accepted_and_hello_answered_with_the_descriptor(
    harness: Harness,
) -> None:
    """A gateway with a valid token gets the platform's descriptor in answer to its hello."""
    connector = await harness.start()
    transport = harness.transport(connector, "gw-a")
    await asyncio.wait_for(transport.connect(), BOUND)
    descriptor = await transport.handshake(BOUND)
    # The platform's capabilities, plus the connector's own announcement.
    assert descriptor == attrs.evolve(harness.platform.descriptor(), features=OUR_FEATURES)
    assert transport.state is TransportState.CONNECTED
    await eventually(lambda: connector.connected("gw-a"), "gw-a connected")
    ws = await harness.raw(connector, "gw-b")
    frame = await raw_hello(ws)
    assert frame == {"type": "descriptor", "descriptor": descriptor.to_wire()}


@pytest.mark.asyncio
async def test_configured_descriptor_overrides_the_drivers(mh: Harness) -> None:
    """A descriptor passed to the connector is what gateways receive for that platform."""
    custom = LoopbackPlatform(label="Custom", max_message_length=99).descriptor()
    connector = await mh.start(descriptors={"loopback": custom})
    ws = await mh.raw(connector)
    frame = await raw_hello(ws)
    assert frame["descriptor"] == attrs.evolve(custom, features=OUR_FEATURES).to_wire()


@pytest.mark.asyncio
async def test_legacy_hello_without_additions_is_served(mh: Harness) -> None:
    """A hello without protocol/features (the original contract) still gets its descriptor."""
    connector = await mh.start()
    ws = await mh.raw(connector)
    await send_line(ws, {"type": "hello", "platform": "loopback", "botId": "b"})
    assert (await recv_frame(ws))["type"] == "descriptor"


@pytest.mark.asyncio
async def test_expired_token_is_closed_with_4419(
    mh: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """A genuine but expired token is refused with close code 4419 (re-dial with a fresh one)
    to a gateway that announced it, and with 4401 + ``expired`` to an original gateway."""
    connector = await mh.start()
    token = mint_token("gw-a", "secret-a", ttl_s=60, now=time.time() - 3600)
    ws = await mh.raw(connector, token=token)
    assert await close_code(ws) == 4419
    original = await mh.raw(connector, token=token, announce=False)
    await asyncio.wait_for(original.wait_closed(), BOUND)
    assert (original.close_code, original.close_reason) == (4401, "expired")
    assert not connector.connected("gw-a")
    assert not no_errors(caplog)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "header",
    [
        pytest.param(f"Bearer {mint_token('gw-nobody', 'secret-a')}", id="unknown-gateway"),
        pytest.param(f"Bearer {mint_token('gw-a', 'wrong-secret')}", id="forged"),
        pytest.param(f"Bearer {mint_token('gw-rot', 'retired')}", id="unlisted-secret"),
        pytest.param("Bearer not-a-token", id="malformed"),
        pytest.param("Basic dXNlcjpwdw==", id="wrong-scheme"),
        pytest.param(None, id="missing-header"),
    ],
)
async def test_refused_credentials_are_closed_with_4401(
    mh: Harness, header: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """Unknown, forged, malformed or missing credentials are refused with 4401, logged at
    WARNING at most, and other connections are unaffected."""
    connector = await mh.start()
    recorder = Recorder()
    other = await mh.gateway(connector, "gw-b", recorder)
    with caplog.at_level(logging.DEBUG):
        ws = await mh.raw(connector, None, header=header)
        assert await close_code(ws) == 4401
    assert not no_errors(caplog)
    assert any(r.levelno == logging.WARNING for r in caplog.records)
    assert (await other.request(send_action("c1", "still here"))).success
    await mh.platform.inject("c1", "to b")
    await eventually(lambda: recorder.texts == ["to b"], "gw-b still receives")


@pytest.mark.asyncio
async def test_rotation_accepts_every_listed_secret(mh: Harness) -> None:
    """During a rotation tokens signed with the new and the old secret are both accepted."""
    connector = await mh.start()
    for secret in ("new-secret", "old-secret"):
        ws = await mh.raw(connector, None, token=mint_token("gw-rot", secret))
        assert (await raw_hello(ws))["type"] == "descriptor"
        await ws.close()
    transport = await mh.gateway(connector, "gw-rot", secret="old-secret")
    assert transport.state is TransportState.CONNECTED


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/", "/other", "/relay/extra", "/relay2"])
async def test_paths_other_than_relay_are_refused_with_404(mh: Harness, path: str) -> None:
    """The connector serves only /relay: any other path is an HTTP 404 at the upgrade."""
    connector = await mh.start()
    with pytest.raises(InvalidStatus) as refused:
        await mh.raw(connector, path=path)
    assert refused.value.response.status_code == 404


# -- hello and identities -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_first_hello_for_an_unknown_platform_closes_at_once_naming_it(
    mh: Harness,
) -> None:
    """A connection whose first hello names a platform the connector does not front is closed at
    once with a reason naming it (4400 to an announced gateway, 4401 to an original one, which
    backs off on an early 4401), so no gateway waits out its handshake timeout."""
    connector = await mh.start()
    for announce, code in ((True, 4400), (False, 4401)):
        ws = await mh.raw(connector, announce=announce)
        await send_line(ws, {"type": "hello", "platform": "nowhere", "botId": "b"})
        await asyncio.wait_for(ws.wait_closed(), BOUND)
        assert ws.close_code == code
        assert ws.close_reason is not None
        assert "nowhere" in ws.close_reason
    assert not connector.connected("gw-a")


@pytest.mark.asyncio
async def test_a_later_hello_for_an_unknown_platform_gets_an_error_frame(mh: Harness) -> None:
    """Once a connection is served, a hello for a platform the connector does not front gets an
    error frame (announced gateways only) and the connection carries on."""
    connector = await mh.start()
    ws = await mh.raw(connector)
    assert (await raw_hello(ws))["type"] == "descriptor"
    frame = await raw_hello(ws, "nowhere")
    assert (frame["type"], frame["code"], frame.get("ref")) == (
        "error",
        "unknown_platform",
        "hello",
    )
    await eventually(lambda: connector.connected("gw-a"), "still served")
    original = await mh.raw(connector, "gw-b", announce=False)
    assert (await raw_hello(original))["type"] == "descriptor"
    await send_line(original, {"type": "hello", "platform": "nowhere", "botId": "b"})
    assert await nothing_arrives(original)


@pytest.mark.asyncio
async def test_outbound_before_hello_fails_and_performs_nothing(mh: Harness) -> None:
    """An outbound frame from a connection that never said hello fails definitely."""
    connector = await mh.start()
    ws = await mh.raw(connector)
    result = await raw_request(ws, "r1", send_action("c1", "too early"))
    assert (result["success"], result.get("code")) == (False, "no_hello")
    assert mh.platform.sent == []


@pytest.mark.asyncio
async def test_outbound_for_a_platform_without_hello_fails(mh: Harness) -> None:
    """Outbound naming a platform the connection did not say hello for fails with
    unknown_identity, and that platform performs nothing."""
    other = LoopbackPlatform("other")
    connector = await mh.start(drivers={"loopback": mh.platform, "other": other})
    transport = await mh.gateway(connector, "gw-a")
    result = await transport.request(send_action("c1", "sneaky"), platform="other", timeout_s=BOUND)
    assert (result.outcome, result.code) == (RequestOutcome.FAILED, "unknown_identity")
    assert other.sent == []
    assert mh.platform.sent == []
    ok = await transport.request(send_action("c1", "fine"), timeout_s=BOUND)
    assert ok.success
    assert mh.platform.texts("c1") == ["fine"]


@pytest.mark.asyncio
async def test_several_identities_on_one_connection(mh: Harness) -> None:
    """A connection that said hello for two platforms may act on both, each by name."""
    other = LoopbackPlatform("other")
    connector = await mh.start(drivers={"loopback": mh.platform, "other": other})
    transport = await mh.gateway(connector, "gw-a", identities=[("other", "bot-2")])
    await eventually(lambda: "other" in transport.descriptors, "second descriptor")
    assert (await transport.request(send_action("c1", "one"), timeout_s=BOUND)).success
    assert (
        await transport.request(send_action("c2", "two"), platform="other", timeout_s=BOUND)
    ).success
    assert (mh.platform.texts("c1"), other.texts("c2")) == (["one"], ["two"])


# -- bad frames -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_malformed_and_oversized_frames_get_error_frames_and_change_nothing(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Each malformed, mistyped or oversized frame is answered with a typed error frame; the
    connection, the other connections and the buffer are unaffected; nothing is logged above
    WARNING."""
    connector = await harness.start(max_frame_bytes=2048)
    recorder = Recorder()
    bystander = await harness.gateway(connector, "gw-b", recorder)
    ws = await harness.raw(connector)
    await raw_hello(ws)
    await eventually(lambda: is_live(connector, "gw-a"), "gw-a live")
    entry = await asyncio.to_thread(connector.buffer.append, "gw-b", "loopback", make_event(1))
    bad: list[tuple[str, str]] = [
        ("this is not json", "malformed_json"),
        ("[1, 2, 3]", "not_an_object"),
        ('{"type": 5}', "bad_field"),
        ('{"no_type": true}', "missing_field"),
        ('{"type": "outbound", "requestId": "r9", "action": {"op": ""}}', "bad_field"),
        ('{"type": "outbound", "requestId": "r8", "action": "send"}', "bad_field"),
        ('{"type": "inbound_ack"}', "missing_field"),
        ('{"type": "hello", "platform": "loopback", "botId": "b", "protocol": "1"}', "bad_field"),
        (json.dumps({"type": "outbound", "pad": "x" * 2100}), "frame_too_large"),
    ]
    with caplog.at_level(logging.DEBUG):
        for line, code in bad:
            await send_line(ws, line)
            frame = await recv_frame(ws)
            assert (frame["type"], frame["code"]) == ("error", code), (line[:60], frame)
        await send_line(ws, {"type": "from_the_future", "x": 1})  # unknown type: ignored
        assert await nothing_arrives(ws)
        result = await raw_request(ws, "ok1", send_action("c9", "still works"))
    assert result["success"] is True
    assert no_errors(caplog) == []
    assert (await bystander.request(send_action("c2", "me too"), timeout_s=BOUND)).success
    assert await asyncio.to_thread(connector.buffered, "gw-b") == 1
    row = await asyncio.to_thread(connector.buffer.store.get, BUFFER_KIND, entry)
    assert row is not None
    assert row.state is BufferState.BUFFERED
    assert mh_texts(harness) == {"c9": ["still works"], "c2": ["me too"]}


def mh_texts(h: Harness) -> dict[str, list[str]]:
    return {chat: h.platform.texts(chat) for chat in h.platform.transcript}


@pytest.mark.asyncio
async def test_repeated_violations_close_with_4400_and_spare_others(
    mh: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """A connection that keeps sending invalid frames is closed with 4400; others carry on."""
    connector = await mh.start()
    recorder = Recorder()
    bystander = await mh.gateway(connector, "gw-b", recorder)
    ws = await mh.raw(connector)
    await raw_hello(ws)
    with caplog.at_level(logging.DEBUG):
        await ws.send("garbage\n" * 40)
        assert await close_code(ws) == 4400
    assert no_errors(caplog) == []
    assert (await bystander.request(send_action("c1", "fine"), timeout_s=BOUND)).success
    assert bystander.state is TransportState.CONNECTED


@pytest.mark.asyncio
async def test_a_few_violations_do_not_close(mh: Harness) -> None:
    """Occasional violations are answered with error frames and the connection survives."""
    connector = await mh.start()
    ws = await mh.raw(connector)
    await raw_hello(ws)
    for _ in range(5):
        await send_line(ws, "nope")
        assert (await recv_frame(ws))["type"] == "error"
    assert (await raw_request(ws, "r1", send_action("c1", "alive")))["success"] is True


@pytest.mark.asyncio
async def test_acks_for_unknown_or_foreign_buffer_ids_change_nothing(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """An inbound_ack for an unknown, foreign or made-up bufferId leaves the buffer as it was
    and logs at WARNING at most."""
    connector = await harness.start()
    theirs = await asyncio.to_thread(connector.buffer.append, "gw-b", "loopback", make_event(1))
    ws = await harness.raw(connector)
    await raw_hello(ws)
    with caplog.at_level(logging.DEBUG):
        for buffer_id in ("no-such-entry", theirs, "", "x" * 500):
            await send_line(ws, {"type": "inbound_ack", "bufferId": buffer_id})
        # Frames are handled in order: once this answers, the acks were processed.
        assert (await raw_request(ws, "sync", send_action("c1", "sync")))["success"]
    assert no_errors(caplog) == []
    assert await asyncio.to_thread(connector.buffered, "gw-b") == 1
    assert await asyncio.to_thread(connector.buffered, "gw-a") == 0
    row = await asyncio.to_thread(connector.buffer.store.get, BUFFER_KIND, theirs)
    assert row is not None
    assert (row.state, row.fence) == (BufferState.BUFFERED, 0)


# -- going idle, replacement, idempotency ---------------------------------------------------------


@pytest.mark.asyncio
async def test_going_idle_is_acked_and_later_inbound_is_buffered(harness: Harness) -> None:
    """going_idle is answered with going_idle_ack (same requestId); inbound after it is
    buffered, not delivered live."""
    connector = await harness.start()
    ws = await harness.raw(connector)
    await raw_hello(ws)
    await eventually(lambda: is_live(connector, "gw-a"), "gw-a live")
    await harness.platform.inject("c1", "live")
    live = await recv_frame(ws)
    assert (live["type"], live["event"]["text"], "bufferId" in live) == ("inbound", "live", False)
    await send_line(ws, {"type": "going_idle", "requestId": "idle-1"})
    assert await recv_frame(ws) == {"type": "going_idle_ack", "requestId": "idle-1"}
    await harness.platform.inject("c1", "while idle")
    assert await nothing_arrives(ws)
    assert await asyncio.to_thread(connector.buffered, "gw-a") == 1
    # Outbound still works while idle.
    assert (await raw_request(ws, "r1", send_action("c1", "reply")))["success"] is True


@pytest.mark.asyncio
async def test_transport_go_idle_makes_the_connector_buffer(harness: Harness) -> None:
    """transport.go_idle() is acked and the connector buffers from then on."""
    connector = await harness.start()
    recorder = Recorder()
    transport = await harness.gateway(connector, "gw-a", recorder)
    assert await transport.go_idle(timeout_s=BOUND)
    await harness.platform.inject("c1", "later")
    await eventually(lambda: connector.buffered("gw-a") == 1, "buffered while idle")
    assert recorder.events == []


@pytest.mark.asyncio
async def test_idempotency_key_performs_once(mh: Harness) -> None:
    """The same idempotency key twice performs once and both answers carry the same message id;
    another gateway's identical key is its own request."""
    connector = await mh.start()
    a = await mh.gateway(connector, "gw-a")
    b = await mh.gateway(connector, "gw-b")
    first = await a.request(send_action("c1", "once"), idempotency_key="k1", timeout_s=BOUND)
    again = await a.request(send_action("c1", "once"), idempotency_key="k1", timeout_s=BOUND)
    assert first.success
    assert again.success
    assert first.message_id == again.message_id
    together = await asyncio.gather(
        a.request(send_action("c1", "pair"), idempotency_key="k2", timeout_s=BOUND),
        a.request(send_action("c1", "pair"), idempotency_key="k2", timeout_s=BOUND),
    )
    assert together[0].message_id == together[1].message_id
    theirs = await b.request(send_action("c1", "once"), idempotency_key="k1", timeout_s=BOUND)
    assert theirs.success
    assert theirs.message_id != first.message_id
    assert mh.platform.texts("c1") == ["once", "pair", "once"]


@pytest.mark.asyncio
async def test_a_definite_failure_may_be_retried_with_the_same_key(mh: Harness) -> None:
    """A failed request is not remembered: retrying its key performs it for real."""
    connector = await mh.start()
    a = await mh.gateway(connector, "gw-a")
    mh.platform.fail_next("rate limited", "rate_limit")
    failed = await a.request(send_action("c1", "retry me"), idempotency_key="k", timeout_s=BOUND)
    assert (failed.outcome, failed.code) == (RequestOutcome.FAILED, "rate_limit")
    retried = await a.request(send_action("c1", "retry me"), idempotency_key="k", timeout_s=BOUND)
    assert retried.success
    assert mh.platform.texts("c1") == ["retry me"]


# -- tenant guard ---------------------------------------------------------------------------------

TENANTS = {"gw-a": {"scope-a", "user-a"}, "gw-b": {"scope-b", "user-b"}}


@pytest.mark.asyncio
async def test_tenant_inbound_reaches_only_the_approved_gateway(mh: Harness) -> None:
    """With tenants, an event reaches only the gateway approved for its scope, or for its user
    when it has no scope."""
    connector = await mh.start(tenants=TENANTS)
    a, b = Recorder(), Recorder()
    await mh.gateway(connector, "gw-a", a)
    await mh.gateway(connector, "gw-b", b)
    await mh.platform.inject("ga", "scoped a", user_id="user-b", scope_id="scope-a")
    await mh.platform.inject("gb", "scoped b", user_id="user-a", scope_id="scope-b")
    await mh.platform.inject("da", "dm a", user_id="user-a")
    await mh.platform.inject("db", "dm b", user_id="user-b")
    await mh.platform.inject("gx", "nobody's", user_id="user-a", scope_id="scope-x")
    await mh.platform.inject("dx", "stranger", user_id="user-x")
    await eventually(lambda: len(a.events) == 2 and len(b.events) == 2, "both deliveries")
    assert a.texts == ["scoped a", "dm a"]
    assert b.texts == ["scoped b", "dm b"]
    await eventually(
        lambda: connector.buffered("gw-a") == connector.buffered("gw-b") == 0, "all acked"
    )


@pytest.mark.asyncio
async def test_tenant_egress_to_another_tenants_chat_is_declined(mh: Harness) -> None:
    """Gateway A may answer its own tenant's chats; any chat of tenant B, or of no known tenant,
    is declined definitely with the one uniform message, and nothing is sent."""
    connector = await mh.start(tenants=TENANTS)
    a_seen, b_seen = Recorder(), Recorder()
    a = await mh.gateway(connector, "gw-a", a_seen)
    await mh.gateway(connector, "gw-b", b_seen)
    await mh.platform.inject("ga", "a here", user_id="user-a", scope_id="scope-a")
    await mh.platform.inject("gb", "b here", user_id="user-b", scope_id="scope-b")
    await eventually(lambda: len(a_seen.events) == len(b_seen.events) == 1, "deliveries")
    own = await a.request(send_action("ga", "ok", scope_id="scope-a"), timeout_s=BOUND)
    assert own.success
    dm = await a.request(send_action("da", "dm", user_id="user-a"), timeout_s=BOUND)
    assert dm.success
    attempts = [
        send_action("gb", "x", scope_id="scope-b"),
        send_action("gb", "x", scope_id="scope-a"),  # lying about a chat the platform scoped
        send_action("gb", "x"),
        send_action("db", "x", user_id="user-b"),
        send_action("unknown-chat", "x"),
        send_action("gz", "x", scope_id="scope-z"),
        # Ids that are not text are never approved (and never break the guard).
        send_action("gz", "x", scope_id=["scope-a"]),
        send_action("dz", "x", user_id={"id": "user-a"}),
    ]
    for action in attempts:
        result = await a.request(action, timeout_s=BOUND)
        assert result.outcome is RequestOutcome.DECLINED, action
        assert (result.code, result.error) == ("egress_declined", EGRESS_DECLINED_MESSAGE)
        assert not result.ambiguous
    assert "scope-b" not in EGRESS_DECLINED_MESSAGE
    assert "gw-b" not in EGRESS_DECLINED_MESSAGE
    assert mh.platform.texts("ga") == ["ok"]
    assert mh.platform.texts("da") == ["dm"]
    assert [s.chat_id for s in mh.platform.sent] == ["ga", "da"]


@pytest.mark.asyncio
async def test_tenant_guard_does_not_trust_a_claimed_user_for_someone_elses_dm(
    mh: Harness,
) -> None:
    """A gateway cannot reach another tenant's DM by claiming one of its own user ids."""
    connector = await mh.start(tenants=TENANTS)
    b_seen = Recorder()
    a = await mh.gateway(connector, "gw-a")
    await mh.gateway(connector, "gw-b", b_seen)
    await mh.platform.inject("dm-b", "private", user_id="user-b")
    await eventually(lambda: b_seen.texts == ["private"], "B's DM delivered to B")
    forged = await a.request(send_action("dm-b", "hijack", user_id="user-a"), timeout_s=BOUND)
    assert mh.platform.texts("dm-b") == []
    assert forged.outcome is RequestOutcome.DECLINED


@pytest.mark.asyncio
async def test_without_tenants_every_subscribed_gateway_receives_and_may_answer(
    mh: Harness,
) -> None:
    """Without tenants, every gateway that said hello for the platform gets its traffic (and
    only those), and egress is not restricted."""
    other = LoopbackPlatform("other")
    connector = await mh.start(drivers={"loopback": mh.platform, "other": other})
    a, b = Recorder(), Recorder()
    ta = await mh.gateway(connector, "gw-a", a)
    await mh.gateway(connector, "gw-b", b)
    elsewhere = Recorder()
    await mh.gateway(connector, "gw-rot", elsewhere, platform="other")
    await mh.platform.inject("c1", "one", user_id="u1", scope_id="s1")
    await mh.platform.inject("c2", "two", user_id="u2")
    await eventually(lambda: len(a.events) == len(b.events) == 2, "both gateways")
    assert a.texts == b.texts == ["one", "two"]
    assert elsewhere.events == []
    result = await ta.request(send_action("c2", "anyone", scope_id="s9"), timeout_s=BOUND)
    assert result.success


# -- wake hook and buffered counts ----------------------------------------------------------------


class WakeRecorder:
    """A wake hook that records the gateways it was asked to wake (and may fail)."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[str] = []
        self.fail = fail

    async def __call__(self, gateway_id: str) -> None:
        self.calls.append(gateway_id)
        if self.fail:
            raise RuntimeError("cannot reach the scheduler")


@pytest.mark.asyncio
async def test_wake_hook_is_called_once_for_a_dormant_instance_and_rate_limited(
    harness: Harness,
) -> None:
    """The first event buffered for a dormant instance calls the wake hook once; more events
    within wake_interval_s do not; after the interval the next one does."""
    clock = FakeClock(start=time.time())
    wake = WakeRecorder()
    connector = await harness.start(wake_hook=wake, wake_interval_s=30, clock=clock)
    transport = await harness.gateway(connector, "gw-a", reconnect=True, dormant_redial_s=3600)
    assert await transport.go_dormant(timeout_s=BOUND)
    await eventually(lambda: not connector.connected("gw-a"), "gw-a gone")
    for n in range(3):
        await harness.platform.inject("c1", f"m{n}")
    await eventually(lambda: wake.calls == ["gw-a"], "one wake")
    assert connector.buffered("gw-a") == 3
    clock.advance(29)
    await harness.platform.inject("c1", "m3")
    await asyncio.sleep(0.05)
    assert wake.calls == ["gw-a"]
    clock.advance(2)
    await harness.platform.inject("c1", "m4")
    await eventually(lambda: wake.calls == ["gw-a", "gw-a"], "second wake after the interval")
    assert connector.buffered("gw-a") == 5


@pytest.mark.asyncio
async def test_wake_hook_for_idle_and_disconnected_instances_not_live_ones(
    mh: Harness,
) -> None:
    """A live instance is never woken; one that went idle or disconnected is, each rate-limited
    on its own."""
    wake = WakeRecorder()
    connector = await mh.start(wake_hook=wake)
    a_seen = Recorder()
    a = await mh.gateway(connector, "gw-a", a_seen)
    b = await mh.gateway(connector, "gw-b", Recorder())  # it acks what it handled
    await mh.platform.inject("c1", "both live")
    await eventually(lambda: a_seen.texts == ["both live"], "live delivery")
    assert wake.calls == []
    assert await a.go_idle(timeout_s=BOUND)  # still connected, buffered-only
    await b.disconnect(budget_s=2)
    await eventually(lambda: not connector.connected("gw-b"), "gw-b gone")
    await mh.platform.inject("c1", "nobody listens")
    await mh.platform.inject("c1", "still nobody")
    await eventually(lambda: sorted(wake.calls) == ["gw-a", "gw-b"], "each woken once")
    await asyncio.sleep(0.05)
    assert sorted(wake.calls) == ["gw-a", "gw-b"]
    assert (connector.buffered("gw-a"), connector.buffered("gw-b")) == (2, 2)


@pytest.mark.asyncio
async def test_failing_wake_hook_is_logged_not_raised(
    mh: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """A wake hook that raises is logged at WARNING; buffering goes on unaffected."""
    wake = WakeRecorder(fail=True)
    connector = await mh.start(wake_hook=wake)
    transport = await mh.gateway(connector, "gw-a", reconnect=True, dormant_redial_s=3600)
    assert await transport.go_dormant(timeout_s=BOUND)
    with caplog.at_level(logging.DEBUG):
        await mh.platform.inject("c1", "wake up")
        await eventually(lambda: wake.calls == ["gw-a"], "the hook ran")
        await eventually(
            lambda: any("wake hook" in r.getMessage() for r in caplog.records),
            "hook failure logged",
        )
        await mh.platform.inject("c1", "again")
    failures = [r for r in caplog.records if "wake hook" in r.getMessage()]
    assert [r.levelno for r in failures] == [logging.WARNING]
    assert no_errors(caplog) == []
    assert connector.buffered("gw-a") == 2


@pytest.mark.asyncio
async def test_a_replay_puts_several_lines_in_one_message(mh: Harness) -> None:
    """A backlog replayed to an original gateway (no window) goes out several lines to a
    WebSocket message -- never more than the batch bound, every line whole, in order -- as the
    framing lets any sender do; the original reader splits them."""
    connector = await mh.start()
    total = delivery_module._SEND_LINES * 2 + 5
    for i in range(total):
        await asyncio.to_thread(connector.buffer.append, "gw-a", "loopback", make_event(i))
    ws = await mh.raw(connector, announce=False)
    await raw_hello(ws)
    messages: list[list[str]] = []
    while sum(len(lines) for lines in messages) < total:
        message = str(await asyncio.wait_for(ws.recv(), BOUND))
        assert message.endswith("\n")
        messages.append(message.splitlines())
    texts = [json.loads(line)["event"]["text"] for lines in messages for line in lines]
    assert texts == [f"e{i}" for i in range(total)]
    assert len(messages) < total / 2
    assert max(len(lines) for lines in messages) <= delivery_module._SEND_LINES


@pytest.mark.asyncio
async def test_buffered_counts_per_gateway_until_acked(harness: Harness) -> None:
    """buffered(gateway_id) counts that gateway's unacked entries; replay and acks bring it to 0."""
    connector = await harness.start()
    first = await harness.gateway(connector, "gw-a", reconnect=True, dormant_redial_s=3600)
    b_seen = Recorder()
    await harness.gateway(connector, "gw-b", b_seen)
    assert await first.go_dormant(timeout_s=BOUND)
    for n in range(4):
        await harness.platform.inject("c1", f"m{n}")
    await eventually(lambda: connector.buffered("gw-a") == 4, "four buffered")
    # gw-b got them live (acked live delivery): each is retired once its handler returned.
    await eventually(lambda: len(b_seen.texts) == 4, "gw-b handled them")
    await eventually(lambda: connector.buffered("gw-b") == 0, "gw-b acked them")
    assert connector.buffered("gw-unknown") == 0
    await first.disconnect(budget_s=2)
    recorder = Recorder()
    await harness.gateway(connector, "gw-a", recorder)
    await eventually(lambda: recorder.texts == ["m0", "m1", "m2", "m3"], "replay")
    await eventually(lambda: connector.buffered("gw-a") == 0, "acked")


# -- replay bookkeeping and ack messages -----------------------------------------------------------


def plain_ack(buffer_id: str) -> str:
    """An inbound_ack line in the canonical compact form a transport sends."""
    return f'{{"type":"inbound_ack","bufferId":"{buffer_id}"}}\n'


async def entry(connector: Connector, buffer_id: str) -> tuple[BufferState, int, list[str]]:
    """(state, replays, audit events) of one buffered entry."""
    store = connector.buffer.store
    row = await asyncio.to_thread(store.get, BUFFER_KIND, buffer_id)
    assert row is not None
    history = await asyncio.to_thread(store.history, BUFFER_KIND, buffer_id)
    return row.state, row.values["replays"], [h.event for h in history]


async def replayed(connector: Connector, ws: ClientConnection, n: int) -> list[str]:
    """Append ``n`` events for gw-a, say hello on ``ws`` and return the replayed bufferIds."""
    for i in range(n):
        await asyncio.to_thread(connector.buffer.append, "gw-a", "loopback", make_event(i))
    assert (await raw_hello(ws))["type"] == "descriptor"
    frames = [await recv_frame(ws) for _ in range(n)]
    assert [f["event"]["text"] for f in frames] == [f"e{i}" for i in range(n)]
    return [str(f["bufferId"]) for f in frames]


@pytest.mark.asyncio
async def test_replay_not_acked_is_recorded_as_sent_when_the_connection_ends(
    harness: Harness,
) -> None:
    """A replayed entry acked promptly goes straight to acked; those left unacked when the
    connection ends are recorded as sent (replays 1) and are exactly what is replayed next."""
    connector = await harness.start()
    ws = await harness.raw(connector)
    ids = await replayed(connector, ws, 3)
    await ws.send(plain_ack(ids[0]))
    await eventually(lambda: connector.buffered("gw-a") == 2, "the first retired")
    await ws.close()

    async def recorded() -> bool:
        states = [(await entry(connector, i))[0] for i in ids[1:]]
        return states == [BufferState.SENT] * len(states)

    deadline = time.monotonic() + BOUND
    while not await recorded():
        assert time.monotonic() < deadline, "the unacked replays were not recorded"
        await asyncio.sleep(0.01)
    assert await entry(connector, ids[0]) == (BufferState.ACKED, 0, ["append", "ack"])
    for buffer_id in ids[1:]:
        assert await entry(connector, buffer_id) == (BufferState.SENT, 1, ["append", "send"])
    again = await harness.raw(connector)
    assert (await raw_hello(again))["type"] == "descriptor"
    tail = [await recv_frame(again) for _ in range(2)]
    assert [f["bufferId"] for f in tail] == ids[1:]
    assert await nothing_arrives(again)


@pytest.mark.asyncio
async def test_replay_not_acked_within_the_grace_is_recorded_as_sent(mh: Harness) -> None:
    """On a connection that stays open, a replayed entry still unacked after the grace is
    recorded as sent (not before); a later ack retires it from there."""
    clock = FakeClock()
    connector = await mh.start(clock=clock)
    token = mint_token("gw-a", SECRETS["gw-a"][0], now=clock.now())
    ws = await mh.raw(connector, token=token)
    ids = await replayed(connector, ws, 2)
    await ws.send(plain_ack(ids[0]))
    await eventually(lambda: connector.buffered("gw-a") == 1, "the first retired")
    await eventually(lambda: clock.sleepers >= 1, "the grace timer waiting")
    assert (await entry(connector, ids[1]))[0] is BufferState.BUFFERED  # within the grace
    clock.advance(delivery_module._SENT_GRACE_S)
    deadline = time.monotonic() + BOUND  # the store thread records it: a bounded wait
    while (await entry(connector, ids[1]))[0] is not BufferState.SENT:
        assert time.monotonic() < deadline, "the unacked replay was not recorded"
        await asyncio.sleep(0.01)
    assert await entry(connector, ids[0]) == (BufferState.ACKED, 0, ["append", "ack"])
    await ws.send(plain_ack(ids[1]))
    await eventually(lambda: connector.buffered("gw-a") == 0, "the second retired")
    assert await entry(connector, ids[1]) == (BufferState.ACKED, 1, ["append", "send", "ack"])


@pytest.mark.asyncio
async def test_ack_messages_in_every_shape_retire_their_entries(harness: Harness) -> None:
    """Acks retire their entries however they are framed: several canonical acks in one
    message, an ack sharing a message with another frame (both take effect, in order), an ack
    in the spaced JSON of another encoder, and an ack split across messages."""
    connector = await harness.start()
    ws = await harness.raw(connector)
    ids = await replayed(connector, ws, 6)
    await ws.send(plain_ack(ids[0]) + plain_ack(ids[1]))
    await ws.send(plain_ack(ids[2]) + '{"type":"going_idle","requestId":"i1"}\n')
    assert await recv_frame(ws) == {"type": "going_idle_ack", "requestId": "i1"}
    await send_line(ws, {"type": "inbound_ack", "bufferId": ids[3]})
    line = plain_ack(ids[4])
    await ws.send(line[:20])
    await ws.send(line[20:] + plain_ack(ids[5]))
    await eventually(lambda: connector.buffered("gw-a") == 0, "all six retired")
    for buffer_id in ids:
        assert (await entry(connector, buffer_id))[0] is BufferState.ACKED


@pytest.mark.asyncio
async def test_canonical_acks_after_an_unterminated_line_complete_that_line(
    mh: Harness,
) -> None:
    """A message of canonical acks that follows an unterminated line is decoded as the rest of
    that line, exactly as the framing says: the joined line is malformed (an error frame, its
    ack not taken) and only the next line's ack retires its entry."""
    connector = await mh.start()
    ws = await mh.raw(connector)
    ids = await replayed(connector, ws, 2)
    await ws.send("not json yet ")
    await ws.send(plain_ack(ids[0]) + plain_ack(ids[1]))
    error = await recv_frame(ws)
    assert (error["type"], error["code"]) == ("error", "malformed_json")
    await eventually(lambda: connector.buffered("gw-a") == 1, "the second retired")
    assert (await entry(connector, ids[1]))[0] is BufferState.ACKED
    assert (await entry(connector, ids[0]))[0] is not BufferState.ACKED


# -- the post-handshake replay race ---------------------------------------------------------------


class GatedStore(InMemoryStore):
    """An in-memory store whose next replay backlog read blocks until released (once armed)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def select(self, kind: Any, **options: Any) -> Any:
        rows = super().select(kind, **options)
        if self.armed and kind is BUFFER_KIND and options.get("order_by") == "seq":
            self.armed = False
            self.entered.set()
            self.release.wait(BOUND)
        return rows


@pytest.mark.asyncio
async def test_events_injected_right_after_the_handshake_are_delivered_in_order(
    harness: Harness,
) -> None:
    """Events a user sends the moment a gateway's handshake completes (while the connector may
    still be replaying) all reach it, in order, and nothing stays buffered."""
    connector = await harness.start(tenants={"gw-a": {"scope-a", "user-a"}})
    recorder = Recorder()
    transport = harness.transport(connector, "gw-a")
    transport.set_inbound_handler(recorder)
    await transport.connect()
    await transport.handshake(BOUND)
    texts = [f"n{n}" for n in range(5)]
    for text in texts:
        await harness.platform.inject("dm", text, user_id="user-a")
    await eventually(lambda: recorder.texts == texts, "every event", timeout=3)
    await eventually(lambda: connector.buffered("gw-a") == 0, "nothing left buffered")
    await harness.platform.inject("dm", "later", user_id="user-a")
    await eventually(lambda: recorder.texts == [*texts, "later"], "a later event", timeout=3)


@pytest.mark.asyncio
async def test_event_nobody_listens_to_is_counted_and_warned(
    mh: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """An inbound event no gateway is subscribed to is counted as undeliverable and logged at
    WARNING (never dropped silently), and nothing is buffered."""
    connector = await mh.start()
    with caplog.at_level(logging.DEBUG):
        await mh.platform.inject("c1", "into the void")
    assert connector.undeliverable == 1
    assert [r.levelno for r in caplog.records if "c1" in r.getMessage()] == [logging.WARNING]
    assert no_errors(caplog) == []
    assert connector.buffered("gw-a") == 0


@pytest.mark.asyncio
async def test_event_arriving_as_replay_finishes_is_delivered() -> None:
    """An event that arrives while the connector checks the backlog one last time is still
    delivered (before any later event), not left in the buffer."""
    store = GatedStore()
    h = Harness(store)
    try:
        connector = await h.start()
        recorder = Recorder()
        transport = h.transport(connector, "gw-a")
        transport.set_inbound_handler(recorder)
        store.armed = True
        await transport.connect()
        await transport.handshake(BOUND)
        assert await asyncio.to_thread(store.entered.wait, BOUND)
        injected = asyncio.create_task(h.platform.inject("c1", "during replay"))
        await eventually(lambda: "c1" in h.platform.transcript, "injection started")
        await asyncio.sleep(0.01)  # the append is now queued behind the blocked read
        store.release.set()
        await asyncio.wait_for(injected, BOUND)
        await h.platform.inject("c1", "after replay")
        await eventually(lambda: len(recorder.events) >= 1, "a delivery", timeout=2)
        await asyncio.sleep(0.2)
        assert recorder.texts == ["during replay", "after replay"]
        await eventually(lambda: connector.buffered("gw-a") == 0, "both acked")
    finally:
        store.release.set()
        await h.close()
        store.close()

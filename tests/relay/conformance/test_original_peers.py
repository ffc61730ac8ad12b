"""Self-test of the original-contract doubles: they interoperate exactly as the contract says."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any

import pytest
import pytest_asyncio
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.relay.conformance.original_peers import (
    GATEWAY_ID,
    SECRET,
    OriginalConnector,
    OriginalGateway,
    Received,
    Refused,
    eventually,
    mint,
    verify,
)

NOW = 1_700_000_000.0
SECRETS = {GATEWAY_ID: [SECRET]}


def event(text: str) -> dict[str, Any]:
    """A minimal inbound event."""
    return {"text": text, "source": {"platform": "discord", "chat_id": "c1"}}


@pytest_asyncio.fixture
async def connector() -> AsyncIterator[OriginalConnector]:
    """A running original connector, stopped afterwards."""
    peer = OriginalConnector(secrets=SECRETS)
    await peer.start()
    try:
        yield peer
    finally:
        await peer.stop()


@pytest_asyncio.fixture
async def gateways(
    connector: OriginalConnector,
) -> AsyncIterator[Callable[..., OriginalGateway]]:
    """A factory of original gateways aimed at ``connector``; all stopped afterwards."""
    built: list[OriginalGateway] = []

    def make(**options: Any) -> OriginalGateway:
        gateway = OriginalGateway(connector.url, **options)
        built.append(gateway)
        return gateway

    try:
        yield make
    finally:
        for gateway in built:
            await gateway.stop()


# --------------------------------------------------------------------------- tokens


def test_token_round_trip_with_colons_in_the_id() -> None:
    """A minted token verifies, is unpadded base64url, and parses its id from the right."""
    token = mint("team:gw:1", "k", ttl_s=60, now=NOW)
    assert "=" not in token
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    gateway_id, exp, sig = raw.rsplit(":", 2)
    assert (gateway_id, exp) == ("team:gw:1", str(int(NOW) + 60))
    assert len(sig) == 64
    assert sig == sig.lower()
    assert verify(token, {"team:gw:1": ["old", "k"]}, now=NOW) == ("team:gw:1", "")


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (mint(GATEWAY_ID, SECRET, ttl_s=-31, now=NOW), "expired"),
        (mint("gw-other", SECRET, now=NOW), "unknown"),
        (mint(GATEWAY_ID, "wrong", now=NOW), "forged"),
        ("not a token!", "malformed"),
        (base64.urlsafe_b64encode(b"gw-1:soon:abc").decode().rstrip("="), "malformed"),
        (mint(GATEWAY_ID, SECRET, now=NOW) + "==", "malformed"),
    ],
)
def test_token_refusal_reasons(token: str, reason: str) -> None:
    """Each bad token is refused with its own reason."""
    with pytest.raises(Refused) as refused:
        verify(token, SECRETS, now=NOW)
    assert refused.value.reason == reason


def test_token_skew_is_tolerated() -> None:
    """A token expired by less than the skew still verifies."""
    assert verify(mint(GATEWAY_ID, SECRET, ttl_s=-29, now=NOW), SECRETS, now=NOW)[0] == GATEWAY_ID


# --------------------------------------------------------------------------- handshake, requests


@pytest.mark.asyncio
async def test_handshake_gets_the_original_descriptor(
    connector: OriginalConnector, gateways: Callable[..., OriginalGateway]
) -> None:
    """A hello without protocol/features is answered with an original descriptor."""
    gateway = gateways()
    await gateway.start()
    await gateway.wait_connected()
    assert connector.received_of("hello") == [
        {"type": "hello", "platform": "discord", "botId": "app-1"}
    ]
    assert connector.raw_messages[0].endswith("\n")
    assert connector.raw_messages[0].count("\n") == 1
    assert gateway.descriptors == [
        {
            "contract_version": 1,
            "platform": "discord",
            "label": "Discord",
            "max_message_length": 4096,
            "supports_draft_streaming": False,
            "supports_edit": True,
            "supports_threads": False,
            "markdown_dialect": "plain",
            "len_unit": "chars",
        }
    ]
    assert gateway.raw_messages[0] == (
        '{"type":"descriptor","descriptor":{"contract_version":1,"platform":"discord",'
        '"label":"Discord","max_message_length":4096,"supports_draft_streaming":false,'
        '"supports_edit":true,"supports_threads":false,"markdown_dialect":"plain",'
        '"len_unit":"chars"}}\n'
    )
    assert (gateway.dials, gateway.handshakes, connector.upgrades) == (1, 1, 1)
    assert connector.dials_by_gateway == {GATEWAY_ID: 1}


@pytest.mark.asyncio
async def test_hello_for_an_unknown_platform_is_ignored(
    connector: OriginalConnector, gateways: Callable[..., OriginalGateway]
) -> None:
    """A hello for a platform the connector lacks is never answered."""
    gateway = gateways(platform="slack", handshake_timeout_s=0.1, max_dials=2)
    await gateway.start()
    await gateway.wait_until(lambda: gateway.stopped_reason == "max_dials")
    assert gateway.handshakes == 0
    assert gateway.handshake_timeouts == 2
    assert len(connector.received_of("hello")) == 2
    assert all(not conn.sent for conn in connector.connections)


@pytest.mark.asyncio
async def test_send_with_content_succeeds(
    connector: OriginalConnector, gateways: Callable[..., OriginalGateway]
) -> None:
    """A send with content is performed and answered with a message id."""
    gateway = gateways()
    await gateway.start()
    result = await gateway.send("c1", "hello there", reply_to="m0")
    assert result == {"success": True, "message_id": "om-1"}
    assert connector.performed == [
        {"op": "send", "chat_id": "c1", "content": "hello there", "reply_to": "m0"}
    ]
    assert connector.received_of("outbound")[0]["requestId"] == "r-1"


@pytest.mark.asyncio
async def test_send_without_content_is_refused(
    connector: OriginalConnector, gateways: Callable[..., OriginalGateway]
) -> None:
    """Send/edit/follow_up without non-empty content get "empty content"; typing needs none."""
    gateway = gateways()
    await gateway.start()
    empty = {"success": False, "error": "empty content"}
    assert await gateway.send("c1", None) == empty
    assert await gateway.send("c1", "") == empty
    assert await gateway.request({"op": "edit", "chat_id": "c1", "message_id": "x"}) == empty
    assert await gateway.request({"op": "follow_up", "chat_id": "c1", "content": 3}) == empty
    assert (await gateway.request({"op": "typing", "chat_id": "c1"}))["success"] is True
    assert await gateway.request({"op": "react", "chat_id": "c1"}) == {
        "success": False,
        "error": "unsupported op",
    }
    assert [action["op"] for action in connector.performed] == ["typing"]


@pytest.mark.asyncio
async def test_going_idle_is_acked_and_buffers_live_events(
    connector: OriginalConnector, gateways: Callable[..., OriginalGateway]
) -> None:
    """going_idle is acked (requestId echoed) and later events are buffered, not pushed."""
    gateway = gateways()
    await gateway.start()
    assert await gateway.going_idle() is True
    assert connector.received_of("going_idle") == [{"type": "going_idle", "requestId": "r-1"}]
    assert gateway.received_frames[-1] == {"type": "going_idle_ack", "requestId": "r-1"}
    assert await connector.deliver(GATEWAY_ID, event("later")) == "b-1"
    assert connector.pending(GATEWAY_ID) == ["b-1"]
    assert await gateway.going_idle(with_request_id=False) is True
    assert gateway.received_frames[-1] == {"type": "going_idle_ack"}


# --------------------------------------------------------------------------- replay


@pytest.mark.asyncio
async def test_buffer_replays_one_entry_at_a_time(
    connector: OriginalConnector, gateways: Callable[..., OriginalGateway]
) -> None:
    """The buffer is replayed one entry per ack, live events queue behind it, then go live."""
    for text in ("one", "two", "three"):
        connector.buffer(GATEWAY_ID, event(text))
    gateway = gateways(auto_ack=False)
    await gateway.start()
    await gateway.wait_until(lambda: gateway.unacked == ["b-1"])
    assert await connector.deliver(GATEWAY_ID, event("live during replay")) == "b-4"

    def outstanding_is(bid: str) -> Callable[[], bool]:
        return lambda: gateway.unacked == [bid]

    def last_ack_is(bid: str) -> Callable[[], bool]:
        return lambda: connector.acked[-1:] == [bid]

    for expected in ("b-1", "b-2", "b-3", "b-4"):
        await gateway.wait_until(outstanding_is(expected))
        assert connector.replayed[-1] == expected
        await gateway.ack(expected)
        await connector.wait_until(last_ack_is(expected))

    live = connector.live(GATEWAY_ID)
    assert live is not None
    await connector.wait_until(lambda: not live.replaying)
    assert connector.acked == ["b-1", "b-2", "b-3", "b-4"]
    assert connector.pending(GATEWAY_ID) == []
    assert connector.max_unacked_in_flight == 1
    assert connector.timeline == [
        (kind, bid) for bid in ("b-1", "b-2", "b-3", "b-4") for kind in ("replay", "ack")
    ]
    assert [r.buffer_id for r in gateway.received_events] == ["b-1", "b-2", "b-3", "b-4"]

    assert await connector.deliver(GATEWAY_ID, event("live")) is None
    await gateway.wait_until(lambda: len(gateway.received_events) == 5)
    assert gateway.received_events[-1] == Received(event("live"), None)
    assert gateway.raw_messages[-1] == (
        '{"type":"inbound","event":{"text":"live","source":'
        '{"platform":"discord","chat_id":"c1"}}}\n'
    )
    assert connector.acked == ["b-1", "b-2", "b-3", "b-4"]


@pytest.mark.asyncio
async def test_auto_ack_drains_the_buffer_and_passthrough_frames(
    connector: OriginalConnector, gateways: Callable[..., OriginalGateway]
) -> None:
    """An auto-acking gateway drains events and whole buffered frames with one in flight."""
    connector.buffer(GATEWAY_ID, event("one"))
    connector.buffer_frame(GATEWAY_ID, {"type": "passthrough_forward", "payload": {"k": 1}})
    connector.buffer(GATEWAY_ID, event("two"))
    gateway = gateways()
    await gateway.start()
    await connector.wait_until(lambda: len(connector.acked) == 3)
    assert connector.acked == ["b-1", "b-2", "b-3"]
    assert connector.max_unacked_in_flight == 1
    assert [r.buffer_id for r in gateway.received_events] == ["b-1", "b-3"]
    assert connector.received_of("inbound_ack") == [
        {"type": "inbound_ack", "bufferId": bid} for bid in ("b-1", "b-2", "b-3")
    ]


@pytest.mark.asyncio
async def test_lines_are_split_and_bad_ones_ignored(
    connector: OriginalConnector, gateways: Callable[..., OriginalGateway]
) -> None:
    """Several lines per message are read; unparsable lines and error frames are not answered."""
    gateway = gateways()
    await gateway.start()
    await gateway.wait_connected()
    await gateway.send_raw(
        '{"type":"outbound","requestId":"x1","action":{"op":"typing","chat_id":"c1"}}\n'
        "not json\n\n[1]\n"
        '{"type":"error","code":"boom"}\n'
    )
    await gateway.wait_until(lambda: gateway.received_frames[-1]["type"] == "outbound_result")
    assert gateway.received_frames[-1]["requestId"] == "x1"
    assert connector.unparsable == ["not json", "[1]"]
    assert connector.error_frames_received == 1
    assert [f["type"] for f in connector.received] == ["hello", "outbound", "error"]

    await connector.push_raw(GATEWAY_ID, '{"type":"error","code":"x"}\n{"type":"mystery"}\n?\n')
    await gateway.wait_until(lambda: gateway.error_frames_received == 1)
    assert gateway.unparsable == ["?"]
    assert gateway.connected
    assert (await gateway.send("c1", "still fine"))["success"] is True


# --------------------------------------------------------------------------- auth and redial


@pytest.mark.asyncio
async def test_expired_token_redials_at_once(
    connector: OriginalConnector, gateways: Callable[..., OriginalGateway]
) -> None:
    """An expired token is closed 4401 "expired" and the gateway redials at once, fresh."""
    tokens = iter([mint(GATEWAY_ID, SECRET, ttl_s=-3600)])

    def token() -> str:
        return next(tokens, None) or mint(GATEWAY_ID, SECRET)

    gateway = gateways(token_factory=token, startup_retry_s=30.0)
    await gateway.start()
    await gateway.wait_connected()
    assert gateway.closes == [(4401, "expired")]
    assert (gateway.dials, gateway.handshakes, gateway.startup_races) == (2, 1, 0)
    first = connector.connections[0]
    assert (first.refused, first.close_code, first.close_reason) == ("expired", 4401, "expired")
    assert connector.upgrades == 2


@pytest.mark.asyncio
async def test_start_up_refusals_are_retried(
    connector: OriginalConnector, gateways: Callable[..., OriginalGateway]
) -> None:
    """Two start-up 4401 "unknown" refusals are retried after the start-up delay, then it works."""
    connector.refuse_next = 2
    gateway = gateways(startup_retry_s=0.05)
    started = time.monotonic()
    await gateway.start()
    await gateway.wait_connected()
    assert time.monotonic() - started >= 0.09
    assert gateway.closes == [(4401, "unknown"), (4401, "unknown")]
    assert (gateway.dials, gateway.startup_races, gateway.handshakes) == (3, 2, 1)
    assert connector.dials_by_gateway == {GATEWAY_ID: 3}
    assert [conn.refused for conn in connector.connections] == ["unknown", "unknown", None]


@pytest.mark.asyncio
async def test_start_up_refusals_give_up_after_the_retries(
    connector: OriginalConnector, gateways: Callable[..., OriginalGateway]
) -> None:
    """A gateway refused more often than its start-up retries stops as refused."""
    connector.refuse_next = 10
    gateway = gateways(startup_retry_s=0.01, startup_retries=2)
    await gateway.start()
    await gateway.wait_until(lambda: not gateway.running)
    assert (gateway.stopped_reason, gateway.dials, gateway.handshakes) == ("refused", 3, 0)


@pytest.mark.asyncio
async def test_4401_after_handshake_stops_the_gateway(
    connector: OriginalConnector, gateways: Callable[..., OriginalGateway]
) -> None:
    """A 4401 on a handshaken connection is a revocation: no redial."""
    gateway = gateways()
    await gateway.start()
    await gateway.wait_connected()
    await connector.kick(GATEWAY_ID, 4401, "unknown")
    await gateway.wait_until(lambda: not gateway.running)
    assert (gateway.stopped_reason, gateway.dials) == ("revoked", 1)


@pytest.mark.asyncio
async def test_ordinary_drop_redials_at_once(
    connector: OriginalConnector, gateways: Callable[..., OriginalGateway]
) -> None:
    """A close other than 4401 is a drop: the gateway redials at once and replays the buffer."""
    gateway = gateways(startup_retry_s=30.0)
    await gateway.start()
    await gateway.wait_connected()
    connector.buffer(GATEWAY_ID, event("while away"))
    await connector.kick(GATEWAY_ID, 1011, "restart")
    await gateway.wait_until(lambda: gateway.handshakes == 2)
    assert gateway.closes == [(1011, "restart")]
    await connector.wait_until(lambda: connector.acked == ["b-1"])


@pytest.mark.asyncio
async def test_duplicate_gateway_is_refused_and_redials_until_stopped(
    connector: OriginalConnector, gateways: Callable[..., OriginalGateway]
) -> None:
    """A second connection of the same gateway gets 1008 and, being original, keeps redialling."""
    first = gateways()
    await first.start()
    await first.wait_connected()
    second = gateways()
    await second.start()
    await second.wait_until(lambda: second.dials >= 10)
    await second.stop()
    dials = second.dials
    assert 10 <= dials < second.max_dials
    assert second.stopped_reason == "stopped"
    assert second.handshakes == 0
    assert set(second.closes) == {(1008, "already connected")}
    # The dial in flight when stopped may or may not have reached the connector.
    assert len(second.closes) + 1 <= connector.dials_by_gateway[GATEWAY_ID] <= dials + 1
    assert first.connected
    assert first.closes == []
    assert (await first.send("c1", "still me"))["success"] is True


@pytest.mark.asyncio
async def test_max_dials_caps_a_spinning_gateway(
    connector: OriginalConnector, gateways: Callable[..., OriginalGateway]
) -> None:
    """The dial cap ends an endless at-once redial loop."""
    first = gateways()
    await first.start()
    await first.wait_connected()
    second = gateways(max_dials=5)
    await second.start()
    await second.wait_until(lambda: not second.running)
    assert (second.stopped_reason, second.dials, len(second.closes)) == ("max_dials", 5, 5)
    refused = [conn for conn in connector.connections if conn.refused == "already connected"]
    assert [(conn.close_code, conn.close_reason) for conn in refused] == [
        (1008, "already connected")
    ] * 5


@pytest.mark.asyncio
async def test_other_paths_are_not_found(connector: OriginalConnector) -> None:
    """Only /relay upgrades; any other path is an HTTP 404."""
    with pytest.raises(InvalidStatus) as rejected:
        async with connect(connector.url + "/other", open_timeout=2):
            pass
    assert rejected.value.response.status_code == HTTPStatus.NOT_FOUND
    assert connector.upgrades == 0


@pytest.mark.asyncio
async def test_eventually_is_bounded() -> None:
    """The polling helper gives up after its timeout."""
    with pytest.raises(AssertionError, match="timed out"):
        await eventually(lambda: False, timeout=0.02)

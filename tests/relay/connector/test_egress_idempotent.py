"""The connector's egress with a driver whose platform deduplicates sends by a key: a keyed
request goes to ``perform_once`` with a scope (the bot, for a gateway that announced our
features; the gateway id, for an original one) and the request's key, joined without
ambiguity; an unkeyed one, or any request to a plain driver, goes to ``perform`` as before; the
connector's memory of outcomes still answers a retry within its process."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from relay.connector._egress import platform_key
from relay.connector.intake import IdempotentDriver
from relay.connector.platform import LoopbackPlatform
from relay.wire.compat import IDEMPOTENT_SENDS
from stores.memory import InMemoryStore
from tests.relay.connector.connector_harness import Harness, raw_hello, raw_request, send_action
from tests.relay.connector.deduping_platform import DAY_S, DedupingPlatform
from tests.waiting import BOUND


@pytest_asyncio.fixture
async def h() -> AsyncIterator[Harness]:
    """A harness over an in-memory store; everything it opened is closed afterwards."""
    store = InMemoryStore()
    harness = Harness(store)
    try:
        yield harness
    finally:
        await harness.close()
        store.close()


def test_the_platform_key_is_the_scope_and_the_key_length_prefixed() -> None:
    """The key names the scope and the request, and no other pair spells the same one."""
    assert platform_key("gw-a", "obl-1") == "4:gw-a:obl-1"
    pairs = [("a:b", "c"), ("a", "b:c"), ("a", ":b:c"), ("4:a", "b"), ("", "4:a:b")]
    assert len({platform_key(*pair) for pair in pairs}) == len(pairs)


def test_the_double_is_an_idempotent_driver_and_loopback_is_not() -> None:
    """What the connector checks: the runtime-checkable protocol."""
    assert isinstance(DedupingPlatform(), IdempotentDriver)
    assert not isinstance(LoopbackPlatform(), IdempotentDriver)


@pytest.mark.asyncio
async def test_a_keyed_send_goes_to_perform_once_with_the_gateways_key(h: Harness) -> None:
    """The driver gets the action as sent and platform_key(the bot it said hello as, key);
    nothing reaches its plain perform."""
    platform = DedupingPlatform()
    connector = await h.start(drivers={"loopback": platform})
    gateway = await h.gateway(connector, "gw-a")

    result = await gateway.request(
        send_action("c1", "hello"), idempotency_key="obl-1", timeout_s=BOUND
    )

    assert result.success
    [(action, key)] = platform.once
    assert key == platform_key("bot/bot-gw-a", "obl-1")
    assert (action["op"], action["chat_id"], action["content"]) == ("send", "c1", "hello")
    assert platform.plain == []
    assert platform.texts("c1") == ["hello"]


@pytest.mark.asyncio
async def test_an_unkeyed_request_goes_to_perform(h: Harness) -> None:
    """Without an idempotency key (an original gateway may send none; ours always does) there
    is nothing to deduplicate by: plain perform."""
    platform = DedupingPlatform()
    connector = await h.start(drivers={"loopback": platform})
    ws = await h.raw(connector, "gw-a", announce=False)
    await raw_hello(ws)

    result = await raw_request(ws, "r1", send_action("c1", "no key"))

    assert result["success"] is True
    assert platform.once == []
    assert [a["content"] for a in platform.plain] == ["no key"]


@pytest.mark.asyncio
async def test_two_bots_with_one_key_are_two_keys_to_the_platform(h: Harness) -> None:
    """The same request key from two gateways of two bots is two requests: each performed,
    each with its own bot's key."""
    platform = DedupingPlatform()
    connector = await h.start(drivers={"loopback": platform})
    a = await h.gateway(connector, "gw-a")
    b = await h.gateway(connector, "gw-b")

    await a.request(send_action("c1", "same"), idempotency_key="k", timeout_s=BOUND)
    await b.request(send_action("c1", "same"), idempotency_key="k", timeout_s=BOUND)

    assert [key for _, key in platform.once] == [
        platform_key("bot/bot-gw-a", "k"),
        platform_key("bot/bot-gw-b", "k"),
    ]
    assert platform.texts("c1") == ["same", "same"]


@pytest.mark.asyncio
async def test_a_fleet_of_one_bot_resends_under_one_key_and_original_gateways_never_share(
    h: Harness,
) -> None:
    """Two gateway ids saying hello as one bot (a fleet, one member resending what another
    attempted) are one key: the second is answered from the connector's memory and the reply is
    shown once.  Two original gateways with the same request key (their own counters, say) are
    two keys: both messages are shown."""
    platform = DedupingPlatform()
    connector = await h.start(drivers={"loopback": platform})
    for gateway_id in ("gw-a", "gw-b"):
        ws = await h.raw(connector, gateway_id)
        await raw_hello(ws)
        result = await raw_request(ws, "r1", send_action("c1", "fleet"), idempotencyKey="obl")
        assert result["success"] is True
        await ws.close()
    for gateway_id in ("gw-a", "gw-b"):
        ws = await h.raw(connector, gateway_id, announce=False)
        await raw_hello(ws)
        result = await raw_request(ws, "r1", send_action("c2", "own"), idempotencyKey="1")
        assert result["success"] is True
        await ws.close()

    keys = [key for _, key in platform.once]
    assert keys[:1] == [platform_key("bot/bot", "obl")]
    assert keys[1:] == [platform_key("gateway/gw-a", "1"), platform_key("gateway/gw-b", "1")]
    assert platform.texts("c1") == ["fleet"]
    assert platform.texts("c2") == ["own", "own"]


@pytest.mark.asyncio
async def test_the_connectors_memory_still_answers_a_retry_in_its_process(h: Harness) -> None:
    """A retry with the same key is answered from the connector's memory (the driver is not
    asked again) with the first outcome."""
    platform = DedupingPlatform()
    connector = await h.start(drivers={"loopback": platform})
    gateway = await h.gateway(connector, "gw-a")

    first = await gateway.request(send_action("c1", "x"), idempotency_key="k", timeout_s=BOUND)
    again = await gateway.request(send_action("c1", "x"), idempotency_key="k", timeout_s=BOUND)

    assert first.message_id == again.message_id
    assert len(platform.once) == 1


@pytest.mark.asyncio
async def test_after_a_connector_restart_the_platform_deduplicates_the_resend(
    h: Harness,
) -> None:
    """A new connector process has no memory of the first send; the same key reaches the
    driver again, with the same platform key, and the platform shows the message once."""
    platform = DedupingPlatform()
    first_life = await h.start(drivers={"loopback": platform})
    gateway = await h.gateway(first_life, "gw-a")
    first = await gateway.request(send_action("c1", "x"), idempotency_key="k", timeout_s=BOUND)
    await gateway.disconnect(budget_s=BOUND)
    await first_life.stop()

    second_life = await h.start(drivers={"loopback": platform})
    gateway = await h.gateway(second_life, "gw-a")
    again = await gateway.request(send_action("c1", "x"), idempotency_key="k", timeout_s=BOUND)

    assert again.success
    assert again.message_id == first.message_id
    assert [key for _, key in platform.once] == [platform_key("bot/bot-gw-a", "k")] * 2
    assert platform.texts("c1") == ["x"]


@pytest.mark.asyncio
async def test_a_plain_driver_gets_perform_with_or_without_a_key(h: Harness) -> None:
    """A driver that is not an IdempotentDriver performs keyed requests through perform, as
    before, and its descriptor announces no idempotent sends."""
    connector = await h.start()
    gateway = await h.gateway(connector, "gw-a")

    keyed = await gateway.request(send_action("c1", "k"), idempotency_key="k", timeout_s=BOUND)
    plain = await gateway.request(send_action("c1", "p"), timeout_s=BOUND)

    assert keyed.success
    assert plain.success
    assert h.platform.texts("c1") == ["k", "p"]
    assert gateway.descriptor is not None
    assert not gateway.descriptor.announces(IDEMPOTENT_SENDS)
    assert gateway.descriptor.idempotency_window_s is None


@pytest.mark.asyncio
async def test_the_drivers_announcement_reaches_the_gateway(h: Harness) -> None:
    """The connector adds the driver's feature to its own and keeps the window."""
    connector = await h.start(drivers={"loopback": DedupingPlatform()})
    gateway = await h.gateway(connector, "gw-a")

    assert gateway.descriptor is not None
    assert gateway.descriptor.announces(IDEMPOTENT_SENDS)
    assert gateway.descriptor.idempotency_window_s == DAY_S


@pytest.mark.asyncio
async def test_a_zombies_late_send_is_answered_with_its_peers_redelivery(h: Harness) -> None:
    """A plain platform: a peer of the fleet redelivered a reply (labelled) under its key, then
    the paused owner wakes with its own send of it under way: answered with the peer's outcome,
    not performed again, so the chat shows the reply once."""
    connector = await h.start()
    peer = await h.raw(connector, "gw-b")
    await raw_hello(peer)
    labelled = await raw_request(
        peer, "r1", send_action("c1", "[redelivered] hi"), idempotencyKey="obl-9"
    )
    zombie = await h.raw(connector, "gw-a")
    await raw_hello(zombie)
    late = await raw_request(zombie, "r1", send_action("c1", "hi"), idempotencyKey="obl-9")

    assert labelled["success"] is True
    assert late["success"] is True
    assert late["message_id"] == labelled["message_id"]
    assert h.platform.texts("c1") == ["[redelivered] hi"]
    await peer.close()
    await zombie.close()

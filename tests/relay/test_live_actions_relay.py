"""Through a real connector: a handler's typing, its long reply (split to the descriptor's
limit, in order) and its edit reach the platform; a platform that lists no edit gets no request;
a refusal for length is permanent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio

from relay.client.adapter import RelayAdapter
from relay.connector.platform import LoopbackPlatform
from statecore.gateway import Turn
from statecore.gateway.adapter import MessageLimit, SendResult
from statecore.policy import ErrorKind
from tests.statecore.gateway.gateway_rig import Relay, Rig
from tests.waiting import BOUND, eventually

LIMIT = 300


async def _relay(platform: LoopbackPlatform) -> Relay:
    relay = Relay()
    relay.platform = platform
    await relay.start()
    return relay


async def _serve(relay: Relay, rig: Rig, bot: Callable[[Turn], Awaitable[None]]) -> RelayAdapter:
    """A started gateway on the rig whose handler is ``bot``, connected to ``relay``; its
    relay adapter."""
    _, adapter = relay.adapter()
    gateway = rig.gateway()
    gateway.add_adapter("loopback", adapter)
    gateway.on_message(bot)
    await asyncio.wait_for(gateway.start(), BOUND)
    await eventually(relay.connected, "the gateway connected")
    return adapter


@pytest_asyncio.fixture
async def small() -> AsyncIterator[Relay]:
    """A connector in front of a loopback chat that takes at most LIMIT characters."""
    relay = await _relay(LoopbackPlatform(max_message_length=LIMIT))
    try:
        yield relay
    finally:
        await relay.close()


@pytest.mark.asyncio
async def test_typing_a_split_reply_and_an_edit_reach_the_platform_in_order(
    small: Relay, rig: Rig
) -> None:
    """The handler's typing, then every part of its long reply in order (each within the
    platform's limit, none refused), then its edit of the last part, are what the platform
    performed."""
    results: list[SendResult] = []
    text = "\n\n".join(f"part {n}: " + "z" * 150 for n in range(6))

    async def bot(turn: Turn) -> None:
        await turn.typing()
        sent = await turn.reply(text)
        results.append(sent)
        results.append(await turn.edit(sent, "edited"))

    adapter = await _serve(small, rig, bot)
    assert adapter.message_limit == MessageLimit(LIMIT, "chars")
    await small.platform.inject("c1", "hi")
    await eventually(lambda: len(results) == 2, "the reply and the edit")
    sent, edited = results
    assert sent.success
    assert edited.success
    ops = [action.op for action in small.platform.sent]
    assert ops[0] == "typing"
    assert ops[-1] == "edit"
    sends = [action for action in small.platform.sent if action.op == "send"]
    assert len(sends) == 6
    assert all(len(action.content or "") <= LIMIT for action in sends)
    assert "\n\n".join(action.content or "" for action in sends) == text  # whole, in order
    assert "\n\n".join(action.content or "" for action in sends[:-1]) + "\n\n" + "edited" == (
        "\n\n".join(small.platform.texts("c1"))
    )
    assert small.platform.sent[-1].message_id == sends[-1].message_id


@pytest.mark.asyncio
async def test_a_platform_without_edits_or_typing_gets_no_request(rig: Rig) -> None:
    """On a platform whose descriptor lists only ``send``, typing and edits are definite
    no-ops: nothing is requested from the connector."""
    relay = await _relay(LoopbackPlatform(supported_ops=("send",)))
    try:
        results: list[SendResult] = []

        async def bot(turn: Turn) -> None:
            results.append(await turn.typing())
            sent = await turn.reply("answer")
            results.append(await turn.edit(sent, "changed"))

        await _serve(relay, rig, bot)
        await relay.platform.inject("c1", "hi")
        await eventually(lambda: len(results) == 2, "the typing and the edit")
        assert all(not r.success and r.kind is ErrorKind.PERMANENT for r in results)
        assert [action.op for action in relay.platform.sent] == ["send"]
    finally:
        await relay.close()


@pytest.mark.asyncio
async def test_the_platforms_refusal_for_length_is_permanent(small: Relay) -> None:
    """Sent whole past the limit (no gateway in between to split it), the platform's
    ``too_long`` refusal comes back as a definite, permanent failure."""
    transport, adapter = small.adapter()
    assert await asyncio.wait_for(adapter.connect(), BOUND)
    result = await adapter.send("c1", "y" * (LIMIT + 1))
    assert not result.success
    assert not result.ambiguous
    assert result.kind is ErrorKind.PERMANENT
    assert small.platform.texts("c1") == []
    await transport.disconnect(budget_s=1.0)

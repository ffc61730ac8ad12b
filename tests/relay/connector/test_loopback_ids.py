"""Loopback message ids are unique across platform instances (and so across processes): a bot
whose ledger outlives the process never sees a new message under an old message's id."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from relay.client.adapter import RelayAdapter
from relay.client.transport import WebSocketRelayTransport
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from relay.wire.frames import InboundEvent
from statecore.gateway import Gateway, Turn
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from tests.waiting import BOUND, eventually


class Intake:
    """A connector's intake that keeps what it is handed."""

    def __init__(self) -> None:
        self.events: list[InboundEvent] = []

    async def __call__(self, platform: str, event: InboundEvent) -> None:
        self.events.append(event)


@pytest.mark.asyncio
async def test_two_instances_never_hand_out_the_same_id() -> None:
    """Two platforms (two runs of a bot) each number their messages from 1, yet no id of one
    is an id of the other: user messages and the bot's sends alike."""
    ids: list[set[str]] = []
    for _ in range(2):
        platform = LoopbackPlatform()
        platform.attach(Intake())
        mine = {await platform.inject("chat-1", f"hello {n}") for n in range(50)}
        sent = await platform.perform({"op": "send", "chat_id": "chat-1", "content": "hi"})
        assert sent.message_id is not None
        mine.add(sent.message_id)
        assert len(mine) == 51
        assert all(i.startswith(platform.id_prefix + "-") for i in mine)
        ids.append(mine)
    assert ids[0].isdisjoint(ids[1])


@pytest.mark.asyncio
async def test_a_fixed_prefix_gives_reproducible_ids_and_a_bad_one_is_refused() -> None:
    """id_prefix fixes the ids (for a reproducible transcript); it must be non-empty text."""
    platform = LoopbackPlatform(id_prefix="run")
    platform.attach(Intake())
    assert await platform.inject("c", "a") == "run-1"
    assert await platform.inject("c", "b") == "run-2"
    for bad in ("", 7):
        with pytest.raises(ValueError, match="id_prefix"):
            LoopbackPlatform(id_prefix=bad)  # type: ignore[arg-type]


async def one_run(db: Path) -> list[str]:
    """One process's life: a connector with a fresh loopback platform, a bot on the persistent
    ``db`` answering "hello"; returns what the bot said."""
    chat = LoopbackPlatform()
    buffer_store = InMemoryStore()
    store = SQLiteStore(db)
    try:
        async with Connector(
            buffer_store, secrets={"bot": ["s3cret"]}, drivers={"loopback": chat}
        ) as connector:

            async def answer(turn: Turn) -> None:
                await turn.reply(f"you said: {turn.message.text}")

            transport = WebSocketRelayTransport(connector.url, "loopback", "bot", secret="s3cret")
            gateway = Gateway(store)
            gateway.add_adapter("loopback", RelayAdapter(transport))
            gateway.on_message(answer)
            async with gateway:
                await eventually(lambda: connector.connected("bot"), "the bot to connect")
                await chat.inject("chat-1", "hello")
                await eventually(lambda: bool(chat.texts("chat-1")), "the reply")
        return chat.texts("chat-1")
    finally:
        store.close()
        buffer_store.close()


@pytest.mark.asyncio
async def test_a_bot_with_a_persistent_ledger_answers_hello_in_every_run(tmp_path: Path) -> None:
    """The README bot run twice on one bot.db: the second run's "hello" is a new message with
    a new id, so it gets its own reply (ids that restarted at 1 mapped it to the first run's
    delivered obligation, and the user got nothing)."""
    db = tmp_path / "bot.db"
    for _ in range(2):
        assert await asyncio.wait_for(one_run(db), BOUND * 2) == ["you said: hello"]

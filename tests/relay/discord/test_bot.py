"""A bot on the fake Discord, the whole way: a person writes, the connector's Discord driver
takes it, the gateway's handler answers, the reply is in the channel as Discord shows it.

The right channel, thread and reply; two channels kept apart; a message written while no
gateway listens waits for one; a restarted connector resumes its gateway session from the
stored seq and hands nothing over twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from relay.client.adapter import RelayAdapter
from relay.client.dedupe import StoreBufferDedupe
from relay.client.transport import WebSocketRelayTransport
from relay.connector.server import Connector
from relay.discord import DiscordDriver
from relay.discord.testing import FakeDiscord
from statecore.gateway import Gateway, Turn
from stores import SQLiteStore

pytestmark = pytest.mark.asyncio

SECRET = "discord-test-secret"
GATEWAY_ID = "gw"
BOUND_S = 20.0


class Bot:
    """A connector with the Discord driver and a gateway answering ``echo: <text>``, each on
    its own SQLite file under ``data``; what the handler saw is in ``seen``."""

    def __init__(self, data: Path, fake: FakeDiscord) -> None:
        self.data = data
        self.fake = fake
        self.seen: list[str] = []
        self.connector: Connector | None = None
        self.gateway: Gateway | None = None
        self.driver: DiscordDriver | None = None
        self._stores: list[SQLiteStore] = []

    async def answer(self, turn: Turn) -> None:
        self.seen.append(turn.message.text)
        await turn.reply(f"echo: {turn.message.text}")

    async def start_connector(self) -> Connector:
        store = SQLiteStore(self.data / "connector.db")
        self._stores.append(store)
        self.driver = DiscordDriver(self.fake.token, api_base=self.fake.api_base)
        port = 0 if self.connector is None else int(self.connector.url.rsplit(":", 1)[1])
        self.connector = Connector(
            store, secrets={GATEWAY_ID: [SECRET]}, drivers={"discord": self.driver}
        )
        await self.connector.start(port=port)
        driver = self.driver
        await until(driver.gateway.connected.is_set, "a live gateway session")
        return self.connector

    async def stop_connector(self) -> None:
        assert self.connector is not None
        await self.connector.stop()

    async def start_gateway(self) -> Gateway:
        assert self.connector is not None
        store = SQLiteStore(self.data / "gateway.db")
        self._stores.append(store)
        transport = WebSocketRelayTransport(
            self.connector.url,
            "discord",
            "bot",
            gateway_id=GATEWAY_ID,
            secret=SECRET,
            reconnect_backoff_s=0.05,
            reconnect_max_s=0.5,
            dedupe=StoreBufferDedupe(store),
        )
        self.gateway = Gateway(store)
        self.gateway.on_message(self.answer)
        self.gateway.add_adapter("discord", RelayAdapter(transport))
        await self.gateway.start()
        return self.gateway

    async def close(self) -> None:
        if self.gateway is not None:
            await self.gateway.stop()
        if self.connector is not None:
            await self.connector.stop()
        for store in self._stores:
            store.close()


@contextlib.asynccontextmanager
async def a_bot(tmp_path: Path, *, gateway: bool = True) -> AsyncIterator[tuple[Bot, FakeDiscord]]:
    async with FakeDiscord() as fake:
        bot = Bot(tmp_path, fake)
        try:
            await bot.start_connector()
            if gateway:
                await bot.start_gateway()
            yield bot, fake
        finally:
            await bot.close()


async def until(check: Callable[[], bool], what: str, timeout_s: float = BOUND_S) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            while not check():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s} s: {what}") from None


async def test_a_person_writes_and_the_bot_answers_in_the_channel_as_a_reply_and_in_the_thread(
    tmp_path: Path,
) -> None:
    async with a_bot(tmp_path) as (bot, fake):
        asked = fake.user_writes("1001", "hello", author="ann")
        in_guild = fake.user_writes("2001", "in the guild", author="bob", guild_id="77")
        threaded = fake.user_writes(
            "3001", "in the thread", author="bob", guild_id="77", thread=True, parent_id="2001"
        )
        await until(
            lambda: all(fake.bot_messages(c) for c in ("1001", "2001", "3001")), "three answers"
        )
    dm_answer = fake.bot_messages("1001")
    assert [(m.content, m.reply_to) for m in dm_answer] == [("echo: hello", asked.id)]
    guild_answer = fake.bot_messages("2001")
    assert [(m.content, m.reply_to) for m in guild_answer] == [("echo: in the guild", in_guild.id)]
    thread_answer = fake.bot_messages("3001")
    assert [(m.content, m.reply_to) for m in thread_answer] == [
        ("echo: in the thread", threaded.id)
    ]
    assert sorted(bot.seen) == ["hello", "in the guild", "in the thread"]


async def test_two_channels_and_two_people_stay_apart(tmp_path: Path) -> None:
    async with a_bot(tmp_path) as (bot, fake):
        for n in range(3):
            fake.user_writes("1001", f"ann {n}", author="ann")
            fake.user_writes("1002", f"bob {n}", author="bob", guild_id="77")
        await until(
            lambda: len(fake.bot_messages("1001")) == 3 and len(fake.bot_messages("1002")) == 3,
            "three answers in each channel",
        )
        assert bot.gateway is not None
        # The gateway may not address a channel the platform never showed it (egress guard).
        refused = await bot.gateway.send_final(
            session_key="probe",
            platform="discord",
            chat_id="9999",
            content="intruding",
            message_ref="p",
        )
    assert not refused.success
    assert [m.content for m in fake.bot_messages("1001")] == [f"echo: ann {n}" for n in range(3)]
    assert [m.content for m in fake.bot_messages("1002")] == [f"echo: bob {n}" for n in range(3)]
    assert fake.channel("9999") == []


async def test_a_message_written_while_no_gateway_listens_waits_for_one(tmp_path: Path) -> None:
    async with a_bot(tmp_path, gateway=False) as (bot, fake):
        fake.user_writes("1001", "anyone there?")
        assert bot.connector is not None
        connector = bot.connector
        await until(lambda: connector.held("discord") == 1, "the event held")
        await bot.start_gateway()
        await until(lambda: len(fake.bot_messages("1001")) == 1, "the answer")
        await until(lambda: connector.held("discord") == 0, "released")
    assert bot.seen == ["anyone there?"]


async def test_a_restarted_connector_resumes_its_session_and_hands_nothing_over_twice(
    tmp_path: Path,
) -> None:
    async with a_bot(tmp_path) as (bot, fake):
        fake.user_writes("1001", "before")
        await until(lambda: len(fake.bot_messages("1001")) == 1, "answered")
        await bot.stop_connector()
        fake.user_writes("1001", "while the connector was down")
        await bot.start_connector()
        fake.user_writes("1001", "after")
        await until(lambda: len(fake.bot_messages("1001")) == 3, "all answered")
        await asyncio.sleep(0.5)  # nothing else comes
        assert fake.gateway.identifies == 1
        assert len(fake.gateway.resumes) == 1
    assert bot.seen == ["before", "while the connector was down", "after"]
    assert [m.content for m in fake.bot_messages("1001")] == [
        "echo: before",
        "echo: while the connector was down",
        "echo: after",
    ]

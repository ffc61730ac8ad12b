"""A bot on the fake Discord, the whole way: a person writes, the connector's Discord driver
takes it, the gateway's handler answers, the reply is in the channel as Discord shows it.

The right channel, thread and reply; two channels kept apart; a message written while no
gateway listens waits for one; a restarted connector resumes its gateway session from the
stored seq and hands nothing over twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from relay.discord import DiscordDriver
from relay.discord.testing import FakeDiscord
from tests.relay.notes_intake import until_within
from tests.relay.relay_bot import RelayBot, started

pytestmark = pytest.mark.asyncio

SECRET = "discord-test-secret"
BOUND_S = 20.0


class Bot(RelayBot[DiscordDriver]):
    """A connector with the Discord driver and a gateway answering ``echo: <text>``, each on
    its own SQLite file under ``data``; what the handler saw is in ``seen``.  A connector
    start returns once the driver's gateway session is live."""

    def __init__(self, data: Path, fake: FakeDiscord) -> None:
        super().__init__(data, "discord", SECRET)
        self.fake = fake

    def make_driver(self) -> DiscordDriver:
        return DiscordDriver(self.fake.token, api_base=self.fake.api_base)

    async def driver_live(self, driver: DiscordDriver) -> None:
        await until(driver.gateway.connected.is_set, "a live gateway session")


@contextlib.asynccontextmanager
async def a_bot(tmp_path: Path, *, gateway: bool = True) -> AsyncIterator[tuple[Bot, FakeDiscord]]:
    async with FakeDiscord() as fake, started(Bot(tmp_path, fake), gateway=gateway) as bot:
        yield bot, fake


until = until_within(BOUND_S, poll_s=0.05)


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

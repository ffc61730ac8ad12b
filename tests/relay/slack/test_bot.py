"""A bot on the fake Slack, the whole way: a person writes, the connector's Slack driver takes
it, the gateway's handler answers, the reply is in the channel (and thread) as people see it.

Two channels and two people kept apart; a message written while no gateway listens waits for
one; a connector restarted while Slack holds unacked events takes them and hands nothing over
twice (Slack's retries, a duplicate delivery and the app_mention copy of a message included);
a hostile payload is rejected and the next message still answered; the Events API the same.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from relay.slack import SlackDriver
from relay.slack.testing import FakeSlack
from tests.relay.notes_intake import until_within
from tests.relay.relay_bot import RelayBot, started

pytestmark = pytest.mark.asyncio

SECRET = "slack-test-secret"
BOUND_S = 20.0


class Bot(RelayBot[SlackDriver]):
    """A connector with the Slack driver and a gateway answering ``echo: <text>``, each on
    its own SQLite file under ``data``; what the handler saw is in ``seen``."""

    def __init__(self, data: Path, fake: FakeSlack, **driver_options: Any) -> None:
        super().__init__(data, "slack", SECRET)
        self.fake = fake
        self.driver_options = driver_options

    def make_driver(self) -> SlackDriver:
        options = {"app_token": self.fake.app_token, "ack_budget_s": 2.0, **self.driver_options}
        return SlackDriver(self.fake.bot_token, api_url=self.fake.api_url, **options)


@contextlib.asynccontextmanager
async def a_fake(**options: Any) -> AsyncIterator[FakeSlack]:
    settings = {"ack_timeout_s": 3.0, "retry_delays_s": (0.2, 0.5, 1.0), "refresh_grace_s": 1.0}
    fake = FakeSlack(**{**settings, **options})
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


@contextlib.asynccontextmanager
async def a_bot(
    tmp_path: Path, fake: FakeSlack, *, gateway: bool = True, **driver_options: Any
) -> AsyncIterator[Bot]:
    async with started(Bot(tmp_path, fake, **driver_options), gateway=gateway) as bot:
        yield bot


until = until_within(BOUND_S, poll_s=0.05)


def bot_texts(fake: FakeSlack, channel: str) -> list[str]:
    return fake.channel(channel).bot_texts() if channel in fake.channels() else []


async def test_a_person_writes_and_the_bot_answers_in_the_channel_and_in_the_thread(
    tmp_path: Path,
) -> None:
    async with a_fake() as fake, a_bot(tmp_path, fake) as bot:
        await until(lambda: bool(fake.delivery.open_sockets()), "connected")
        fake.user_writes("D1", "hello", user="U1")
        root = fake.user_writes("C1", "thread root", user="U1", channel_type="channel")
        await until(lambda: len(bot_texts(fake, "C1")) == 1, "the root answered")
        fake.user_writes("C1", "in the thread", user="U1", channel_type="channel", thread_ts=root)
        await until(
            lambda: (
                bot_texts(fake, "D1") == ["echo: hello"]
                and len(fake.channel("C1").thread(root)) == 2
            ),
            "three answers",
        )
        view = fake.channel("C1")
        assert [m.text for m in view.top_level()] == ["thread root", "echo: thread root"]
        assert [(m.text, m.bot) for m in view.thread(root)] == [
            ("in the thread", False),
            ("echo: in the thread", True),
        ]
        assert sorted(bot.seen) == ["hello", "in the thread", "thread root"]


async def test_two_channels_and_two_people_stay_apart(tmp_path: Path) -> None:
    async with a_fake() as fake, a_bot(tmp_path, fake) as bot:
        await until(lambda: bool(fake.delivery.open_sockets()), "connected")
        for n in range(3):
            fake.user_writes("D_ANN", f"ann {n}", user="U_ANN")
            fake.user_writes("C_BOB", f"bob {n}", user="U_BOB", channel_type="channel")
        await until(
            lambda: len(bot_texts(fake, "D_ANN")) == 3 and len(bot_texts(fake, "C_BOB")) == 3,
            "three answers in each",
        )
        assert bot.gateway is not None
        fake.add_channel("C_ELSE")
        refused = await bot.gateway.send_final(
            session_key="probe", platform="slack", chat_id="C_ELSE", content="x", message_ref="p"
        )
        assert not refused.success  # never shown to the gateway: the egress guard
    assert bot_texts(fake, "D_ANN") == [f"echo: ann {n}" for n in range(3)]
    assert bot_texts(fake, "C_BOB") == [f"echo: bob {n}" for n in range(3)]
    assert bot_texts(fake, "C_ELSE") == []


async def test_a_message_written_while_no_gateway_listens_waits_for_one(tmp_path: Path) -> None:
    async with a_fake() as fake, a_bot(tmp_path, fake, gateway=False) as bot:
        await until(lambda: bool(fake.delivery.open_sockets()), "connected")
        fake.user_writes("D1", "anyone there?")
        connector = bot.connector
        assert connector is not None
        await until(lambda: connector.held("slack") == 1, "the event held")
        await fake.settled()
        assert fake.delivery.given_up == []  # held is taken: acked
        await bot.start_gateway()
        await until(lambda: bot_texts(fake, "D1") == ["echo: anyone there?"], "the answer")
    assert bot.seen == ["anyone there?"]


async def test_a_restarted_connector_takes_what_slack_kept_and_hands_nothing_over_twice(
    tmp_path: Path,
) -> None:
    async with a_fake() as fake, a_bot(tmp_path, fake) as bot:
        await until(lambda: bool(fake.delivery.open_sockets()), "connected")
        fake.user_writes("D1", "before")
        await until(lambda: bot_texts(fake, "D1") == ["echo: before"], "answered")
        await bot.stop_connector()
        fake.user_writes("D1", "while the connector was down")
        fake.duplicate_next()
        twice = fake.user_writes("C1", "delivered twice", channel_type="channel")
        mention = {"type": "app_mention", "channel": "C1", "user": "U0PERSON"}
        fake.push_event({**mention, "text": "delivered twice", "ts": twice})
        await until(lambda: len(fake.delivery.deliveries) >= 3, "attempts while down")
        await bot.start_connector()
        await until(
            lambda: len(bot_texts(fake, "D1")) == 2 and len(bot_texts(fake, "C1")) == 1,
            "all answered",
        )
        await fake.settled()
        await asyncio.sleep(0.5)
        assert bot.connector is not None
        assert bot.connector.duplicates >= 2
    assert sorted(bot.seen) == ["before", "delivered twice", "while the connector was down"]
    assert bot_texts(fake, "D1") == ["echo: before", "echo: while the connector was down"]
    assert bot_texts(fake, "C1") == ["echo: delivered twice"]
    assert fake.delivery.given_up == []


async def test_a_hostile_payload_is_rejected_and_the_next_message_still_answered(
    tmp_path: Path,
) -> None:
    async with a_fake() as fake, a_bot(tmp_path, fake) as bot:
        await until(lambda: bool(fake.delivery.open_sockets()), "connected")
        await fake.send_raw("{not json")
        fake.push_event({"type": "message", "channel": "C1", "user": "U1", "text": 7, "ts": "1.1"})
        fake.user_writes("D1", "still here")
        await until(lambda: bot_texts(fake, "D1") == ["echo: still here"], "the answer")
        connector = bot.connector
        assert connector is not None
        await until(lambda: connector.rejections == 2, "two rejections")
    assert bot.seen == ["still here"]


async def test_over_the_events_api_the_bot_answers_and_a_retry_is_one_answer(
    tmp_path: Path,
) -> None:
    async with (
        a_fake() as fake,
        a_bot(
            tmp_path,
            fake,
            app_token=None,
            mode="events",
            signing_secret=fake.signing_secret,
        ) as bot,
    ):
        assert bot.driver is not None
        url = bot.driver.events_url
        assert url is not None
        assert await fake.verify_url(url)
        fake.request_url = url
        fake.duplicate_next()
        fake.user_writes("D1", "over http")
        await until(lambda: bot_texts(fake, "D1") == ["echo: over http"], "the answer")
        await fake.settled()
        await asyncio.sleep(0.5)
    assert bot.seen == ["over http"]
    assert bot_texts(fake, "D1") == ["echo: over http"]

"""A bot on the fake Bot API server, the whole way: a person writes, the connector's Telegram
driver takes it, the gateway's handler answers, the reply is in the chat.

The right chat, topic and reply; two chats kept apart and a chat the platform never showed
refused; a message written while no gateway listens waits for one; a restarted connector
resumes from its stored offset and hands nothing over twice; a reply over Telegram's limit
split by UTF-16 units; a send that reached Telegram without an answer resent with the ledger's
"possible repeat" label (Telegram has no idempotent send).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from relay.telegram import TelegramDriver
from relay.telegram.testing import FakeTelegram, TelegramUser
from statecore import RECONNECTED_MARKER, RECOVERED_MARKER, LedgerPolicy
from tests.relay.notes_intake import until_within
from tests.relay.relay_bot import RelayBot, started

pytestmark = pytest.mark.asyncio

SECRET = "telegram-test-secret"
BOUND_S = 20.0


class Bot(RelayBot[TelegramDriver]):
    """A connector with the Telegram driver and a gateway answering ``echo: <text>`` (or what
    ``reply`` makes of it), each on its own SQLite file under ``data``; the gateway's ledger
    retries after 0.2 s and 0.5 s, its sweep every 0.2 s."""

    def __init__(self, data: Path, fake: FakeTelegram, **driver_options: Any) -> None:
        super().__init__(data, "telegram", SECRET)
        self.fake = fake
        self.driver_options = driver_options

    def make_driver(self) -> TelegramDriver:
        options = {"poll_timeout_s": 1, "chat_rate_per_s": 20.0, **self.driver_options}
        return TelegramDriver(self.fake.token, api_url=self.fake.api_url, **options)

    def gateway_options(self) -> dict[str, Any]:
        return {"policy": LedgerPolicy(retry_backoff=(0.2, 0.5)), "retry_interval_s": 0.2}


@contextlib.asynccontextmanager
async def a_bot(tmp_path: Path, *, gateway: bool = True, **options: Any) -> AsyncIterator[Bot]:
    async with (
        FakeTelegram() as fake,
        started(Bot(tmp_path, fake, **options), gateway=gateway) as bot,
    ):
        yield bot


until = until_within(BOUND_S, poll_s=0.05)


def bot_messages(fake: FakeTelegram, chat_id: int) -> list[Any]:
    return [m for m in fake.chat(chat_id) if m.from_bot]


async def test_a_person_writes_and_the_bot_answers_in_the_chat_as_a_reply_and_in_the_topic(
    tmp_path: Path,
) -> None:
    async with a_bot(tmp_path) as bot:
        fake = bot.fake
        asked = fake.user_writes(42, "hello")["message"]["message_id"]
        ann = TelegramUser(5, "Ann", "ann")
        in_topic = fake.user_writes(
            -1001, "in the topic", user=ann, chat_type="supergroup", forum=True, thread_id=9
        )["message"]["message_id"]
        await until(
            lambda: len(bot_messages(fake, 42)) == 1 and len(bot_messages(fake, -1001)) == 1,
            "both answers",
        )
    (private,) = bot_messages(fake, 42)
    assert (private.text, private.reply_to, private.thread_id) == ("echo: hello", asked, None)
    (topic,) = bot_messages(fake, -1001)
    assert (topic.text, topic.reply_to, topic.thread_id) == ("echo: in the topic", in_topic, 9)
    assert sorted(bot.seen) == ["hello", "in the topic"]


async def test_two_chats_stay_apart_and_a_chat_never_shown_is_refused(tmp_path: Path) -> None:
    async with a_bot(tmp_path) as bot:
        fake = bot.fake
        for n in range(3):
            fake.user_writes(42, f"ann {n}")
            fake.user_writes(43, f"bob {n}")
        await until(
            lambda: len(bot_messages(fake, 42)) == 3 and len(bot_messages(fake, 43)) == 3,
            "three answers in each chat",
        )
        fake.user_writes(44, "eve was here")  # a chat the bot could reach, via another path
        assert bot.gateway is not None
        refused = await bot.gateway.send_final(
            session_key="probe",
            platform="telegram",
            chat_id="45",
            content="intruding",
            message_ref="p",
        )
        await until(lambda: len(bot_messages(fake, 44)) == 1, "eve's answer")
    assert not refused.success
    assert [m.text for m in bot_messages(fake, 42)] == [f"echo: ann {n}" for n in range(3)]
    assert [m.text for m in bot_messages(fake, 43)] == [f"echo: bob {n}" for n in range(3)]
    assert fake.chat(45) == []


async def test_a_message_written_while_no_gateway_listens_waits_for_one(tmp_path: Path) -> None:
    async with a_bot(tmp_path, gateway=False) as bot:
        fake = bot.fake
        fake.user_writes(42, "anyone there?")
        assert bot.connector is not None
        connector = bot.connector
        await until(lambda: connector.held("telegram") == 1, "the event held")
        await bot.start_gateway()
        await until(lambda: len(bot_messages(fake, 42)) == 1, "the answer")
        await until(lambda: connector.held("telegram") == 0, "released")
    assert bot.seen == ["anyone there?"]


async def test_a_restarted_connector_resumes_from_its_offset_and_hands_nothing_over_twice(
    tmp_path: Path,
) -> None:
    async with a_bot(tmp_path) as bot:
        fake = bot.fake
        fake.user_writes(42, "before")
        await until(lambda: len(bot_messages(fake, 42)) == 1, "answered")
        await bot.stop_connector()
        fake.user_writes(42, "while the connector was down")
        await bot.start_connector()
        fake.user_writes(42, "after")
        await until(lambda: len(bot_messages(fake, 42)) == 3, "all answered")
        await asyncio.sleep(0.5)
    assert bot.seen == ["before", "while the connector was down", "after"]
    assert [m.text for m in bot_messages(fake, 42)] == [
        "echo: before",
        "echo: while the connector was down",
        "echo: after",
    ]


async def test_a_webhook_bot_answers_what_telegram_pushes(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    hook: dict[str, Any] = {
        "mode": "webhook",
        "webhook_url": f"http://127.0.0.1:{port}/telegram",
        "webhook_port": port,
    }
    async with a_bot(tmp_path, **hook) as bot:
        fake = bot.fake
        await until(lambda: fake.updates.webhook is not None, "the webhook set")
        asked = fake.user_writes(42, "pushed")["message"]["message_id"]
        await until(lambda: len(bot_messages(fake, 42)) == 1, "the answer")
    (answer,) = bot_messages(fake, 42)
    assert (answer.text, answer.reply_to) == ("echo: pushed", asked)
    assert fake.calls_of("getUpdates") == []
    assert [d.status for d in fake.updates.deliveries] == [200]


async def test_a_reply_over_the_limit_is_split_by_utf16_units(tmp_path: Path) -> None:
    async with a_bot(tmp_path) as bot:
        fake = bot.fake
        long = "😀" * 3000  # 6,000 UTF-16 units: over 4,096, though 3,000 characters
        bot.reply = lambda _text: long
        fake.user_writes(42, "say a lot")
        await until(lambda: len(bot_messages(fake, 42)) >= 2, "the parts")
        await asyncio.sleep(0.5)
    parts = [m.text for m in bot_messages(fake, 42)]
    assert "".join(parts).replace("\n", "").replace(" ", "") == long
    assert all(len(p.encode("utf-16-le")) // 2 <= 4096 for p in parts)


async def test_a_send_without_an_answer_is_resent_with_the_possible_repeat_label(
    tmp_path: Path,
) -> None:
    async with a_bot(tmp_path, request_timeout_s=1.0) as bot:
        fake = bot.fake
        fake.act_then_timeout("sendMessage")
        fake.user_writes(42, "are you there?")
        await until(lambda: len(bot_messages(fake, 42)) == 2, "the resend")
        await asyncio.sleep(0.5)
        assert bot.driver is not None
        assert bot.driver.ambiguous == 1
    first, second = (m.text for m in bot_messages(fake, 42))
    assert first == "echo: are you there?"
    assert second.endswith("echo: are you there?")
    assert second.startswith((RECOVERED_MARKER, RECONNECTED_MARKER))

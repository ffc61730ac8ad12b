"""The fake Bot API server behaves as the Bot API's documentation says.

Read with plain HTTP, and with python-telegram-bot (a client library written against the real
API) pointed at the fake by its base URL: updates confirmed only by a later offset, the long
poll, limit and allowed_updates, 409 for a second poller and with a webhook set, message ids
per chat, replies, topics, the UTF-16 limit, edits, chat actions, the refusals' texts, and each
misbehaviour a test can ask for.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from relay.telegram.testing import SECRET_HEADER, FakeTelegram, TelegramUser

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def call(
    http: aiohttp.ClientSession,
    fake: FakeTelegram,
    method: str,
    token: str | None = None,
    timeout_s: float = 10.0,
    **params: Any,
) -> tuple[int, dict[str, Any]]:
    url = f"{fake.api_url}{token or fake.token}/{method}"
    async with http.post(
        url, json=params, timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as response:
        return response.status, await response.json()


async def test_updates_stay_until_a_higher_offset_confirms_them(
    fake: FakeTelegram, http: aiohttp.ClientSession
) -> None:
    first = fake.user_writes(42, "one")
    second = fake.user_writes(42, "two")
    _, answer = await call(http, fake, "getUpdates")
    assert [u["update_id"] for u in answer["result"]] == [first["update_id"], second["update_id"]]
    # Not confirmed yet: asked again without an offset, both come again.
    _, again = await call(http, fake, "getUpdates")
    assert len(again["result"]) == 2
    _, rest = await call(http, fake, "getUpdates", offset=first["update_id"] + 1)
    assert [u["message"]["text"] for u in rest["result"]] == ["two"]
    _, none = await call(http, fake, "getUpdates", offset=second["update_id"] + 1)
    assert none["result"] == []
    _, still_none = await call(http, fake, "getUpdates")  # confirmed updates are forgotten
    assert still_none["result"] == []


async def test_limit_negative_offset_and_the_long_poll(
    fake: FakeTelegram, http: aiohttp.ClientSession
) -> None:
    for n in range(5):
        fake.user_writes(42, f"m{n}")
    _, two = await call(http, fake, "getUpdates", limit=2)
    assert [u["message"]["text"] for u in two["result"]] == ["m0", "m1"]
    _, last = await call(http, fake, "getUpdates", offset=-1)
    assert [u["message"]["text"] for u in last["result"]] == ["m4"]
    uid = last["result"][0]["update_id"]
    began = time.monotonic()
    waiting = asyncio.create_task(call(http, fake, "getUpdates", offset=uid + 1, timeout=5))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    fake.user_writes(42, "late")
    _, answer = await asyncio.wait_for(waiting, 5)
    assert [u["message"]["text"] for u in answer["result"]] == ["late"]
    assert time.monotonic() - began < 3
    began = time.monotonic()
    _, empty = await call(http, fake, "getUpdates", offset=uid + 2, timeout=1)
    assert empty["result"] == []
    assert time.monotonic() - began >= 0.9


async def test_a_second_poller_ends_the_first_with_409_and_a_webhook_blocks_polling(
    fake: FakeTelegram, http: aiohttp.ClientSession
) -> None:
    first = asyncio.create_task(call(http, fake, "getUpdates", timeout=5))
    await asyncio.sleep(0.2)
    second = asyncio.create_task(call(http, fake, "getUpdates", timeout=1))
    status, answer = await asyncio.wait_for(first, 5)
    assert status == 409
    assert "terminated by other getUpdates" in answer["description"]
    await second
    status, ok = await call(http, fake, "setWebhook", url="http://127.0.0.1:9/hook")
    assert (status, ok["result"]) == (200, True)
    status, answer = await call(http, fake, "getUpdates")
    assert status == 409
    assert "webhook is active" in answer["description"]
    _, info = await call(http, fake, "getWebhookInfo")
    assert info["result"]["url"] == "http://127.0.0.1:9/hook"
    await call(http, fake, "deleteWebhook")
    status, _ = await call(http, fake, "getUpdates")
    assert status == 200


async def test_allowed_updates_decide_which_updates_are_made_from_then_on(
    fake: FakeTelegram, http: aiohttp.ClientSession
) -> None:
    fake.user_writes(42, "before")
    sent = fake.user_writes(42, "to edit")
    await call(http, fake, "getUpdates", allowed_updates=["message"])
    fake.user_edits(42, sent["message"]["message_id"], "edited")  # not made
    fake.user_writes(42, "after")
    _, answer = await call(http, fake, "getUpdates")
    assert [u["message"]["text"] for u in answer["result"]] == ["before", "to edit", "after"]


async def test_sends_replies_topics_edits_and_actions_as_the_chat_shows_them(
    fake: FakeTelegram, http: aiohttp.ClientSession
) -> None:
    ann = TelegramUser(7, "Ann", "ann")
    asked = fake.user_writes(-1001, "hi", user=ann, chat_type="supergroup", forum=True, thread_id=5)
    asked_id = asked["message"]["message_id"]
    assert asked["message"]["chat"] == {
        "id": -1001,
        "type": "supergroup",
        "title": "chat -1001",
        "is_forum": True,
    }
    assert (asked["message"]["message_thread_id"], asked["message"]["is_topic_message"]) == (
        5,
        True,
    )
    status, sent = await call(
        http,
        fake,
        "sendMessage",
        chat_id=-1001,
        text="hello 👋",
        message_thread_id=5,
        reply_parameters={"message_id": asked_id},
    )
    assert status == 200
    message = sent["result"]
    assert message["message_id"] == asked_id + 1  # ids count per chat
    assert message["reply_to_message"]["message_id"] == asked_id
    assert message["from"]["is_bot"] is True
    status, edited = await call(
        http, fake, "editMessageText", chat_id=-1001, message_id=message["message_id"], text="bye"
    )
    assert status == 200
    assert edited["result"]["text"] == "bye"
    await call(http, fake, "sendChatAction", chat_id=-1001, action="typing", message_thread_id=5)
    shown = fake.chat(-1001)
    assert [(m.sender, m.text, m.thread_id, m.reply_to, m.edited) for m in shown] == [
        ("Ann", "hi", 5, None, False),
        ("bot", "bye", 5, asked_id, True),
    ]
    assert [(a.action, a.thread_id) for a in fake.actions(-1001)] == [("typing", 5)]
    fake.user_writes(42, "in private")
    _, private = await call(
        http, fake, "sendMessage", chat_id="42", text="x", reply_to_message_id=1
    )
    assert private["result"]["message_id"] == 2
    assert fake.chat(42)[1].reply_to == 1


@pytest.mark.parametrize(
    ("params", "status", "description"),
    [
        ({"chat_id": 999, "text": "x"}, 400, "Bad Request: chat not found"),
        ({"chat_id": 42, "text": ""}, 400, "Bad Request: message text is empty"),
        ({"chat_id": 42, "text": "x" * 4097}, 400, "Bad Request: message is too long"),
        ({"chat_id": 42, "text": "😀" * 2049}, 400, "Bad Request: message is too long"),
        (
            {"chat_id": 42, "text": "x", "reply_parameters": {"message_id": 77}},
            400,
            "Bad Request: message to be replied not found",
        ),
        (
            {"chat_id": 42, "text": "x", "message_thread_id": 3},
            400,
            "Bad Request: message thread not found",
        ),
    ],
)
async def test_what_sendmessage_refuses_and_how_it_says_so(
    fake: FakeTelegram,
    http: aiohttp.ClientSession,
    params: dict[str, Any],
    status: int,
    description: str,
) -> None:
    fake.user_writes(42, "hello")
    got, answer = await call(http, fake, "sendMessage", **params)
    assert (got, answer) == (
        status,
        {"ok": False, "error_code": status, "description": description},
    )
    assert fake.bot_texts(42) == []


async def test_limits_count_utf16_units_and_a_reply_to_a_gone_message_may_go_without(
    fake: FakeTelegram, http: aiohttp.ClientSession
) -> None:
    fake.user_writes(42, "hello")
    status, _ = await call(http, fake, "sendMessage", chat_id=42, text="😀" * 2048)
    assert status == 200
    status, sent = await call(
        http,
        fake,
        "sendMessage",
        chat_id=42,
        text="x",
        reply_parameters={"message_id": 77, "allow_sending_without_reply": True},
    )
    assert status == 200
    assert "reply_to_message" not in sent["result"]
    fake.block(42)
    status, answer = await call(http, fake, "sendMessage", chat_id=42, text="x")
    assert (status, answer["description"]) == (403, "Forbidden: bot was blocked by the user")


async def test_faults_a_429_a_5xx_a_garbled_answer_and_a_revoked_token(
    fake: FakeTelegram, http: aiohttp.ClientSession
) -> None:
    fake.user_writes(42, "hello")
    fake.fail_next("sendMessage", 429, retry_after=3)
    fake.fail_next("sendMessage", 502)
    status, answer = await call(http, fake, "sendMessage", chat_id=42, text="a")
    assert (status, answer["parameters"], answer["description"]) == (
        429,
        {"retry_after": 3},
        "Too Many Requests: retry after 3",
    )
    status, answer = await call(http, fake, "sendMessage", chat_id=42, text="a")
    assert (status, answer["description"]) == (502, "Bad Gateway")
    assert fake.bot_texts(42) == []  # neither acted
    fake.malformed_next_answer("getUpdates", b"not json")
    async with http.post(f"{fake.api_url}{fake.token}/getUpdates") as response:
        assert (response.status, await response.read()) == (200, b"not json")
    status, answer = await call(http, fake, "getMe", token="123:wrong")
    assert (status, answer) == (
        401,
        {"ok": False, "error_code": 401, "description": "Unauthorized"},
    )
    fake.revoke_token()
    status, _ = await call(http, fake, "getMe")
    assert status == 401


async def test_act_then_timeout_sends_and_never_answers(
    fake: FakeTelegram, http: aiohttp.ClientSession
) -> None:
    fake.user_writes(42, "hello")
    fake.act_then_timeout("sendMessage")
    with pytest.raises(TimeoutError):
        await call(http, fake, "sendMessage", chat_id=42, text="maybe", timeout_s=0.5)
    assert fake.bot_texts(42) == ["maybe"]  # it acted
    assert fake.calls_of("sendMessage")[-1].status is None


async def test_duplicate_next_update_delivers_one_update_twice(
    fake: FakeTelegram, http: aiohttp.ClientSession
) -> None:
    fake.user_writes(42, "once")
    fake.duplicate_next_update()
    _, answer = await call(http, fake, "getUpdates")
    ids = [u["update_id"] for u in answer["result"]]
    assert len(ids) == 2
    assert ids[0] == ids[1]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_python_telegram_bot_reads_the_fake_as_the_real_api(fake: FakeTelegram) -> None:
    """A client library written against the real API: its objects parse, its errors map."""
    telegram = pytest.importorskip("telegram")
    from telegram.error import BadRequest, InvalidToken, RetryAfter, TimedOut  # noqa: PLC0415

    fake.user_writes(42, "hello", reply_to=None)
    async with telegram.Bot(fake.token, base_url=fake.api_url) as bot:
        assert bot.username == "statecore_test_bot"
        updates = await bot.get_updates(timeout=0)
        assert updates[0].message is not None
        assert updates[0].message.text == "hello"
        assert updates[0].message.chat.type == "private"
        sent = await bot.send_message(42, "hi", reply_to_message_id=updates[0].message.message_id)
        assert sent.reply_to_message is not None
        edited = await bot.edit_message_text("hi!", chat_id=42, message_id=sent.message_id)
        assert not isinstance(edited, bool)
        assert edited.edit_date is not None
        assert await bot.send_chat_action(42, "typing") is True
        with pytest.raises(BadRequest, match=r"[Cc]hat not found"):
            await bot.send_message(1, "x")
        fake.fail_next("sendMessage", 429, retry_after=2)
        with pytest.raises(RetryAfter):
            await bot.send_message(42, "x")
        fake.act_then_timeout("sendMessage")
        with pytest.raises(TimedOut):
            await bot.send_message(42, "lost", read_timeout=0.5)
    with pytest.raises(InvalidToken):
        async with telegram.Bot("123:wrong", base_url=fake.api_url):
            pass


async def test_the_webhook_pusher_sends_the_secret_and_retries_until_a_2xx(
    fake: FakeTelegram,
) -> None:
    seen: list[tuple[str | None, int]] = []
    answers = [503, 500, 200, 200]

    async def hook(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        seen.append((request.headers.get(SECRET_HEADER), body["update_id"]))
        return web.Response(status=answers.pop(0) if answers else 200)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        first = fake.user_writes(42, "one")
        second = fake.user_writes(42, "two")
        async with aiohttp.ClientSession() as http:
            await call(
                http, fake, "setWebhook", url=f"http://127.0.0.1:{port}/hook", secret_token="s3"
            )
            async with asyncio.timeout(10):
                while fake.updates.pending:
                    await asyncio.sleep(0.05)
            _, info = await call(http, fake, "getWebhookInfo")
    finally:
        await runner.cleanup()
    ids = [first["update_id"]] * 3 + [second["update_id"]]
    assert seen == [("s3", uid) for uid in ids]
    assert info["result"]["pending_update_count"] == 0
    assert "500" in info["result"]["last_error_message"]

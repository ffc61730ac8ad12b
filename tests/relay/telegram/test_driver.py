"""The Telegram driver against the fake Bot API server, its connector side played in memory.

The cursor rule (no getUpdates confirms an update before the intake took it; the offset is
saved before the call that confirms), a restart resuming from the stored offset, hostile
updates rejected or passed over without blocking what follows, the mapping of chats, topics,
replies and edits, sends that are asked again only when Telegram certainly did not act, 429s
waited out, and a refused token.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from relay.telegram import TelegramAuthError, TelegramDriver
from relay.telegram.testing import FakeTelegram, TelegramUser
from tests.relay.notes_intake import NotesIntake, running, until

pytestmark = pytest.mark.asyncio
WAIT_S = 15.0
"""The bound of the intake's waits."""


@pytest_asyncio.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def make_driver(fake: FakeTelegram, **options: Any) -> TelegramDriver:
    options.setdefault("poll_timeout_s", 1)
    options.setdefault("chat_rate_per_s", 50.0)
    options.setdefault("send_budget_s", 5.0)
    return TelegramDriver(fake.token, api_url=fake.api_url, **options)


def polls(fake: FakeTelegram) -> int:
    return len(fake.calls_of("getUpdates"))


def offsets(fake: FakeTelegram) -> list[int]:
    """The offset of every getUpdates call, in order (0: none given)."""
    return [int(call.params.get("offset") or 0) for call in fake.calls_of("getUpdates")]


async def test_a_person_writes_and_the_driver_takes_it_then_confirms_it(
    fake: FakeTelegram,
) -> None:
    notes = NotesIntake(lambda: polls(fake), wait_s=WAIT_S)
    async with running(make_driver(fake), notes) as driver:
        update = fake.user_writes(42, "hello <b>bot</b>")
        await notes.wait_for(1)
        await until(lambda: not fake.updates.pending, "the update confirmed")
    (event,) = notes.events
    uid = update["update_id"]
    assert event.text == "hello <b>bot</b>"
    assert event.message_id == f"42:{update['message']['message_id']}"
    assert (event.source.chat_id, event.source.chat_type, event.source.user_id) == (
        "42",
        "dm",
        "42",
    )
    assert event.source.user_name == "person42"
    assert notes.notes[("telegram", "offset")] == str(uid + 1)
    assert driver.offset == uid + 1
    # No getUpdates before the intake returned asked past the update: the calls up to then
    # all had offsets at most its id.
    before = offsets(fake)[: notes.taken_after_calls[0]]
    assert all(offset <= uid for offset in before)
    assert uid + 1 in offsets(fake)


async def test_the_offset_stays_while_the_intake_refuses_and_moves_once_it_takes(
    fake: FakeTelegram,
) -> None:
    notes = NotesIntake(lambda: polls(fake), wait_s=WAIT_S)
    notes.refuse = 3
    async with running(make_driver(fake), notes) as driver:
        first = fake.user_writes(42, "one")
        await notes.wait_for(1, timeout_s=30)
        second = fake.user_writes(42, "two")
        await notes.wait_for(2)
        await until(lambda: driver.offset == second["update_id"] + 1, "the offset moved")
    assert notes.refused == 3
    assert notes.texts() == ["one", "two"]
    taken_at = notes.taken_after_calls[0]
    assert all(offset <= first["update_id"] for offset in offsets(fake)[:taken_at])
    assert driver.failed_rounds >= 3


async def test_a_restart_resumes_from_the_stored_offset_and_hands_nothing_over_twice(
    fake: FakeTelegram,
) -> None:
    notes = NotesIntake(lambda: polls(fake), wait_s=WAIT_S)
    async with running(make_driver(fake), notes):
        fake.user_writes(42, "before")
        await notes.wait_for(1)
        await until(lambda: ("telegram", "offset") in notes.notes, "the offset saved")
    fake.user_writes(42, "while down")
    fake.user_writes(7, "elsewhere")
    calls_before = polls(fake)
    async with running(make_driver(fake), notes):
        await notes.wait_for(3)
        fake.user_writes(42, "after")
        await notes.wait_for(4)
    assert notes.texts() == ["before", "while down", "elsewhere", "after"]
    assert len({e.message_id for e in notes.events}) == 4
    stored_before_restart = offsets(fake)[calls_before]
    assert stored_before_restart > 0  # the new life asked from the stored offset


async def test_an_offset_not_saved_means_the_same_update_again_under_the_same_id(
    fake: FakeTelegram,
) -> None:
    notes = NotesIntake(lambda: polls(fake), wait_s=WAIT_S)
    notes.fail_saves = 1  # the store fails once, after the intake took the event
    async with running(make_driver(fake), notes) as driver:
        update = fake.user_writes(42, "once")
        await notes.wait_for(2)
        await until(lambda: driver.offset == update["update_id"] + 1, "saved at last")
    first, second = notes.events
    assert first.message_id == second.message_id  # the connector recognises the copy


async def test_hostile_updates_are_rejected_or_passed_over_and_never_block_what_follows(
    fake: FakeTelegram,
) -> None:
    notes = NotesIntake(wait_s=WAIT_S)
    fake.user_writes(42, "first")
    ann = TelegramUser(5, "Ann", "ann")
    group = fake.user_writes(-100, "group hi", user=ann, chat_type="group")
    hostile: list[object] = [
        ["not", "an", "object"],
        {"message": {"text": "no update id"}},
        {"update_id": "x", "message": {}},
        {"message": {"message_id": 3, "text": "no chat"}},
        {"message": {"message_id": 3, "chat": {"id": 42, "type": "weird"}, "text": "t"}},
        {"message": "not an object"},
        {"business_message_v9": {"text": "a kind nobody knows"}},
        {"message": {"message_id": 9, "chat": {"id": 42, "type": "private"}, "location": {}}},
        {"message": 1, "edited_message": 2},
    ]
    for raw in hostile:
        fake.push_update(raw)
    passed = [
        {"my_chat_member": {"chat": {"id": 42}, "new_chat_member": {"status": "kicked"}}},
        {"poll": {"id": "p", "question": "?"}},
        {
            "message": {
                "message_id": 10,
                "chat": {"id": -100, "type": "group", "title": "g"},
                "from": {"id": 5, "is_bot": False, "first_name": "Ann"},
                "new_chat_members": [{"id": 6}],
            }
        },
    ]
    for raw in passed:
        fake.push_update(raw)
    fake.user_edits(-100, group["message"]["message_id"], "group hi (edited)")
    fake.user_writes(42, "last")
    async with running(make_driver(fake), notes):
        await notes.wait_for(4 + len(hostile))
        await until(lambda: not fake.updates.pending, "every update confirmed")
    # Each chat in order (chats are taken side by side).
    by_chat = {
        chat: [e.text for e in notes.events if e.source.chat_id == chat] for chat in ("42", "-100")
    }
    assert by_chat == {"42": ["first", "last"], "-100": ["group hi", "group hi (edited)"]}
    said, edit = (e for e in notes.events if e.source.chat_id == "-100")
    assert edit.message_type == "edit"
    assert edit.reply_to_message_id == said.message_id
    assert edit.message_id != said.message_id
    assert said.source.chat_type == "group"
    assert said.source.chat_name == "chat -100"
    reasons = [reason for _, reason, _ in notes.rejected]
    assert len(reasons) == len(hostile)  # each once, though id-less ones come at every poll
    assert "an update that is not a JSON object" in reasons
    assert any("does not know" in r for r in reasons)
    assert any("without text" in r for r in reasons)
    assert any("without a chat id" in r for r in reasons)
    raw_texts = [raw for _, _, raw in notes.rejected]
    assert any('"no chat"' in raw for raw in raw_texts)


async def test_a_garbled_or_refused_getupdates_keeps_the_offset(fake: FakeTelegram) -> None:
    notes = NotesIntake(wait_s=WAIT_S)
    fake.malformed_next_answer("getUpdates", b"<html>502</html>")
    fake.malformed_next_answer("getUpdates", b'{"ok": true, "result": {"not": "a list"}}')
    fake.fail_next("getUpdates", 429, retry_after=1)
    fake.user_writes(42, "survives")
    began = time.monotonic()
    async with running(make_driver(fake), notes) as driver:
        await notes.wait_for(1, timeout_s=30)
    assert notes.texts() == ["survives"]
    assert driver.failed_rounds == 3
    assert time.monotonic() - began >= 1.0  # the 429's retry_after was waited out


async def test_topics_replies_edits_and_typing_go_where_they_belong(fake: FakeTelegram) -> None:
    notes = NotesIntake(wait_s=WAIT_S)
    ann = TelegramUser(5, "Ann", "ann")
    async with running(make_driver(fake), notes) as driver:
        asked = fake.user_writes(
            -1001, "in a topic", user=ann, chat_type="supergroup", forum=True, thread_id=77
        )
        await notes.wait_for(1)
        (event,) = notes.events
        assert (event.source.chat_type, event.source.thread_id) == ("forum", "77")
        assert event.reply_to_message_id is None  # the topic's own root is no reply
        action = {
            "op": "send",
            "chat_id": event.source.chat_id,
            "content": "answer",
            "thread_id": event.source.thread_id,
            "reply_to": event.message_id,
        }
        sent = await driver.perform(action)
        assert sent.success
        assert sent.message_id == f"-1001:{asked['message']['message_id'] + 1}"
        typing = await driver.perform({"op": "typing", "chat_id": "-1001", "thread_id": "77"})
        assert typing.success
        edited = await driver.perform(
            {"op": "edit", "chat_id": "-1001", "message_id": sent.message_id, "content": "new"}
        )
        assert (edited.success, edited.message_id) == (True, sent.message_id)
        same = await driver.perform(
            {"op": "edit", "chat_id": "-1001", "message_id": sent.message_id, "content": "new"}
        )
        assert same.success  # "message is not modified" is the edit done already
    bot = [m for m in fake.chat(-1001) if m.from_bot]
    assert [(m.text, m.thread_id, m.reply_to, m.edited) for m in bot] == [
        ("new", 77, asked["message"]["message_id"], True)
    ]
    assert [(a.action, a.thread_id) for a in fake.actions(-1001)] == [("typing", 77)]


async def test_refusals_come_back_with_codes_and_the_limit_counts_utf16(
    fake: FakeTelegram,
) -> None:
    notes = NotesIntake(wait_s=WAIT_S)
    fake.user_writes(42, "hello")
    fake.user_writes(43, "hello")
    async with running(make_driver(fake), notes) as driver:
        assert driver.descriptor().len_unit == "utf16"
        assert driver.descriptor().max_message_length == 4096
        assert "idempotent_sends" not in driver.descriptor().features
        ok = await driver.perform({"op": "send", "chat_id": "42", "content": "😀" * 2048})
        assert ok.success
        long = await driver.perform({"op": "send", "chat_id": "42", "content": "😀" * 2049})
        assert (long.success, long.code) == (False, "too_long")
        missing = await driver.perform({"op": "send", "chat_id": "999", "content": "x"})
        assert (missing.success, missing.code) == (False, "not_found")
        gone = await driver.perform(
            {"op": "edit", "chat_id": "42", "message_id": "42:900", "content": "x"}
        )
        assert gone.code == "not_found"
        bad = await driver.perform({"op": "send", "chat_id": "general", "content": "x"})
        assert bad.code == "bad_action"
        odd = await driver.perform({"op": "react", "chat_id": "42", "content": "x"})
        assert odd.code == "unsupported_op"
        fake.block(43)
        blocked = await driver.perform({"op": "send", "chat_id": "43", "content": "x"})
        assert (blocked.code, "blocked" in (blocked.error or "")) == ("forbidden", True)
    assert fake.bot_texts(42) == ["😀" * 2048]


async def test_a_send_that_may_have_reached_telegram_is_never_asked_again(
    fake: FakeTelegram,
) -> None:
    fake.user_writes(42, "hello")
    driver = make_driver(fake, request_timeout_s=0.5)
    async with running(driver, NotesIntake(wait_s=WAIT_S)):
        fake.act_then_timeout("sendMessage")
        lost = await driver.perform({"op": "send", "chat_id": "42", "content": "maybe"})
        fake.fail_next("sendMessage", 502)
        failed = await driver.perform({"op": "send", "chat_id": "42", "content": "five oh two"})
    assert (lost.success, lost.code) == (False, "platform_down")
    assert "may have been sent" in (lost.error or "")
    assert (failed.success, failed.code) == (False, "platform_down")
    assert fake.bot_texts(42) == ["maybe"]  # sent once, and not asked again
    assert len(fake.calls_of("sendMessage")) == 2
    assert driver.ambiguous == 2


async def test_a_429_is_waited_out_and_the_send_lands_once(fake: FakeTelegram) -> None:
    fake.user_writes(42, "hello")
    async with running(make_driver(fake), NotesIntake(wait_s=WAIT_S)) as driver:
        fake.fail_next("sendMessage", 429, retry_after=1, times=2)
        began = time.monotonic()
        sent = await driver.perform({"op": "send", "chat_id": "42", "content": "patient"})
        waited = time.monotonic() - began
        fake.fail_next("sendMessage", 429, retry_after=30)
        given_up = await driver.perform({"op": "send", "chat_id": "42", "content": "too long"})
    assert sent.success
    assert waited >= 2.0
    assert driver.rate_limited == 3
    assert (given_up.success, given_up.code) == (False, "rate_limited")
    assert fake.bot_texts(42) == ["patient"]


async def test_a_refused_token_is_a_clear_error_and_an_unreachable_api_is_retried(
    fake: FakeTelegram,
) -> None:
    wrong = TelegramDriver("123:wrong", api_url=fake.api_url)
    wrong.attach(NotesIntake())
    with pytest.raises(TelegramAuthError, match="telegram: the Bot API refuses the bot's token"):
        await wrong.start()
    await wrong.stop()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    notes = NotesIntake(wait_s=WAIT_S)
    away = TelegramDriver(fake.token, api_url=f"http://127.0.0.1:{dead}/bot", send_budget_s=1.0)
    async with running(away, notes):
        await until(lambda: away.failed_rounds >= 1, "a failed round")
        down = await away.perform({"op": "send", "chat_id": "42", "content": "x"})
    assert (down.success, down.code) == (False, "platform_down")
    assert "cannot connect" in (down.error or "")
    assert notes.saves == []
    notes = NotesIntake(wait_s=WAIT_S)
    fake.user_writes(42, "hello")
    async with running(make_driver(fake), notes) as driver:
        await notes.wait_for(1)
        fake.revoke_token()
        revoked = await driver.perform({"op": "send", "chat_id": "42", "content": "x"})
    assert revoked.code == "auth"
    assert fake.token not in (revoked.error or "")


async def test_drop_pending_on_first_start_confirms_the_backlog_without_taking_it(
    fake: FakeTelegram,
) -> None:
    fake.user_writes(42, "old")
    notes = NotesIntake(wait_s=WAIT_S)
    async with running(make_driver(fake, drop_pending_on_first_start=True), notes):
        await until(lambda: ("telegram", "offset") in notes.notes, "the offset saved")
        fake.user_writes(42, "new")
        await notes.wait_for(1)
        await asyncio.sleep(0.2)
    assert notes.texts() == ["new"]


async def test_options_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValueError, match="bot token"):
        TelegramDriver("no-colon")
    with pytest.raises(ValueError, match="webhook_url"):
        TelegramDriver("1:a", mode="webhook")
    with pytest.raises(ValueError, match="webhook_secret"):
        TelegramDriver("1:a", mode="webhook", webhook_url="https://x/y", webhook_secret="a b")
    with pytest.raises(ValueError, match="poll_timeout_s"):
        TelegramDriver("1:a", poll_timeout_s=500)
    with pytest.raises(TypeError, match="DriverIntake"):
        TelegramDriver("1:a").attach(lambda platform, event: asyncio.sleep(0))  # type: ignore[arg-type,return-value]

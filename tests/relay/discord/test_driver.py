"""The Discord driver against the fake Discord (real sockets on loopback), its connector side
played in memory (tests/relay/notes_intake.py).

Inbound: what a person writes is mapped (DMs, guild channels, threads, replies, edits), the
bot's own messages are passed over, the seq moves only after the intake returned, a restarted
driver resumes its session from the stored seq and gets what it missed, a zombied, dropped or
invalidated connection loses nothing the platform still has, duplicate and malformed dispatches
never block what follows.  Outbound: the nonce makes a resend one message, rate limits are
honoured from the headers and from 429s, refusals are typed.  Bad tokens are a clear error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from relay.discord import DiscordAuthError, DiscordDriver
from relay.discord.driver import nonce_of
from relay.discord.testing import SEND_ROUTE, FakeDiscord
from tests.relay import notes_intake
from tests.relay.notes_intake import NotesIntake, until

pytestmark = pytest.mark.asyncio
BOUND_S = 15.0


@pytest_asyncio.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(heartbeat_interval_ms=600, route_limit=(50, 1.0)) as server:
        yield server


def make_driver(fake: FakeDiscord, **options: Any) -> DiscordDriver:
    options.setdefault("invalid_session_wait_s", (0.05, 0.1))
    options.setdefault("send_budget_s", 5.0)
    return DiscordDriver(options.pop("token", fake.token), api_base=fake.api_base, **options)


@contextlib.asynccontextmanager
async def running(driver: DiscordDriver, notes: NotesIntake) -> AsyncIterator[DiscordDriver]:
    async with notes_intake.running(driver, notes):
        await until(driver.gateway.connected.is_set, "a live gateway session", BOUND_S)
        yield driver


def stored_seq(notes: NotesIntake) -> int:
    text = notes.notes.get(("discord", "gateway_session"))
    return int(json.loads(text)["seq"]) if text else 0


async def test_messages_are_mapped_dm_guild_thread_reply_and_edit(fake: FakeDiscord) -> None:
    notes = NotesIntake()
    async with running(make_driver(fake), notes):
        dm = fake.user_writes("111", "hello <@everyone>", author="ann")
        guild = fake.user_writes("222", "in the guild", author="bob", guild_id="900")
        reply = fake.user_writes("222", "a reply", author="bob", guild_id="900", reply_to=guild.id)
        in_thread = fake.user_writes(
            "333", "in a thread", author="bob", guild_id="900", thread=True, parent_id="222"
        )
        fake.user_edits("222", guild.id, "in the guild, fixed")
        await notes.wait_for(5)
    by_text = {event.text: event for event in notes.events}
    first = by_text["hello <@everyone>"]
    assert (first.message_id, first.source.chat_id, first.source.chat_type) == (dm.id, "111", "dm")
    assert (first.source.user_id, first.source.user_name) == (fake.user_id("ann"), "ann")
    assert first.source.scope_id is None
    group = by_text["in the guild"]
    assert (group.source.chat_type, group.source.scope_id, group.source.thread_id) == (
        "group",
        "900",
        None,
    )
    assert by_text["a reply"].reply_to_message_id == guild.id
    assert by_text["a reply"].message_id == reply.id
    threaded = by_text["in a thread"]
    assert (threaded.source.chat_id, threaded.source.thread_id) == ("222", "333")
    assert threaded.message_id == in_thread.id
    edit = by_text["in the guild, fixed"]
    assert (edit.message_type, edit.reply_to_message_id) == ("edit", guild.id)
    assert edit.message_id is not None
    assert edit.message_id.startswith(f"{guild.id}:edit:")


async def test_the_bots_own_messages_are_passed_over(fake: FakeDiscord) -> None:
    notes = NotesIntake()
    async with running(make_driver(fake), notes) as driver:
        fake.user_writes("111", "hi")
        await notes.wait_for(1)
        sent = await driver.perform({"op": "send", "chat_id": "111", "content": "from the bot"})
        assert sent.success
        fake.user_writes("111", "after")
        await notes.wait_for(2)
        await until(lambda: driver.gateway.seq >= fake.gateway.sessions_seq(), "all dispatches")
    assert notes.texts() == ["hi", "after"]
    assert driver.user_id == fake.bot_id


async def test_the_seq_moves_only_after_the_intake_took_the_dispatch(fake: FakeDiscord) -> None:
    notes = NotesIntake()
    async with running(make_driver(fake), notes) as driver:
        before = stored_seq(notes)
        notes.refuse = 2  # the connector cannot take the next two offers
        message = fake.user_writes("111", "one")
        await notes.wait_for(1)
        await until(lambda: stored_seq(notes) > before, "the seq saved")
        assert driver.gateway.taken == 1
    refused = [o for o in notes.offers if o[0] == "refused"]
    assert [o[1] for o in refused] == [message.id, message.id]
    assert all(o[2] is not None and json.loads(o[2])["seq"] == before for o in refused)
    assert notes.texts() == ["one"]


async def test_a_restarted_driver_resumes_from_the_stored_seq_and_gets_what_it_missed(
    fake: FakeDiscord,
) -> None:
    notes = NotesIntake()
    async with running(make_driver(fake), notes):
        fake.user_writes("111", "before")
        await notes.wait_for(1)
        await until(lambda: stored_seq(notes) == fake.gateway.sessions_seq(), "saved")
    fake.user_writes("111", "while down 1")
    fake.user_writes("222", "while down 2", guild_id="900")
    async with running(make_driver(fake), notes) as driver:
        fake.user_writes("111", "after")
        await notes.wait_for(4)
        assert driver.gateway.resumes == 1
    assert fake.gateway.identifies == 1
    assert [r[2] for r in fake.gateway.resumes] == ["/gateway/resume"]
    assert notes.texts() == ["before", "while down 1", "while down 2", "after"]
    assert len({e.message_id for e in notes.events}) == 4


async def test_a_save_that_fails_is_asked_again_and_a_crash_before_it_replays_the_event(
    fake: FakeDiscord,
) -> None:
    notes = NotesIntake()
    async with running(make_driver(fake), notes) as driver:
        before = stored_seq(notes)
        notes.fail_saves = 1_000_000  # the store is failing: the event is taken, the seq not
        fake.user_writes("111", "taken, seq not saved")
        await notes.wait_for(1)
        await until(lambda: driver.gateway.taken == 1, "taken")
    assert stored_seq(notes) == before
    notes.fail_saves = 0
    async with running(make_driver(fake), notes):
        await notes.wait_for(2)  # Discord replays it; the connector would recognise the copy
    assert notes.texts() == ["taken, seq not saved"] * 2
    assert notes.events[0].message_id == notes.events[1].message_id


async def test_a_zombie_a_drop_and_a_reconnect_lose_nothing(fake: FakeDiscord) -> None:
    notes = NotesIntake()
    async with running(make_driver(fake), notes) as driver:
        gateway = driver.gateway
        fake.gateway.ack_heartbeats = False
        await until(lambda: gateway.zombies >= 1, "a zombie noticed")
        fake.gateway.ack_heartbeats = True
        fake.user_writes("111", "after the zombie")
        await until(lambda: gateway.resumes >= 1 and gateway.connected.is_set(), "resumed")
        fake.user_writes("111", "before the drop")
        fake.drop_gateway()
        fake.user_writes("111", "while dropped")
        await until(lambda: gateway.resumes >= 2 and gateway.connected.is_set(), "resumed")
        fake.send_reconnect()
        fake.user_writes("111", "around the reconnect")
        await notes.wait_for(4)
        await until(lambda: gateway.resumes >= 3, "resumed after op 7")
    assert fake.gateway.identifies == 1
    assert notes.texts() == [
        "after the zombie",
        "before the drop",
        "while dropped",
        "around the reconnect",
    ]


async def test_an_invalid_session_resumes_or_identifies_anew(fake: FakeDiscord) -> None:
    notes = NotesIntake()
    async with running(make_driver(fake), notes) as driver:
        gateway = driver.gateway
        fake.invalidate_session(resumable=True)
        await until(lambda: gateway.resumes >= 1 and gateway.connected.is_set(), "resumed")
        fake.user_writes("111", "one")
        await notes.wait_for(1)
        fake.invalidate_session(resumable=False)
        await until(lambda: fake.gateway.identifies == 2 and gateway.connected.is_set(), "anew")
        fake.user_writes("111", "two")
        await notes.wait_for(2)
        assert gateway.lost_sessions == 1
        fake.expire_sessions()
        fake.drop_gateway()
        await until(lambda: fake.gateway.identifies == 3 and gateway.connected.is_set(), "anew")
    assert notes.texts() == ["one", "two"]


async def test_duplicate_and_malformed_dispatches_never_block_what_follows(
    fake: FakeDiscord,
) -> None:
    notes = NotesIntake()
    async with running(make_driver(fake), notes) as driver:
        fake.duplicate_next(2)
        fake.user_writes("111", "once")
        fake.send_malformed("not_json")
        fake.send_malformed("bad_message")
        fake.send_malformed("no_op")
        fake.user_writes("111", "still taken")
        await notes.wait_for(5)
        assert driver.gateway.skipped == 2  # "once" and the bad message, each sent twice
    assert notes.texts() == ["once", "still taken"]
    reasons = [reason for _, reason, _ in notes.rejected]
    assert len(reasons) == 3
    assert any("not a JSON object" in r for r in reasons)
    assert any("without a message or channel id" in r for r in reasons)


async def test_a_resend_under_one_key_is_one_message_even_after_an_answer_never_came(
    fake: FakeDiscord,
) -> None:
    notes = NotesIntake()
    async with running(make_driver(fake), notes) as driver:
        asked = fake.user_writes("111", "hi")
        action = {"op": "send", "chat_id": "111", "content": "answer", "reply_to": asked.id}
        fake.act_then_drop()  # made, but the answer is lost: the driver asks again
        first = await driver.perform_once(action, "gw:req-1")
        again = await driver.perform_once(action, "gw:req-1")  # the relay's resend
        other = await driver.perform_once(action, "gw:req-2")
    assert first.success
    assert again.message_id == first.message_id
    assert other.message_id != first.message_id
    bot = fake.bot_messages("111")
    assert [(m.content, m.reply_to) for m in bot] == [("answer", asked.id)] * 2
    assert bot[0].nonce == nonce_of("gw:req-1")
    assert len(nonce_of("gw:req-1")) == 25
    descriptor = driver.descriptor()
    assert descriptor.announces("idempotent_sends")
    assert descriptor.idempotency_window_s == 120
    assert (descriptor.max_message_length, descriptor.len_unit) == (2000, "chars")


async def test_rate_limits_are_honoured_from_headers_and_429s(fake: FakeDiscord) -> None:
    fake.route_limit = (3, 0.5)
    notes = NotesIntake()
    async with running(make_driver(fake), notes) as driver:
        fake.user_writes("111", "hi")
        for n in range(8):
            sent = await driver.perform({"op": "send", "chat_id": "111", "content": f"m{n}"})
            assert sent.success, sent
        assert fake.limit_hits == 0  # the driver waited for the bucket's reset instead
        assert driver.api.waited >= 2
        fake.rate_limit_next(retry_after=0.3, route=SEND_ROUTE)
        fake.rate_limit_next(retry_after=0.2, is_global=True)
        sent = await driver.perform({"op": "send", "chat_id": "111", "content": "late"})
        assert sent.success
        assert driver.rate_limited == 2
        fake.rate_limit_next(retry_after=30.0, route=SEND_ROUTE)
        refused = await driver.perform({"op": "send", "chat_id": "111", "content": "never"})
    assert (refused.success, refused.code) == (False, "rate_limited")
    assert [m.content for m in fake.bot_messages("111")] == [f"m{n}" for n in range(8)] + ["late"]


async def test_edits_typing_threads_and_refusals(fake: FakeDiscord) -> None:
    notes = NotesIntake()
    async with running(make_driver(fake), notes) as driver:
        fake.user_writes("333", "in a thread", guild_id="900", thread=True, parent_id="222")
        await notes.wait_for(1)
        event = notes.events[0]
        action = {"op": "send", "chat_id": "222", "thread_id": "333", "content": "there"}
        sent = await driver.perform(action)
        assert sent.success
        edited = await driver.perform(
            {"op": "edit", "chat_id": "222", "message_id": sent.message_id, "content": "edited"}
        )
        assert (edited.success, edited.message_id) == (True, sent.message_id)
        typing = await driver.perform({"op": "typing", "chat_id": "222", "thread_id": "333"})
        assert typing.success
        too_long = await driver.perform({"op": "send", "chat_id": "222", "content": "x" * 2001})
        unknown = await driver.perform({"op": "send", "chat_id": "404", "content": "x"})
        bad = await driver.perform({"op": "send", "chat_id": "not-an-id", "content": "x"})
        nope = await driver.perform({"op": "pin", "chat_id": "222"})
        fake.forbid("222")
        forbidden = await driver.perform({"op": "send", "chat_id": "222", "content": "x"})
        fake.fail_next(3, status=502)
        flaky = await driver.perform({"op": "send", "chat_id": "333", "content": "after 502s"})
    assert event.source.thread_id == "333"
    assert [m.content for m in fake.bot_messages("333")] == ["edited", "after 502s"]
    assert fake.bot_messages("222") == []
    assert [r.route for r in fake.requests if r.route.endswith("/typing")] == [
        "POST /channels/{channel_id}/typing"
    ]
    assert [r.path for r in fake.requests if r.route.endswith("/typing")] == [
        "/channels/333/typing"
    ]
    codes = [o.code for o in (too_long, unknown, bad, nope, forbidden)]
    assert codes == ["too_long", "not_found", "bad_action", "unsupported_op", "forbidden"]
    assert flaky.success


async def test_a_wrong_token_is_a_clear_error_and_a_revoked_one_never_crashes(
    fake: FakeDiscord,
) -> None:
    wrong = make_driver(fake, token="not-the-token")
    wrong.attach(NotesIntake())
    with pytest.raises(DiscordAuthError, match="refused the bot's token"):
        await wrong.start()
    await wrong.stop()
    notes = NotesIntake()
    async with running(make_driver(fake), notes) as driver:
        fake.revoke_token()
        fake.drop_gateway()
        await until(lambda: driver.auth_failure is not None, "the refusal noticed")
        assert "4004" in str(driver.auth_failure)
        sent = await driver.perform({"op": "send", "chat_id": "111", "content": "x"})
        assert (sent.success, sent.code) == (False, "auth")


async def test_an_unreachable_api_is_retried_with_backoff_and_stops_bounded() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    driver = DiscordDriver("token", api_base=f"http://127.0.0.1:{port}/api/v10", send_budget_s=1.0)
    driver.attach(NotesIntake())
    await driver.start()  # does not raise: Discord may come back
    await until(lambda: driver.failed_connections >= 2, "retried", timeout_s=10)
    async with asyncio.timeout(12):
        await driver.stop()
    outcome = await driver.perform({"op": "send", "chat_id": "111", "content": "x"})
    await driver.stop()
    assert (outcome.success, outcome.code) == (False, "platform_down")

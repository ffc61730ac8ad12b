"""The Matrix driver against a real homeserver, its connector side played in memory.

The cursor rule (the token moves only after every event of a batch was taken), a restart
resuming from the stored token, the bot's own events passed over, the mapping of what a person
writes with a real client (threads, replies, edits, HTML, hostile content), sends under a txnId
that the server deduplicates across a restart of the driver, and the credentials' troubles.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from nio import AsyncClient

from relay.matrix._api import MatrixAuthError
from relay.matrix.driver import MatrixDriver, txn_id
from relay.matrix.testing import Homeserver, MatrixAccount, start_homeserver
from tests.relay.matrix.fault_proxy import FaultProxy
from tests.relay.notes_intake import NotesIntake, running

pytestmark = pytest.mark.asyncio

NewAccount = Callable[..., MatrixAccount]


def make_driver(account: MatrixAccount, **options: Any) -> MatrixDriver:
    options.setdefault("sync_timeout_ms", 1000)
    return MatrixDriver(account.homeserver, account.user_id, password=account.password, **options)


@contextlib.asynccontextmanager
async def person(account: MatrixAccount) -> AsyncIterator[AsyncClient]:
    """A person on a real Matrix client library."""
    client = AsyncClient(account.homeserver, account.user_id, device_id=account.device_id)
    client.access_token = account.access_token
    try:
        yield client
    finally:
        await client.close()


async def rounds(driver: MatrixDriver, more: int = 1, timeout_s: float = 20.0) -> None:
    """Until the driver saved its token ``more`` more times."""
    target = driver.rounds + more
    async with asyncio.timeout(timeout_s):
        while driver.rounds < target:
            await asyncio.sleep(0.02)


async def send(
    client: AsyncClient, room: str, content: dict[str, Any], kind: str = "m.room.message"
) -> str:
    answer = await client.room_send(room, kind, content)
    event_id = getattr(answer, "event_id", None)
    assert isinstance(event_id, str), answer
    return event_id


async def a_room_with_the_bot(
    homeserver: Homeserver, driver: MatrixDriver, who: MatrixAccount, *, direct: bool = True
) -> str:
    """``who`` creates a room and invites the bot; returns once the driver joined it."""
    room = homeserver.create_room(who, invite=[driver.user_id], is_direct=direct)
    async with asyncio.timeout(20):
        while room not in joined_rooms(homeserver, driver):
            await asyncio.sleep(0.05)
    await rounds(driver)
    return room


def as_driver(homeserver: Homeserver, driver: MatrixDriver) -> MatrixAccount:
    """The driver's own session (its device and token), for reading what it did."""
    token = driver._api.token or ""
    return MatrixAccount(driver.user_id, "", token, driver.device_id or "", homeserver.url)


def joined_rooms(homeserver: Homeserver, driver: MatrixDriver) -> set[str]:
    answer = homeserver.request(
        "GET", "/_matrix/client/v3/joined_rooms", account=as_driver(homeserver, driver)
    )
    return set(answer.get("joined_rooms", []))


Scene = tuple[MatrixAccount, MatrixAccount, NotesIntake, MatrixDriver, str]
"""The bot's account, a person's, the connector side, the running driver, their room."""


@contextlib.asynccontextmanager
async def a_bot_in_a_room(
    homeserver: Homeserver, new_account: NewAccount, **options: Any
) -> AsyncIterator[Scene]:
    """A running driver for a new bot, and a room a new person made and invited it to."""
    bot, ann = new_account("bot"), new_account("ann")
    notes = NotesIntake()
    async with running(make_driver(bot, **options), notes) as driver:
        room = await a_room_with_the_bot(homeserver, driver, ann)
        yield bot, ann, notes, driver, room


async def test_a_person_writes_and_the_driver_takes_it_with_room_sender_and_dm(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    async with (
        a_bot_in_a_room(homeserver, new_account) as (_bot, ann, notes, driver, room),
        person(ann) as client,
    ):
        event_id = await send(client, room, {"msgtype": "m.text", "body": "hello <b>bot</b>"})
        await notes.wait_for(1)
    (event,) = notes.events
    assert event.text == "hello <b>bot</b>"  # as typed: no markup interpreted
    assert event.message_id == event_id
    assert event.source.chat_id == room
    assert event.source.user_id == ann.user_id
    assert event.source.chat_type == "dm"
    assert driver.device_id is not None
    assert notes.notes[("matrix", "device_id")] == driver.device_id


async def test_threads_replies_and_edits_arrive_mapped(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    bot, ann, bob = new_account("bot"), new_account("ann"), new_account("bob")
    notes = NotesIntake()
    async with running(make_driver(bot), notes) as driver, person(ann) as client:
        room = homeserver.create_room(ann, invite=[driver.user_id, bob.user_id])
        homeserver.join(bob, room)
        async with asyncio.timeout(20):
            while room not in joined_rooms(homeserver, driver):
                await asyncio.sleep(0.05)
        await rounds(driver)
        root = await send(client, room, {"msgtype": "m.text", "body": "root"})
        in_thread = {
            "msgtype": "m.text",
            "body": "in thread",
            "m.relates_to": {
                "rel_type": "m.thread",
                "event_id": root,
                "is_falling_back": True,
                "m.in_reply_to": {"event_id": root},
            },
        }
        await send(client, room, in_thread)
        reply = {
            "msgtype": "m.text",
            "body": "a reply",
            "m.relates_to": {"m.in_reply_to": {"event_id": root}},
        }
        await send(client, room, reply)
        edit = {
            "msgtype": "m.text",
            "body": "* root fixed",
            "m.new_content": {"msgtype": "m.text", "body": "root fixed"},
            "m.relates_to": {"rel_type": "m.replace", "event_id": root},
        }
        await send(client, room, edit)
        await send(client, room, {"msgtype": "m.emote", "body": "waves"})
        await notes.wait_for(5)
    by_text = {event.text: event for event in notes.events}
    assert by_text["root"].source.chat_type == "group"  # three members
    assert (by_text["in thread"].source.thread_id, by_text["in thread"].reply_to_message_id) == (
        root,
        None,
    )
    assert (by_text["a reply"].reply_to_message_id, by_text["a reply"].source.thread_id) == (
        root,
        None,
    )
    assert (by_text["root fixed"].message_type, by_text["root fixed"].reply_to_message_id) == (
        "edit",
        root,
    )
    assert by_text["waves"].message_type == "emote"


async def test_the_bots_own_events_are_passed_over(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    async with (
        a_bot_in_a_room(homeserver, new_account) as (_bot, ann, notes, driver, room),
        person(ann) as client,
    ):
        sent = await driver.perform({"op": "send", "chat_id": room, "content": "from the bot"})
        assert sent.success
        await send(client, room, {"msgtype": "m.text", "body": "after"})
        await notes.wait_for(1)
        await rounds(driver)
    assert notes.texts() == ["after"]


async def test_the_token_moves_only_after_every_event_was_taken(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    async with (
        a_bot_in_a_room(homeserver, new_account) as (_bot, ann, notes, driver, room),
        person(ann) as client,
    ):
        notes.refuse = 2  # the connector cannot take the next two offers
        await send(client, room, {"msgtype": "m.text", "body": "one"})
        await notes.wait_for(1, timeout_s=30)
        await rounds(driver)
    assert notes.texts() == ["one"]
    assert notes.refused == 2
    assert driver.failed_rounds >= 2
    # No note was saved from the first refusal until the event was taken: the token stayed.
    assert [what for what, _ in notes.log] == ["refused", "refused", "taken"]
    assert len({saved for _, saved in notes.log}) == 1
    assert notes.saves[-1][0] == "next_batch"  # and moved once it was taken


async def test_a_restarted_driver_resumes_from_its_stored_token(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    async with a_bot_in_a_room(homeserver, new_account) as (bot, ann, notes, driver, room):
        homeserver.send_text(ann, room, "before the restart")
        await notes.wait_for(1)
        await rounds(driver)
    device = driver.device_id
    homeserver.send_text(ann, room, "while it was down")  # nobody syncs now
    again = make_driver(bot)
    async with running(again, notes):
        homeserver.send_text(ann, room, "after the restart")
        await notes.wait_for(3)
        await rounds(again)
    assert notes.texts() == ["before the restart", "while it was down", "after the restart"]
    assert again.device_id == device  # the same device: its txnIds still deduplicate


async def test_a_first_start_takes_no_history_unless_asked(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    bot, ann = new_account("bot"), new_account("ann")
    room = homeserver.create_room(ann, invite=[bot.user_id], is_direct=True)
    homeserver.join(bot, room)
    homeserver.send_text(ann, room, "old news")
    quiet, eager = NotesIntake(), NotesIntake()
    async with running(make_driver(bot), quiet) as driver:
        await rounds(driver, 2)
    async with running(make_driver(bot, backlog_on_first_start=True), eager):
        await eager.wait_for(1)
    assert quiet.texts() == []
    assert eager.texts() == ["old news"]


async def test_hostile_content_is_rejected_or_taken_as_documented_and_never_blocks(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    async with (
        a_bot_in_a_room(homeserver, new_account) as (_bot, ann, notes, _driver, room),
        person(ann) as client,
    ):
        await send(
            client,
            room,
            {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "x"},
            "m.room.encrypted",
        )
        await send(client, room, {"anything": [1, 2]}, "com.example.unknown")
        await send(client, room, {"msgtype": "org.example.weird", "body": "strange"})
        await send(client, room, {"msgtype": "m.text", "body": "x" * 60_000})
        await send(
            client,
            room,
            {
                "msgtype": "m.text",
                "body": "<script>alert(1)</script>",
                "format": "org.matrix.custom.html",
                "formatted_body": "<b>hidden</b>",
            },
        )
        await send(client, room, {"msgtype": "m.text", "body": "still heard"})
        await notes.wait_for(6)
    reasons = [reason for _, reason, _ in notes.rejected]
    assert len(reasons) == 2
    assert any("encrypted" in r for r in reasons)
    assert any("unknown type" in r for r in reasons)
    assert all(raw.startswith("{") for _, _, raw in notes.rejected)  # the raw event kept
    assert notes.texts() == ["strange", "x" * 60_000, "<script>alert(1)</script>", "still heard"]


async def test_a_resend_under_the_same_key_is_one_event_even_after_a_restart(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    async with a_bot_in_a_room(homeserver, new_account) as (bot, ann, notes, driver, room):
        action = {"op": "send", "chat_id": room, "content": "the reply"}
        first = await driver.perform_once(action, "gw\x1fob-1")
        second = await driver.perform_once({**action, "content": "LABEL the reply"}, "gw\x1fob-1")
    again = make_driver(bot)
    async with running(again, notes):
        third = await again.perform_once(action, "gw\x1fob-1")
        other = await again.perform_once(action, "gw\x1fob-2")
    assert first.success
    assert first.message_id is not None
    assert second.message_id == first.message_id == third.message_id
    assert other.message_id != first.message_id
    bodies = [
        e["content"].get("body")
        for e in homeserver.messages(ann, room, event_type="m.room.message")
    ]
    assert bodies == ["the reply", "the reply"]  # ob-1 once, ob-2 once; never the label


async def test_replies_threads_edits_and_typing_reach_the_room(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    async with a_bot_in_a_room(homeserver, new_account) as (_bot, ann, _notes, driver, room):
        asked = homeserver.send_text(ann, room, "question")
        reply = await driver.perform(
            {"op": "send", "chat_id": room, "content": "**answer**", "reply_to": asked}
        )
        threaded = await driver.perform(
            {"op": "send", "chat_id": room, "content": "more", "thread_id": asked}
        )
        edited = await driver.perform(
            {"op": "edit", "chat_id": room, "message_id": reply.message_id, "content": "better"}
        )
        typing = await driver.perform({"op": "typing", "chat_id": room})
        cleared = await driver.perform({"op": "typing", "chat_id": room, "content": ""})
        follow = await driver.perform(
            {"op": "follow_up", "metadata": {"chat_id": room}, "content": "later"}
        )
    assert all(o.success for o in (reply, threaded, edited, typing, cleared, follow))
    assert edited.message_id == reply.message_id
    events = {e["event_id"]: e for e in homeserver.messages(ann, room, event_type="m.room.message")}
    first = events[str(reply.message_id)]["content"]
    assert first["m.relates_to"] == {"m.in_reply_to": {"event_id": asked}}
    assert first["formatted_body"] == "<p><strong>answer</strong></p>"
    assert events[str(threaded.message_id)]["content"]["m.relates_to"]["rel_type"] == "m.thread"
    replacing = [
        e
        for e in events.values()
        if e["content"].get("m.relates_to", {}).get("rel_type") == "m.replace"
    ]
    assert [e["content"]["m.new_content"]["body"] for e in replacing] == ["better"]
    assert any(e["content"].get("body") == "later" for e in events.values())


async def test_refusals_come_back_as_typed_outcomes(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    bot, ann, other = new_account("bot"), new_account("ann"), new_account("other")
    notes = NotesIntake()
    async with running(make_driver(bot), notes) as driver:
        room = await a_room_with_the_bot(homeserver, driver, ann)
        not_ours = homeserver.create_room(other)  # the bot was never invited
        huge = await driver.perform({"op": "send", "chat_id": room, "content": "y" * 70_000})
        outside = await driver.perform({"op": "send", "chat_id": not_ours, "content": "hi"})
        bad_room = await driver.perform({"op": "send", "chat_id": "general", "content": "hi"})
        empty = await driver.perform({"op": "send", "chat_id": room, "content": ""})
        unknown = await driver.perform({"op": "react", "chat_id": room, "content": "x"})
        bad_edit = await driver.perform(
            {"op": "edit", "chat_id": room, "message_id": "nope", "content": "x"}
        )
        gone = await driver.perform(
            {"op": "edit", "chat_id": room, "message_id": "$not-an-event", "content": "x"}
        )
    assert (huge.success, huge.code) == (False, "too_long")
    assert (outside.success, outside.code) == (False, "forbidden")
    assert (gone.success, gone.code) == (False, "not_found")
    assert [o.code for o in (bad_room, empty, unknown, bad_edit)] == [
        "bad_action",
        "bad_action",
        "unsupported_op",
        "bad_action",
    ]
    assert homeserver.messages(other, not_ours, event_type="m.room.message") == []


async def test_a_token_the_server_forgot_is_replaced_on_the_same_device(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    async with a_bot_in_a_room(homeserver, new_account) as (_bot, ann, notes, driver, room):
        device, token = driver.device_id, driver._api.token
        homeserver.request(
            "POST", "/_matrix/client/v3/logout", account=as_driver(homeserver, driver), body={}
        )
        homeserver.send_text(ann, room, "after the logout")
        await notes.wait_for(1, timeout_s=30)
        sent = await driver.perform({"op": "send", "chat_id": room, "content": "still here"})
    assert sent.success
    assert driver.device_id == device
    assert driver._api.token != token
    assert notes.notes[("matrix", "access_token")] == driver._api.token


async def test_refused_credentials_are_a_clear_error_at_start(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    bot = new_account("bot")
    driver = MatrixDriver(homeserver.url, bot.user_id, password="not the password")
    driver.attach(NotesIntake())
    with pytest.raises(MatrixAuthError, match="refused to log in"):
        await driver.start()
    await driver.stop()


async def test_an_unreachable_homeserver_is_retried_with_backoff_not_raised() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here once closed
    driver = MatrixDriver(
        f"http://127.0.0.1:{port}", "@bot:localhost", password="pw", send_budget_s=1.0
    )
    notes = NotesIntake()
    async with running(driver, notes):
        async with asyncio.timeout(10):
            while driver.failed_rounds < 2:
                await asyncio.sleep(0.05)
        outcome = await driver.perform({"op": "typing", "chat_id": "!room"})
    # No cursor and no token: only the device chosen before the first login is kept.
    assert set(notes.notes) == {("matrix", "device_id")}
    assert not outcome.success


async def test_transaction_ids_are_what_the_server_is_sent(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    async with a_bot_in_a_room(homeserver, new_account) as (_bot, _ann, _notes, driver, room):
        outcome = await driver.perform_once(
            {"op": "send", "chat_id": room, "content": "x"}, "gw\x1fk"
        )
        mine = as_driver(homeserver, driver)
        (event,) = homeserver.messages(mine, room, event_type="m.room.message")
    assert event["event_id"] == outcome.message_id
    assert event.get("unsigned", {}).get("transaction_id") == txn_id("gw\x1fk")


async def test_a_gap_in_a_limited_timeline_is_filled_in_order(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    bot, ann = new_account("bot"), new_account("ann")
    notes = NotesIntake()
    async with running(make_driver(bot, timeline_limit=2), notes) as driver:
        room = await a_room_with_the_bot(homeserver, driver, ann)
    for n in range(7):
        homeserver.send_text(ann, room, f"while down {n}")  # more than one timeline holds
    async with running(make_driver(bot, timeline_limit=2), notes):
        await notes.wait_for(7)
    assert notes.texts() == [f"while down {n}" for n in range(7)]


@pytest.mark.parametrize("fault", ["502", "malformed", "not-json", "drop"])
async def test_a_homeserver_misbehaving_mid_sync_never_moves_the_cursor_nor_loses_a_message(
    homeserver: Homeserver, new_account: NewAccount, fault: str
) -> None:
    bot, ann = new_account("bot"), new_account("ann")
    proxy = await FaultProxy(homeserver.url).start()
    notes = NotesIntake()
    try:
        driver = MatrixDriver(proxy.url, bot.user_id, password=bot.password, sync_timeout_ms=1000)
        async with running(driver, notes):
            room = await a_room_with_the_bot(homeserver, driver, ann)
            saved = len(notes.saves)
            proxy.faults = [fault, fault]
            async with asyncio.timeout(20):
                while proxy.spoiled < 1:  # the next sync was spoiled: the driver backs off
                    await asyncio.sleep(0.01)
            homeserver.send_text(ann, room, "through the trouble")  # in the second's answer
            await notes.wait_for(1, timeout_s=30)
            await rounds(driver)
    finally:
        await proxy.stop()
    assert proxy.spoiled == 2
    # (A dropped connection may be asked again at once by the HTTP client: one round.)
    assert driver.failed_rounds >= 1
    assert notes.texts() == ["through the trouble"]
    # The spoiled rounds saved nothing; the round that took the message moved the token.
    assert [name for name, _ in notes.saves[saved:]] == ["next_batch"] * (len(notes.saves) - saved)


async def test_the_servers_rate_limit_is_waited_out_and_every_send_lands_once(
    new_account: NewAccount,
) -> None:
    limits = {"rc_message": {"per_second": 4, "burst_count": 2}}
    with start_homeserver(config_overrides=limits) as limited:
        bot, ann = limited.register("bot"), limited.register("ann")
        notes = NotesIntake()
        async with running(make_driver(bot), notes) as driver:
            room = await a_room_with_the_bot(limited, driver, ann)
            outcomes = [
                await driver.perform_once(
                    {"op": "send", "chat_id": room, "content": f"n{n}"}, f"gw\x1fk{n}"
                )
                for n in range(8)
            ]
        bodies = [
            e["content"]["body"]
            for e in limited.messages(ann, room, event_type="m.room.message")
            if e["sender"] == bot.user_id
        ]
    assert all(o.success for o in outcomes)
    assert driver.rate_limited >= 1  # the server did say M_LIMIT_EXCEEDED
    assert bodies == [f"n{n}" for n in range(8)]


async def test_a_room_someone_joins_turns_from_direct_to_group(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    bot, ann, bob = new_account("bot"), new_account("ann"), new_account("bob")
    notes = NotesIntake()
    async with running(make_driver(bot), notes) as driver:
        room = await a_room_with_the_bot(homeserver, driver, ann, direct=False)
        homeserver.send_text(ann, room, "two of us")
        await notes.wait_for(1)
        homeserver.invite(ann, room, bob.user_id)
        homeserver.join(bob, room)
        homeserver.send_text(bob, room, "three of us")
        await notes.wait_for(2)
    assert [(e.text, e.source.chat_type) for e in notes.events] == [
        ("two of us", "dm"),
        ("three of us", "group"),
    ]


async def test_without_auto_join_an_invitation_is_left_alone(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    bot, ann = new_account("bot"), new_account("ann")
    notes = NotesIntake()
    async with running(make_driver(bot, auto_join=False), notes) as driver:
        room = homeserver.create_room(ann, invite=[bot.user_id])
        await rounds(driver, 2)
        assert room not in joined_rooms(homeserver, driver)
        homeserver.send_text(ann, room, "not for you yet")
        await rounds(driver, 2)
    assert notes.texts() == []

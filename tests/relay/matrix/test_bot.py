"""A bot on a real homeserver, the whole way: a person on a real Matrix client writes, the
connector's Matrix driver takes it, the gateway's handler answers, the reply is in the room.

The right room, thread and reply; two rooms and two people kept apart; a room the bot was never
invited to gets nothing; a message written while no gateway listens waits for one; a restarted
connector resumes from its stored token and hands nothing over twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from nio import AsyncClient

from relay.matrix import MatrixDriver
from relay.matrix.testing import Homeserver, MatrixAccount
from tests.relay.notes_intake import until_within
from tests.relay.relay_bot import RelayBot, started

pytestmark = pytest.mark.asyncio

NewAccount = Callable[..., MatrixAccount]
SECRET = "matrix-test-secret"
BOUND_S = 30.0


class Bot(RelayBot[MatrixDriver]):
    """A connector with the Matrix driver and a gateway answering ``echo: <text>``, each on its
    own SQLite file under ``data``; what the handler saw is in ``seen``."""

    def __init__(self, data: Path, account: MatrixAccount) -> None:
        super().__init__(data, "matrix", SECRET)
        self.account = account

    def make_driver(self) -> MatrixDriver:
        return MatrixDriver(
            self.account.homeserver,
            self.account.user_id,
            password=self.account.password,
            sync_timeout_ms=1000,
        )


@contextlib.asynccontextmanager
async def a_bot(
    tmp_path: Path, account: MatrixAccount, *, gateway: bool = True
) -> AsyncIterator[Bot]:
    async with started(Bot(tmp_path, account), gateway=gateway) as bot:
        yield bot


@contextlib.asynccontextmanager
async def person(account: MatrixAccount) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(account.homeserver, account.user_id, device_id=account.device_id)
    client.access_token = account.access_token
    try:
        yield client
    finally:
        await client.close()


async def write(client: AsyncClient, room: str, content: dict[str, Any]) -> str:
    answer = await client.room_send(room, "m.room.message", content)
    event_id = getattr(answer, "event_id", None)
    assert isinstance(event_id, str), answer
    return event_id


def bot_events(
    homeserver: Homeserver, reader: MatrixAccount, room: str, bot: str
) -> list[dict[str, Any]]:
    """The bot's messages in ``room``, read back from the server."""
    events = homeserver.messages(reader, room, event_type="m.room.message")
    return [e for e in events if e["sender"] == bot]


until = until_within(BOUND_S, poll_s=0.05)


async def room_with(homeserver: Homeserver, bot: Bot, who: MatrixAccount, **options: Any) -> str:
    """``who`` makes a room and invites the bot; returns once the bot is in it."""
    room = homeserver.create_room(who, invite=[bot.account.user_id], **options)
    await until(
        lambda: any(
            e.get("state_key") == bot.account.user_id and e["content"].get("membership") == "join"
            for e in homeserver.messages(who, room, event_type="m.room.member")
        ),
        "the bot joined",
    )
    return room


async def test_a_person_writes_and_the_bot_answers_in_the_room_as_a_reply_and_in_the_thread(
    tmp_path: Path, homeserver: Homeserver, new_account: NewAccount
) -> None:
    account, ann = new_account("bot"), new_account("ann")
    async with a_bot(tmp_path, account) as bot, person(ann) as client:
        room = await room_with(homeserver, bot, ann, is_direct=True)
        asked = await write(client, room, {"msgtype": "m.text", "body": "hello"})
        root = await write(client, room, {"msgtype": "m.text", "body": "thread root"})
        in_thread = {
            "msgtype": "m.text",
            "body": "in the thread",
            "m.relates_to": {
                "rel_type": "m.thread",
                "event_id": root,
                "is_falling_back": True,
                "m.in_reply_to": {"event_id": root},
            },
        }
        threaded = await write(client, room, in_thread)
        await until(
            lambda: len(bot_events(homeserver, ann, room, account.user_id)) == 3, "three answers"
        )
    answers = {
        e["content"]["body"]: e["content"]
        for e in bot_events(homeserver, ann, room, account.user_id)
    }
    assert answers["echo: hello"]["m.relates_to"] == {"m.in_reply_to": {"event_id": asked}}
    thread_answer = answers["echo: in the thread"]["m.relates_to"]
    assert (thread_answer["rel_type"], thread_answer["event_id"]) == ("m.thread", root)
    assert thread_answer["m.in_reply_to"] == {"event_id": threaded}
    assert bot.seen == ["hello", "thread root", "in the thread"]


async def test_two_rooms_and_two_people_stay_apart_and_an_uninvited_room_gets_nothing(
    tmp_path: Path, homeserver: Homeserver, new_account: NewAccount
) -> None:
    account, ann, bob, eve = (
        new_account("bot"),
        new_account("ann"),
        new_account("bob"),
        new_account("eve"),
    )
    async with (
        a_bot(tmp_path, account) as bot,
        person(ann) as a,
        person(bob) as b,
        person(eve) as e,
    ):
        room_a = await room_with(homeserver, bot, ann, is_direct=True)
        room_b = await room_with(homeserver, bot, bob)
        elsewhere = homeserver.create_room(eve)  # the bot was never invited
        for n in range(3):
            await write(a, room_a, {"msgtype": "m.text", "body": f"ann {n}"})
            await write(b, room_b, {"msgtype": "m.text", "body": f"bob {n}"})
            await write(e, elsewhere, {"msgtype": "m.text", "body": f"eve {n}"})
        await until(
            lambda: (
                len(bot_events(homeserver, ann, room_a, account.user_id)) == 3
                and len(bot_events(homeserver, bob, room_b, account.user_id)) == 3
            ),
            "three answers in each room",
        )
        assert bot.gateway is not None
        # The gateway may not address a room the platform never showed it (egress guard).
        refused = await bot.gateway.send_final(
            session_key="probe",
            platform="matrix",
            chat_id=elsewhere,
            content="intruding",
            message_ref="p",
        )
    assert not refused.success
    texts_a = [ev["content"]["body"] for ev in bot_events(homeserver, ann, room_a, account.user_id)]
    texts_b = [ev["content"]["body"] for ev in bot_events(homeserver, bob, room_b, account.user_id)]
    assert texts_a == [f"echo: ann {n}" for n in range(3)]
    assert texts_b == [f"echo: bob {n}" for n in range(3)]
    assert bot_events(homeserver, eve, elsewhere, account.user_id) == []
    assert not any("eve" in text for text in bot.seen)


async def test_a_message_written_while_no_gateway_listens_waits_for_one(
    tmp_path: Path, homeserver: Homeserver, new_account: NewAccount
) -> None:
    account, ann = new_account("bot"), new_account("ann")
    async with a_bot(tmp_path, account, gateway=False) as bot, person(ann) as client:
        room = await room_with(homeserver, bot, ann, is_direct=True)
        await write(client, room, {"msgtype": "m.text", "body": "anyone there?"})
        assert bot.connector is not None
        connector = bot.connector
        await until(lambda: connector.held("matrix") == 1, "the event held")
        await bot.start_gateway()
        await until(
            lambda: len(bot_events(homeserver, ann, room, account.user_id)) == 1, "the answer"
        )
        await until(lambda: connector.held("matrix") == 0, "released")
    assert bot.seen == ["anyone there?"]


async def test_a_restarted_connector_resumes_from_its_token_and_hands_nothing_over_twice(
    tmp_path: Path, homeserver: Homeserver, new_account: NewAccount
) -> None:
    account, ann = new_account("bot"), new_account("ann")
    async with a_bot(tmp_path, account) as bot, person(ann) as client:
        room = await room_with(homeserver, bot, ann, is_direct=True)
        await write(client, room, {"msgtype": "m.text", "body": "before"})
        await until(lambda: bot.seen == ["before"], "the first answer's turn")
        await until(
            lambda: len(bot_events(homeserver, ann, room, account.user_id)) == 1, "answered"
        )
        assert bot.driver is not None
        device = bot.driver.device_id
        await bot.stop_connector()
        await write(client, room, {"msgtype": "m.text", "body": "while the connector was down"})
        await bot.start_connector()
        await write(client, room, {"msgtype": "m.text", "body": "after"})
        await until(
            lambda: len(bot_events(homeserver, ann, room, account.user_id)) == 3, "all answered"
        )
        assert bot.driver.device_id == device
    assert bot.seen == ["before", "while the connector was down", "after"]
    bodies = [e["content"]["body"] for e in bot_events(homeserver, ann, room, account.user_id)]
    assert bodies == ["echo: before", "echo: while the connector was down", "echo: after"]

"""The Telegram driver in webhook mode, with the fake server pushing updates to it.

A 2xx only once the intake took the update (a full intake is a 503, and the server sends it
again); the secret header checked; what is not an update refused with a 400 and recorded; a
body over the bound refused; a delivery repeated after a lost answer is the same event id.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from relay.telegram import TelegramDriver
from relay.telegram.testing import SECRET_HEADER, FakeTelegram
from tests.relay.notes_intake import NotesIntake, running, until

pytestmark = pytest.mark.asyncio
WAIT_S = 15.0
"""The bound of the intake's waits."""

SECRET = "the-webhook-secret_1"


@pytest_asyncio.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(webhook_retry_s=0.05) as server:
        yield server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def webhook_driver(fake: FakeTelegram, **options: Any) -> TelegramDriver:
    port = free_port()
    return TelegramDriver(
        fake.token,
        api_url=fake.api_url,
        mode="webhook",
        webhook_url=f"http://127.0.0.1:{port}/telegram",
        webhook_port=port,
        webhook_secret=SECRET,
        **options,
    )


def statuses(fake: FakeTelegram) -> list[int | None]:
    return [d.status for d in fake.updates.deliveries]


async def test_updates_are_answered_200_only_once_the_intake_took_them(fake: FakeTelegram) -> None:
    notes = NotesIntake(wait_s=WAIT_S)
    notes.refuse = 2
    notes.break_takes = 1
    async with running(webhook_driver(fake), notes) as driver:
        await until(lambda: fake.updates.webhook is not None, "the webhook set")
        update = fake.user_writes(42, "over the hook")
        await notes.wait_for(1)
        await until(lambda: not fake.updates.pending, "confirmed by a 2xx")
        assert statuses(fake) == [503, 503, 500, 200]
        fake.duplicate_next_update()
        fake.user_writes(42, "twice")
        await notes.wait_for(3)
        await until(lambda: not fake.updates.pending, "confirmed again")
    assert fake.updates.webhook is not None  # left set: Telegram keeps updates for next time
    assert notes.texts() == ["over the hook", "twice", "twice"]
    assert notes.events[0].message_id == f"42:{update['message']['message_id']}"
    assert notes.events[1].message_id == notes.events[2].message_id  # one key: one event
    assert (driver.webhook.answers[503], driver.webhook.answers[500]) == (2, 1)
    setting = fake.calls_of("setWebhook")[0].params
    assert (setting["secret_token"], setting["drop_pending_updates"]) == (SECRET, False)
    assert setting["allowed_updates"] == [
        "message",
        "edited_message",
        "channel_post",
        "edited_channel_post",
    ]


async def test_a_wrong_secret_a_malformed_body_and_an_oversized_one_are_refused(
    fake: FakeTelegram,
) -> None:
    notes = NotesIntake(wait_s=WAIT_S)
    driver = webhook_driver(fake, max_body_bytes=2048)
    async with running(driver, notes), aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{driver.webhook.port}/telegram"
        good = {SECRET_HEADER: SECRET}
        update = {
            "update_id": 5,
            "message": {"message_id": 1, "chat": {"id": 9, "type": "private"}, "text": "x"},
        }

        async def post(body: bytes, headers: dict[str, str]) -> int:
            async with http.post(url, data=body, headers=headers) as response:
                return response.status

        forged = await post(b'{"update_id": 1}', {SECRET_HEADER: "guess"})
        unsigned = await post(b'{"update_id": 1}', {})
        async with http.get(url, headers=good) as response:
            wrong_method = response.status
        garbage = await post(b"{not json", good)
        no_id = await post(b'{"message": {}}', good)
        big = await post(b'{"update_id": 2, "pad": "' + b"x" * 4096 + b'"}', good)
        fine = await post(json.dumps(update).encode(), good)
    assert (forged, unsigned, wrong_method) == (401, 401, 405)
    assert (garbage, no_id, big) == (400, 400, 413)
    assert fine == 200
    assert notes.texts() == ["x"]
    assert [reason for _, reason, _ in notes.rejected] == [
        "a webhook body that is not an update",
        "a webhook body that is not an update",
    ]
    assert notes.rejected[0][2] == "{not json"

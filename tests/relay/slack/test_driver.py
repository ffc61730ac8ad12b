"""The Slack driver against the fake Slack, with an in-memory connector side: an envelope is
acked only after the intake took it and within the window (else Slack's retry brings it
again), refreshes open the new connection before the old one closes, several connections,
hostile frames rejected without blocking, subtypes mapped or passed over, the bot's own
messages ignored, outbound sends, threads, edits, 429s honoured, ambiguous sends never repeated
silently, refused tokens a clear error, the Events API's signatures, replays and retries."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from relay.slack import SlackAuthError, SlackDriver
from relay.slack.testing import FakeSlack, sign
from tests.relay.notes_intake import NotesIntake, until_within

pytestmark = pytest.mark.asyncio

ACK_BUDGET_S = 0.6
BOUND_S = 10.0
"""The bound of every wait."""


@pytest_asyncio.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    server = FakeSlack(ack_timeout_s=1.0, retry_delays_s=(0.1, 0.2, 0.3), refresh_grace_s=1.0)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def socket_driver(fake: FakeSlack, **options: object) -> SlackDriver:
    return SlackDriver(
        fake.bot_token,
        app_token=fake.app_token,
        api_url=fake.api_url,
        ack_budget_s=ACK_BUDGET_S,
        **options,  # type: ignore[arg-type]
    )


@pytest_asyncio.fixture
async def running(fake: FakeSlack) -> AsyncIterator[tuple[SlackDriver, NotesIntake]]:
    driver, intake = socket_driver(fake), NotesIntake(wait_s=BOUND_S)
    driver.attach(intake)
    await driver.start()
    try:
        await until(lambda: bool(fake.delivery.open_sockets()), "a connection")
        yield driver, intake
    finally:
        await driver.stop()


until = until_within(BOUND_S)


async def test_a_message_is_taken_with_its_ids_and_acked_once_and_the_bots_own_is_passed_over(
    fake: FakeSlack, running: tuple[SlackDriver, NotesIntake]
) -> None:
    driver, intake = running
    ts = fake.user_writes("D1", "hello", user="U1")
    await intake.wait_for(1)
    event = intake.events[0]
    assert (event.message_id, event.text, event.message_type) == (f"D1:{ts}", "hello", "text")
    source = event.source
    assert (source.chat_id, source.chat_type, source.user_id) == ("D1", "dm", "U1")
    assert (source.scope_id, source.thread_id, source.platform) == ("T0FAKE", None, "slack")
    outcome = await driver.perform({"op": "send", "chat_id": "D1", "content": "hi"})
    assert outcome.success
    await fake.settled()
    assert [e.message_id for e in intake.events] == [f"D1:{ts}"]  # its own echo passed over
    assert sum(fake.delivery.acked.values()) == 2  # the person's and the bot's own event
    assert fake.delivery.given_up == []
    assert fake.delivery.late_acks == 0
    # On one connection, a channel's events reach the intake in order, even a slow intake.
    intake.delay_s = 0.05
    for n in range(5):
        fake.user_writes("D1", f"n{n}")
    await intake.wait_for(6)
    assert intake.texts()[1:] == [f"n{n}" for n in range(5)]


async def test_an_event_the_intake_refuses_is_not_acked_and_slacks_retry_brings_it_again(
    fake: FakeSlack, running: tuple[SlackDriver, NotesIntake]
) -> None:
    driver, intake = running
    intake.refuse = 2
    fake.user_writes("C1", "refused twice", channel_type="channel")
    await intake.wait_for(1)
    await fake.settled()
    attempts = [(d.attempt, d.outcome) for d in fake.delivery.deliveries]
    assert attempts == [(0, "no_ack"), (1, "no_ack"), (2, "acked")]
    assert intake.texts() == ["refused twice"]
    assert driver.unacked == 2


async def test_an_intake_slower_than_the_window_is_never_acked_late(
    fake: FakeSlack, running: tuple[SlackDriver, NotesIntake]
) -> None:
    _, intake = running
    intake.delay_s = ACK_BUDGET_S + 0.2
    fake.user_writes("D1", "slow")
    await until(lambda: len(fake.delivery.deliveries) >= 1, "the first attempt's end")
    intake.delay_s = 0.0
    await fake.settled()
    assert [d.outcome for d in fake.delivery.deliveries] == ["no_ack", "acked"]
    assert fake.delivery.late_acks == 0
    # Both copies reached the intake (the real connector keeps one by the message id).
    assert len({e.message_id for e in intake.events}) == 1


async def test_a_refresh_opens_the_new_connection_first_and_acks_on_the_old_one(
    fake: FakeSlack, running: tuple[SlackDriver, NotesIntake]
) -> None:
    _, intake = running
    intake.delay_s = 0.3
    fake.user_writes("D1", "during the refresh")
    await until(lambda: fake.delivery.in_flight == 1 and not intake.events, "in the intake")
    await asyncio.sleep(0.05)
    old = fake.sockets[0]
    await fake.disconnect("refresh_requested", close_after_s=1.0)
    await until(lambda: len(fake.delivery.open_sockets()) == 1, "a new connection")
    assert not old.ws.closed  # the new one is open before the old one closes
    await fake.settled()
    assert [(d.via, d.outcome) for d in fake.delivery.deliveries] == [("socket:1", "acked")]
    fake.user_writes("D1", "after")
    await intake.wait_for(2)
    await fake.settled()
    assert fake.delivery.deliveries[-1].via == "socket:2"
    assert running[0].socket is not None
    assert running[0].socket.disconnects == ["refresh_requested"]


async def test_several_connections_take_events_from_any_and_a_duplicate_is_offered_twice(
    fake: FakeSlack,
) -> None:
    driver, intake = socket_driver(fake, connections=3), NotesIntake(wait_s=BOUND_S)
    driver.attach(intake)
    await driver.start()
    try:
        await until(lambda: len(fake.delivery.open_sockets()) == 3, "three connections")
        for n in range(6):
            fake.user_writes(f"C{n % 2}", f"m{n}", channel_type="channel")
        fake.duplicate_next()
        twice = fake.user_writes("C0", "twice", channel_type="channel")
        await intake.wait_for(8)
        await fake.settled()
        assert {d.via for d in fake.delivery.deliveries} == {"socket:1", "socket:2", "socket:3"}
        assert all(d.outcome == "acked" for d in fake.delivery.deliveries)
        assert [e.message_id for e in intake.events].count(f"C0:{twice}") == 2
        # Slack promises no order across connections.
        assert sorted(intake.texts()) == sorted([f"m{n}" for n in range(6)] + ["twice"] * 2)
    finally:
        await driver.stop()


async def test_hostile_frames_and_events_are_rejected_with_a_reason_and_never_block(
    fake: FakeSlack, running: tuple[SlackDriver, NotesIntake]
) -> None:
    _, intake = running
    await fake.send_raw("not json {")
    await fake.send_raw(json.dumps({"type": "events_api", "payload": {}}))
    fake.push_event("an event that is a string")
    fake.push_event({"type": "message", "channel": "C1", "user": "U1", "text": "no ts"})
    fake.push_event({"type": "message", "subtype": "weird", "channel": "C1", "ts": "1.2"})
    fake.push_payload({"type": "event_callback"}, event_id="Ev-no-event")
    fake.push_event({"type": "message", "channel": "C1", "user": "U1", "ts": "1.2", "text": 5})
    fake.user_writes("D1", "still answered")
    await intake.wait_for(8)
    await fake.settled()
    reasons = [reason for _, reason, _ in intake.rejected]
    assert "a Socket Mode frame that is not JSON" in reasons
    assert "an events_api envelope without an envelope_id" in reasons
    assert "an event callback without an event object" in reasons
    assert "a message without a ts, a user or a text" in reasons
    assert "a message of unknown subtype 'weird'" in reasons
    assert len(intake.rejected) == 7
    assert any(raw == "not json {" for _, _, raw in intake.rejected)
    assert intake.texts() == ["still answered"]
    assert fake.delivery.given_up == []  # every envelope with an id was acked


async def test_subtypes_edits_threads_mentions_and_other_bots(
    fake: FakeSlack, running: tuple[SlackDriver, NotesIntake]
) -> None:
    _, intake = running
    root = fake.user_writes("C1", "root", channel_type="channel", user="U1")
    reply = fake.user_writes("C1", "in thread", channel_type="channel", thread_ts=root)
    fake.user_edits("C1", root, "root, edited")
    fake.push_event(
        {"type": "app_mention", "channel": "C1", "user": "U1", "text": "<@U0BOT> hi", "ts": reply}
    )
    base = {"type": "message", "channel": "C1", "channel_type": "channel"}
    fake.push_event(
        {**base, "subtype": "channel_join", "user": "U2", "ts": "9.1", "text": "joined"}
    )
    fake.push_event({**base, "subtype": "message_deleted", "ts": "9.2", "deleted_ts": root})
    fake.push_event({**base, "subtype": "bot_message", "bot_id": "B9", "ts": "9.3", "text": "x"})
    fake.push_event({**base, "bot_id": "B9", "user": "U9", "ts": "9.4", "text": "other bot"})
    preview = {"ts": root, "user": "U1", "text": "root", "attachments": [{}]}
    fake.push_event({**base, "subtype": "message_changed", "ts": "9.5", "message": preview})
    fake.user_writes("C1", "last", channel_type="channel")
    await intake.wait_for(5)
    await fake.settled()
    assert intake.texts() == ["root", "in thread", "root, edited", "<@U0BOT> hi", "last"]
    root_e, reply_e, edit_e, mention_e, _ = intake.events
    assert reply_e.source.thread_id == root
    assert root_e.source.thread_id is None
    assert edit_e.message_type == "edit"
    assert edit_e.reply_to_message_id == f"C1:{root}"
    assert edit_e.message_id.startswith(f"C1:{root}:edit:")  # type: ignore[union-attr]
    assert mention_e.message_id == reply_e.message_id  # one message, two events: one id
    assert mention_e.source.chat_type == "channel"  # asked with conversations.info
    assert intake.rejected == []


async def test_outbound_sends_threads_edits_and_refusals(
    fake: FakeSlack, running: tuple[SlackDriver, NotesIntake]
) -> None:
    driver, _ = running
    root = fake.user_writes("C1", "root", channel_type="channel")
    sent = await driver.perform({"op": "send", "chat_id": "C1", "content": "top"})
    threaded = await driver.perform(
        {"op": "send", "chat_id": "C1", "content": "in thread", "thread_id": root}
    )
    assert sent.success
    assert threaded.success
    edited = await driver.perform(
        {"op": "edit", "chat_id": "C1", "message_id": sent.message_id, "content": "top!"}
    )
    assert edited.success
    assert edited.message_id == sent.message_id
    view = fake.channel("C1")
    assert [m.text for m in view.thread(root)] == ["in thread"]
    assert [(m.text, m.edited) for m in view.top_level() if m.bot] == [("top!", True)]
    calls = len(fake.calls)
    typing = await driver.perform({"op": "typing", "chat_id": "C1"})
    too_long = await driver.perform({"op": "send", "chat_id": "C1", "content": "x" * 4001})
    assert (typing.code, too_long.code) == ("unsupported_op", "too_long")
    assert len(fake.calls) == calls  # neither asked Slack
    assert "typing" not in driver.descriptor().supported_ops
    missing = await driver.perform({"op": "send", "chat_id": "C404", "content": "x"})
    assert missing.code == "not_found"
    other = await driver.perform(
        {"op": "edit", "chat_id": "C1", "message_id": f"C1:{root}", "content": "x"}
    )
    assert other.code == "forbidden"


async def test_a_429_is_waited_out_and_ambiguous_sends_are_never_repeated_silently(
    fake: FakeSlack, running: tuple[SlackDriver, NotesIntake]
) -> None:
    driver, _ = running
    fake.add_channel("C1")
    fake.fail_next("chat.postMessage", status=429, retry_after=1)
    began = time.monotonic()
    limited = await driver.perform({"op": "send", "chat_id": "C1", "content": "after the limit"})
    assert limited.success
    assert time.monotonic() - began >= 1.0
    assert driver.rate_limited == 1
    fake.fail_next("chat.postMessage", status=503)
    down = await driver.perform({"op": "send", "chat_id": "C1", "content": "maybe"})
    fake.fail_next("chat.postMessage", drop_after_acting=True)
    dropped = await driver.perform({"op": "send", "chat_id": "C1", "content": "posted once"})
    assert (down.code, dropped.code) == ("platform_down", "platform_down")
    assert fake.channel("C1").bot_texts() == ["after the limit", "posted once"]
    fake.fail_next("chat.update", status=503)
    edit = await driver.perform(
        {"op": "edit", "chat_id": "C1", "message_id": limited.message_id, "content": "edited"}
    )
    assert edit.success  # an update is asked again: it sets the same text
    assert fake.channel("C1").bot_texts()[0] == "edited"


async def test_refused_tokens_are_a_clear_error_and_an_unreachable_slack_is_retried(
    fake: FakeSlack,
) -> None:
    bad_bot = SlackDriver("xoxb-wrong", app_token=fake.app_token, api_url=fake.api_url)
    bad_bot.attach(NotesIntake())
    with pytest.raises(SlackAuthError, match=r"slack: auth\.test refused the token: invalid_auth"):
        await bad_bot.start()
    bad_app = SlackDriver(fake.bot_token, app_token="xapp-wrong", api_url=fake.api_url)
    bad_app.attach(NotesIntake())
    with pytest.raises(SlackAuthError, match=r"apps\.connections\.open refused the token"):
        await bad_app.start()
    swapped = SlackDriver(fake.bot_token, app_token=fake.bot_token, api_url=fake.api_url)
    swapped.attach(NotesIntake())
    with pytest.raises(SlackAuthError, match="not_allowed_token_type"):
        await swapped.start()
    nowhere = SlackDriver(
        fake.bot_token, app_token=fake.app_token, api_url="http://127.0.0.1:9/api/"
    )
    nowhere.attach(NotesIntake())
    await nowhere.start()  # not raised: retried with backoff
    began = time.monotonic()
    await nowhere.stop()
    assert time.monotonic() - began < 5
    assert nowhere.me is None
    with pytest.raises(ValueError, match="app-level token"):
        SlackDriver(fake.bot_token)
    with pytest.raises(TypeError, match="DriverIntake"):
        socket_driver(fake).attach(lambda platform, event: asyncio.sleep(0))


async def test_a_restarted_driver_gets_what_slack_kept_unacked(fake: FakeSlack) -> None:
    driver, intake = socket_driver(fake), NotesIntake(wait_s=BOUND_S)
    driver.attach(intake)
    await driver.start()
    await until(lambda: bool(fake.delivery.open_sockets()), "a connection")
    await driver.stop()
    await until(lambda: not fake.delivery.open_sockets(), "the connection closed")
    fake.user_writes("D1", "while down")
    await until(lambda: bool(fake.delivery.deliveries), "a failed attempt")
    again, later = socket_driver(fake), NotesIntake(wait_s=BOUND_S)
    again.attach(later)
    await again.start()
    try:
        await later.wait_for(1)
        assert later.texts() == ["while down"]
        assert intake.texts() == []
        await fake.settled()
        assert fake.delivery.deliveries[0].outcome == "no_connection"
        assert fake.delivery.deliveries[-1].outcome == "acked"
    finally:
        await again.stop()


async def test_the_events_api_checks_signatures_refuses_replays_and_answers_5xx_until_taken(
    fake: FakeSlack,
) -> None:
    driver = SlackDriver(
        fake.bot_token,
        signing_secret=fake.signing_secret,
        mode="events",
        api_url=fake.api_url,
        ack_budget_s=ACK_BUDGET_S,
    )
    intake = NotesIntake(wait_s=BOUND_S)
    driver.attach(intake)
    await driver.start()
    try:
        url = driver.events_url
        assert url is not None
        assert await fake.verify_url(url)
        fake.request_url = url
        intake.refuse = 1
        ts = fake.user_writes("D1", "over http")
        await intake.wait_for(1)
        await fake.settled()
        assert [d.outcome for d in fake.delivery.deliveries] == ["http_error", "acked"]
        assert intake.events[0].message_id == f"D1:{ts}"
        assert driver.endpoint is not None
        assert driver.endpoint.retries == {"http_error": 1}
        body = json.dumps({"type": "event_callback", "event": {}}).encode()
        async with aiohttp.ClientSession() as http:
            for stamp, signature in (
                (str(int(time.time())), "v0=" + "0" * 64),  # a wrong signature
                (str(int(time.time()) - 301), None),  # a replay, signed
                ("not-a-number", None),
            ):
                headers = {
                    "X-Slack-Request-Timestamp": stamp,
                    "X-Slack-Signature": signature or sign(fake.signing_secret, stamp, body),
                }
                async with http.post(url, data=body, headers=headers) as answer:
                    assert answer.status == 401
            stamp = str(int(time.time()))
            garbage = b"\xff not json"
            headers = {
                "X-Slack-Request-Timestamp": stamp,
                "X-Slack-Signature": sign(fake.signing_secret, stamp, garbage),
            }
            async with http.post(url, data=garbage, headers=headers) as answer:
                assert answer.status == 401  # not UTF-8: the signature cannot be checked
        assert driver.endpoint.refused == 4
        assert intake.texts() == ["over http"]
    finally:
        await driver.stop()

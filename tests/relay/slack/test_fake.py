"""The fake Slack behaves as Slack's documentation says: the Web API through slack_sdk's own
client (its base_url pointed at the fake), Socket Mode envelopes acked or redelivered with
retry_attempt, disconnects, the signed Events API pusher and its retries, and every fault a
test can ask for."""

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
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from relay.slack.testing import FakeSlack

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    server = FakeSlack(ack_timeout_s=0.3, retry_delays_s=(0.0, 0.1, 0.1), refresh_grace_s=0.5)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def client(fake: FakeSlack, token: str | None = None) -> AsyncWebClient:
    return AsyncWebClient(token=token or fake.bot_token, base_url=fake.api_url, retry_handlers=[])


async def connect(
    fake: FakeSlack, session: aiohttp.ClientSession
) -> aiohttp.ClientWebSocketResponse:
    answer = await client(fake, fake.app_token).apps_connections_open(app_token=fake.app_token)
    ws = await session.ws_connect(str(answer["url"]))
    hello = json.loads((await ws.receive(timeout=5)).data)
    assert hello["type"] == "hello"
    return ws


async def envelope(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    frame = await ws.receive(timeout=5)
    value = json.loads(frame.data)
    assert isinstance(value, dict)
    return value


async def test_the_web_api_through_slack_sdk_posts_threads_edits_and_refuses_bad_tokens(
    fake: FakeSlack,
) -> None:
    web_client = client(fake)
    who = await web_client.auth_test()
    assert (who["user_id"], who["bot_id"], who["team_id"]) == ("U0BOT", "B0BOT", "T0FAKE")
    asked = fake.user_writes("D1", "hello")
    posted = await web_client.chat_postMessage(channel="D1", text="hi")
    replied = await web_client.chat_postMessage(channel="D1", text="in thread", thread_ts=asked)
    await web_client.chat_update(channel="D1", ts=posted["ts"], text="hi, edited")
    view = fake.channel("D1")
    assert [m.text for m in view.top_level()] == ["hello", "hi, edited"]
    assert [m.ts for m in view.thread(asked)] == [replied["ts"]]
    assert view.messages[1].edited
    assert view.messages[1].bot
    info = await web_client.conversations_info(channel="D1")
    assert info["channel"]["is_im"] is True
    for call, error in (
        (web_client.chat_postMessage(channel="C404", text="x"), "channel_not_found"),
        (web_client.chat_postMessage(channel="D1", text="x" * 40_001), "msg_too_long"),
        (web_client.chat_update(channel="D1", ts=asked, text="x"), "cant_update_message"),
        (client(fake, "xoxb-wrong").auth_test(), "invalid_auth"),
        (
            client(fake, fake.app_token).chat_postMessage(channel="D1", text="x"),
            "not_allowed_token_type",
        ),
    ):
        with pytest.raises(SlackApiError) as caught:
            await call
        assert caught.value.response["error"] == error
    fake.revoke(fake.bot_token)
    with pytest.raises(SlackApiError, match="token_revoked"):
        await web_client.auth_test()


async def test_faults_a_429_with_retry_after_a_5xx_and_a_method_that_acts_then_never_answers(
    fake: FakeSlack,
) -> None:
    fake.add_channel("C1")
    web_client = client(fake)
    fake.fail_next("chat.postMessage", status=429, retry_after=7)
    with pytest.raises(SlackApiError) as caught:
        await web_client.chat_postMessage(channel="C1", text="a")
    assert caught.value.response.status_code == 429
    assert caught.value.response.headers["Retry-After"] == "7"
    fake.fail_next("chat.postMessage", status=503)
    with pytest.raises(SlackApiError) as caught:
        await web_client.chat_postMessage(channel="C1", text="b")
    assert caught.value.response.status_code == 503
    fake.fail_next("chat.postMessage", drop_after_acting=True)
    with pytest.raises(aiohttp.ClientError):
        await web_client.chat_postMessage(channel="C1", text="c")
    # Neither refusal posted anything; the dropped call did.
    assert fake.channel("C1").bot_texts() == ["c"]


async def test_an_envelope_not_acked_in_time_is_redelivered_with_retry_attempt_then_given_up(
    fake: FakeSlack,
) -> None:
    async with aiohttp.ClientSession() as session:
        ws = await connect(fake, session)
        fake.user_writes("D1", "hello")
        first = await envelope(ws)
        assert (first["type"], first["retry_attempt"]) == ("events_api", 0)
        assert first["payload"]["event"]["text"] == "hello"
        attempts = [first] + [await envelope(ws) for _ in range(3)]
        assert [e["retry_attempt"] for e in attempts] == [0, 1, 2, 3]
        assert attempts[1]["retry_reason"] == "timeout"
        assert len({e["envelope_id"] for e in attempts}) == 4
        assert len({e["payload"]["event_id"] for e in attempts}) == 1
        await fake.settled()
        assert fake.delivery.given_up == [first["payload"]["event_id"]]
        # A late ack is counted as late, and settles nothing.
        await ws.send_str(json.dumps({"envelope_id": first["envelope_id"]}))
        await asyncio.sleep(0.1)
        assert fake.delivery.late_acks == 1
        await ws.close()


async def test_an_ack_on_time_and_on_the_same_connection_settles_the_event(
    fake: FakeSlack,
) -> None:
    async with aiohttp.ClientSession() as session:
        one, two = await connect(fake, session), await connect(fake, session)
        fake.user_writes("D1", "hello")
        # Round robin: the first attempt goes to the first connection, the retry to the second.
        sent = await envelope(one)
        await two.send_str(json.dumps({"envelope_id": sent["envelope_id"]}))  # the wrong one
        again = await envelope(two)
        assert again["retry_attempt"] == 1
        await two.send_str(json.dumps({"envelope_id": again["envelope_id"]}))
        await fake.settled()
        assert fake.delivery.acked[sent["payload"]["event_id"]] == 1
        assert fake.delivery.given_up == []


async def test_the_bots_own_posts_and_edits_come_back_as_events_and_duplicates_on_demand(
    fake: FakeSlack,
) -> None:
    async with aiohttp.ClientSession() as session:
        ws = await connect(fake, session)
        fake.add_channel("C1")
        posted = await client(fake).chat_postMessage(channel="C1", text="mine")
        own = await envelope(ws)
        assert own["payload"]["event"]["bot_id"] == "B0BOT"
        await ws.send_str(json.dumps({"envelope_id": own["envelope_id"]}))
        await client(fake).chat_update(channel="C1", ts=posted["ts"], text="mine, edited")
        changed = await envelope(ws)
        event = changed["payload"]["event"]
        assert (event["subtype"], event["message"]["ts"]) == ("message_changed", posted["ts"])
        await ws.send_str(json.dumps({"envelope_id": changed["envelope_id"]}))
        fake.duplicate_next()
        fake.user_writes("C1", "twice", channel_type="channel")
        copies = [await envelope(ws), await envelope(ws)]
        assert copies[0]["payload"] == copies[1]["payload"]
        assert copies[0]["envelope_id"] != copies[1]["envelope_id"]
        assert copies[0]["payload"]["event"]["channel_type"] == "channel"
        assert await fake.send_raw("not json") == 1
        assert (await ws.receive(timeout=5)).data == "not json"
        await ws.close()


async def test_disconnect_says_why_takes_no_new_envelope_there_and_closes_later(
    fake: FakeSlack,
) -> None:
    async with aiohttp.ClientSession() as session:
        old = await connect(fake, session)
        await fake.disconnect("refresh_requested", close_after_s=0.3)
        said = await envelope(old)
        assert (said["type"], said["reason"]) == ("disconnect", "refresh_requested")
        new = await connect(fake, session)
        fake.user_writes("D1", "after")
        sent = await envelope(new)
        assert sent["payload"]["event"]["text"] == "after"
        closed = await old.receive(timeout=5)
        assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        fake.drop_sockets()
        gone = await new.receive(timeout=5)
        assert gone.type in (
            aiohttp.WSMsgType.CLOSE,
            aiohttp.WSMsgType.CLOSED,
            aiohttp.WSMsgType.ERROR,
        )
        # A ticket is good for one connection only.
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await session.ws_connect(fake.sockets[0].request.url.with_scheme("ws"))


async def test_the_events_api_pusher_signs_retries_with_retry_num_and_verifies_the_url(
    fake: FakeSlack,
) -> None:
    seen: list[tuple[dict[str, str], bytes]] = []
    verifier = SignatureVerifier(fake.signing_secret)
    answers = [500, 200]

    async def endpoint(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append((dict(request.headers), body))
        assert verifier.is_valid_request(body, dict(request.headers))
        payload = json.loads(body)
        if payload["type"] == "url_verification":
            return web.json_response({"challenge": payload["challenge"]})
        return web.Response(status=answers.pop(0))

    app = web.Application()
    app.router.add_post("/events", endpoint)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        url = f"http://127.0.0.1:{port}/events"
        assert await fake.verify_url(url)
        fake.request_url = url
        began = time.monotonic()
        fake.user_writes("D1", "over http")
        await fake.settled()
        assert time.monotonic() - began < 5
        pushes = seen[1:]
        assert len(pushes) == 2
        assert "X-Slack-Retry-Num" not in pushes[0][0]
        assert pushes[1][0]["X-Slack-Retry-Num"] == "1"
        assert pushes[1][0]["X-Slack-Retry-Reason"] == "http_error"
        assert pushes[0][1] == pushes[1][1]
        assert fake.delivery.acked[json.loads(pushes[0][1])["event_id"]] == 1
    finally:
        await runner.cleanup()

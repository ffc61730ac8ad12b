"""The fake Discord itself, spoken to with plain aiohttp as Discord's documentation says: the
REST routes, the nonce's dedupe, rate limits and their headers, injected faults, and the
gateway's sessions (IDENTIFY, READY, dispatches in order, RESUME replaying the backlog,
INVALID_SESSION, RECONNECT, heartbeats checked, bad tokens)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from relay.discord.testing import SEND_ROUTE, FakeDiscord

pytestmark = pytest.mark.asyncio

INTENTS = (1 << 0) | (1 << 9) | (1 << 12) | (1 << 15)


@pytest_asyncio.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(heartbeat_interval_ms=400, route_limit=(3, 0.5)) as server:
        yield server


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def call(
    http: aiohttp.ClientSession,
    fake: FakeDiscord,
    method: str,
    path: str,
    body: Any = None,
    *,
    token: str | None = None,
) -> tuple[int, Any, dict[str, str]]:
    headers = {"Authorization": f"Bot {token or fake.token}"}
    async with http.request(method, fake.api_base + path, json=body, headers=headers) as answer:
        data = None if answer.status == 204 else await answer.json()
        return answer.status, data, dict(answer.headers)


async def test_a_send_with_the_same_nonce_and_enforce_nonce_is_one_message(
    fake: FakeDiscord, http: aiohttp.ClientSession
) -> None:
    asked = fake.user_writes("100", "hi")
    body = {"content": "answer", "nonce": "n-1", "enforce_nonce": True}
    first = await call(http, fake, "POST", "/channels/100/messages", body)
    again = await call(http, fake, "POST", "/channels/100/messages", body)
    assert first[0] == again[0] == 200
    assert first[1]["id"] == again[1]["id"]
    loose = {"content": "answer", "nonce": "n-1"}  # without enforce_nonce: a new message
    third = await call(http, fake, "POST", "/channels/100/messages", loose)
    assert third[1]["id"] != first[1]["id"]
    assert [m.content for m in fake.channel("100")] == ["hi", "answer", "answer"]
    assert fake.channel("100")[0].id == asked.id


async def test_the_routes_refuse_what_discord_refuses(
    fake: FakeDiscord, http: aiohttp.ClientSession
) -> None:
    user = fake.user_writes("200", "mine", guild_id="9")
    status, body, _ = await call(
        http, fake, "POST", "/channels/200/messages", {"content": "x" * 2001}
    )
    assert (status, body["code"]) == (400, 50035)
    status, body, _ = await call(http, fake, "POST", "/channels/404/messages", {"content": "x"})
    assert (status, body["code"]) == (404, 10003)
    status, body, _ = await call(http, fake, "GET", "/users/@me", token="wrong")
    assert status == 401
    ref = {"content": "r", "message_reference": {"message_id": "1"}}
    status, body, _ = await call(http, fake, "POST", "/channels/200/messages", ref)
    assert (status, body["code"]) == (400, 50035)
    status, body, _ = await call(
        http, fake, "PATCH", f"/channels/200/messages/{user.id}", {"content": "no"}
    )
    assert (status, body["code"]) == (403, 50005)
    await asyncio.sleep(0.6)  # the bucket's window
    ok = {"content": "reply", "message_reference": {"message_id": user.id}}
    status, made, _ = await call(http, fake, "POST", "/channels/200/messages", ok)
    assert status == 200
    assert made["message_reference"]["message_id"] == user.id
    status, edited, _ = await call(
        http, fake, "PATCH", f"/channels/200/messages/{made['id']}", {"content": "edited"}
    )
    assert status == 200
    assert edited["edited_timestamp"]
    assert (await call(http, fake, "POST", "/channels/200/typing"))[0] == 204
    assert fake.bot_messages("200")[0].content == "edited"
    status, channel, _ = await call(http, fake, "GET", "/channels/200")
    assert channel == {"id": "200", "type": 0, "guild_id": "9", "name": "channel-200"}


async def test_rate_limits_are_announced_in_headers_and_enforced(
    fake: FakeDiscord, http: aiohttp.ClientSession
) -> None:
    fake.user_writes("300", "hi")
    seen = [await call(http, fake, "POST", "/channels/300/typing") for _ in range(4)]
    assert [s[0] for s in seen] == [204, 204, 204, 429]
    assert [s[2]["X-RateLimit-Remaining"] for s in seen[:3]] == ["2", "1", "0"]
    assert float(seen[2][2]["X-RateLimit-Reset-After"]) <= 0.5
    assert seen[3][1]["global"] is False
    assert 0 < seen[3][1]["retry_after"] <= 0.5
    assert fake.limit_hits == 1
    await asyncio.sleep(0.55)
    assert (await call(http, fake, "POST", "/channels/300/typing"))[0] == 204
    fake.rate_limit_next(retry_after=0.25, is_global=True)
    status, body, headers = await call(http, fake, "GET", "/users/@me")
    assert (status, body["global"], headers["X-RateLimit-Global"]) == (429, True, "true")


async def test_injected_faults_fail_or_act_without_answering(
    fake: FakeDiscord, http: aiohttp.ClientSession
) -> None:
    fake.user_writes("400", "hi")
    fake.fail_next(status=502, route=SEND_ROUTE)
    status, _, _ = await call(http, fake, "POST", "/channels/400/messages", {"content": "a"})
    assert status == 502
    assert len(fake.channel("400")) == 1
    fake.act_then_drop()
    with pytest.raises(aiohttp.ClientError):
        await call(http, fake, "POST", "/channels/400/messages", {"content": "b"})
    assert [m.content for m in fake.channel("400")] == ["hi", "b"]  # acted on
    old = fake.token
    fake.revoke_token()
    assert (await call(http, fake, "GET", "/users/@me", token=old))[0] == 401


class Client:
    """A minimal gateway client speaking the documented protocol."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    async def recv(self, timeout_s: float = 5.0) -> dict[str, Any]:
        message = await self.ws.receive(timeout=timeout_s)
        assert message.type == aiohttp.WSMsgType.TEXT, message
        data: dict[str, Any] = json.loads(message.data)
        return data

    async def send(self, op: int, d: Any) -> None:
        await self.ws.send_str(json.dumps({"op": op, "d": d}))

    async def until(self, event: str) -> dict[str, Any]:
        while True:
            payload = await self.recv()
            if payload.get("t") == event:
                return payload


async def connect(http: aiohttp.ClientSession, url: str) -> tuple[Client, dict[str, Any]]:
    ws = await http.ws_connect(url + "?v=10&encoding=json")
    client = Client(ws)
    hello = await client.recv()
    return client, hello


async def test_identify_ready_dispatches_and_a_resume_replays_what_was_missed(
    fake: FakeDiscord, http: aiohttp.ClientSession
) -> None:
    _, info, _ = await call(http, fake, "GET", "/gateway/bot")
    client, hello = await connect(http, info["url"])
    assert hello == {"op": 10, "d": {"heartbeat_interval": 400}}
    await client.send(2, {"token": fake.token, "intents": INTENTS, "properties": {}})
    ready = await client.until("READY")
    session, resume_url = ready["d"]["session_id"], ready["d"]["resume_gateway_url"]
    assert ready["s"] == 1
    assert ready["d"]["user"]["id"] == fake.bot_id
    first = fake.user_writes("500", "one")
    created = await client.until("MESSAGE_CREATE")
    assert created["d"]["id"] == first.id
    assert "guild_id" not in created["d"]
    seq = created["s"]
    await client.ws.close()
    fake.user_writes("500", "two")  # while nobody is connected
    fake.user_writes("500", "three")
    again, _ = await connect(http, resume_url)
    await again.send(6, {"token": fake.token, "session_id": session, "seq": seq})
    replayed = [await again.until("MESSAGE_CREATE") for _ in range(2)]
    assert [p["d"]["content"] for p in replayed] == ["two", "three"]
    assert [p["s"] for p in replayed] == [seq + 1, seq + 2]
    assert (await again.recv())["t"] == "RESUMED"
    assert fake.gateway.resumes == [(session, seq, "/gateway/resume")]
    await again.send(1, seq + 2)
    assert (await again.recv())["op"] == 11
    fake.expire_sessions()
    await again.ws.close()
    third, _ = await connect(http, resume_url)
    await third.send(6, {"token": fake.token, "session_id": session, "seq": seq + 2})
    assert await third.recv() == {"op": 9, "d": False}
    await third.ws.close()


async def test_the_gateway_closes_for_a_bad_token_silence_and_garbage(
    fake: FakeDiscord, http: aiohttp.ClientSession
) -> None:
    url = fake.ws_base + "/gateway"
    client, _ = await connect(http, url)
    await client.send(2, {"token": "wrong", "intents": INTENTS, "properties": {}})
    closed = await client.ws.receive(timeout=5)
    assert (closed.type, client.ws.close_code) == (aiohttp.WSMsgType.CLOSE, 4004)
    client, _ = await connect(http, url)
    await client.send(2, {"token": fake.token, "intents": INTENTS, "properties": {}})
    await client.until("READY")
    while True:  # no heartbeat: closed within 1.5 intervals
        message = await client.ws.receive(timeout=5)
        if message.type != aiohttp.WSMsgType.TEXT:
            break
    assert client.ws.close_code == 4009
    client, _ = await connect(http, url)
    await client.ws.send_str("{not json")
    await client.ws.receive(timeout=5)
    assert client.ws.close_code == 4002
    wrong = await http.ws_connect(url + "?v=9&encoding=json")
    await wrong.receive(timeout=5)
    assert wrong.close_code == 4012


async def test_gateway_faults_reach_the_client(
    fake: FakeDiscord, http: aiohttp.ClientSession
) -> None:
    fake.gateway.heartbeat_interval_ms = 30_000  # no heartbeats needed here
    client, _ = await connect(http, fake.ws_base + "/gateway")
    await client.send(2, {"token": fake.token, "intents": INTENTS, "properties": {}})
    await client.until("READY")
    fake.duplicate_next()
    fake.user_writes("600", "twice", guild_id="7")
    created = [await client.until("MESSAGE_CREATE") for _ in range(2)]
    assert created[0] == created[1]
    assert created[0]["d"]["guild_id"] == "7"
    fake.send_malformed("not_json")
    raw = await client.ws.receive(timeout=5)
    assert raw.data == "{this is not json"
    fake.send_reconnect()
    assert await client.recv() == {"op": 7, "d": None}
    fake.invalidate_session(resumable=True)
    assert await client.recv() == {"op": 9, "d": True}
    fake.drop_gateway()
    message = await client.ws.receive(timeout=5)
    assert message.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)


async def test_without_the_message_content_intent_guild_content_is_empty(
    fake: FakeDiscord, http: aiohttp.ClientSession
) -> None:
    fake.gateway.heartbeat_interval_ms = 30_000  # no heartbeats needed here
    client, _ = await connect(http, fake.ws_base + "/gateway")
    await client.send(2, {"token": fake.token, "intents": INTENTS & ~(1 << 15), "properties": {}})
    await client.until("READY")
    fake.user_writes("700", "secret", guild_id="8")
    fake.user_writes("701", "in a dm")
    guild = await client.until("MESSAGE_CREATE")
    dm = await client.until("MESSAGE_CREATE")
    assert (guild["d"]["content"], dm["d"]["content"]) == ("", "in a dm")
    strict = FakeDiscord(allowed_intents=0)
    async with strict:
        other, _ = await connect(http, strict.ws_base + "/gateway")
        await other.send(2, {"token": strict.token, "intents": INTENTS, "properties": {}})
        await other.ws.receive(timeout=5)
        assert other.ws.close_code == 4014

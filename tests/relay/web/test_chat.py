"""The web chat's protocol, spoken by a raw WebSocket client as the page speaks it: a real
connector fronting the web chat, a real gateway answering, a real web server on 127.0.0.1.
People are kept apart by their keys; text is text; bad input is answered, never obeyed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from websockets.asyncio.client import ClientConnection, connect

from relay.client.adapter import RelayAdapter
from relay.client.transport import WebSocketRelayTransport
from relay.connector.server import Connector
from relay.web.chat import WebChatPlatform
from relay.web.server import WebServer
from statecore.gateway import Gateway, Turn
from stores import SQLiteStore
from tests.waiting import BOUND

SECRET = "web-chat-test-secret"


class Stack:
    """Connector + gateway + web server, and the browsers (raw clients) opened on it."""

    def __init__(self, chat: WebChatPlatform, web: WebServer) -> None:
        self.chat = chat
        self.web = web
        self.clients: list[ClientConnection] = []

    async def browser(self, key: str, name: str = "Ada") -> tuple[ClientConnection, dict[str, Any]]:
        """A tab that said hello with ``key``; returns it and the welcome."""
        ws = await connect(self.web.url.replace("http", "ws") + "/chat/ws", open_timeout=BOUND)
        self.clients.append(ws)
        await ws.send(json.dumps({"type": "hello", "key": key, "name": name}))
        return ws, await expect(ws, "welcome")


async def expect(ws: ClientConnection, kind: str, **fields: Any) -> dict[str, Any]:
    """The next message of type ``kind`` (with ``fields``), skipping others; bounded."""
    async with asyncio.timeout(BOUND):
        while True:
            message = json.loads(await ws.recv())
            if message["type"] == kind and all(message.get(k) == v for k, v in fields.items()):
                return message


async def answer(turn: Turn) -> None:
    await turn.reply(f"echo: {turn.message.text}")


@pytest_asyncio.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    chat = WebChatPlatform(max_message_length=100, max_chats_per_user=3)
    connector_store, gateway_store = SQLiteStore(tmp_path / "c.db"), SQLiteStore(tmp_path / "g.db")
    connector = Connector(connector_store, secrets={"bot": [SECRET]}, drivers={"webchat": chat})
    web = WebServer([chat])
    await connector.start()
    await web.start()
    transport = WebSocketRelayTransport(
        connector.url, "webchat", "bot", gateway_id="bot", secret=SECRET
    )
    gateway = Gateway(gateway_store)
    gateway.add_adapter("webchat", RelayAdapter(transport))
    gateway.on_message(answer)
    await gateway.start()
    s = Stack(chat, web)
    try:
        yield s
    finally:
        for ws in s.clients:
            await ws.close()
        await gateway.stop()
        await web.stop()
        await connector.stop()
        connector_store.close()
        gateway_store.close()


@pytest.mark.asyncio
async def test_a_person_writes_and_the_bot_answers_live(stack: Stack) -> None:
    """Hello, open a chat, write: the page gets its own message back, then the bot's reply."""
    ws, welcome = await stack.browser("k" * 32)
    assert welcome["chats"] == []
    assert welcome["max_text"] == 100
    assert welcome["user"].startswith("u-")
    await ws.send(json.dumps({"type": "open", "chat": "general"}))
    assert (await expect(ws, "history", chat="general"))["messages"] == []
    await ws.send(json.dumps({"type": "send", "chat": "general", "text": "hello bot"}))
    mine = await expect(ws, "message", sender="you")
    assert (mine["chat"], mine["text"], mine["bot"]) == ("general", "hello bot", False)
    reply = await expect(ws, "message", bot=True)
    assert (reply["chat"], reply["text"], reply["redelivery"]) == (
        "general",
        "echo: hello bot",
        False,
    )


@pytest.mark.asyncio
async def test_typing_and_edits_show_up_live(stack: Stack) -> None:
    """The bot's typing status and its edit of a reply reach the page as they happen (the
    connector performs them through the driver like any action)."""
    ws, welcome = await stack.browser("e" * 32)
    await ws.send(json.dumps({"type": "open", "chat": "general"}))
    await ws.send(json.dumps({"type": "send", "chat": "general", "text": "draft"}))
    reply = await expect(ws, "message", bot=True)
    chat_id = f"{welcome['user']}.general"
    typing = await stack.chat.perform({"op": "typing", "chat_id": chat_id, "content": "typing"})
    assert typing.success
    assert (await expect(ws, "typing"))["status"] == "typing"
    edit = {"op": "edit", "chat_id": chat_id, "message_id": reply["id"], "content": "final"}
    assert (await stack.chat.perform(edit)).success
    edited = await expect(ws, "edit")
    assert (edited["id"], edited["text"], edited["edited"]) == (reply["id"], "final", True)
    again, _ = await stack.browser("e" * 32)
    history = await expect(again, "history", chat="general")
    assert [m["text"] for m in history["messages"]] == ["draft", "final"]


@pytest.mark.asyncio
async def test_reopening_the_page_keeps_the_conversation(stack: Stack) -> None:
    """A tab closed and opened again (same key) is welcomed with its chats and their history;
    several chats stay apart."""
    key = "r" * 32
    ws, _ = await stack.browser(key)
    for chat in ("one", "two"):
        await ws.send(json.dumps({"type": "open", "chat": chat}))
        await ws.send(json.dumps({"type": "send", "chat": chat, "text": f"in {chat}"}))
        await expect(ws, "message", bot=True, chat=chat)
    await ws.close()
    again, welcome = await stack.browser(key, name="Ada L.")
    assert welcome["chats"] == ["one", "two"]
    assert welcome["name"] == "Ada L."
    for chat in ("one", "two"):
        history = await expect(again, "history", chat=chat)
        assert [m["text"] for m in history["messages"]] == [f"in {chat}", f"echo: in {chat}"]


@pytest.mark.asyncio
async def test_people_never_see_each_others_chats(stack: Stack) -> None:
    """Two keys, the same chat name: each sees only its own messages, and knowing the other's
    user id (what the bot sees) gives nothing."""
    ada, ada_welcome = await stack.browser("a" * 32, "Ada")
    bob, _ = await stack.browser("b" * 32, "Bob")
    for ws, text in ((ada, "ada's secret"), (bob, "bob's secret")):
        await ws.send(json.dumps({"type": "open", "chat": "general"}))
        await expect(ws, "history", chat="general")
        await ws.send(json.dumps({"type": "send", "chat": "general", "text": text}))
    assert (await expect(ada, "message", bot=True))["text"] == "echo: ada's secret"
    assert (await expect(bob, "message", bot=True))["text"] == "echo: bob's secret"
    # Bob asks for Ada's chat by her user id: a slug never names another user's chat.
    await bob.send(json.dumps({"type": "open", "chat": f"{ada_welcome['user']}.general"}))
    assert "chat name" in (await expect(bob, "refused"))["reason"]
    transcript = stack.chat.transcript
    assert {chat_id.split(".")[0] for chat_id in transcript} == {
        ada_welcome["user"],
        next(c.split(".")[0] for c in transcript if not c.startswith(ada_welcome["user"])),
    }


@pytest.mark.asyncio
async def test_html_in_a_message_is_carried_as_text(stack: Stack) -> None:
    """Markup is never interpreted by the server: it goes to the bot and back unchanged (the
    page renders it with textContent; the browser test proves it is shown as text)."""
    ws, _ = await stack.browser("h" * 32)
    await ws.send(json.dumps({"type": "open", "chat": "general"}))
    payload = '<img src=x onerror="alert(1)">'
    await ws.send(json.dumps({"type": "send", "chat": "general", "text": payload}))
    assert (await expect(ws, "message", bot=True))["text"] == f"echo: {payload}"


@pytest.mark.asyncio
async def test_an_oversized_or_empty_message_is_refused_and_not_sent(stack: Stack) -> None:
    """Past the platform's limit (or blank): refused with the reason, nothing reaches the bot."""
    ws, _ = await stack.browser("o" * 32)
    await ws.send(json.dumps({"type": "open", "chat": "general"}))
    await expect(ws, "history")
    await ws.send(json.dumps({"type": "send", "chat": "general", "text": "x" * 101}))
    assert "too long: 101 characters, at most 100" in (await expect(ws, "refused"))["reason"]
    await ws.send(json.dumps({"type": "send", "chat": "general", "text": "   "}))
    assert (await expect(ws, "refused"))["reason"] == "an empty message"
    assert stack.chat.sent == []
    assert all(not messages for messages in stack.chat.transcript.values())


@pytest.mark.asyncio
async def test_bad_input_is_answered_and_never_breaks_the_session(stack: Stack) -> None:
    """Malformed JSON, wrong types, unknown types, sends before hello or to an unopened chat,
    a bad key, too many chats: each answered with an error or a refusal; the tab still works."""
    ws = await connect(stack.web.url.replace("http", "ws") + "/chat/ws", open_timeout=BOUND)
    stack.clients.append(ws)
    await ws.send("not json")
    assert (await expect(ws, "error"))["reason"] == "expected a JSON object"
    await ws.send(json.dumps({"type": "send", "chat": "x", "text": "early"}))
    assert (await expect(ws, "error"))["reason"] == "say hello first"
    await ws.send(json.dumps({"type": "hello", "key": "short", "name": "x"}))
    assert "key" in (await expect(ws, "error"))["reason"]
    await ws.send(json.dumps({"type": "hello", "key": "z" * 32, "name": ["not", "text"]}))
    assert "name" in (await expect(ws, "error"))["reason"]
    await ws.send(json.dumps({"type": "hello", "key": "z" * 32, "name": "Zed"}))
    await expect(ws, "welcome")
    for bad in ([], {"type": 7}, {"type": "nope"}):
        await ws.send(json.dumps(bad))
        await expect(ws, "error")
    await ws.send(json.dumps({"type": "send", "chat": "never-opened", "text": "hi"}))
    assert (await expect(ws, "refused"))["reason"] == "open the chat first"
    for n in range(3):
        await ws.send(json.dumps({"type": "open", "chat": f"c{n}"}))
        await expect(ws, "history", chat=f"c{n}")
    await ws.send(json.dumps({"type": "open", "chat": "c3"}))
    assert (await expect(ws, "refused"))["reason"] == "no more chats can be opened"
    await ws.send(json.dumps({"type": "send", "chat": "c0", "text": "still here"}))
    assert (await expect(ws, "message", bot=True))["text"] == "echo: still here"


@pytest.mark.asyncio
async def test_the_server_serves_the_page_and_nothing_else(stack: Stack) -> None:
    """The page and its files with a policy that forbids inline script; 404 elsewhere; the
    WebSocket path refuses a plain GET."""
    import urllib.request  # noqa: PLC0415

    def get(path: str) -> tuple[int, dict[str, str], bytes]:
        try:
            with urllib.request.urlopen(stack.web.url + path, timeout=BOUND) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    status, headers, body = await asyncio.to_thread(get, "/chat/")
    assert status == 200
    assert b'<script src="chat.js" defer></script>' in body
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert "unsafe-inline" not in headers["Content-Security-Policy"]
    for path, wanted in (("/chat/chat.js", 200), ("/chat/../server.py", 404), ("/nope", 404)):
        assert (await asyncio.to_thread(get, path))[0] == wanted, path
    assert (await asyncio.to_thread(get, "/chat/ws"))[0] == 426


def test_limits_must_be_positive() -> None:
    """A limit that is not a positive integer is refused at construction."""
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="max_history"):
            WebChatPlatform(max_history=bad)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_chats_in_all_are_bounded() -> None:
    """Past ``max_chats`` chats over every user, a new one is refused (memory stays bounded
    whoever opens them); chats already open still work."""
    chat = WebChatPlatform(max_chats=2)
    async with WebServer([chat]) as web:
        stack = Stack(chat, web)
        try:
            ada, _ = await stack.browser("a" * 32, "Ada")
            bob, _ = await stack.browser("b" * 32, "Bob")
            for ws, slug in ((ada, "one"), (bob, "two")):
                await ws.send(json.dumps({"type": "open", "chat": slug}))
                await expect(ws, "history", chat=slug)
            await bob.send(json.dumps({"type": "open", "chat": "three"}))
            assert (await expect(bob, "refused"))["reason"] == "no more chats can be opened"
            await ada.send(json.dumps({"type": "open", "chat": "one"}))
            await expect(ada, "history", chat="one")
        finally:
            for ws in stack.clients:
                await ws.close()


@pytest.mark.asyncio
async def test_plain_typing_shows_and_an_empty_status_clears_it(stack: Stack) -> None:
    """A typing action without content (what ``Turn.typing()`` sends) shows the bot typing;
    ``""`` clears it, as the contract says."""
    ws, welcome = await stack.browser("t" * 32)
    await ws.send(json.dumps({"type": "open", "chat": "general"}))
    chat_id = f"{welcome['user']}.general"
    assert (await stack.chat.perform({"op": "typing", "chat_id": chat_id})).success
    assert (await expect(ws, "typing"))["status"] == "typing"
    assert (await stack.chat.perform({"op": "typing", "chat_id": chat_id, "content": ""})).success
    assert (await expect(ws, "typing"))["status"] is None

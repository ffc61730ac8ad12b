"""The chaos run's chat platform, in the harness process: the users who write at a steady rate,
the webhook pushes to the connector nodes, and the send API the nodes call -- and the
:class:`~tests.chaos.transcript.Transcript` of all of it.

Chats ``chat-0`` .. ``chat-<n-1>``; chat ``k`` is in tenant ``tenant-a`` when ``k`` is even,
``tenant-b`` when odd.  Each user message is recorded when the platform accepts it, then pushed
to a node's hook (``POST /event``, the nodes in turn, the next one after a refusal or no answer
within :data:`PUSH_TIMEOUT_S`) until a node took it: a message whose answer got lost may reach
both nodes, as a real webhook platform redelivers; the connector knows it by its message id.
Every bot message is recorded exactly as the API received it, with its chat's tenant and the
node that sent it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Sequence

import aiohttp
from aiohttp import web

from tests.chaos.transcript import BotMessage, Transcript, UserMessage

__all__ = ["PUSH_TIMEOUT_S", "ChaosPlatform", "chat_id", "tenant_of"]

PUSH_TIMEOUT_S = 3.0
"""The bound on one push to one node."""
RETRY_S = 0.2
"""The pause after every node refused a push (or gave no answer)."""
SEND_S = 0.02
"""How long the platform takes to perform one send (a reply is in flight that long)."""


def chat_id(n: int) -> str:
    """The id of chat number ``n``."""
    return f"chat-{n}"


def tenant_of(chat: str) -> str:
    """The tenant the platform places ``chat`` in."""
    number = int(chat.rpartition("-")[2])
    return "tenant-a" if number % 2 == 0 else "tenant-b"


class ChaosPlatform:
    """The platform (see the module docs); :meth:`start`, then :meth:`write` per message."""

    def __init__(self, hook_ports: Sequence[int]) -> None:
        self.hook_ports = list(hook_ports)
        self.transcript = Transcript()
        self.port = 0
        self.pushes = 0
        """Push attempts, successful or not."""
        self.refused = 0
        """Push attempts a node refused or did not answer in time."""
        self.pending: set[asyncio.Task[None]] = set()
        """Pushes not yet taken by a node."""
        self._ids = itertools.count(1)
        self._turn = itertools.count()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._closing = False

    @property
    def api_url(self) -> str:
        """Where the nodes send (``POST /send``)."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Serve the send API on a fresh port of 127.0.0.1."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PUSH_TIMEOUT_S))
        app = web.Application()
        app.router.add_post("/send", self._send)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server  # the bound port: aiohttp keeps it on the site's server
        assert isinstance(server, asyncio.base_events.Server)
        self.port = int(server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop pushing and serving; bounded, never raises."""
        self._closing = True
        for task in list(self.pending):
            task.cancel()
        if self.pending:
            await asyncio.wait(list(self.pending), timeout=5.0)
        runner, self._runner = self._runner, None
        if runner is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(runner.cleanup(), 5.0)
        session, self._session = self._session, None
        if session is not None:
            with contextlib.suppress(Exception):
                await session.close()

    def write(self, chat: str, text: str, user: str) -> UserMessage:
        """A user writes ``text`` in ``chat``: recorded now, pushed to a node in the
        background (see the module docs)."""
        message = UserMessage(
            chat_id=chat,
            tenant=tenant_of(chat),
            message_id=f"m-{next(self._ids)}",
            text=text,
            at=time.time(),
        )
        self.transcript.add(message)
        task = asyncio.ensure_future(self._push(message, user))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)
        return message

    async def _push(self, message: UserMessage, user: str) -> None:
        body = {
            "chat_id": message.chat_id,
            "tenant": message.tenant,
            "message_id": message.message_id,
            "text": message.text,
            "user_id": user,
        }
        while not self._closing:
            for _ in self.hook_ports:
                port = self.hook_ports[next(self._turn) % len(self.hook_ports)]
                if await self._offer(port, body):
                    return
            await asyncio.sleep(RETRY_S)

    async def _offer(self, port: int, body: dict[str, str]) -> bool:
        session = self._session
        if session is None:
            return False
        self.pushes += 1
        try:
            async with session.post(f"http://127.0.0.1:{port}/event", json=body) as answer:
                await answer.read()
                if answer.status == 200:
                    return True
        except (aiohttp.ClientError, TimeoutError, OSError):
            pass
        self.refused += 1
        return False

    async def _send(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            chat, content, node = str(body["chat_id"]), body["content"], str(body.get("node", ""))
            if not isinstance(content, str) or not chat.startswith("chat-"):
                raise ValueError("a chat-N chat and a str content are required")
            tenant = tenant_of(chat)
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"error": f"bad send: {exc}"}, status=400)
        await asyncio.sleep(SEND_S)
        self.transcript.add(
            BotMessage(chat_id=chat, tenant=tenant, text=content, at=time.time(), node=node)
        )
        return web.json_response({"message_id": f"b-{next(self._ids)}"})

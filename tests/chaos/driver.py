"""The connector nodes' driver for the chaos platform (:mod:`tests.chaos.platform`).

Like a webhook platform (the Slack Events API, Telegram webhooks): the platform POSTs each user
message to one node's hook (``POST /event``), and the node answers ``200`` only once its
connector's intake returned -- the event is then durably the cluster's -- and ``503`` when the
intake raised :class:`~relay.connector.intake.IntakeFull` (the platform offers it again, maybe
to the other node).  A send is ``POST /send`` on the platform's API; the platform records it in
its transcript with the node's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web

from relay.connector.intake import IntakeFull
from relay.connector.platform import Intake, target_chat
from relay.wire.descriptor import CONTRACT_VERSION, LEGACY_OPS, CapabilityDescriptor
from relay.wire.frames import EventSource, InboundEvent, OutboundOutcome

__all__ = ["PLATFORM", "ChaosDriver"]

PLATFORM = "chaos"
_SEND_TIMEOUT_S = 5.0
log = logging.getLogger("tests.chaos.driver")


class ChaosDriver:
    """One node's edge to the chaos platform: its hook on ``hook_port``, its sends to
    ``api_url``, under the name ``node``."""

    platform = PLATFORM

    def __init__(self, *, api_url: str, hook_port: int, node: str) -> None:
        self.api_url = api_url.rstrip("/")
        self.hook_port = hook_port
        self.node = node
        self._intake: Intake | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._descriptor = CapabilityDescriptor(
            contract_version=CONTRACT_VERSION,
            platform=PLATFORM,
            label="Chaos chat",
            max_message_length=4096,
            supports_draft_streaming=False,
            supports_edit=False,
            supports_threads=False,
            markdown_dialect="plain",
            len_unit="chars",
            supported_ops=LEGACY_OPS,
        )

    def attach(self, intake: Intake) -> None:
        """Called by the connector: inbound events go through ``intake``."""
        self._intake = intake

    def descriptor(self) -> CapabilityDescriptor:
        """The chaos platform's capabilities."""
        return self._descriptor

    async def start(self) -> None:
        """Open the API session and serve the hook; raises ``OSError`` when the port is taken."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_SEND_TIMEOUT_S))
        app = web.Application()
        app.router.add_post("/event", self._event)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.hook_port, reuse_address=True).start()

    async def stop(self) -> None:
        """Stop the hook and close the session; bounded, never raises."""
        runner, self._runner = self._runner, None
        if runner is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(runner.cleanup(), 5.0)
        session, self._session = self._session, None
        if session is not None:
            with contextlib.suppress(Exception):
                await session.close()

    async def _event(self, request: web.Request) -> web.Response:
        if self._intake is None:
            return web.Response(status=503, text="not attached")
        try:
            body = await request.json()
            event = InboundEvent(
                text=str(body["text"]),
                message_id=str(body["message_id"]),
                source=EventSource(
                    platform=PLATFORM,
                    chat_id=str(body["chat_id"]),
                    chat_type="group",
                    user_id=str(body["user_id"]),
                    scope_id=str(body["tenant"]),
                ),
            )
        except (ValueError, KeyError, TypeError) as exc:
            return web.Response(status=400, text=f"bad event: {exc}")
        try:
            await self._intake(PLATFORM, event)
        except IntakeFull as exc:
            return web.Response(status=503, text=f"intake full: {exc}")
        except Exception as exc:  # the platform offers it again; the log says why
            log.warning("intake failed: %r", exc)
            return web.Response(status=500, text=f"intake failed: {exc!r}")
        return web.Response(status=200, text="ok")

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        """Send through the platform's API; a refusal or no answer is a failed outcome."""
        op = action.get("op")
        chat_id = target_chat(action)
        content = action.get("content")
        if op == "typing":
            return OutboundOutcome(True)
        if op != "send" or chat_id is None or not isinstance(content, str) or not content:
            return OutboundOutcome(False, None, f"unsupported action {op!r}", "bad_action")
        session = self._session
        if session is None:
            return OutboundOutcome(False, None, "platform unreachable", "platform_down")
        try:
            async with session.post(
                f"{self.api_url}/send",
                json={"chat_id": chat_id, "content": content, "node": self.node},
            ) as answer:
                data = await answer.json()
                if answer.status != 200:
                    return OutboundOutcome(False, None, str(data.get("error")), "refused")
                return OutboundOutcome(True, str(data["message_id"]))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
            return OutboundOutcome(False, None, f"platform unreachable: {exc!r}", "platform_down")

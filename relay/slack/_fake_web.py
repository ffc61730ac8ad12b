"""The served half of the fake Slack (:mod:`relay.slack.testing`): the channels, their
messages, the methods a bot calls, answered as Slack's documentation says (errors as HTTP
200 with ``ok: false``, a rate limit as HTTP 429 with ``Retry-After``), and the Socket Mode
endpoint."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any, Final

import attrs
from aiohttp import web

from relay.slack._fake_delivery import Deliverer, Socket

__all__ = ["MAX_TEXT", "FakeWebApi", "Fault"]

MAX_TEXT: Final = 40_000
"""Slack's limit on a message's text (``msg_too_long`` past it)."""


@attrs.define
class Fault:
    """One failure asked for by a test (see ``FakeSlack.fail_next``)."""

    status: int = 200
    error: str | None = None
    retry_after: float | None = None
    drop_after_acting: bool = False


class FakeWebApi:
    """The Web API methods and the Socket Mode endpoint, mixed into ``FakeSlack`` (which sets
    every attribute below)."""

    team_id: str
    app_id: str
    bot_user_id: str
    bot_id: str
    bot_token: str
    app_token: str
    calls: list[tuple[str, dict[str, Any]]]
    revoked: set[str]
    _port: int
    _channels: dict[str, str]
    _messages: dict[str, dict[str, dict[str, Any]]]
    _faults: dict[str, list[Fault]]
    _tickets: set[str]
    _last_us: int
    _socket_numbers: Iterator[int]
    delivery: Deliverer
    connections_opened: int

    def push_event(self, event: Any, *, event_id: str | None = None) -> str:
        """Deliver ``event`` to the app (``FakeSlack`` delivers it)."""
        raise NotImplementedError

    def _next_ts(self) -> str:
        micro = max(self._last_us + 1, int(time.time() * 1_000_000))
        self._last_us = micro
        return f"{micro // 1_000_000}.{micro % 1_000_000:06d}"

    def _post(self, channel: str, user: str, text: str, thread_ts: str | None, *, bot: bool) -> str:
        ts = self._next_ts()
        message = {"ts": ts, "user": user, "text": text, "bot": bot, "edited": False}
        if thread_ts is not None:
            message["thread_ts"] = thread_ts
            parent = self._messages[channel].get(thread_ts)
            if parent is not None:
                parent["thread_ts"] = thread_ts
        self._messages[channel][ts] = message
        return ts

    def _changed_event(self, channel: str, message: dict[str, Any]) -> None:
        now = self._next_ts()
        changed: dict[str, Any] = {k: message[k] for k in ("ts", "user", "text")}
        changed["type"] = "message"
        changed["edited"] = {"user": message["user"], "ts": now}
        if message["bot"]:
            changed["bot_id"] = self.bot_id
        if message.get("thread_ts"):
            changed["thread_ts"] = message["thread_ts"]
        self.push_event(
            {
                "type": "message",
                "subtype": "message_changed",
                "channel": channel,
                "channel_type": self._channels[channel],
                "hidden": True,
                "ts": now,
                "event_ts": now,
                "message": changed,
            }
        )

    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        args: dict[str, Any] = dict(request.query)
        raw = await request.read()
        if raw:
            if request.content_type == "application/json":
                with contextlib.suppress(ValueError):
                    body = json.loads(raw)
                    if isinstance(body, dict):
                        args.update(body)
            else:
                args.update(await request.post())
        self.calls.append((method, dict(args)))
        token = args.pop("token", None)
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            token = header[len("Bearer ") :]
        faults = self._faults.get(method)
        fault = faults.pop(0) if faults else None
        if fault is not None and fault.status == 429:
            headers = {"Retry-After": str(int(fault.retry_after or 1))}
            return web.json_response(
                {"ok": False, "error": "ratelimited"}, status=429, headers=headers
            )
        if fault is not None and fault.status >= 500:
            return web.Response(
                status=fault.status,
                text="<html>Service Unavailable</html>",
                content_type="text/html",
            )
        if fault is not None and fault.error is not None:
            return web.json_response({"ok": False, "error": fault.error})
        answer = self._method(method, token, args)
        if fault is not None and fault.drop_after_acting:
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=200)  # never reaches the caller: the connection is gone
        return web.json_response(answer)

    def _method(self, method: str, token: object, args: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(token, str) or not token:
            return {"ok": False, "error": "not_authed"}
        if token in self.revoked:
            return {"ok": False, "error": "token_revoked"}
        if token not in (self.bot_token, self.app_token):
            return {"ok": False, "error": "invalid_auth"}
        if method == "apps.connections.open":
            if token != self.app_token:
                return {"ok": False, "error": "not_allowed_token_type"}
            ticket = uuid.uuid4().hex
            self._tickets.add(ticket)
            url = f"ws://127.0.0.1:{self._port}/link/?ticket={ticket}&app_id={self.app_id}"
            return {"ok": True, "url": url}
        if token != self.bot_token:
            return {"ok": False, "error": "not_allowed_token_type"}
        if method == "auth.test":
            return {
                "ok": True,
                "url": "https://fake.slack.com/",
                "team": "Fake",
                "user": "bot",
                "team_id": self.team_id,
                "user_id": self.bot_user_id,
                "bot_id": self.bot_id,
                "is_enterprise_install": False,
            }
        channel = args.get("channel")
        if method not in ("chat.postMessage", "chat.update", "conversations.info"):
            return {"ok": False, "error": "unknown_method"}
        if not isinstance(channel, str) or channel not in self._channels:
            return {"ok": False, "error": "channel_not_found"}
        if method == "conversations.info":
            kind = self._channels[channel]
            info = {
                "id": channel,
                "name": channel.lower(),
                "is_im": kind == "im",
                "is_mpim": kind == "mpim",
                "is_private": kind in ("group", "mpim", "im"),
                "is_channel": kind == "channel",
                "is_group": kind == "group",
            }
            return {"ok": True, "channel": info}
        text = args.get("text")
        if not isinstance(text, str) or not text:
            return {"ok": False, "error": "no_text"}
        if len(text) > MAX_TEXT:
            return {"ok": False, "error": "msg_too_long"}
        if method == "chat.update":
            message = self._messages[channel].get(str(args.get("ts")))
            if message is None:
                return {"ok": False, "error": "message_not_found"}
            if not message["bot"]:
                return {"ok": False, "error": "cant_update_message"}
            message["text"], message["edited"] = text, True
            self._changed_event(channel, message)
            return {"ok": True, "channel": channel, "ts": message["ts"], "text": text}
        thread = args.get("thread_ts")
        thread_ts = thread if isinstance(thread, str) and thread else None
        ts = self._post(channel, self.bot_user_id, text, thread_ts, bot=True)
        event: dict[str, Any] = {
            "type": "message",
            "channel": channel,
            "user": self.bot_user_id,
            "bot_id": self.bot_id,
            "text": text,
            "ts": ts,
            "event_ts": ts,
            "channel_type": self._channels[channel],
        }
        if thread_ts is not None:
            event["thread_ts"] = thread_ts
        self.push_event(event)
        message = {
            "type": "message",
            "user": self.bot_user_id,
            "bot_id": self.bot_id,
            "text": text,
            "ts": ts,
        }
        return {"ok": True, "channel": channel, "ts": ts, "message": message}

    # -- Socket Mode -----------------------------------------------------------------------------

    async def _link(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets:
            return web.Response(status=401, text="invalid or used ticket")
        self._tickets.discard(ticket)
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        socket = Socket(next(self._socket_numbers), ws, request)
        self.delivery.sockets.append(socket)
        self.connections_opened += 1
        hello = {
            "type": "hello",
            "num_connections": len(self.delivery.open_sockets()),
            "debug_info": {"host": "fake", "approximate_connection_time": 18060},
            "connection_info": {"app_id": self.app_id},
        }
        await ws.send_str(json.dumps(hello))
        self.delivery.changed.set()
        with contextlib.suppress(Exception):
            async for frame in ws:
                if frame.type == web.WSMsgType.TEXT:
                    self.delivery.on_frame(socket, frame.data)
        socket.draining = True
        self.delivery.changed.set()
        return ws

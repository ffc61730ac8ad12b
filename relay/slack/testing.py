"""A fake Slack on loopback, written from Slack's published API documentation, for testing bots
(the driver's own tests use it, and so may yours).

:class:`FakeSlack` serves, on ``127.0.0.1`` (port 0 unless given):

* the Web API methods a bot uses, under :attr:`FakeSlack.api_url` (``http://127.0.0.1:P/api/``,
  the ``base_url`` of ``slack_sdk``'s clients): ``auth.test``, ``apps.connections.open`` (app
  token only; a single-use ``ws://`` URL on the same fake), ``chat.postMessage`` (returns the
  message's ``ts``; ``msg_too_long`` past 40,000 characters), ``chat.update`` (the bot's own
  messages), ``conversations.info``.  Arguments are read from the query, a form or a JSON body;
  the token from ``Authorization: Bearer``.  Errors are HTTP 200 with ``{"ok": false, "error":
  ...}`` (``invalid_auth``, ``not_authed``, ``token_revoked``, ``not_allowed_token_type``,
  ``channel_not_found``, ``no_text``, ``message_not_found``, ``cant_update_message``), a rate
  limit is HTTP 429 with ``Retry-After``, as Slack answers;
* Socket Mode: ``hello`` on connect, ``events_api`` envelopes, redelivery of every envelope not
  acknowledged within 3 s, ``disconnect`` when told to (see ``relay.slack._fake_delivery``);
* the Events API pusher: with :attr:`request_url` set, events are signed ``POST`` requests to
  it instead, retried on a non-2xx or after 3 s.

What the bot does is recorded as a person would see it: :meth:`FakeSlack.channel` shows a
channel's messages, threads and edits.  What a person does: :meth:`FakeSlack.user_writes`,
:meth:`FakeSlack.user_edits`, :meth:`FakeSlack.push_event`.  As the real platform, the bot
receives its own messages back as events.  What hurts, on demand: :meth:`fail_next` (429 with
``Retry-After``, a 5xx, a method that acts and then never answers), :meth:`duplicate_next`
(the same event delivered twice), :meth:`send_raw` (malformed envelopes), :meth:`disconnect`
(``refresh_requested``, ``warning``, ``link_disabled``), :meth:`drop_sockets`, :meth:`revoke`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any, Final

import attrs
from aiohttp import web

from relay.slack._fake_delivery import Deliverer, Delivery, Socket, sign
from relay.slack._fake_web import MAX_TEXT, FakeWebApi, Fault

__all__ = ["MAX_TEXT", "ChannelView", "Delivery", "FakeSlack", "SlackMessage", "sign"]

_CHANNEL_TYPES: Final = frozenset(("im", "mpim", "channel", "group"))


@attrs.frozen
class SlackMessage:
    """One message in a channel, as people see it."""

    ts: str
    user: str
    text: str
    thread_ts: str | None = None
    bot: bool = False
    edited: bool = False


@attrs.frozen
class ChannelView:
    """What one channel shows: every message in ``ts`` order (thread replies included)."""

    channel: str
    channel_type: str
    messages: tuple[SlackMessage, ...]

    def top_level(self) -> list[SlackMessage]:
        """The messages outside any thread (thread parents included)."""
        return [m for m in self.messages if m.thread_ts is None or m.thread_ts == m.ts]

    def thread(self, ts: str) -> list[SlackMessage]:
        """The replies in the thread of the message ``ts``."""
        return [m for m in self.messages if m.thread_ts == ts and m.ts != ts]

    def bot_texts(self) -> list[str]:
        """The bot's messages' texts, in order (edits applied)."""
        return [m.text for m in self.messages if m.bot]


class FakeSlack(FakeWebApi):
    """One Slack workspace with one app and its bot (see the module docs).

    ``FakeSlack(*, team_id="T0FAKE", bot_user_id="U0BOT", bot_id="B0BOT", bot_token=
    "xoxb-fake", app_token="xapp-fake", signing_secret="fake-signing-secret",
    ack_timeout_s=3.0, retry_delays_s=(0.0, 60.0, 300.0), refresh_grace_s=10.0, port=0)``.
    ``await start()`` before use, ``await stop()`` after.
    """

    def __init__(
        self,
        *,
        team_id: str = "T0FAKE",
        bot_user_id: str = "U0BOT",
        bot_id: str = "B0BOT",
        bot_token: str = "xoxb-fake",
        app_token: str = "xapp-fake",
        signing_secret: str = "fake-signing-secret",
        ack_timeout_s: float = 3.0,
        retry_delays_s: Sequence[float] = (0.0, 60.0, 300.0),
        refresh_grace_s: float = 10.0,
        port: int = 0,
    ) -> None:
        self.team_id = team_id
        self.app_id = "A0FAKE"
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.refresh_grace_s = refresh_grace_s
        self._port = port
        self.delivery = Deliverer(
            signing_secret=signing_secret,
            ack_timeout_s=ack_timeout_s,
            retry_delays_s=retry_delays_s,
        )
        self.calls: list[tuple[str, dict[str, Any]]] = []
        """Every Web API call (method, arguments), in order, failed ones included."""
        self.revoked: set[str] = set()
        self._channels: dict[str, str] = {}
        self._messages: dict[str, dict[str, dict[str, Any]]] = {}
        self._faults: dict[str, list[Fault]] = {}
        self._duplicates = 0
        self._tickets: set[str] = set()
        self._socket_numbers = itertools.count(1)
        self._last_us = 0
        self._runner: web.AppRunner | None = None
        self.connections_opened = 0
        """Socket Mode connections the app opened (hello sent)."""

    # -- life ------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on loopback; :attr:`api_url` is usable when this returns."""
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/link/", self._link)
        self._runner = web.AppRunner(
            app, handle_signals=False, access_log=None, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self._port)
        await site.start()
        server = site._server
        assert server is not None
        self._port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

    async def stop(self) -> None:
        """Stop delivering, close every connection and stop listening."""
        await self.delivery.close()
        for socket in list(self.delivery.sockets):
            with contextlib.suppress(Exception):
                await socket.ws.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def port(self) -> int:
        """The port the fake listens on (after :meth:`start`)."""
        return self._port

    @property
    def api_url(self) -> str:
        """The Web API's base URL, ending in ``/``."""
        return f"http://127.0.0.1:{self._port}/api/"

    @property
    def request_url(self) -> str | None:
        """Where events are pushed over HTTP (the Events API); None: over Socket Mode."""
        return self.delivery.request_url

    @request_url.setter
    def request_url(self, url: str | None) -> None:
        self.delivery.request_url = url

    # -- what people do --------------------------------------------------------------------------

    def add_channel(self, channel: str, channel_type: str = "channel") -> None:
        """Make ``channel`` exist (``im``, ``mpim``, ``channel`` or ``group``), the bot in it."""
        if channel_type not in _CHANNEL_TYPES:
            raise ValueError(f"channel_type must be one of {sorted(_CHANNEL_TYPES)}")
        self._channels.setdefault(channel, channel_type)
        self._messages.setdefault(channel, {})

    def user_writes(
        self,
        channel: str,
        text: str,
        *,
        user: str = "U0PERSON",
        channel_type: str = "im",
        thread_ts: str | None = None,
    ) -> str:
        """A person writes ``text`` in ``channel`` (made with ``channel_type`` if new), in the
        thread of ``thread_ts`` if given; the message event goes to the app.  Returns its ts."""
        self.add_channel(channel, channel_type)
        ts = self._post(channel, user, text, thread_ts, bot=False)
        event: dict[str, Any] = {
            "type": "message",
            "channel": channel,
            "user": user,
            "text": text,
            "ts": ts,
            "event_ts": ts,
            "channel_type": self._channels[channel],
            "team": self.team_id,
            "client_msg_id": str(uuid.uuid4()),
        }
        if thread_ts is not None:
            event["thread_ts"] = thread_ts
        self.push_event(event)
        return ts

    def user_edits(self, channel: str, ts: str, text: str) -> None:
        """The person who wrote ``ts`` edits it: the app gets a ``message_changed`` event."""
        message = self._messages[channel][ts]
        message["text"], message["edited"] = text, True
        self._changed_event(channel, message)

    def push_event(self, event: Any, *, event_id: str | None = None) -> str:
        """Deliver any ``event`` (even a malformed one) in a proper event callback; returns
        its ``event_id``."""
        event_id = event_id or "Ev" + uuid.uuid4().hex[:16].upper()
        payload = {
            "token": "fake-verification-token",
            "team_id": self.team_id,
            "api_app_id": self.app_id,
            "event": event,
            "type": "event_callback",
            "event_id": event_id,
            "event_time": int(time.time()),
            "authorizations": [
                {"team_id": self.team_id, "user_id": self.bot_user_id, "is_bot": True}
            ],
        }
        self.push_payload(payload, event_id=event_id)
        return event_id

    def push_payload(self, payload: Any, *, event_id: str = "-") -> None:
        """Deliver ``payload`` as an envelope's payload (or a request's body) as it is."""
        copies = 1
        if self._duplicates:
            self._duplicates -= 1
            copies = 2
        self.delivery.deliver(event_id, payload, copies=copies)

    # -- what hurts ------------------------------------------------------------------------------

    def fail_next(
        self,
        method: str,
        *,
        status: int = 200,
        error: str | None = None,
        retry_after: float | None = None,
        drop_after_acting: bool = False,
        times: int = 1,
    ) -> None:
        """The next ``times`` calls of ``method`` fail: ``status=429`` with ``retry_after``
        (seconds, the ``Retry-After`` header), a 5xx (an HTML body), an ``error`` (HTTP 200,
        ``ok: false``), or ``drop_after_acting`` (the method acts, then the connection is
        closed without an answer)."""
        fault = Fault(status, error, retry_after, drop_after_acting)
        self._faults.setdefault(method, []).extend(attrs.evolve(fault) for _ in range(times))

    def duplicate_next(self, count: int = 1) -> None:
        """The next ``count`` events are delivered twice (two envelopes, maybe on two
        connections, each retried on its own)."""
        self._duplicates += count

    def revoke(self, token: str) -> None:
        """From now on ``token`` is answered ``token_revoked``."""
        self.revoked.add(token)

    async def send_raw(self, text: str) -> int:
        """Send ``text`` as a frame on every open connection; how many got it."""
        sent = 0
        for socket in self.delivery.open_sockets():
            with contextlib.suppress(ConnectionError, RuntimeError):
                await socket.ws.send_str(text)
                sent += 1
        return sent

    async def disconnect(
        self, reason: str = "refresh_requested", *, close_after_s: float | None = None
    ) -> None:
        """Send ``disconnect`` (``reason``) on every open connection, take no new envelope
        there, and close it ``close_after_s`` later (default ``refresh_grace_s``)."""
        delay = self.refresh_grace_s if close_after_s is None else close_after_s
        frame = json.dumps({"type": "disconnect", "reason": reason, "debug_info": {"host": "fake"}})
        for socket in self.delivery.open_sockets():
            socket.draining = True
            with contextlib.suppress(ConnectionError, RuntimeError):
                await socket.ws.send_str(frame)
            asyncio.get_running_loop().call_later(delay, self._close_later, socket)

    def _close_later(self, socket: Socket) -> None:
        task = asyncio.ensure_future(socket.ws.close())
        closing = self.delivery.closing
        closing.add(task)  # type: ignore[arg-type]
        task.add_done_callback(closing.discard)

    def drop_sockets(self) -> None:
        """Cut every Socket Mode connection at once (no close frame)."""
        for socket in self.delivery.sockets:
            socket.draining = True
            transport = socket.request.transport
            if transport is not None:
                transport.close()

    # -- what the bot did ------------------------------------------------------------------------

    def channel(self, channel: str) -> ChannelView:
        """What ``channel`` shows now (KeyError for a channel nobody wrote in)."""
        messages = sorted(self._messages[channel].values(), key=lambda m: _ts_key(m["ts"]))
        return ChannelView(
            channel,
            self._channels[channel],
            tuple(
                SlackMessage(
                    m["ts"], m["user"], m["text"], m.get("thread_ts"), m["bot"], m["edited"]
                )
                for m in messages
            ),
        )

    def channels(self) -> list[str]:
        """Every channel that exists."""
        return list(self._channels)

    @property
    def sockets(self) -> list[Socket]:
        """Every Socket Mode connection ever opened (closed ones included)."""
        return self.delivery.sockets

    async def settled(self, timeout_s: float = 10.0) -> None:
        """Until no delivery is in flight (each acknowledged or given up); TimeoutError after
        ``timeout_s``."""
        async with asyncio.timeout(timeout_s):
            while self.delivery.in_flight:
                self.delivery.changed.clear()
                await self.delivery.changed.wait()

    async def verify_url(self, url: str) -> bool:
        """Slack's ``url_verification`` of ``url``: True when it answers the challenge."""
        challenge = uuid.uuid4().hex
        body = {
            "token": "fake-verification-token",
            "challenge": challenge,
            "type": "url_verification",
        }
        status, text = await self.delivery.post_signed(url, body)
        if status != 200:
            return False
        with contextlib.suppress(ValueError):
            answer = json.loads(text)
            if isinstance(answer, dict):
                return bool(answer.get("challenge") == challenge)
        return text.strip() == challenge


def _ts_key(ts: str) -> tuple[int, int]:
    seconds, _, micro = ts.partition(".")
    return int(seconds), int(micro or 0)

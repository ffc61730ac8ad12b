"""The Slack platform driver: a bot in a Slack workspace, behind the connector.

:class:`SlackDriver` is a connector driver (``Connector(store, drivers={"slack": driver}, ...)``):
the connector holds the bot's tokens through it, the gateway stays free of any Slack code.  It
keeps the one rule of every driver (``docs/platforms.md``): Slack's cursor is the ack of each
delivery, and the driver acks only once the connector's intake returned for the event, within
Slack's 3 s window (:mod:`relay.slack._take`); an event not taken in time is left unacked, Slack
delivers it again, and the connector's durable dedupe (by message id, ``<channel>:<ts>``) makes
the copy harmless.  Slack keeps every unacked event for its retries, so the driver stores no
cursor of its own.

* **Inbound**, one of two modes: Socket Mode (``mode="socket"``, the app-level token:
  :mod:`relay.slack._socket`, up to 10 connections) or the Events API (``mode="events"``, the
  signing secret: :mod:`relay.slack._http`, an aiohttp endpoint the driver serves).  The bot's
  own messages are passed over; what cannot be mapped is recorded as rejected.
* **Outbound** (:mod:`relay.slack._outbound`): ``chat.postMessage`` and ``chat.update`` through
  ``slack_sdk``'s ``AsyncWebClient``.  Slack does not deduplicate sends, so this is not an
  ``IdempotentDriver``: a resend after an ambiguous attempt keeps the ledger's label.

Outcome codes: ``too_long``, ``bad_action``, ``unsupported_op`` (``typing``), ``not_found``,
``forbidden``, ``rate_limited`` and ``platform_down`` (the budget ran out, or Slack may have
acted), ``auth`` (the token is refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Final, Literal

from aiohttp import web

from relay.connector.driver_kit import IntakeSlot, LoopTask, RoundLoop
from relay.connector.platform import Intake
from relay.slack._api import DEFAULT_API_URL, SlackAuthError, SlackError, SlackUnreachable, WebApi
from relay.slack._events import Me
from relay.slack._http import EventsEndpoint
from relay.slack._outbound import OPS, Sender
from relay.slack._socket import SocketMode
from relay.slack._take import Taker, chat_type_by_prefix
from relay.wire.descriptor import CONTRACT_VERSION, CapabilityDescriptor
from relay.wire.frames import OutboundOutcome
from statecore.clock import Clock, SystemClock

__all__ = ["MAX_MESSAGE_CHARS", "SLACK_TEXT_LIMIT", "SlackDriver"]

log = logging.getLogger("relay.slack")

SLACK_TEXT_LIMIT: Final = 40_000
"""Slack's own limit on a message's text (``msg_too_long`` past it)."""
MAX_MESSAGE_CHARS: Final = 4_000
"""The default ``max_message_length`` announced: Slack's advice for a readable message (longer
replies are split by the gateway); up to :data:`SLACK_TEXT_LIMIT` may be configured."""


class SlackDriver:
    """One Slack app's bot in one workspace (see the module docs).

    ``SlackDriver(bot_token, *, app_token=None, signing_secret=None, mode="socket",
    connections=1, events_host="127.0.0.1", events_port=0, events_path="/slack/events",
    api_url="https://slack.com/api/", platform="slack", label="Slack",
    max_message_length=4000, reply_in_thread=False, ack_budget_s=2.5, send_budget_s=20.0,
    request_timeout_s=10.0, clock=None)``

    ``bot_token`` (``xoxb-``) posts; Socket Mode needs ``app_token`` (``xapp-``, scope
    ``connections:write``), the Events API ``signing_secret``.  ``reply_in_thread``: a reply
    to a message outside a thread starts a thread under it (default: answer in the channel).
    Raises ``ValueError`` / ``TypeError`` for a bad option.

    The connector calls :meth:`attach`, :meth:`start` (raises
    :class:`~relay.slack._api.SlackAuthError` when a token is refused) and :meth:`stop`.
    """

    def __init__(
        self,
        bot_token: str,
        *,
        app_token: str | None = None,
        signing_secret: str | None = None,
        mode: Literal["socket", "events"] = "socket",
        connections: int = 1,
        events_host: str = "127.0.0.1",
        events_port: int = 0,
        events_path: str = "/slack/events",
        api_url: str = DEFAULT_API_URL,
        platform: str = "slack",
        label: str = "Slack",
        max_message_length: int = MAX_MESSAGE_CHARS,
        reply_in_thread: bool = False,
        ack_budget_s: float = 2.5,
        send_budget_s: float = 20.0,
        request_timeout_s: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        _check(bot_token, app_token, signing_secret, mode, connections)
        if not (
            isinstance(max_message_length, int) and 1 <= max_message_length <= SLACK_TEXT_LIMIT
        ):
            raise ValueError(f"max_message_length must be 1 to {SLACK_TEXT_LIMIT}")
        if not 0 < ack_budget_s < 3.0:
            raise ValueError("ack_budget_s must be within Slack's 3 s window")
        if not send_budget_s > 0 or not request_timeout_s > 0:
            raise ValueError("send_budget_s and request_timeout_s must be positive")
        self.platform = platform
        self.mode = mode
        self.clock: Clock = clock or SystemClock()
        self.me: Me | None = None
        """Who the bot is (``auth.test``), once known."""
        self.team_id: str | None = None
        self._api = WebApi(bot_token, base_url=api_url, timeout_s=request_timeout_s)
        self._app_api = (
            WebApi(app_token, base_url=api_url, timeout_s=request_timeout_s) if app_token else None
        )
        self._attached = IntakeSlot("Slack", needs="rejections")
        self._channel_types: dict[str, str] = {}
        self.taker = Taker(
            platform=platform,
            intake=self._attached,
            me=lambda: self.me,
            chat_type_of=self._chat_type_of,
            clock=self.clock,
            ack_budget_s=ack_budget_s,
        )
        self.socket: SocketMode | None = None
        if mode == "socket":
            assert self._app_api is not None
            self.socket = SocketMode(
                self._app_api,
                platform=platform,
                taker=self.taker,
                intake=self._attached,
                connections=connections,
                clock=self.clock,
            )
        self.endpoint: EventsEndpoint | None = None
        if mode == "events":
            assert signing_secret is not None
            self.endpoint = EventsEndpoint(
                platform=platform,
                signing_secret=signing_secret,
                taker=self.taker,
                intake=self._attached,
                clock=self.clock,
                path=events_path,
            )
        self._events_host, self._events_port = events_host, events_port
        self._runner: web.AppRunner | None = None
        self._descriptor = CapabilityDescriptor(
            contract_version=CONTRACT_VERSION,
            platform=platform,
            label=label,
            max_message_length=max_message_length,
            supports_draft_streaming=False,
            supports_edit=True,
            supports_threads=True,
            markdown_dialect="slack_mrkdwn",
            len_unit="chars",
            supported_ops=OPS,
        )
        self._sender = Sender(
            self._api,
            clock=self.clock,
            send_budget_s=send_budget_s,
            max_chars=max_message_length,
            reply_in_thread=reply_in_thread,
        )
        self._task = LoopTask()

    # -- the connector's side -------------------------------------------------------------------

    def attach(self, intake: Intake) -> None:
        """Called by the connector; ``intake`` must be its :class:`DriverIntake` (rejections
        are kept through it).  Raises ``TypeError`` for a plain callable."""
        self._attached.attach(intake)

    def descriptor(self) -> CapabilityDescriptor:
        """What the bot can do here (sent to gateways in answer to hello): send, edit and
        follow_up, threads; no typing, no idempotent sends."""
        return self._descriptor

    @property
    def events_url(self) -> str | None:
        """The Events API endpoint's URL once served (``mode="events"``), else None."""
        if self._runner is None or self.endpoint is None:
            return None
        return f"http://{self._events_host}:{self._events_port}{self.endpoint.path}"

    async def start(self) -> None:
        """Check the tokens and start reading Slack.

        Raises :class:`SlackAuthError` when Slack refuses a token for good; a Slack that
        cannot be reached now is retried by the driver's loop, with backoff.
        """
        self._attached()
        if self._task.running:
            return
        try:
            await self._identify()
            if self._app_api is not None:
                await self._app_api.call("apps.connections.open")
        except SlackError as exc:
            if exc.auth:
                await self._close_clients()
                raise SlackAuthError(
                    f"slack: {exc.method} refused the token: {exc.error}"
                ) from None
            log.warning("slack: cannot check the tokens yet (%s); retrying", exc)
        except SlackUnreachable as exc:
            log.warning("slack: cannot reach Slack yet (%s); retrying", exc)
        if self.endpoint is not None:
            self._runner = web.AppRunner(self.endpoint.app(), access_log=None, shutdown_timeout=2.0)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self._events_host, self._events_port)
            await site.start()
            server = site._server
            if server is not None and self._events_port == 0:
                self._events_port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
        self._task.start(self._run(), name=f"slack-{self.platform}")

    async def _identify(self) -> None:
        answer = await self._api.call("auth.test")
        user, bot = answer.get("user_id"), answer.get("bot_id")
        if not isinstance(user, str) or not user:
            raise SlackUnreachable("slack auth.test: no user_id in the answer", sent=True)
        team = answer.get("team_id")
        self.team_id = team if isinstance(team, str) else None
        self.me = Me(user, bot if isinstance(bot, str) else None)

    async def _run(self) -> None:
        if self.me is None:
            identifying = RoundLoop(self.clock)

            async def one_round() -> bool:
                await self._identify()
                return True

            async def failed(exc: Exception) -> float:
                if not isinstance(exc, SlackError | SlackUnreachable):
                    raise exc
                delay = identifying.backoff.fail()
                log.warning("slack: auth.test failed (%s); asking again in %g s", exc, delay)
                return delay

            await identifying.run(one_round, failed)
        if self.socket is not None:
            await self.socket.run()

    async def stop(self) -> None:
        """Stop reading and writing Slack; bounded, idempotent, never raises."""
        await self._task.stop()
        runner, self._runner = self._runner, None
        if runner is not None:
            with contextlib.suppress(Exception):
                await runner.cleanup()
        await self.taker.drain(5.0)
        await self._close_clients()

    async def _close_clients(self) -> None:
        await self._api.close()
        if self._app_api is not None:
            await self._app_api.close()

    async def _chat_type_of(self, channel: str, deadline: float) -> str:
        """``dm``, ``group`` or ``channel`` for an event that did not say (an app_mention):
        ``conversations.info`` (remembered), else the id's prefix."""
        known = self._channel_types.get(channel)
        if known is not None:
            return known
        remaining = deadline - self.clock.monotonic() - 0.3
        kind = chat_type_by_prefix(channel)
        if remaining > 0:
            with contextlib.suppress(SlackError, SlackUnreachable, TimeoutError):
                async with asyncio.timeout(remaining):
                    answer = await self._api.call("conversations.info", {"channel": channel})
                info = answer.get("channel")
                if isinstance(info, dict):
                    is_dm, is_mpim = info.get("is_im") is True, info.get("is_mpim") is True
                    private = info.get("is_private") is True or info.get("is_group") is True
                    kind = "dm" if is_dm else "group" if is_mpim or private else "channel"
                    self._channel_types[channel] = kind
        return kind

    # -- outbound --------------------------------------------------------------------------------

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        """Perform one action (``send``, ``edit``, ``follow_up``); never raises for Slack's
        refusals (see the module docs for the codes)."""
        return await self._sender.perform(action)

    # -- counts ----------------------------------------------------------------------------------

    @property
    def taken(self) -> int:
        """Inbound events handed to the connector's intake by this driver."""
        return self.taker.taken

    @property
    def rejected(self) -> int:
        """Inbound events recorded as rejected."""
        return self.taker.rejected

    @property
    def unacked(self) -> int:
        """Deliveries left unacked (refused, too slow, too many): Slack sends them again."""
        return self.taker.unacked

    @property
    def rate_limited(self) -> int:
        """429 answers waited out."""
        return self._sender.rate_limited


def _check(
    bot_token: object, app_token: object, secret: object, mode: object, connections: object
) -> None:
    if not isinstance(bot_token, str) or not bot_token:
        raise TypeError("bot_token must be a non-empty str (xoxb-...)")
    for name, value in (("app_token", app_token), ("signing_secret", secret)):
        if value is not None and (not isinstance(value, str) or not value):
            raise TypeError(f"{name} must be a non-empty str or None")
    if mode == "socket":
        if app_token is None:
            raise ValueError("Socket Mode needs the app-level token (app_token, xapp-...)")
    elif mode == "events":
        if secret is None:
            raise ValueError("the Events API needs the app's signing_secret")
    else:
        raise ValueError(f"mode must be 'socket' or 'events', not {mode!r}")
    if not (isinstance(connections, int) and 1 <= connections <= 10):
        raise ValueError("connections must be 1 to 10 (Slack allows 10 per app)")

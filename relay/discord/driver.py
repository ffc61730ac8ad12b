"""The Discord platform driver: a bot on Discord, behind the connector.

:class:`DiscordDriver` is a connector driver (``Connector(store, drivers={"discord": driver},
...)``): the connector holds the bot's token through it, the gateway stays free of any Discord
code.  It keeps the one rule of every driver (``docs/platforms.md``):

* **Inbound** (:mod:`relay.discord._gateway`): the gateway WebSocket (API v10, JSON); the
  session and the seq of the last dispatch *taken* are a note in the connector's store, moved
  only after the connector's intake returned for the dispatch.  A restarted connector resumes
  its session from that seq, and Discord replays what came after it; the connector recognises
  a replayed message by its id.  The bot's own messages are passed over.
* **Outbound** (:mod:`relay.discord._outbound`): a send carries a ``nonce`` derived from the
  relay's idempotency key (:func:`nonce_of`) with ``enforce_nonce``, so a resend within
  Discord's window (documented as "a few minutes") is the same message.  The descriptor
  announces ``idempotent_sends`` with a window of :data:`DEDUPE_WINDOW_S` (120 s, a
  conservative reading of "a few minutes"): a resend older than that is still labelled.

Outcome codes: ``too_long`` (over 2,000 characters), ``bad_action``, ``unsupported_op``,
``not_found`` (an unknown channel or message), ``forbidden`` (no access), ``rate_limited`` and
``platform_down`` (the budget ran out), ``auth`` (the token is refused).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Mapping
from typing import Any, Final

from relay.connector.driver_kit import IntakeSlot, LoopTask, RoundLoop, warn_limited
from relay.connector.platform import Intake
from relay.discord._api import DiscordApi, DiscordAuthError, DiscordError, DiscordUnreachable
from relay.discord._events import DM_TYPES, THREAD_TYPES, ChannelInfo, Channels, Message
from relay.discord._gateway import INTENTS, NOTE_USER, ConnectionEnded, GatewayClient, describe
from relay.discord._outbound import MAX_MESSAGE_CHARS, OPS, Sender
from relay.wire.compat import IDEMPOTENT_SENDS
from relay.wire.descriptor import CONTRACT_VERSION, CapabilityDescriptor
from relay.wire.frames import EventSource, InboundEvent, OutboundOutcome
from relay.wire.throttle import LogLimits
from statecore.clock import Clock, SystemClock

__all__ = ["API_BASE", "DEDUPE_WINDOW_S", "DiscordDriver", "nonce_of"]

log = logging.getLogger("relay.discord")

API_BASE: Final = "https://discord.com/api/v10"
DEDUPE_WINDOW_S: Final = 120
"""The window the descriptor announces for Discord's nonce dedupe ("a few minutes")."""


def nonce_of(key: str) -> str:
    """The nonce of every send made under ``key``: stable, 25 characters (Discord's limit)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:25]


class DiscordDriver:
    """One bot token on Discord (see the module docs).

    ``DiscordDriver(token, *, platform="discord", label="Discord", api_base=API_BASE,
    send_budget_s=20.0, request_timeout_s=15.0, invalid_session_wait_s=(1.0, 5.0),
    clock=None)``.  ``api_base`` is the REST base (``relay.discord.testing.FakeDiscord``'s
    ``api_base`` in tests); the gateway's URL is asked of it.  Raises ``ValueError`` /
    ``TypeError`` for a bad option.

    Attach it to a connector (which calls :meth:`attach`, :meth:`start` and :meth:`stop`);
    :meth:`start` raises :class:`~relay.discord._api.DiscordAuthError` when Discord refuses the
    token.  An unreachable Discord is retried with backoff.
    """

    def __init__(
        self,
        token: str,
        *,
        platform: str = "discord",
        label: str = "Discord",
        api_base: str = API_BASE,
        send_budget_s: float = 20.0,
        request_timeout_s: float = 15.0,
        invalid_session_wait_s: tuple[float, float] = (1.0, 5.0),
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(token, str) or not token or any(c.isspace() for c in token):
            raise TypeError("token must be a non-empty str without spaces (the bot's token)")
        if not isinstance(api_base, str) or not api_base.startswith(("http://", "https://")):
            raise ValueError(f"api_base must be an http(s):// URL, not {api_base!r}")
        if not send_budget_s > 0 or not request_timeout_s > 0:
            raise ValueError("send_budget_s and request_timeout_s must be positive")
        low, high = invalid_session_wait_s
        if not 0 <= low <= high:
            raise ValueError("invalid_session_wait_s must be (low, high) with 0 <= low <= high")
        self.platform = platform
        self.clock: Clock = clock or SystemClock()
        self._api = DiscordApi(
            api_base, token, clock=self.clock, request_timeout_s=request_timeout_s
        )
        self._attached = IntakeSlot("Discord", needs="notes, rejections")
        self.channels = Channels()
        self._gateway = GatewayClient(
            self._api,
            platform=platform,
            intake=self._attached,
            to_event=self._to_event,
            channels=self.channels,
            clock=self.clock,
            intents=INTENTS,
            invalid_wait_s=(float(low), float(high)),
        )
        self._sender = Sender(self._api, clock=self.clock, send_budget_s=send_budget_s)
        self._descriptor = CapabilityDescriptor(
            contract_version=CONTRACT_VERSION,
            platform=platform,
            label=label,
            max_message_length=MAX_MESSAGE_CHARS,
            supports_draft_streaming=False,
            supports_edit=True,
            supports_threads=True,
            markdown_dialect="discord",
            len_unit="chars",
            supported_ops=OPS,
            features=(IDEMPOTENT_SENDS,),
            idempotency_window_s=DEDUPE_WINDOW_S,
        )
        self._task = LoopTask()
        self._loop = RoundLoop(self.clock)
        self._log_limits = LogLimits(clock=self.clock)
        self.failed_connections = 0
        """Connections that ended in an error (each retried after a backoff)."""
        self.auth_failure: DiscordAuthError | None = None
        """Why Discord refused the bot last (None while it does not)."""

    # -- the connector's side -------------------------------------------------------------------

    def attach(self, intake: Intake) -> None:
        """Called by the connector; ``intake`` must be its :class:`DriverIntake` (the cursor
        and rejections are kept through it).  Raises ``TypeError`` for a plain callable."""
        self._attached.attach(intake)

    def descriptor(self) -> CapabilityDescriptor:
        """What the bot can do here (sent to gateways in answer to hello)."""
        return self._descriptor

    @property
    def gateway(self) -> GatewayClient:
        """The gateway client (its counters: taken, rejected, skipped, resumes, ...)."""
        return self._gateway

    @property
    def user_id(self) -> str | None:
        """The bot's user id (None until Discord said it)."""
        return self._gateway.me

    async def start(self) -> None:
        """Check the token and start the gateway loop.

        Raises :class:`DiscordAuthError` when Discord refuses the token; a Discord that cannot
        be reached now is retried by the loop, with backoff.
        """
        intake = self._attached()
        if self._task.running:
            return
        self._api.open()
        if self._gateway.me is None:
            self._gateway.me = await intake.load(self.platform, NOTE_USER)
        try:
            await self._whoami()
        except DiscordAuthError:
            await self._api.close()
            raise
        except (DiscordUnreachable, DiscordError) as exc:
            log.warning("discord: cannot check the bot's token yet (%s); retrying", exc)
        self._task.start(self._run(), name=f"discord-gateway-{self.platform}")

    async def stop(self) -> None:
        """Stop the gateway loop and close the HTTP session; bounded, idempotent, never
        raises."""
        await self._task.stop()
        await self._api.close()
        self._log_limits.report(log, f"discord driver {self.platform}")

    async def _whoami(self) -> None:
        try:
            me = await self._api.request("GET", "/users/@me", route="GET /users/@me")
        except DiscordError as exc:
            if exc.status == 401:
                raise DiscordAuthError(f"Discord refused the bot's token: {exc}") from None
            raise
        user_id = me.get("id") if isinstance(me, dict) else None
        if isinstance(user_id, str) and user_id != self._gateway.me:
            self._gateway.me = user_id
            await self._attached().save(self.platform, NOTE_USER, user_id)

    # -- inbound ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        gateway = self._gateway

        async def one_round() -> bool:
            if gateway.me is None:
                await self._whoami()
            await gateway.connect_once()
            return False

        # A connection that ended without an error is made again at once, the backoff kept.
        await self._loop.run(one_round, self._failed, reset_on_round=False)

    async def _failed(self, exc: Exception) -> float:
        """The wait before connecting again (an ended connection is no failure)."""
        gateway, backoff = self._gateway, self._loop.backoff
        if isinstance(exc, ConnectionEnded):
            if exc.new_session:
                await gateway.forget_session()
            if gateway.went_live:
                backoff.reset()
                delay = max(exc.wait_s, 0.0)
            else:
                backoff.fail()
                delay = max(exc.wait_s, backoff.current())
            log.info("discord: %s; connecting again in %.2g s", exc, delay)
            return delay
        self.failed_connections += 1
        if isinstance(exc, DiscordAuthError):
            self.auth_failure = exc
            delay = backoff.longest
            self._warn("auth", f"discord: {exc}; asking again in {delay:g} s")
            return delay
        delay = backoff.fail()
        self._warn(
            "gateway",
            f"discord: the gateway connection failed ({describe(exc)}); the seq stays "
            f"at {gateway.seq}, connecting again in {delay:g} s",
        )
        return delay

    async def _to_event(self, message: Message) -> InboundEvent:
        info = self.channels.get(message.channel_id)
        if info is None and message.guild_id is not None:
            info = await self._lookup(message.channel_id)
        thread = info is not None and info.type in THREAD_TYPES
        direct = message.guild_id is None or (info is not None and info.type in DM_TYPES)
        parent = info.parent_id if info is not None and thread else None
        return InboundEvent(
            text=message.text,
            message_type=message.message_type,
            message_id=message.event_id,
            reply_to_message_id=message.reply_to,
            media_urls=message.media_urls,
            source=EventSource(
                platform=self.platform,
                chat_id=parent or message.channel_id,
                chat_type="dm" if direct else "group",
                user_id=message.author_id,
                user_name=message.author_name,
                thread_id=message.channel_id if thread else None,
                scope_id=message.guild_id,
            ),
        )

    async def _lookup(self, channel_id: str) -> ChannelInfo | None:
        """``GET /channels/{id}`` for a channel no dispatch described.  Raises for an answer
        worth asking again (the dispatch is then offered again: never mapped on a guess)."""
        try:
            channel = await self._api.request(
                "GET",
                f"/channels/{channel_id}",
                route="GET /channels/{channel_id}",
                major=channel_id,
            )
        except DiscordError as exc:
            if exc.transient:
                raise
            return None
        self.channels.note(channel)
        return self.channels.get(channel_id)

    def _warn(self, kind: str, line: str) -> None:
        warn_limited(self._log_limits, log, kind, line)

    # -- outbound --------------------------------------------------------------------------------

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        """Perform one action under a nonce of its own (a resend of it by the relay would be a
        new message: requests with an idempotency key go through :meth:`perform_once`).  Never
        raises for Discord's refusals."""
        return await self._sender.perform(action, secrets.token_hex(12) + "r")

    async def perform_once(self, action: Mapping[str, Any], key: str) -> OutboundOutcome:
        """Perform ``action`` so that every call with ``key`` within Discord's nonce window is
        one message.  Never raises for refusals."""
        return await self._sender.perform(action, nonce_of(key))

    @property
    def rate_limited(self) -> int:
        """429 answers the driver waited out."""
        return self._sender.rate_limited

    @property
    def api(self) -> DiscordApi:
        """The REST client (its counters: ``waited`` before a bucket's reset, ``limited``)."""
        return self._api

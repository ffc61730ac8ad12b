"""The Telegram platform driver: a bot on the Telegram Bot API, behind the connector.

:class:`TelegramDriver` is a connector driver (``Connector(store, drivers={"telegram":
driver}, ...)``): the connector holds the bot's token through it, the gateway stays free of any
Telegram code.  It keeps the one rule of every driver (``docs/platforms.md``):

* **Long polling** (:mod:`relay.telegram._polling`, the default): the ``getUpdates`` offset is
  a note in the connector's store, moved only past updates the intake took (or recorded as
  rejected, or that were nobody's message), and saved before the next ``getUpdates`` -- the
  call that confirms them to Telegram.  A restart resumes from the stored offset; Telegram
  keeps unconfirmed updates for 24 hours, and the connector recognises a redelivered message
  by its id (``"<chat id>:<message id>"``).
* **Webhook** (:mod:`relay.telegram._webhook`): the endpoint answers 2xx only once the intake
  took the update; a wrong secret, a malformed body or a full intake are answered so that
  Telegram sends it again (or, for a forgery, never gets a 2xx).
* **Outbound** (:mod:`relay.telegram._outbound`): ``sendMessage`` (replies by
  ``reply_parameters``, forum topics by ``message_thread_id``), ``editMessageText``,
  ``sendChatAction``; paced per chat and overall; 429 ``retry_after`` honoured.  Telegram has
  no idempotent send, so the descriptor announces no ``idempotent_sends``: a send that may
  have reached Telegram without an answer is a failed outcome, which the gateway's ledger
  resends with its "possible repeat" label.

Outcome codes: ``too_long``, ``bad_action``, ``unsupported_op``, ``not_found`` (an unknown
chat, a message to edit that is gone, a topic that is not there), ``forbidden`` (blocked,
kicked), ``rate_limited`` and ``platform_down`` (the budget ran out, or no answer), ``auth``
(the token is refused).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from typing import Any, Literal

from relay.connector.driver_kit import Backoff, IntakeSlot, LoopTask, RoundLoop, warn_limited
from relay.connector.platform import Intake
from relay.telegram._api import (
    DEFAULT_API_URL,
    TelegramApi,
    TelegramAuthError,
    TelegramError,
    TelegramUnreachable,
)
from relay.telegram._outbound import MAX_MESSAGE_UTF16, OPS, Pacer, Sender
from relay.telegram._polling import Poller, Taker
from relay.telegram._updates import MESSAGE_KINDS
from relay.telegram._webhook import WebhookEndpoint
from relay.wire.descriptor import CONTRACT_VERSION, CapabilityDescriptor
from relay.wire.frames import OutboundOutcome
from relay.wire.throttle import LogLimits
from statecore.clock import Clock, SystemClock

__all__ = ["TelegramDriver"]

log = logging.getLogger("relay.telegram")

Mode = Literal["polling", "webhook"]


class TelegramDriver:
    """One bot (one token) on the Bot API (see the module docs).

    ``TelegramDriver(token, *, api_url=DEFAULT_API_URL, platform="telegram", label="Telegram",
    mode="polling", poll_timeout_s=30, drop_pending_on_first_start=False, webhook_url=None,
    webhook_secret=None, webhook_host="127.0.0.1", webhook_port=8443,
    webhook_path="/telegram", max_body_bytes=1048576, chat_rate_per_s=1.0,
    group_rate_per_min=20.0, global_rate_per_s=30.0, burst=3, send_budget_s=20.0,
    request_timeout_s=30.0, clock=None)``

    ``api_url`` is the base every method URL starts with (the token and the method follow it):
    point it at a local Bot API server or at ``relay.telegram.testing.FakeTelegram.api_url``.
    ``mode="webhook"`` needs ``webhook_url`` (the public HTTPS URL Telegram POSTs to, which
    reaches ``webhook_host:webhook_port`` + ``webhook_path``); ``webhook_secret`` defaults to a
    new random one at each start.  Raises ``ValueError`` / ``TypeError`` for a bad option.

    Attach it to a connector (the connector calls :meth:`attach`, :meth:`start` and
    :meth:`stop`); :meth:`start` raises :class:`~relay.telegram._api.TelegramAuthError` when
    the token is refused.  An unreachable Bot API is retried with backoff.
    """

    def __init__(
        self,
        token: str,
        *,
        api_url: str = DEFAULT_API_URL,
        platform: str = "telegram",
        label: str = "Telegram",
        mode: Mode = "polling",
        poll_timeout_s: int = 30,
        drop_pending_on_first_start: bool = False,
        webhook_url: str | None = None,
        webhook_secret: str | None = None,
        webhook_host: str = "127.0.0.1",
        webhook_port: int = 8443,
        webhook_path: str = "/telegram",
        max_body_bytes: int = 1024 * 1024,
        chat_rate_per_s: float = 1.0,
        group_rate_per_min: float = 20.0,
        global_rate_per_s: float = 30.0,
        burst: int = 3,
        send_budget_s: float = 20.0,
        request_timeout_s: float = 30.0,
        clock: Clock | None = None,
    ) -> None:
        _check(token, api_url, mode, webhook_url=webhook_url, secret=webhook_secret)
        if not isinstance(webhook_path, str) or not webhook_path.startswith("/"):
            raise ValueError(f"webhook_path must start with '/', not {webhook_path!r}")
        if not (isinstance(poll_timeout_s, int) and 0 <= poll_timeout_s <= 50):
            raise ValueError(f"poll_timeout_s must be 0 to 50, not {poll_timeout_s!r}")
        for name, value in (
            ("chat_rate_per_s", chat_rate_per_s),
            ("group_rate_per_min", group_rate_per_min),
            ("global_rate_per_s", global_rate_per_s),
            ("send_budget_s", send_budget_s),
            ("request_timeout_s", request_timeout_s),
        ):
            if not (isinstance(value, int | float) and value > 0):
                raise ValueError(f"{name} must be a positive number, not {value!r}")
        if not (isinstance(burst, int) and burst >= 1) or not max_body_bytes > 0:
            raise ValueError("burst must be at least 1 and max_body_bytes positive")
        self.platform = platform
        self.mode: Mode = mode
        self.drop_pending_on_first_start = drop_pending_on_first_start
        self.webhook_url = webhook_url
        self.clock: Clock = clock or SystemClock()
        self._secret = webhook_secret or secrets.token_urlsafe(32)
        self._api = TelegramApi(token, api_url=api_url, request_timeout_s=request_timeout_s)
        self._attached = IntakeSlot("Telegram", needs="notes, rejections")
        self.bot_id: int | None = int(token.split(":", 1)[0])
        self.username: str | None = None
        self._taker = Taker(platform=platform, intake=self._attached, bot_id=lambda: self.bot_id)
        self._poller = Poller(
            self._api,
            self._taker,
            platform=platform,
            intake=self._attached,
            poll_timeout_s=poll_timeout_s,
        )
        self._log_limits = LogLimits(clock=self.clock)
        self.webhook = WebhookEndpoint(
            self._taker,
            secret=self._secret,
            host=webhook_host,
            port=webhook_port,
            path=webhook_path,
            max_body_bytes=max_body_bytes,
            log_limits=self._log_limits,
        )
        pacer = Pacer(
            self.clock,
            chat_rate_per_s=chat_rate_per_s,
            group_rate_per_min=group_rate_per_min,
            global_rate_per_s=global_rate_per_s,
            burst=burst,
        )
        self.pacer = pacer
        self._sender = Sender(self._api, pacer, clock=self.clock, send_budget_s=send_budget_s)
        self._descriptor = CapabilityDescriptor(
            contract_version=CONTRACT_VERSION,
            platform=platform,
            label=label,
            max_message_length=MAX_MESSAGE_UTF16,
            supports_draft_streaming=False,
            supports_edit=True,
            supports_threads=True,
            markdown_dialect="plain",
            len_unit="utf16",
            supported_ops=OPS,
        )
        self._task = LoopTask()
        self._started = False
        self._polls = RoundLoop(self.clock)

    # -- the connector's side -------------------------------------------------------------------

    def attach(self, intake: Intake) -> None:
        """Called by the connector; ``intake`` must be its :class:`DriverIntake` (the offset
        and rejections are kept through it).  Raises ``TypeError`` for a plain callable."""
        self._attached.attach(intake)

    def descriptor(self) -> CapabilityDescriptor:
        """What the bot can do here (sent to gateways in answer to hello)."""
        return self._descriptor

    @property
    def offset(self) -> int | None:
        """The ``getUpdates`` offset in use (None before the first round)."""
        return self._poller.offset

    @property
    def rounds(self) -> int:
        """``getUpdates`` rounds whose batch was taken (and offset saved when it moved)."""
        return self._polls.rounds

    @property
    def failed_rounds(self) -> int:
        """Rounds that ended before the offset covered their batch (each asked again)."""
        return self._polls.failed_rounds

    @property
    def taken(self) -> int:
        """Updates handed to the connector's intake by this driver."""
        return self._taker.taken

    @property
    def rejected(self) -> int:
        """Updates this driver recorded as rejected."""
        return self._taker.rejected

    @property
    def rate_limited(self) -> int:
        """429 answers to sends the driver waited out."""
        return self._sender.rate_limited

    @property
    def ambiguous(self) -> int:
        """Sends that may have reached Telegram without an answer (left to the ledger)."""
        return self._sender.ambiguous

    async def start(self) -> None:
        """Check the token (``getMe``) and start polling, or serve the webhook and set it.

        Raises :class:`TelegramAuthError` when the Bot API refuses the token, ``OSError`` when
        the webhook's address cannot be bound; a Bot API that cannot be reached now is retried
        by the loop, with backoff.
        """
        self._attached()
        if self._task.running:
            return
        self._api.open()
        try:
            await self._who_am_i()
        except (TelegramUnreachable, TelegramError) as exc:
            log.warning("telegram: the Bot API cannot answer yet (%s); retrying", exc)
        if self.mode == "webhook":
            await self.webhook.start()
        loop = self._webhook_loop() if self.mode == "webhook" else self._poll_loop()
        self._task.start(loop, name=f"telegram-{self.mode}-{self.platform}")

    async def stop(self) -> None:
        """Stop polling (or serving the webhook: it stays set, so Telegram keeps the updates
        for the next start) and close the HTTP session; bounded, idempotent, never raises."""
        await self._task.stop()
        await self.webhook.stop()
        await self._api.close()
        self._log_limits.report(log, f"telegram driver {self.platform}")

    async def _who_am_i(self) -> None:
        try:
            me = await self._api.call("getMe")
        except TelegramError as exc:
            if exc.unauthorized:
                raise TelegramAuthError(
                    f"telegram: the Bot API refuses the bot's token ({exc.status} "
                    f"{exc.description[:100]}); get a valid one from @BotFather"
                ) from None
            raise
        if isinstance(me, dict) and isinstance(me.get("id"), int):
            self.bot_id = me["id"]
            username = me.get("username")
            self.username = username if isinstance(username, str) else None
        self._started = True

    # -- inbound ---------------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        ready = False

        async def one_round() -> bool:
            nonlocal ready
            if not self._started:
                await self._who_am_i()
            if not ready:
                # getUpdates answers 409 while a webhook is set; its updates stay queued.
                await self._api.call("deleteWebhook", {"drop_pending_updates": False})
                await self._poller.load()
                if self._poller.offset is None and self.drop_pending_on_first_start:
                    await self._poller.skip_pending()
                ready = True
            await self._poller.round()
            return False

        async def failed(exc: Exception) -> float:
            delay = _delay(exc, self._polls.backoff)
            self._warn(
                "poll",
                f"telegram: a getUpdates round failed ({_describe(exc, self._api)}); the "
                f"offset stays, asking again in {delay:g} s",
            )
            return delay

        await self._polls.run(one_round, failed)

    async def _webhook_loop(self) -> None:
        """Set the webhook (asked again until it is set); then only the endpoint works."""
        assert self.webhook_url is not None
        params = {
            "url": self.webhook_url,
            "secret_token": self._secret,
            "allowed_updates": list(MESSAGE_KINDS),
            "drop_pending_updates": False,
        }
        setting = RoundLoop(self.clock)

        async def one_round() -> bool:
            if not self._started:
                await self._who_am_i()
            await self._api.call("setWebhook", params)
            log.info("telegram: the webhook is set; updates come to %s", self.webhook.path)
            return True

        async def failed(exc: Exception) -> float:
            delay = _delay(exc, setting.backoff)
            self._warn("webhook", f"telegram: setWebhook failed ({_describe(exc, self._api)})")
            return delay

        await setting.run(one_round, failed)

    def _warn(self, kind: str, line: str) -> None:
        warn_limited(self._log_limits, log, kind, line)

    # -- outbound --------------------------------------------------------------------------------

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        """Perform one action (``send``, ``follow_up``, ``edit``, ``typing``); never raises
        for the Bot API's refusals (see the module docs for the codes)."""
        return await self._sender.perform(action)


def _delay(exc: BaseException, backoff: Backoff) -> float:
    """Counts the failure in ``backoff``; the wait Telegram asked for (a 429), else its step."""
    if isinstance(exc, TelegramError) and exc.rate_limited and exc.retry_after:
        return backoff.fail(exc.retry_after)
    return backoff.fail()


def _describe(exc: BaseException, api: TelegramApi) -> str:
    if isinstance(exc, TelegramError | TelegramUnreachable | TelegramAuthError):
        return api.scrub(str(exc))[:300]
    return api.scrub(f"{type(exc).__name__}: {str(exc)[:300]}")


def _check(
    token: object, api_url: object, mode: object, *, webhook_url: object, secret: object
) -> None:
    if not isinstance(token, str) or not token.partition(":")[0].isdigit() or ":" not in token:
        raise ValueError("token must be a bot token like '123456:ABC-...' (from @BotFather)")
    if not isinstance(api_url, str) or not api_url.startswith(("http://", "https://")):
        raise ValueError(f"api_url must be an http(s):// URL, not {api_url!r}")
    if mode not in ("polling", "webhook"):
        raise ValueError(f"mode must be 'polling' or 'webhook', not {mode!r}")
    if mode == "webhook" and not (
        isinstance(webhook_url, str) and webhook_url.startswith(("http://", "https://"))
    ):
        raise ValueError("mode='webhook' needs webhook_url, the URL Telegram POSTs to")
    if secret is not None and not (
        isinstance(secret, str)
        and 1 <= len(secret) <= 256
        and all(c.isascii() and (c.isalnum() or c in "_-") for c in secret)
    ):
        raise ValueError("webhook_secret must be 1-256 characters of A-Z, a-z, 0-9, _ and -")

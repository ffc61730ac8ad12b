"""The webhook endpoint of the Telegram driver: a 2xx is the ack, so it comes last.

Telegram POSTs each update to the URL given to ``setWebhook`` and sends it again (for a while)
until it gets a 2xx.  The endpoint answers:

* ``200`` only once the update is the connector's (the intake returned), or was recorded as
  rejected, or is nobody's message;
* ``401`` when the ``X-Telegram-Bot-Api-Secret-Token`` header is missing or wrong (compared in
  constant time), before the body is read; ``405`` for anything but POST; ``413`` for a body
  over ``max_body_bytes``; ``400`` for a body that is not a JSON object with an ``update_id``
  (recorded as rejected: it carried the secret);
* ``503`` when the intake is full and ``500`` when the store failed: Telegram asks again later,
  and the connector recognises a copy of an update it already took by its id.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import Final

from aiohttp import web

from relay.connector.intake import IntakeFull
from relay.telegram._polling import Taker
from relay.telegram._updates import raw_text, update_id_of
from relay.wire.throttle import LogLimits

__all__ = ["SECRET_HEADER", "WebhookEndpoint"]

log = logging.getLogger("relay.telegram")

SECRET_HEADER: Final = "X-Telegram-Bot-Api-Secret-Token"


class WebhookEndpoint:
    """An ``aiohttp.web`` server for one bot's webhook (see the module docs)."""

    def __init__(
        self,
        taker: Taker,
        *,
        secret: str,
        host: str,
        port: int,
        path: str,
        max_body_bytes: int,
        log_limits: LogLimits,
    ) -> None:
        self._taker = taker
        self._secret = secret.encode()
        self.host = host
        self.port = port
        self.path = path
        self.max_body_bytes = max_body_bytes
        self._log_limits = log_limits
        self._runner: web.AppRunner | None = None
        self.answers: dict[int, int] = {}
        """Status -> how many requests were answered with it."""

    async def start(self) -> None:
        """Listen; raises ``OSError`` when the address cannot be bound."""
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_route("*", self.path, self._handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        """Stop listening; never raises."""
        runner, self._runner = self._runner, None
        if runner is not None:
            try:
                await runner.cleanup()
            except Exception:
                log.debug("telegram: the webhook's server did not stop cleanly", exc_info=True)

    def _answer(self, status: int, text: str) -> web.Response:
        self.answers[status] = self.answers.get(status, 0) + 1
        return web.Response(status=status, text=text)

    async def _handle(self, request: web.Request) -> web.Response:
        if request.method != "POST":
            return self._answer(405, "POST only")
        given = request.headers.get(SECRET_HEADER, "").encode()
        if not hmac.compare_digest(given, self._secret):
            self._warn("secret", "telegram: a webhook request without the right secret")
            return self._answer(401, "wrong secret")
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            return self._answer(413, "too large")
        try:
            body = await request.content.read(self.max_body_bytes + 1)
        except (OSError, ValueError):
            return self._answer(400, "unreadable body")
        if len(body) > self.max_body_bytes:
            return self._answer(413, "too large")
        try:
            update = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            update = None
            raw = body[:16_384].decode("utf-8", "replace")
        else:
            raw = raw_text(update)
        if update_id_of(update) is None:
            try:
                await self._taker.reject(raw, "a webhook body that is not an update")
            except Exception:
                self._warn("reject", "telegram: a malformed webhook body could not be recorded")
            return self._answer(400, "not an update")
        try:
            await self._taker.take(update)
        except IntakeFull:
            return self._answer(503, "busy: send it again later")
        except Exception as exc:
            self._warn("intake", f"telegram: a webhook update was not taken: {type(exc).__name__}")
            return self._answer(500, "not taken: send it again later")
        return self._answer(200, "ok")

    def _warn(self, kind: str, line: str) -> None:
        more = self._log_limits.check(log, logging.WARNING, kind)
        if more is not None:
            log.warning("%s%s", line, more)

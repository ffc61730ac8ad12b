"""The Events API: Slack POSTs each event to the bot's request URL; an aiohttp.web endpoint.

Every request is checked before anything is read from it: ``X-Slack-Signature`` must be
``v0=`` + the HMAC-SHA256 (with the app's signing secret) of ``v0:{X-Slack-Request-Timestamp}:
{body}``, compared in constant time (``slack_sdk.signature.SignatureVerifier``), and the
timestamp within 5 minutes of the driver's clock (an older request is a replay): else 401.
Then:

* ``url_verification``: the ``challenge`` is answered;
* an event callback: 200 once the connector took it (or recorded it as rejected, or it is
  nobody's message), 503 when it could not within the ack budget, so Slack sends it again;
  a retry (``X-Slack-Retry-Num`` / ``X-Slack-Retry-Reason``) is taken like the first copy: the
  connector recognises it by its message id, and it is counted;
* a signed body that is not a JSON object: recorded as rejected, answered 200 (Slack would only
  send the same bytes again).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from typing import Final

from aiohttp import web
from slack_sdk.signature import Clock as SignatureClock
from slack_sdk.signature import SignatureVerifier

from relay.connector.intake import DriverIntake
from relay.slack._events import raw_text
from relay.slack._take import Taker
from statecore.clock import Clock

__all__ = ["MAX_BODY_BYTES", "EventsEndpoint"]

log = logging.getLogger("relay.slack")

MAX_BODY_BYTES: Final = 1024 * 1024


class _Wall(SignatureClock):
    """The signature check's clock: the driver's (a test's fake clock moves it)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def now(self) -> float:
        return self._clock.now()


class EventsEndpoint:
    """Serves ``POST path`` for one app (see the module docs)."""

    def __init__(
        self,
        *,
        platform: str,
        signing_secret: str,
        taker: Taker,
        intake: Callable[[], DriverIntake],
        clock: Clock,
        path: str = "/slack/events",
    ) -> None:
        self._platform = platform
        self._verifier = SignatureVerifier(signing_secret, clock=_Wall(clock))
        self._taker = taker
        self._intake = intake
        self._clock = clock
        self.path = path
        self.refused = 0
        """Requests refused for their signature or timestamp."""
        self.retries: Counter[str] = Counter()
        """Retried requests seen, by ``X-Slack-Retry-Reason``."""

    def app(self) -> web.Application:
        """An application serving the endpoint (mount it, or let the driver serve it)."""
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post(self.path, self.handle)
        return app

    def _signed(self, body: bytes, stamp: str, signature: str) -> bool:
        # The verifier raises for a timestamp that is not a number and a body that is not
        # UTF-8: both are refusals here, like a wrong signature.
        if not (stamp.isdigit() and len(stamp) <= 12 and signature.startswith("v0=")):
            return False
        try:
            return self._verifier.is_valid(body, stamp, signature)
        except (ValueError, UnicodeDecodeError):
            return False

    async def handle(self, request: web.Request) -> web.Response:
        """One request from Slack (see the module docs); never raises for bad input."""
        received = self._clock.monotonic()
        body = await request.read()
        stamp = request.headers.get("X-Slack-Request-Timestamp", "")
        signature = request.headers.get("X-Slack-Signature", "")
        if not self._signed(body, stamp, signature):
            self.refused += 1
            return web.Response(status=401, text="invalid signature or timestamp")
        if "X-Slack-Retry-Num" in request.headers:
            self.retries[request.headers.get("X-Slack-Retry-Reason", "")[:40]] += 1
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            text = body.decode("utf-8", errors="replace")
            reason = "an Events API body that is not a JSON object"
            try:
                await self._intake().reject(self._platform, raw_text(text), reason)
            except Exception:  # the record could not be written: let Slack send it again
                return web.Response(status=503)
            self._taker.rejected += 1
            return web.Response(status=200)
        if payload.get("type") == "url_verification":
            challenge = payload.get("challenge")
            return web.json_response({"challenge": challenge if isinstance(challenge, str) else ""})
        if await self._taker.take(payload, received_at=received):
            return web.Response(status=200)
        return web.Response(status=503, text="not taken now; send it again")

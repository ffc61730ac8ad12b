"""Slack's Web API as the driver uses it: ``slack_sdk``'s ``AsyncWebClient``, with typed errors.

The client is built with ``retry_handlers=[]``: its default handler asks again, silently, after a
connection error, and for ``chat.postMessage`` that is a second message nobody labelled (measured
against the fake: one dropped answer made two messages).  Every retry is the driver's own
decision (:mod:`relay.slack._outbound`).

Every answer is read the same way: ``ok: true`` is the result; anything else is a
:class:`SlackError` carrying the ``error`` code, the HTTP status and ``Retry-After`` (seconds)
for a 429.  A request with no usable answer is :class:`SlackUnreachable`, with ``sent`` telling
whether the request may have reached Slack (a refused connection: it did not).  Tokens are sent
in the ``Authorization`` header by the client, and never appear in an error's text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from statecore.errors import StatecoreError

__all__ = [
    "AUTH_ERRORS",
    "DEFAULT_API_URL",
    "SlackAuthError",
    "SlackError",
    "SlackUnreachable",
    "WebApi",
]

DEFAULT_API_URL: Final = "https://slack.com/api/"
AUTH_ERRORS: Final = frozenset(
    (
        "invalid_auth",
        "not_authed",
        "token_revoked",
        "token_expired",
        "account_inactive",
        "not_allowed_token_type",
    )
)
"""Errors that mean the token will not work, whatever is asked."""


class SlackError(StatecoreError):
    """Slack answered with an error (``error``, ``status``; ``retry_after_s`` for a 429)."""

    def __init__(self, method: str, error: str, status: int, retry_after_s: float | None) -> None:
        self.method = method
        self.error = error
        self.status = status
        self.retry_after_s = retry_after_s
        super().__init__(f"slack {method} answered {status} {error}")

    @property
    def rate_limited(self) -> bool:
        """A 429 (``ratelimited``): wait ``retry_after_s`` and ask again."""
        return self.status == 429 or self.error == "ratelimited"

    @property
    def auth(self) -> bool:
        """The token is refused (see :data:`AUTH_ERRORS`)."""
        return self.error in AUTH_ERRORS

    @property
    def transient(self) -> bool:
        """Worth asking again later: a 5xx or a rate limit."""
        return self.status >= 500 or self.rate_limited


class SlackUnreachable(StatecoreError):
    """No usable answer from Slack; ``sent`` is False when the request surely never left."""

    def __init__(self, text: str, *, sent: bool) -> None:
        self.sent = sent
        super().__init__(text)


class SlackAuthError(StatecoreError):
    """A token of the driver is refused for good (wrong, revoked, of the wrong type): the
    operator must fix the configuration."""


class WebApi:
    """One token's client; :meth:`close` when done."""

    def __init__(self, token: str, *, base_url: str, timeout_s: float) -> None:
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self._client = AsyncWebClient(
            token=token, base_url=self.base_url, timeout=int(max(1, timeout_s)), retry_handlers=[]
        )

    async def call(self, method: str, args: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Call ``method`` (a JSON body); the answer's object.  Raises :class:`SlackError` or
        :class:`SlackUnreachable`."""
        try:
            response = await self._client.api_call(method, json=dict(args or {}))
        except SlackApiError as exc:
            answer = exc.response
            data = answer.data if isinstance(answer.data, dict) else {}
            error = data.get("error")
            status = int(answer.status_code)
            retry = _seconds(answer.headers.get("Retry-After") or answer.headers.get("retry-after"))
            shown = error if isinstance(error, str) else f"http_{status}"
            raise SlackError(method, shown[:100], status, retry) from None
        except aiohttp.ClientConnectorError as exc:
            raise SlackUnreachable(
                f"slack {method}: cannot connect ({exc.os_error})", sent=False
            ) from None
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            why = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
            raise SlackUnreachable(f"slack {method}: no answer ({why})", sent=True) from None
        raw = response.data
        if not isinstance(raw, dict):
            raise SlackUnreachable(f"slack {method}: an answer that is not an object", sent=True)
        return raw

    async def close(self) -> None:
        """Close the client's HTTP session, if it made one; never raises."""
        session = getattr(self._client, "session", None)
        if isinstance(session, aiohttp.ClientSession) and not session.closed:
            await session.close()


def _seconds(value: object) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(str(value))
    except ValueError:
        return None
    return seconds if seconds >= 0 else None

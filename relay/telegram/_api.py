"""The Telegram Bot API as the driver uses it: one method call at a time, typed errors.

Every answer is read the same way: ``{"ok": true, "result": ...}`` is the result; an answer with
``"ok": false`` is a :class:`TelegramError` carrying the status (``error_code``), the
``description`` and the ``parameters`` that matter (``retry_after`` of a 429,
``migrate_to_chat_id`` of a group that became a supergroup).  A call without a usable answer
is a :class:`TelegramUnreachable`, which says whether the Bot API may have acted on it:
``maybe_acted`` is False only when no connection could be made (the request never left).

The token is part of every method URL (``<api_url><token>/<method>``), so no error text ever
holds a URL: every text this module makes names the method and replaces the token wherever a
library's message might have quoted it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any, Final

from relay.connector.driver_http import HttpSession, why
from statecore.errors import StatecoreError

__all__ = [
    "DEFAULT_API_URL",
    "TelegramApi",
    "TelegramAuthError",
    "TelegramError",
    "TelegramUnreachable",
]

DEFAULT_API_URL: Final = "https://api.telegram.org/bot"
"""The Bot API's base: the token and the method name follow it."""
MAX_ANSWER_BYTES: Final = 16 * 1024 * 1024
"""The largest answer read (100 updates with long messages are far below it)."""


class TelegramError(StatecoreError):
    """The Bot API answered ``ok: false`` (``status``, ``description``, ``retry_after``)."""

    def __init__(
        self,
        method: str,
        status: int,
        description: str,
        *,
        retry_after: float | None = None,
        migrate_to: int | None = None,
    ) -> None:
        self.method = method
        self.status = status
        self.description = description
        self.retry_after = retry_after
        self.migrate_to = migrate_to
        super().__init__(f"telegram {method}: {status} {description[:300]}")

    @property
    def rate_limited(self) -> bool:
        """True for a 429: wait ``retry_after`` seconds and ask again (nothing was done)."""
        return self.status == 429

    @property
    def unauthorized(self) -> bool:
        """True when the token is refused (401; 404 is the answer to a malformed token)."""
        return self.status in (401, 404)


class TelegramUnreachable(StatecoreError):
    """No usable answer; ``maybe_acted`` is False only when the request never left."""

    def __init__(self, text: str, *, maybe_acted: bool) -> None:
        super().__init__(text)
        self.maybe_acted = maybe_acted


class TelegramAuthError(StatecoreError):
    """The Bot API refuses the bot's token for good (wrong or revoked): the operator must give
    the driver a valid one (from @BotFather)."""


class TelegramApi:
    """One bot token against one Bot API base URL.

    Open with :meth:`open` (inside a running event loop), close with :meth:`close`.
    """

    def __init__(
        self, token: str, *, api_url: str = DEFAULT_API_URL, request_timeout_s: float = 30.0
    ) -> None:
        self._token = token
        self.api_url = api_url
        self.request_timeout_s = request_timeout_s
        self._http = HttpSession()

    def open(self) -> None:
        """Create the HTTP session (idempotent); call it on the event loop that will use it."""
        self._http.open()

    async def close(self) -> None:
        """Close the HTTP session; never raises."""
        await self._http.close()

    def scrub(self, text: str) -> str:
        """``text`` with the token replaced (for any line that may quote a URL)."""
        return text.replace(self._token, "<token>")

    async def call(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> Any:
        """Call ``method`` with ``params`` (a JSON body); returns its ``result``.

        Raises :class:`TelegramError` for an ``ok: false`` answer and
        :class:`TelegramUnreachable` for no usable answer (see the module docs).
        """
        got = await self._http.request(
            "POST",
            f"{self.api_url}{self._token}/{method}",
            json=dict(params or {}),
            timeout_s=timeout_s or self.request_timeout_s,
            connect_timeout_s=10.0,
            max_bytes=MAX_ANSWER_BYTES,
            unreachable=lambda exc, sent: self._unreachable(method, exc, sent),
        )
        raw, status = got.body, got.status
        retry_header = got.headers.get("Retry-After")
        answer = None if got.too_large else _json(raw)
        if answer is None:
            if status == 429 or status >= 500:
                raise TelegramError(
                    method, status, f"HTTP {status}", retry_after=_num(retry_header)
                )
            raise TelegramUnreachable(
                f"telegram {method}: a {status} answer that is not a Bot API answer",
                maybe_acted=True,
            )
        if answer.get("ok") is True and "result" in answer:
            return answer["result"]
        code = answer.get("error_code")
        description = answer.get("description")
        parameters = answer.get("parameters")
        parameters = parameters if isinstance(parameters, dict) else {}
        migrate = parameters.get("migrate_to_chat_id")
        raise TelegramError(
            method,
            code if isinstance(code, int) and not isinstance(code, bool) else status,
            self.scrub(description) if isinstance(description, str) else f"HTTP {status}",
            retry_after=_num(parameters.get("retry_after")) or _num(retry_header),
            migrate_to=migrate if isinstance(migrate, int) else None,
        )

    def _unreachable(self, method: str, exc: BaseException, sent: bool) -> TelegramUnreachable:
        if not sent:
            text = f"telegram {method}: cannot connect ({self._why(exc)})"
        else:
            text = f"telegram {method}: no answer ({self._why(exc)})"
        return TelegramUnreachable(text, maybe_acted=sent)

    def _why(self, exc: BaseException) -> str:
        return self.scrub(why(exc))


def _json(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) and isinstance(value.get("ok"), bool) else None


def _num(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float) and value >= 0:
        return float(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value)
            return number if number >= 0 else None
    return None

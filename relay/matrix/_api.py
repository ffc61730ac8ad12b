"""The Matrix client-server API as the driver uses it: one HTTP request at a time, typed errors.

Every answer is read the same way: a 2xx with a JSON object is the result; anything else is a
:class:`MatrixError` carrying the status, the ``errcode`` and ``error`` of the server's body
(when it sent one) and ``retry_after_ms`` for ``M_LIMIT_EXCEEDED`` (from the body, or the
``Retry-After`` header).  A request that got no answer (refused, reset, timed out, a body that
is not JSON) is a :class:`MatrixUnreachable`: for a send, the server may or may not have acted.
The access token is sent in the ``Authorization`` header only, never in a URL, and never
appears in an error's text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from relay.connector.driver_http import HttpSession, why
from statecore.errors import StatecoreError

__all__ = ["MatrixApi", "MatrixAuthError", "MatrixError", "MatrixUnreachable", "path"]

MAX_BODY_BYTES = 64 * 1024 * 1024
"""The largest answer read (a sync of a busy account is large, but never this large)."""


class MatrixError(StatecoreError):
    """The homeserver answered with an error (``status``, ``errcode``, ``error``)."""

    def __init__(
        self,
        status: int,
        errcode: str | None,
        error: str | None,
        *,
        retry_after_ms: int | None = None,
    ) -> None:
        self.status = status
        self.errcode = errcode
        self.error = error
        self.retry_after_ms = retry_after_ms
        shown = f" {errcode}" if errcode else ""
        text = f": {error[:200]}" if error else ""
        super().__init__(f"homeserver answered {status}{shown}{text}")

    @property
    def rate_limited(self) -> bool:
        """True for ``429`` / ``M_LIMIT_EXCEEDED``: wait ``retry_after_ms`` and ask again."""
        return self.status == 429 or self.errcode == "M_LIMIT_EXCEEDED"

    @property
    def unknown_token(self) -> bool:
        """True when the server no longer knows the access token (log in again)."""
        return self.status == 401 or self.errcode in ("M_UNKNOWN_TOKEN", "M_MISSING_TOKEN")

    @property
    def transient(self) -> bool:
        """True for an answer worth asking again later (5xx, rate limits)."""
        return self.status >= 500 or self.rate_limited


class MatrixUnreachable(StatecoreError):
    """No usable answer from the homeserver (refused, reset, timed out, not JSON)."""


class MatrixAuthError(StatecoreError):
    """The bot's credentials are refused for good (a wrong password, a token of another user,
    no way to log in again): the operator must fix the configuration."""


def path(*parts: str) -> str:
    """A client-server API path under ``/_matrix/client/v3`` with every part percent-encoded
    (room ids, event ids and user ids hold ``!``, ``$``, ``@`` and ``:``)."""
    return "/_matrix/client/v3/" + "/".join(quote(part, safe="") for part in parts)


class MatrixApi:
    """One homeserver, one access token (which :meth:`use_token` may change).

    Open with :meth:`open` (inside a running event loop), close with :meth:`close`.
    """

    def __init__(self, homeserver: str, *, request_timeout_s: float = 30.0) -> None:
        self.homeserver = homeserver.rstrip("/")
        self.request_timeout_s = request_timeout_s
        self.token: str | None = None
        self._http = HttpSession()

    def use_token(self, token: str | None) -> None:
        """Send ``token`` with every later request (None: none)."""
        self.token = token

    def open(self) -> None:
        """Create the HTTP session (idempotent); call it on the event loop that will use it."""
        self._http.open()

    async def close(self) -> None:
        """Close the HTTP session; never raises."""
        await self._http.close()

    async def request(
        self,
        method: str,
        url_path: str,
        *,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        authed: bool = True,
    ) -> dict[str, Any]:
        """One request; returns the answer's JSON object.

        Raises :class:`MatrixError` for an error answer and :class:`MatrixUnreachable` when
        there was no usable answer (the caller decides whether to ask again).
        """
        headers = {"Accept": "application/json"}
        if authed and self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        shown = f"{method} {url_path.partition('?')[0]}"
        got = await self._http.request(
            method,
            self.homeserver + url_path,
            json=None if body is None else dict(body),
            params=query,
            headers=headers,
            timeout_s=timeout_s or self.request_timeout_s,
            max_bytes=MAX_BODY_BYTES,
            unreachable=lambda exc, _sent: MatrixUnreachable(f"{shown}: {why(exc)}"),
            keep_cause=True,
        )
        raw, status = got.body, got.status
        retry_header = got.headers.get("Retry-After")
        if got.too_large:
            raise MatrixUnreachable(f"{method}: the answer is over {MAX_BODY_BYTES} bytes")
        answer = _json_object(raw)
        if 200 <= status < 300:
            if answer is None:
                raise MatrixUnreachable(f"{method}: a {status} answer that is not a JSON object")
            return answer
        errcode = answer.get("errcode") if answer else None
        error = answer.get("error") if answer else None
        retry_after = answer.get("retry_after_ms") if answer else None
        if not (isinstance(retry_after, int) and not isinstance(retry_after, bool)):
            retry_after = _retry_after_header(retry_after_header=retry_header)
        raise MatrixError(
            status,
            errcode if isinstance(errcode, str) else None,
            error if isinstance(error, str) else None,
            retry_after_ms=retry_after,
        )


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _retry_after_header(*, retry_after_header: str | None) -> int | None:
    if retry_after_header is None:
        return None
    try:
        seconds = float(retry_after_header)
    except ValueError:
        return None
    return int(seconds * 1000) if seconds >= 0 else None

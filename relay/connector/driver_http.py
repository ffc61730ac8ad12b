"""The HTTP skeleton of a platform driver's API client: one aiohttp session, one request at a
time with a total timeout, an answer read up to a bound, no answer turned into the driver's
own "unreachable" error.

Each platform reads the answer its own way (its error body, its rate-limit fields); what is the
same for all of them is here.  No redirect is followed (a redirect could carry a token to
another host) and nothing is read from the environment (no proxy settings).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import attrs

__all__ = ["HttpAnswer", "HttpSession", "why"]


@attrs.frozen
class HttpAnswer:
    """One answer: its status, headers, and body (at most ``max_bytes + 1`` bytes were read,
    so a body longer than ``max_bytes`` is :attr:`too_large`)."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    max_bytes: int

    @property
    def too_large(self) -> bool:
        """True when the answer went past ``max_bytes`` (only its start was read)."""
        return len(self.body) > self.max_bytes


class HttpSession:
    """The aiohttp session of one API client.

    Open with :meth:`open` (inside a running event loop; :meth:`request` opens it too), close
    with :meth:`close`.
    """

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The aiohttp session (opened on first use)."""
        self.open()
        assert self._session is not None
        return self._session

    def open(self) -> None:
        """Create the session (idempotent); call it on the event loop that will use it."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, enable_cleanup_closed=True),
                # Every request sets its own timeout; nothing is read from the environment.
                trust_env=False,
            )

    async def close(self) -> None:
        """Close the session; never raises."""
        session, self._session = self._session, None
        if session is not None and not session.closed:
            with contextlib.suppress(Exception):
                await session.close()

    async def request(
        self,
        method: str,
        url: str,
        *,
        unreachable: Callable[[BaseException, bool], Exception],
        max_bytes: int,
        timeout_s: float,
        connect_timeout_s: float | None = None,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        keep_cause: bool = False,
    ) -> HttpAnswer:
        """One request (``json``: its body, None for none); returns the answer, whatever its
        status.

        With no answer (refused, reset, timed out, a broken body), raises
        ``unreachable(exc, sent)``: ``sent`` is False only when no connection was made (the
        request surely never left).  The library's exception is its ``__cause__`` only with
        ``keep_cause`` (its text may quote the URL, and a URL may hold a token).
        """
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_timeout_s)
        try:
            async with self.session.request(
                method,
                url,
                json=json,
                params=None if params is None else dict(params),
                headers=None if headers is None else dict(headers),
                timeout=timeout,
                allow_redirects=False,
            ) as response:
                body = await response.content.read(max_bytes + 1)
                return HttpAnswer(response.status, response.headers, body, max_bytes)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            sent = not isinstance(
                exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError
            )
            error = unreachable(exc, sent)
            if keep_cause:
                raise error from exc
            raise error from None


def why(exc: BaseException) -> str:
    """A failed request's cause, for an error's text: ``timed out``, or the exception's type
    and the start of its text."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {str(exc)[:200]}"

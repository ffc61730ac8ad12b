"""How the gateway opens one WebSocket to its connector and introduces itself.

:class:`Dialer` knows what every dial of one transport carries: the features announced on the
upgrade (``X-Relay-Features``), a freshly minted bearer token when a secret is configured, the
socket options, and the hello frames sent once the socket is open (one per identity,
announcing protocol, features and window -- or exactly the original contract's hello when no
feature is announced).  It keeps no connection state: the transport decides what a refusal
means.
"""

from __future__ import annotations

from collections.abc import Iterable

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from relay.client.teardown import TEARDOWN_AWAIT_S
from relay.wire.auth import bearer_header, mint_token
from relay.wire.codec import encode
from relay.wire.compat import ACKED_LIVE, TRACE_CONTEXT, features_header
from relay.wire.descriptor import CONTRACT_VERSION
from relay.wire.errors import RelayBroken
from relay.wire.frames import Hello
from statecore import tracing

__all__ = ["Dialer", "UpgradeRefused"]


class UpgradeRefused(RelayBroken):
    """The connector answered the upgrade with an HTTP error status (``status``)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"upgrade refused with HTTP {status}")
        self.status = status

    @property
    def credentials(self) -> bool:
        """True for 401/403: the connector refused our credentials."""
        return self.status in (401, 403)


class Dialer:
    """Opens sockets to ``url`` for ``gateway_id`` (see the module docs)."""

    def __init__(
        self,
        url: str,
        *,
        gateway_id: str,
        secret: str | bytes | None,
        token_ttl_s: int,
        features: tuple[str, ...],
        identities: Iterable[tuple[str, str]],
        open_timeout_s: float,
        max_frame_bytes: int,
    ) -> None:
        self.url = url
        self._gateway_id = gateway_id
        self._secret = secret
        self._token_ttl_s = token_ttl_s
        if features and TRACE_CONTEXT not in features and tracing.refresh():
            # Announced only while tracing is on, and never by a gateway that announces
            # nothing (it must stay an original-contract peer).
            features = (*features, TRACE_CONTEXT)
        self._features = features
        self._identities = tuple(identities)
        self._announcement = [features_header(features)] if features else []
        self._open_timeout_s = open_timeout_s
        self._max_frame_bytes = max_frame_bytes

    async def open(self, token_time: float) -> ClientConnection:
        """Open one socket, minting its token at wall time ``token_time``.

        Raises :class:`UpgradeRefused` for an HTTP error status and
        :class:`~relay.wire.errors.RelayBroken` when the connector cannot be reached.
        """
        headers: list[tuple[str, str]] = list(self._announcement)
        if self._secret is not None:
            token = mint_token(
                self._gateway_id, self._secret, ttl_s=self._token_ttl_s, now=token_time
            )
            headers.append(bearer_header(token))
        try:
            return await connect(
                self.url,
                additional_headers=headers,
                compression=None,  # small frames gain nothing and lose throughput
                proxy=None,
                open_timeout=self._open_timeout_s,
                max_size=self._max_frame_bytes + 1024,
                ping_interval=20,
                ping_timeout=20,
                close_timeout=TEARDOWN_AWAIT_S,
            )
        except InvalidStatus as exc:
            raise UpgradeRefused(exc.response.status_code) from exc
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            raise RelayBroken(f"cannot reach {self.url}: {exc}") from exc

    async def hello(self, ws: ClientConnection, window: int) -> None:
        """Say hello for every identity; a closed socket is left to its reader."""
        protocol = CONTRACT_VERSION if self._features else None
        announced = window if ACKED_LIVE in self._features else None
        try:
            for platform, bot_id in self._identities:
                await ws.send(encode(Hello(platform, bot_id, protocol, self._features, announced)))
        except ConnectionClosed:
            pass  # the reader sees the close and handles it

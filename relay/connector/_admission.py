"""Admission at the WebSocket upgrade: the relay's path, and the token that proves a gateway id
(with the features the gateway announced in its upgrade headers)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from relay.connector._log import limited, log
from relay.wire.auth import token_from_header, verify_token
from relay.wire.compat import EXPIRED_4419, FEATURES_HEADER, parse_features
from relay.wire.errors import AuthError
from relay.wire.logtext import peer_text
from relay.wire.throttle import LogLimits
from relay.wire.urls import CLOSE_EXPIRED, CLOSE_REVOKED, RELAY_PATH, clock_skew_reason
from statecore.clock import Clock

__all__ = ["authenticate", "check_path"]


def check_path(connection: ServerConnection, request: Request) -> Response | None:
    """Refuse (404) an upgrade anywhere but the relay's path; None lets it through."""
    if request.path.split("?", 1)[0] != RELAY_PATH:
        return connection.respond(404, "the relay lives at /relay\n")
    return None


async def authenticate(
    ws: ServerConnection,
    *,
    secrets: Mapping[str, Sequence[str | bytes]],
    clock: Clock,
    max_ttl_s: float,
    log_limits: LogLimits,
) -> tuple[str, frozenset[str]] | None:
    """The gateway id the upgrade's token proves, and the features it announced; or None
    after closing a refused upgrade (4401; an expired token 4419 only to a gateway that
    announced it, else 4401 + ``expired`` as the original contract says).  Refusals are logged
    rate-limited in ``log_limits`` (anyone who reaches the port can cause them)."""
    request = ws.request
    values = request.headers.get_all("Authorization") if request is not None else []
    features = (
        parse_features(request.headers.get_all(FEATURES_HEADER))
        if request is not None
        else frozenset()
    )
    try:
        if len(values) > 1:
            raise AuthError("malformed", "more than one Authorization header")
        token = token_from_header(values[0] if values else None)
        gateway_id = verify_token(token, secrets, now=clock.now(), max_ttl_s=max_ttl_s)
    except AuthError as exc:
        code = CLOSE_REVOKED
        if exc.reason == "expired" and EXPIRED_4419 in features:
            code = CLOSE_EXPIRED
        reason: str = exc.reason
        now = clock.now()
        if exc.timing and features:
            # A genuine token refused for its times: the clocks disagree.  Say so, with this
            # connector's time, so that the gateway can measure the offset (an original
            # gateway gets the bare reason it knows).
            reason = clock_skew_reason(exc.reason, now)
        more = limited(log_limits, "refused upgrades", logging.WARNING)
        if more is not None:
            log.warning(
                "connector: refused an upgrade (%s%s); closing %d%s",
                exc.reason,
                f", {peer_text(exc.detail)}; connector time {now:.0f}" if exc.timing else "",
                code,
                more,
                extra={"reason": exc.reason},
            )
        with contextlib.suppress(ConnectionClosed):
            await ws.close(code, reason)
        return None
    return gateway_id, features

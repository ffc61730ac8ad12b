"""Where the gateway dials, and what a close code means (docs/wire-contract.md).

* :func:`relay_url` turns the configured connector base into the WebSocket URL to dial.
* :func:`classify_close` turns a received close code and reason into a :class:`CloseKind` the
  transport acts on, including the interoperability rules for connectors of the original
  contract, which overloaded 4401 for both expiry and revocation.
"""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from typing import Final
from urllib.parse import urlsplit

__all__ = [
    "CLOSE_EXPIRED",
    "CLOSE_PROTOCOL",
    "CLOSE_REPLACED",
    "CLOSE_REVOKED",
    "RELAY_PATH",
    "CloseKind",
    "classify_close",
    "clock_skew_reason",
    "connector_time",
    "is_loopback_host",
    "relay_url",
]

CLOSE_PROTOCOL: Final = 4400
"""Repeated protocol violations: the peer gave up on us."""
CLOSE_REVOKED: Final = 4401
"""Credentials revoked or unknown: terminal for the gateway (but see :func:`classify_close`)."""
CLOSE_REPLACED: Final = 4409
"""A newer connection of the same gateway took over: re-dialing would make the two fight."""
CLOSE_EXPIRED: Final = 4419
"""The token expired: re-dial at once with a fresh token."""

RELAY_PATH: Final = "/relay"

_SCHEMES: Final = {"https": "wss", "wss": "wss", "http": "ws", "ws": "ws"}


def is_loopback_host(host: str) -> bool:
    """Return whether ``host`` (a URL hostname, without brackets) names this machine.

    ``localhost`` (any case, optionally with a trailing dot), ``127.0.0.0/8`` and ``::1`` (also
    as an IPv4-mapped IPv6 address) count; every other name -- including ``*.localhost``, which a
    resolver may send elsewhere -- does not.
    """
    host = host.lower()
    if host in ("localhost", "localhost."):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def relay_url(base: str) -> str:
    """Return the WebSocket URL to dial for the connector configured as ``base``.

    ``https`` becomes ``wss`` and ``http`` becomes ``ws`` (``ws``/``wss`` are kept); surrounding
    whitespace and trailing slashes are stripped; ``/relay`` is appended once (a base that already
    ends in ``/relay`` is kept). Call it once at configuration time and dial the result.

    Raises ``TypeError`` for a non-str base and ``ValueError`` (naming the problem) for another
    scheme, a missing host, a bad port, user info, a query or fragment, any path other than
    ``/relay``, and a plain ``ws``/``http`` URL to a host that is not loopback (tokens must not
    cross a network in clear text).
    """
    if not isinstance(base, str):
        raise TypeError(f"relay base URL must be a str, got {type(base).__name__}")
    try:
        parts = urlsplit(base.strip())
        port = parts.port  # validates the port
    except ValueError as exc:
        raise ValueError(f"relay base URL {base!r} is not a valid URL: {exc}") from None
    scheme = _SCHEMES.get(parts.scheme.lower())
    if scheme is None:
        raise ValueError(f"relay base URL {base!r} must use https, http, wss or ws")
    host = parts.hostname
    if not host:
        raise ValueError(f"relay base URL {base!r} has no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"relay base URL {base!r} must not carry user info (tokens are minted)")
    if parts.query or parts.fragment or base.strip().endswith(("?", "#")):
        raise ValueError(f"relay base URL {base!r} must not have a query or fragment")
    path = parts.path.rstrip("/")
    if path not in ("", RELAY_PATH):
        raise ValueError(f"relay base URL {base!r} has path {parts.path!r}; only /relay is allowed")
    if scheme == "ws" and not is_loopback_host(host):
        raise ValueError(
            f"relay base URL {base!r} is plain {parts.scheme}:// to a non-loopback host; "
            "use https/wss"
        )
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc = f"{netloc}:{port}"
    return f"{scheme}://{netloc}{RELAY_PATH}"


class CloseKind(StrEnum):
    """What the transport must do after the connection closed with a given code."""

    NORMAL = "normal"
    """A clean close (1000/1001): re-dial with the usual backoff if the close was unexpected."""
    REVOKED = "revoked"
    """Credentials refused: terminal, never re-dial."""
    EXPIRED = "expired"
    """The token expired: re-dial at once with a fresh token."""
    REPLACED = "replaced"
    """Another connection of this gateway took over: stop, never re-dial."""
    PROTOCOL = "protocol"
    """The peer closed for protocol violations: a bug on one side; re-dial with backoff."""
    REFUSED = "refused"
    """A 4401 before this transport ever completed a handshake: a start-up race (the connector
    does not know us yet) or a revocation.  Re-dial with backoff for a bounded period before
    concluding revocation, so one early refusal never locks a valid gateway out for good."""
    RETRY_ONCE = "retry_once"
    """A legacy 4401 after an earlier successful handshake: re-dial once at once with a fresh
    token; if that also ends in 4401 before a handshake, it is revocation."""
    OTHER = "other"
    """Any other code, or none: treat as a broken connection and re-dial with backoff."""


def classify_close(
    code: int | None,
    reason: str | None,
    *,
    handshaken_before: bool,
    ever_handshaken: bool = True,
) -> CloseKind:
    """Classify a received WebSocket close (code and reason) into a :class:`CloseKind`.

    Rules: 4419 -> EXPIRED; 4409 -> REPLACED; 4400 -> PROTOCOL; 1000/1001 -> NORMAL; 4401 with
    the reason ``expired`` (case and surrounding spaces ignored) -> EXPIRED, the way connectors
    of the original contract signal expiry; any other 4401 -> RETRY_ONCE when
    ``handshaken_before``, REFUSED when the transport has not ``ever_handshaken`` (the caller
    retries it with backoff for a bounded period), else REVOKED. A missing, non-integer or
    out-of-range (outside 1000-4999) code -> OTHER.

    ``handshaken_before`` must be True only if a handshake succeeded since the last RETRY_ONCE
    was acted on: the caller grants the legacy re-dial once, and classifies the 4401 that ends
    the re-dial with ``handshaken_before=False`` so that it becomes REVOKED. Raises nothing.
    """
    # int subclasses (websockets' CloseCode IntEnum) are codes; bool is not.
    if not isinstance(code, int) or isinstance(code, bool) or not 1000 <= code <= 4999:
        return CloseKind.OTHER
    if code == CLOSE_EXPIRED:
        return CloseKind.EXPIRED
    if code == CLOSE_REPLACED:
        return CloseKind.REPLACED
    if code == CLOSE_PROTOCOL:
        return CloseKind.PROTOCOL
    if code in (1000, 1001):
        return CloseKind.NORMAL
    if code == CLOSE_REVOKED:
        if isinstance(reason, str) and reason.strip().lower() == "expired":
            return CloseKind.EXPIRED
        if handshaken_before:
            return CloseKind.RETRY_ONCE
        return CloseKind.REVOKED if ever_handshaken else CloseKind.REFUSED
    return CloseKind.OTHER


_CONNECTOR_TIME: Final = re.compile(r"connector time (\d{1,12})\b")


def clock_skew_reason(reason: str, now: float) -> str:
    """The close reason of a token refused for its times: the refusal, a hint that the clocks
    disagree, and the connector's time (unix seconds) so the gateway can measure the offset.

    Kept within a WebSocket close reason's 123 bytes.  Raises nothing.
    """
    return f"{reason}: clock skew? connector time {int(now)}"[:123]


def connector_time(reason: str | None) -> int | None:
    """The connector's time (unix seconds) named in a close reason by :func:`clock_skew_reason`,
    or None when the reason names none.  Raises nothing."""
    if not isinstance(reason, str):
        return None
    found = _CONNECTOR_TIME.search(reason)
    return int(found.group(1)) if found else None

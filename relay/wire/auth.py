"""Relay upgrade authentication: short-lived HMAC tokens (docs/wire-contract.md).

A token is the base64url encoding, without padding, of ``"{gatewayId}:{exp}:{sig}"``: ``exp`` is
the expiry in unix seconds (an integer), ``sig`` the lowercase hex HMAC-SHA256 of
``"{gatewayId}:{exp}"`` keyed with the shared secret. The gateway mints a fresh token on every dial
(:func:`mint_token`) and sends it as ``Authorization: Bearer <token>`` (:func:`bearer_header`); the
connector extracts it (:func:`token_from_header`) and checks it against every secret configured
for that gateway, newest first, so a secret can be rotated without downtime
(:func:`verify_token`).

A gateway id may itself contain ``':'``: the token is parsed from the right. Secrets are
``str`` (UTF-8 encoded) or ``bytes``. Nothing here logs, and no error message contains a secret or
a signature.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
from collections.abc import Mapping, Sequence
from typing import Final

from relay.wire.errors import AuthError
from statecore.checks import require_text

__all__ = [
    "DEFAULT_MAX_TTL_S",
    "DEFAULT_SKEW_S",
    "DEFAULT_TTL_S",
    "bearer_header",
    "mint_token",
    "token_from_header",
    "verify_token",
]

DEFAULT_TTL_S: Final = 300
"""Lifetime of a minted token, in seconds."""

DEFAULT_SKEW_S: Final = 30
"""Clock skew the verifier tolerates past a token's expiry, in seconds."""

DEFAULT_MAX_TTL_S: Final = 3600
"""The longest lifetime a verifier accepts: a token expiring further ahead (beyond the skew) is
refused, so a captured token cannot be replayed for ever."""

_TOKEN_RE: Final = re.compile(r"[A-Za-z0-9_-]+={0,2}")
_EXP_RE: Final = re.compile(r"[0-9]{1,15}")  # ASCII digits only; 15 digits outlive us all
_SIG_RE: Final = re.compile(r"[0-9a-f]{64}")
_MAX_TOKEN_CHARS: Final = 4096  # a header this long is not one of ours; refuse before decoding


def _key(secret: str | bytes) -> bytes:
    return secret.encode("utf-8") if isinstance(secret, str) else secret


def _signature(key: bytes, gateway_id: str, exp: int) -> str:
    return hmac.new(key, f"{gateway_id}:{exp}".encode(), hashlib.sha256).hexdigest()


def _check_secret(secret: object, what: str) -> bytes:
    if not isinstance(secret, str | bytes):
        raise TypeError(f"{what} must be str or bytes, got {type(secret).__name__}")
    if not secret:
        raise ValueError(f"{what} must not be empty")
    return _key(secret)


def _check_time(now: object, name: str) -> float:
    if now is None:
        return time.time()
    if not isinstance(now, int | float) or isinstance(now, bool):
        raise TypeError(f"{name} must be a number of unix seconds, got {type(now).__name__}")
    return float(now)


def mint_token(
    gateway_id: str,
    secret: str | bytes,
    *,
    ttl_s: float = DEFAULT_TTL_S,
    now: float | None = None,
) -> str:
    """Return a fresh token for ``gateway_id``, valid until ``now + ttl_s`` (unix seconds).

    Mint one per dial and send it with :func:`bearer_header`; never cache it across dials.
    ``now`` defaults to the wall clock (inject it in tests). The expiry is rounded down to a whole
    second.

    Raises ``TypeError`` for a non-str ``gateway_id``, a secret that is not str/bytes, or a
    non-numeric ``ttl_s``/``now``; ``ValueError`` for an empty id or secret or ``ttl_s <= 0``.
    """
    require_text("gateway_id", gateway_id)
    key = _check_secret(secret, "secret")
    if not isinstance(ttl_s, int | float) or isinstance(ttl_s, bool):
        raise TypeError(f"ttl_s must be a number of seconds, got {type(ttl_s).__name__}")
    if not ttl_s > 0:  # also refuses NaN
        raise ValueError(f"ttl_s must be positive, got {ttl_s}")
    exp = int(_check_time(now, "now") + ttl_s)
    payload = f"{gateway_id}:{exp}:{_signature(key, gateway_id, exp)}"
    return base64.urlsafe_b64encode(payload.encode("utf-8")).rstrip(b"=").decode("ascii")


def verify_token(
    token: str,
    secrets: Mapping[str, Sequence[str | bytes]],
    *,
    now: float | None = None,
    skew_s: float = DEFAULT_SKEW_S,
    max_ttl_s: float = DEFAULT_MAX_TTL_S,
) -> str:
    """Check ``token`` and return the gateway id it authenticates.

    ``secrets`` maps each gateway id to its secrets, newest first; during a rotation list both the
    new and the old one, and drop the old one once every gateway has switched. The signature is
    compared in constant time against every secret of that gateway. A token is still accepted
    ``skew_s`` seconds after its expiry (inclusive), and refused when its expiry lies more than
    ``max_ttl_s + skew_s`` seconds ahead (a lifetime no honest minter asks for).

    On success the caller should authorise the connection as the returned id (never as an id taken
    from a later frame). Raises :class:`~relay.wire.errors.AuthError` with ``reason``
    ``"malformed"`` (bad base64, wrong shape, non-integer expiry, empty id), ``"unknown"`` (no
    such gateway, or it has no secrets), ``"forged"`` (no secret matches), ``"expired"``
    (genuine but too old: close with 4419 -- 4401 + ``expired`` to an original gateway -- so the
    client re-dials with a fresh token) or ``"malformed"`` again for a genuine token whose
    lifetime exceeds the cap.
    Raises ``TypeError`` for a non-str ``token``, a ``secrets`` that is not a mapping of
    sequences of str/bytes (a bare string in place of the list is refused), or a non-numeric
    ``now``/``skew_s``/``max_ttl_s``; ``ValueError`` for a negative ``skew_s`` or a
    ``max_ttl_s`` that is not positive.
    """
    if not isinstance(token, str):
        raise TypeError(f"token must be a str, got {type(token).__name__}")
    if not isinstance(secrets, Mapping):
        raise TypeError(f"secrets must be a mapping, got {type(secrets).__name__}")
    if not isinstance(skew_s, int | float) or isinstance(skew_s, bool):
        raise TypeError(f"skew_s must be a number of seconds, got {type(skew_s).__name__}")
    if not skew_s >= 0:
        raise ValueError(f"skew_s must not be negative, got {skew_s}")
    if not isinstance(max_ttl_s, int | float) or isinstance(max_ttl_s, bool):
        raise TypeError(f"max_ttl_s must be a number of seconds, got {type(max_ttl_s).__name__}")
    if not max_ttl_s > 0:
        raise ValueError(f"max_ttl_s must be positive, got {max_ttl_s}")
    current = _check_time(now, "now")

    gateway_id, exp, sig = _parse(token)

    configured = secrets.get(gateway_id)
    if configured is not None and (
        isinstance(configured, str | bytes) or not isinstance(configured, Sequence)
    ):
        # {"gw": "secret"} would otherwise be iterated character by character.
        raise TypeError(f"secrets[{gateway_id!r}] must be a list of secrets, not a single value")
    if not configured:
        raise AuthError("unknown", f"no secret configured for gateway {gateway_id!r}")
    keys = [_check_secret(secret, f"secrets[{gateway_id!r}] item") for secret in configured]

    # Compare against every secret, without stopping at the first match, so the time taken does
    # not reveal which secret (or whether an old one) matched.
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(_signature(key, gateway_id, exp), sig)
    if not matched:
        raise AuthError("forged", f"signature does not match any secret of {gateway_id!r}")
    # Expiry is judged only for a genuine token: an attacker learns nothing from "expired".
    if exp < current - skew_s:
        raise AuthError("expired", f"token of {gateway_id!r} expired at {exp}", timing=True)
    if exp > current + max_ttl_s + skew_s:
        raise AuthError("malformed", f"token lifetime exceeds the {max_ttl_s:g} s cap", timing=True)
    return gateway_id


def _parse(token: str) -> tuple[str, int, str]:
    """Split a token into (gateway id, expiry, signature) or raise AuthError("malformed")."""
    if len(token) > _MAX_TOKEN_CHARS or not _TOKEN_RE.fullmatch(token):
        raise AuthError("malformed", "token is not base64url")
    body = token.rstrip("=")
    if len(body) % 4 == 1:
        raise AuthError("malformed", "token has an impossible base64 length")
    try:
        payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise AuthError("malformed", "token does not decode to UTF-8 text") from None
    parts = payload.rsplit(":", 2)
    if len(parts) != 3:
        raise AuthError("malformed", "token is not gatewayId:exp:sig")
    gateway_id, exp_text, sig = parts
    if not gateway_id:
        raise AuthError("malformed", "token has an empty gateway id")
    if not _EXP_RE.fullmatch(exp_text):
        raise AuthError("malformed", "token expiry is not an integer")
    if not _SIG_RE.fullmatch(sig):
        raise AuthError("malformed", "token signature is not 64 lowercase hex digits")
    return gateway_id, int(exp_text), sig


def bearer_header(token: str) -> tuple[str, str]:
    """Return the ``("Authorization", "Bearer <token>")`` header to send with the upgrade.

    Raises ``TypeError`` for a non-str token and ``ValueError`` for one that is not base64url
    (which also keeps CR/LF and spaces out of the header).
    """
    if not isinstance(token, str):
        raise TypeError(f"token must be a str, got {type(token).__name__}")
    if not _TOKEN_RE.fullmatch(token):
        raise ValueError("token must be base64url text")
    return ("Authorization", f"Bearer {token}")


def token_from_header(value: str | None) -> str:
    """Extract the token from an ``Authorization`` header value; pass it to :func:`verify_token`.

    Accepts exactly ``"Bearer <token>"``: one space, no other whitespace, a non-empty token. The
    scheme name is matched case-insensitively (RFC 7235 says it is). A missing header (``None``)
    or any other shape raises :class:`~relay.wire.errors.AuthError` with reason ``"malformed"``;
    close the upgrade with HTTP 401. Raises ``TypeError`` for a value that is neither str nor
    ``None``.
    """
    if value is None:
        raise AuthError("malformed", "no Authorization header")
    if not isinstance(value, str):
        raise TypeError(f"header value must be a str, got {type(value).__name__}")
    scheme, space, token = value.partition(" ")
    if scheme.lower() != "bearer" or not space:
        raise AuthError("malformed", "Authorization header is not 'Bearer <token>'")
    if not token or any(c.isspace() for c in token):
        raise AuthError("malformed", "Authorization header is not 'Bearer <token>'")
    return token

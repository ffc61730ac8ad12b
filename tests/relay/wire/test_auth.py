"""Tests for relay.wire.auth: token format, rotation, skew, refusal reasons, Bearer header."""

from __future__ import annotations

import base64
import hashlib
import hmac
import pickle
from typing import Any

import pytest

from relay.wire.auth import (
    DEFAULT_SKEW_S,
    DEFAULT_TTL_S,
    bearer_header,
    mint_token,
    token_from_header,
    verify_token,
)
from relay.wire.errors import AUTH_REASONS, AuthError

NOW = 1_700_000_000
SECRETS: dict[str, list[str | bytes]] = {"gw-1": ["s3cret"]}


def b64(text: str) -> str:
    """base64url without padding, as tokens are encoded."""
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()


def sign(gateway_id: str, exp: int, secret: str | bytes) -> str:
    """An independent rewrite of the documented signature."""
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, f"{gateway_id}:{exp}".encode(), hashlib.sha256).hexdigest()


def reason(token: str, secrets: Any = None, **kwargs: Any) -> str:
    """The AuthError reason verify_token gives for ``token``."""
    with pytest.raises(AuthError) as info:
        verify_token(token, SECRETS if secrets is None else secrets, **kwargs)
    return info.value.reason


# -- format --------------------------------------------------------------------------------------


def test_token_has_the_documented_format() -> None:
    """A token is base64url (no padding) of gatewayId:exp:sig with sig = hex HMAC-SHA256."""
    token = mint_token("gw-1", "s3cret", now=NOW)
    assert "=" not in token
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    exp = NOW + DEFAULT_TTL_S
    assert token == b64(f"gw-1:{exp}:{sign('gw-1', exp, 's3cret')}")


def test_default_ttl_is_300_and_skew_30() -> None:
    """Tokens live 300 s by default and the verifier tolerates 30 s of skew."""
    assert (DEFAULT_TTL_S, DEFAULT_SKEW_S) == (300, 30)


def test_expiry_is_rounded_down_to_whole_seconds() -> None:
    """A fractional now/ttl gives an integer expiry, rounded down."""
    token = mint_token("gw", "k", ttl_s=10.9, now=NOW + 0.5)
    exp = NOW + 11
    assert token == b64(f"gw:{exp}:{sign('gw', exp, 'k')}")


def test_mint_uses_the_wall_clock_by_default() -> None:
    """Without now, a freshly minted token verifies against the wall clock."""
    assert verify_token(mint_token("gw-1", "s3cret"), SECRETS) == "gw-1"


def test_token_minted_by_hand_per_the_doc_verifies() -> None:
    """A token built independently from the doc's recipe is accepted (interoperability)."""
    exp = NOW + 60
    token = b64(f"gw-1:{exp}:{sign('gw-1', exp, 's3cret')}")
    assert verify_token(token, SECRETS, now=NOW) == "gw-1"


# -- verify --------------------------------------------------------------------------------------


def test_round_trip_returns_the_gateway_id() -> None:
    """verify_token returns the gateway id of a token minted with a configured secret."""
    assert verify_token(mint_token("gw-1", "s3cret", now=NOW), SECRETS, now=NOW) == "gw-1"


@pytest.mark.parametrize("gateway_id", ["a:b", "tenant:gw:1", "::", "é:ü", "gw:123:abc"])
def test_gateway_ids_may_contain_colons(gateway_id: str) -> None:
    """The token is parsed from the right, so ids containing ':' round-trip."""
    token = mint_token(gateway_id, "k", now=NOW)
    assert verify_token(token, {gateway_id: ["k"]}, now=NOW) == gateway_id


def test_bytes_and_str_secrets_are_interchangeable() -> None:
    """A str secret is its UTF-8 bytes: minting with one verifies with the other."""
    token = mint_token("gw", "clé", now=NOW)
    assert verify_token(token, {"gw": ["clé".encode()]}, now=NOW) == "gw"
    token = mint_token("gw", b"\x00\xffraw", now=NOW)
    assert verify_token(token, {"gw": [b"\x00\xffraw"]}, now=NOW) == "gw"


def test_rotation_accepts_every_listed_secret() -> None:
    """During rotation both the new and the old secret are accepted while both are listed."""
    rotating: dict[str, list[str | bytes]] = {"gw-1": ["new", "old"]}
    assert verify_token(mint_token("gw-1", "old", now=NOW), rotating, now=NOW) == "gw-1"
    assert verify_token(mint_token("gw-1", "new", now=NOW), rotating, now=NOW) == "gw-1"


def test_a_removed_secret_is_forged() -> None:
    """Once the old secret is removed from the list, its tokens are refused as forged."""
    token = mint_token("gw-1", "old", now=NOW)
    assert reason(token, {"gw-1": ["new"]}, now=NOW) == "forged"


def test_every_secret_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The signature is compared with hmac.compare_digest against every secret, even after a
    match, so timing reveals neither the signature nor which secret matched."""
    calls: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def spy(a: str, b: str) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    token = mint_token("gw-1", "first", now=NOW)
    verify_token(token, {"gw-1": ["first", "second", "third"]}, now=NOW)
    assert len(calls) == 3


def test_unknown_gateway_is_unknown() -> None:
    """A well-formed token for a gateway id without configured secrets is refused as unknown."""
    token = mint_token("gw-2", "s3cret", now=NOW)
    assert reason(token, now=NOW) == "unknown"
    assert reason(token, {"gw-2": []}, now=NOW) == "unknown"


def test_wrong_secret_is_forged() -> None:
    """A token signed with a secret the gateway does not have is forged."""
    assert reason(mint_token("gw-1", "guess", now=NOW), now=NOW) == "forged"


def test_tampered_fields_are_forged() -> None:
    """Changing the id or the expiry of a genuine token breaks its signature."""
    exp = NOW + 300
    sig = sign("gw-1", exp, "s3cret")
    assert reason(b64(f"gw-1:{exp + 3600}:{sig}"), now=NOW) == "forged"
    two: dict[str, list[str | bytes]] = {"gw-1": ["s3cret"], "gw-1x": ["s3cret"]}
    assert reason(b64(f"gw-1x:{exp}:{sig}"), two, now=NOW) == "forged"


def test_skew_boundary() -> None:
    """A token is accepted exactly skew seconds after its expiry and refused one second later."""
    token = mint_token("gw-1", "s3cret", ttl_s=60, now=NOW)
    exp = NOW + 60
    assert verify_token(token, SECRETS, now=exp) == "gw-1"
    assert verify_token(token, SECRETS, now=exp + DEFAULT_SKEW_S) == "gw-1"
    assert reason(token, now=exp + DEFAULT_SKEW_S + 1) == "expired"
    assert verify_token(token, SECRETS, now=exp + 5, skew_s=5) == "gw-1"
    assert reason(token, now=exp + 1, skew_s=0) == "expired"


def test_expiry_is_judged_only_for_genuine_tokens() -> None:
    """An expired token with a bad signature is forged, not expired (no oracle for attackers)."""
    token = mint_token("gw-1", "guess", ttl_s=1, now=NOW)
    assert reason(token, now=NOW + 10_000) == "forged"


@pytest.mark.parametrize(
    "token",
    [
        "",
        "not base64!",
        "abc=def",
        "a",
        "Z3ctMTox",  # "gw-1:1" (two fields)
        b64("gw-1"),
        b64(f":{NOW}:{'0' * 64}"),
        b64(f"gw-1:soon:{'0' * 64}"),
        b64(f"gw-1:-5:{'0' * 64}"),
        b64(f"gw-1:1e9:{'0' * 64}"),
        b64(f"gw-1:{NOW}:{'A' * 64}"),
        b64(f"gw-1:{NOW}:{'0' * 63}"),
        b64(f"gw-1:{NOW}:"),
        base64.urlsafe_b64encode(b"\xff\xfe:1:2").decode(),
        "A" * 5000,
        "ab+c",
        "ab/c",
    ],
)
def test_malformed_tokens(token: str) -> None:
    """Bad base64, bad shape, non-integer expiry, empty id or a non-hex sig is malformed."""
    assert reason(token, now=NOW) == "malformed"


def test_padded_tokens_are_tolerated() -> None:
    """A token that kept its base64 padding still verifies (the padding carries no data)."""
    token = mint_token("gw-1", "s3cret", now=NOW)
    padded = token + "=" * (-len(token) % 4)
    assert padded != token
    assert verify_token(padded, SECRETS, now=NOW) == "gw-1"


# -- argument validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: mint_token(1, "k"), TypeError),  # type: ignore[arg-type]
        (lambda: mint_token("", "k"), ValueError),
        (lambda: mint_token("gw", 5), TypeError),  # type: ignore[arg-type]
        (lambda: mint_token("gw", ""), ValueError),
        (lambda: mint_token("gw", b""), ValueError),
        (lambda: mint_token("gw", "k", ttl_s=0), ValueError),
        (lambda: mint_token("gw", "k", ttl_s=-1), ValueError),
        (lambda: mint_token("gw", "k", ttl_s=float("nan")), ValueError),
        (lambda: mint_token("gw", "k", ttl_s="300"), TypeError),  # type: ignore[arg-type]
        (lambda: mint_token("gw", "k", ttl_s=True), TypeError),
        (lambda: mint_token("gw", "k", now="now"), TypeError),  # type: ignore[arg-type]
        (lambda: verify_token(b"token", SECRETS), TypeError),  # type: ignore[arg-type]
        (lambda: verify_token("t", [("gw-1", ["k"])]), TypeError),  # type: ignore[arg-type]
        (lambda: verify_token("t", SECRETS, skew_s=-1), ValueError),
        (lambda: verify_token("t", SECRETS, skew_s="30"), TypeError),  # type: ignore[arg-type]
        (lambda: verify_token("t", SECRETS, now="x"), TypeError),  # type: ignore[arg-type]
        (lambda: verify_token(mint_token("gw", "k", now=NOW), {"gw": "k"}, now=NOW), TypeError),
        (lambda: verify_token(mint_token("gw", "k", now=NOW), {"gw": [1]}, now=NOW), TypeError),  # type: ignore[list-item]
        (lambda: verify_token(mint_token("gw", "k", now=NOW), {"gw": {"k"}}, now=NOW), TypeError),  # type: ignore[dict-item]
        (lambda: bearer_header(None), TypeError),  # type: ignore[arg-type]
        (lambda: bearer_header("a b"), ValueError),
        (lambda: bearer_header("tok\r\nX-Evil: 1"), ValueError),
        (lambda: token_from_header(b"Bearer x"), TypeError),  # type: ignore[arg-type]
    ],
)
def test_argument_types_are_checked(call: Any, error: type[Exception]) -> None:
    """Bad argument types are TypeError and bad values ValueError (local errors, not AuthError)."""
    with pytest.raises(error):
        call()


# -- header --------------------------------------------------------------------------------------


def test_bearer_header_round_trips() -> None:
    """bearer_header builds the Authorization header token_from_header reads back."""
    token = mint_token("gw-1", "s3cret", now=NOW)
    name, value = bearer_header(token)
    assert name == "Authorization"
    assert value == f"Bearer {token}"
    assert token_from_header(value) == token


def test_bearer_scheme_is_case_insensitive() -> None:
    """The auth scheme is matched case-insensitively, as RFC 7235 requires."""
    assert token_from_header("bearer abc") == "abc"
    assert token_from_header("BEARER abc") == "abc"


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Bearer  abc",
        "Bearer abc def",
        "Bearer abc\t",
        "Basic abc",
        "Token abc",
        "Bearerabc",
        " Bearer abc",
    ],
)
def test_anything_but_bearer_token_is_malformed(value: str | None) -> None:
    """A missing header or any shape other than "Bearer <token>" is AuthError("malformed")."""
    with pytest.raises(AuthError) as info:
        token_from_header(value)
    assert info.value.reason == "malformed"


# -- AuthError -----------------------------------------------------------------------------------


def test_auth_error_reasons_are_the_documented_four() -> None:
    """AuthError.reason is one of expired/unknown/forged/malformed; anything else is refused."""
    assert {"expired", "unknown", "forged", "malformed"} == AUTH_REASONS
    with pytest.raises(ValueError, match="reason"):
        AuthError("nope")  # type: ignore[arg-type]


def test_auth_errors_never_contain_the_secret_or_signature() -> None:
    """Refusal messages name the gateway but leak neither the secret nor the signature."""
    exp = NOW - 1000
    sig = sign("gw-1", exp, "s3cret")
    for secrets, now in ((SECRETS, NOW), ({"gw-1": ["other"]}, exp)):
        with pytest.raises(AuthError) as info:
            verify_token(b64(f"gw-1:{exp}:{sig}"), secrets, now=now)
        assert "s3cret" not in str(info.value)
        assert sig not in str(info.value)


def test_auth_error_pickles() -> None:
    """AuthError survives pickling with its reason and detail."""
    err = AuthError("forged", "no match")
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.reason, copy.detail, str(copy)) == ("forged", "no match", str(err))


def test_a_token_living_longer_than_the_cap_is_refused() -> None:
    """A genuine token whose expiry lies beyond now + max_ttl_s (+ skew) is refused as
    malformed: a captured long-lived token cannot be replayed for ever.  At the cap it passes."""
    now = 1_700_000_000.0
    secrets = {"gw": ["k"]}
    forever = mint_token("gw", "k", ttl_s=10**9, now=now)
    with pytest.raises(AuthError) as caught:
        verify_token(forever, secrets, now=now)
    assert caught.value.reason == "malformed"
    assert "cap" in str(caught.value)
    at_cap = mint_token("gw", "k", ttl_s=3600 + DEFAULT_SKEW_S, now=now)
    assert verify_token(at_cap, secrets, now=now) == "gw"
    with pytest.raises(AuthError):
        verify_token(mint_token("gw", "k", ttl_s=601, now=now), secrets, now=now, max_ttl_s=570)
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="max_ttl_s"):
            verify_token(at_cap, secrets, now=now, max_ttl_s=bad)
    with pytest.raises(TypeError, match="max_ttl_s"):
        verify_token(at_cap, secrets, now=now, max_ttl_s="1")  # type: ignore[arg-type]

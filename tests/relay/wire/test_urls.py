"""Tests for relay.wire.urls: the dial URL rules and the close-code classification."""

from __future__ import annotations

from typing import Any

import pytest
from websockets.frames import CloseCode

from relay.wire.urls import (
    CLOSE_EXPIRED,
    CLOSE_PROTOCOL,
    CLOSE_REPLACED,
    CLOSE_REVOKED,
    CloseKind,
    classify_close,
    clock_skew_reason,
    connector_time,
    is_loopback_host,
    relay_url,
)

# -- relay_url -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("https://relay.example.com", "wss://relay.example.com/relay"),
        ("https://relay.example.com/", "wss://relay.example.com/relay"),
        ("https://relay.example.com//", "wss://relay.example.com/relay"),
        ("https://relay.example.com/relay", "wss://relay.example.com/relay"),
        ("https://relay.example.com/relay/", "wss://relay.example.com/relay"),
        ("https://relay.example.com:8443", "wss://relay.example.com:8443/relay"),
        ("wss://relay.example.com", "wss://relay.example.com/relay"),
        ("wss://relay.example.com/relay", "wss://relay.example.com/relay"),
        ("HTTPS://Relay.Example.com", "wss://relay.example.com/relay"),
        ("  https://relay.example.com \n", "wss://relay.example.com/relay"),
        ("https://[2001:db8::1]:443", "wss://[2001:db8::1]:443/relay"),
        ("http://127.0.0.1:8080", "ws://127.0.0.1:8080/relay"),
        ("http://127.9.8.7", "ws://127.9.8.7/relay"),
        ("http://localhost:9000/", "ws://localhost:9000/relay"),
        ("http://LOCALHOST", "ws://localhost/relay"),
        ("ws://localhost/relay", "ws://localhost/relay"),
        ("ws://[::1]:7000", "ws://[::1]:7000/relay"),
        ("http://[::ffff:127.0.0.1]", "ws://[::ffff:127.0.0.1]/relay"),
    ],
)
def test_relay_url_maps_schemes_and_appends_relay_once(base: str, expected: str) -> None:
    """https->wss, http->ws, trailing slashes stripped, /relay appended once (or kept)."""
    assert relay_url(base) == expected


@pytest.mark.parametrize(
    "base",
    [
        "https://relay.example.com/api",
        "https://relay.example.com/relay/v2",
        "https://relay.example.com/relay/relay",
        "https://relay.example.com/v1/relay",
        "https://relay.example.com/relayx",
    ],
)
def test_other_paths_are_refused(base: str) -> None:
    """Any path other than empty or /relay is a ValueError naming the path."""
    with pytest.raises(ValueError, match="path"):
        relay_url(base)


@pytest.mark.parametrize(
    "base",
    [
        "http://relay.example.com",
        "ws://relay.example.com",
        "ws://10.0.0.5:8080",
        "http://192.168.1.1",
        "ws://[2001:db8::1]",
        "http://localhost.example.com",
        "http://app.localhost",
        "http://0.0.0.0",
        "http://[::ffff:10.0.0.1]",
    ],
)
def test_plain_ws_only_to_loopback(base: str) -> None:
    """A plain http/ws base to anything but loopback is refused (tokens never travel in clear)."""
    with pytest.raises(ValueError, match="loopback"):
        relay_url(base)


@pytest.mark.parametrize(
    "base",
    [
        "ftp://relay.example.com",
        "relay.example.com",
        "localhost:8080",
        "https://",
        "https:///relay",
        "https://relay.example.com:99999",
        "https://relay.example.com:port",
        "https://user:pw@relay.example.com",
        "https://relay.example.com/?gw=1",
        "https://relay.example.com/relay#frag",
        "https://relay.example.com?",
        "",
    ],
)
def test_unusable_bases_are_refused(base: str) -> None:
    """Other schemes, no host, bad ports, user info, queries and fragments are ValueErrors."""
    with pytest.raises(ValueError, match="relay base URL"):
        relay_url(base)


def test_relay_url_refuses_non_strings() -> None:
    """relay_url raises TypeError for a non-str base."""
    with pytest.raises(TypeError):
        relay_url(b"https://x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("localhost.", True),
        ("LocalHost", True),
        ("127.0.0.1", True),
        ("127.255.255.254", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("128.0.0.1", False),
        ("::2", False),
        ("localhost.localdomain", False),
        ("example.com", False),
        ("", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    """Only localhost, 127.0.0.0/8 and ::1 (plain or IPv4-mapped) count as loopback."""
    assert is_loopback_host(host) is loopback


# -- classify_close ------------------------------------------------------------------------------


def test_close_code_constants() -> None:
    """The close codes are the documented 4400/4401/4409/4419."""
    assert (CLOSE_PROTOCOL, CLOSE_REVOKED, CLOSE_REPLACED, CLOSE_EXPIRED) == (
        4400,
        4401,
        4409,
        4419,
    )


def test_close_kind_is_a_str_enum() -> None:
    """CloseKind values are the documented lowercase names and compare equal to them."""
    assert {k.value for k in CloseKind} == {
        "normal",
        "revoked",
        "expired",
        "replaced",
        "protocol",
        "retry_once",
        "refused",
        "other",
    }
    assert isinstance(CloseKind.RETRY_ONCE, str)
    assert str(CloseKind.RETRY_ONCE) == "retry_once"


@pytest.mark.parametrize("handshaken", [False, True])
@pytest.mark.parametrize(
    ("code", "reason", "kind"),
    [
        (4419, None, CloseKind.EXPIRED),
        (4419, "whatever", CloseKind.EXPIRED),
        (4409, "replaced", CloseKind.REPLACED),
        (4400, "protocol violation", CloseKind.PROTOCOL),
        (1000, "", CloseKind.NORMAL),
        (1001, "going away", CloseKind.NORMAL),
        (1006, None, CloseKind.OTHER),
        (1011, "internal error", CloseKind.OTHER),
        (4000, None, CloseKind.OTHER),
        (4401, "expired", CloseKind.EXPIRED),
        (4401, " Expired ", CloseKind.EXPIRED),
    ],
)
def test_codes_that_do_not_depend_on_history(
    code: int, reason: str | None, kind: CloseKind, handshaken: bool
) -> None:
    """4419/4409/4400/1000/1001, other codes and a 4401 saying 'expired' classify the same
    whether or not a handshake succeeded before."""
    assert classify_close(code, reason, handshaken_before=handshaken) is kind


@pytest.mark.parametrize("reason", [None, "", "revoked", "unknown gateway", "token expired!"])
def test_legacy_4401_after_a_handshake_gets_one_retry(reason: str | None) -> None:
    """A 4401 not saying 'expired' after a successful handshake is RETRY_ONCE."""
    assert classify_close(4401, reason, handshaken_before=True) is CloseKind.RETRY_ONCE


@pytest.mark.parametrize("reason", [None, "", "revoked", "unknown gateway"])
def test_4401_without_an_earlier_handshake_is_revocation(reason: str | None) -> None:
    """A 4401 not saying 'expired' with no successful handshake before is REVOKED (terminal)."""
    assert classify_close(4401, reason, handshaken_before=False) is CloseKind.REVOKED


@pytest.mark.parametrize(
    "code",
    [None, "4401", 4401.0, True, False, -1, 0, 999, 5000, 65535, 2**70, object()],
    # An id that does not change between runs (an object's repr holds its address).
    ids=lambda code: "object" if type(code) is object else repr(code),
)
def test_garbage_codes_are_other(code: Any) -> None:
    """A missing, non-integer or out-of-range close code is OTHER, never an exception."""
    assert classify_close(code, "expired", handshaken_before=True) is CloseKind.OTHER


def test_int_enum_close_codes_are_accepted() -> None:
    """websockets' CloseCode (an IntEnum) classifies like the plain int it stands for."""
    assert classify_close(CloseCode.NORMAL_CLOSURE, "", handshaken_before=False) is CloseKind.NORMAL
    assert classify_close(CloseCode.GOING_AWAY, None, handshaken_before=True) is CloseKind.NORMAL


def test_garbage_reason_does_not_crash() -> None:
    """A non-string reason on a 4401 is treated as no reason."""
    assert classify_close(4401, 5, handshaken_before=False) is CloseKind.REVOKED  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("handshaken_before", "ever_handshaken", "expected"),
    [
        (True, True, CloseKind.RETRY_ONCE),
        (False, True, CloseKind.REVOKED),
        (False, False, CloseKind.REFUSED),
    ],
)
def test_a_4401_before_the_first_handshake_is_a_refusal_to_retry(
    handshaken_before: bool, ever_handshaken: bool, expected: CloseKind
) -> None:
    """A plain 4401 is RETRY_ONCE after a handshake, REFUSED (retried with backoff for a
    bounded period) before the transport's first handshake, and REVOKED otherwise; 4401 +
    expired stays EXPIRED either way."""
    kind = classify_close(
        CLOSE_REVOKED,
        "unknown",
        handshaken_before=handshaken_before,
        ever_handshaken=ever_handshaken,
    )
    assert kind is expected
    expired = classify_close(
        CLOSE_REVOKED,
        "expired",
        handshaken_before=handshaken_before,
        ever_handshaken=ever_handshaken,
    )
    assert expired is CloseKind.EXPIRED


def test_a_clock_skew_reason_names_the_connector_time_and_reads_back() -> None:
    """clock_skew_reason fits a close reason and connector_time reads the time back; a reason
    without one (or not a string) reads as None."""
    reason = clock_skew_reason("expired", 1_796_000_123.9)
    assert reason == "expired: clock skew? connector time 1796000123"
    assert len(reason.encode()) <= 123
    assert connector_time(reason) == 1_796_000_123
    assert connector_time("expired") is None
    assert connector_time(None) is None
    assert len(clock_skew_reason("x" * 200, 1.0)) == 123

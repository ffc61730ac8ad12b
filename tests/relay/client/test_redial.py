"""The gateway transport's redial policy, sans I/O on a fake clock: backoff ladder, the close
rules' one-shot allowances, the refusal grace and the measured clock offset."""

from __future__ import annotations

import random

import pytest

from relay.client.redial import RedialPolicy
from relay.wire.urls import CLOSE_EXPIRED, CLOSE_REPLACED, CLOSE_REVOKED, CloseKind
from statecore.clock import FakeClock


def policy(clock: FakeClock, **overrides: float) -> RedialPolicy:
    """A policy with a seeded jitter: base 1 s, cap 8 s, dormant 5 s, stable after 60 s,
    refusal grace 30 s unless overridden."""
    settings: dict[str, float] = {
        "backoff_s": 1.0,
        "max_s": 8.0,
        "dormant_s": 5.0,
        "stable_after_s": 60.0,
        "refusal_grace_s": 30.0,
    }
    settings.update(overrides)
    return RedialPolicy(clock, random.Random(7), **settings)


def test_backoff_doubles_up_to_its_cap_with_jitter_in_the_upper_half() -> None:
    """Each wait is uniform in [d/2, d], d = min(cap, base * 2**attempt)."""
    redial = policy(FakeClock())
    ceilings = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    for ceiling in ceilings:
        wait = redial.next_wait(dormant=False)
        assert ceiling / 2 <= wait <= ceiling


def test_a_dormant_transport_waits_the_dormant_cadence_and_spends_no_backoff() -> None:
    """Dormant re-dials are at the fixed cadence and do not climb the ladder."""
    redial = policy(FakeClock())
    assert [redial.next_wait(dormant=True) for _ in range(3)] == [5.0, 5.0, 5.0]
    assert 0.5 <= redial.next_wait(dormant=False) <= 1.0  # still the first step


def test_the_ladder_starts_again_after_a_stable_connection_only() -> None:
    """A connection that lasted stable_after_s resets the backoff; a short one does not."""
    clock = FakeClock()
    redial = policy(clock)
    for _ in range(3):
        redial.next_wait(dormant=False)
    redial.established()
    clock.advance(10.0)
    redial.lost(1006, None)
    assert 4.0 <= redial.next_wait(dormant=False) <= 8.0  # short-lived: keeps climbing
    redial.established()
    clock.advance(60.0)
    redial.lost(1006, None)
    assert 0.5 <= redial.next_wait(dormant=False) <= 1.0  # stable: back to the first step


def test_an_expiry_close_allows_one_immediate_redial_per_handshake() -> None:
    """4419 re-dials at once, once; the next one waits its backoff until a handshake."""
    redial = policy(FakeClock())
    redial.established()
    assert redial.lost(CLOSE_EXPIRED, "expired").kind is CloseKind.EXPIRED
    assert redial.next_wait(dormant=False) == 0.0
    redial.lost(CLOSE_EXPIRED, "expired")
    assert redial.next_wait(dormant=False) > 0.0
    redial.established()
    redial.lost(CLOSE_EXPIRED, "expired")
    assert redial.next_wait(dormant=False) == 0.0


def test_a_4401_after_a_handshake_is_retried_once_then_taken_as_revocation() -> None:
    """The original contract's 4401 after a handshake: one re-dial, then revoked."""
    redial = policy(FakeClock())
    redial.established()
    assert redial.lost(CLOSE_REVOKED, "unauthorized").kind is CloseKind.RETRY_ONCE
    assert redial.next_wait(dormant=False) == 0.0
    assert redial.lost(CLOSE_REVOKED, "unauthorized").kind is CloseKind.REVOKED


def test_refusals_before_any_handshake_are_retried_for_the_grace_then_revoked() -> None:
    """A connector that does not know us yet: refused is retried until the grace is spent."""
    clock = FakeClock()
    redial = policy(clock)
    assert redial.lost(CLOSE_REVOKED, "unknown gateway").kind is CloseKind.REFUSED
    clock.advance(29.0)
    assert redial.refusal_may_be_a_race()
    clock.advance(1.0)
    assert redial.lost(CLOSE_REVOKED, "unknown gateway").kind is CloseKind.REVOKED


def test_a_replaced_close_is_reported_as_such() -> None:
    """4409 ends the transport (a newer connection of this gateway took over)."""
    verdict = policy(FakeClock()).lost(CLOSE_REPLACED, "replaced")
    assert (verdict.kind, verdict.code, verdict.reason) == (CloseKind.REPLACED, 4409, "replaced")


def test_a_refusal_naming_the_connector_time_sets_the_token_clock() -> None:
    """The connector's time in a refusal is measured once and tokens follow it."""
    clock = FakeClock(start=1_000_000.0)
    redial = policy(clock)
    redial.lost(CLOSE_REVOKED, "token expired; connector time 1003600")
    assert redial.clock_offset_s == pytest.approx(3600.0)
    assert redial.token_time() == pytest.approx(clock.now() + 3600.0)
    assert redial.last_close == (CLOSE_REVOKED, "token expired; connector time 1003600")


def test_small_offsets_are_latency_not_a_wrong_clock() -> None:
    """An offset under a few seconds is not adopted."""
    clock = FakeClock(start=1_000_000.0)
    redial = policy(clock)
    redial.measure_clock("connector time 1000002")
    assert redial.clock_offset_s == 0.0

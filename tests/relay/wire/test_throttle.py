"""Tests for relay.wire.throttle.LogThrottle: bounded logging of what a peer controls."""

from __future__ import annotations

import pytest

from relay.wire.throttle import LogThrottle
from statecore.clock import FakeClock


def test_a_burst_is_allowed_then_counted_and_reported_on_the_next_window() -> None:
    """Within a window the first `burst` occurrences are allowed (0 suppressed so far), the rest
    suppressed; the first line of the next window reports how many were suppressed."""
    clock = FakeClock()
    throttle = LogThrottle(burst=3, interval_s=60.0, clock=clock)
    assert [throttle.allow() for _ in range(5)] == [0, 0, 0, None, None]
    assert throttle.suppressed == 2
    clock.advance(59.9)
    assert throttle.allow() is None
    clock.advance(0.1)
    assert throttle.allow() == 3
    assert throttle.suppressed == 0
    assert throttle.allow() == 0


@pytest.mark.parametrize(("burst", "interval"), [(0, 1.0), (True, 1.0), (1, 0.0), (1, -1.0)])
def test_bad_settings_are_refused(burst: int, interval: float) -> None:
    """A burst that is not a positive int, or an interval that is not positive, is refused."""
    with pytest.raises(ValueError, match="must be"):
        LogThrottle(burst=burst, interval_s=interval)

"""The one bounded wait the relay tests share: poll a condition over real sockets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

BOUND = 5.0
"""Real seconds any single wait may take before the test fails."""


async def eventually(
    predicate: Callable[[], bool],
    what: str = "condition",
    timeout: float = BOUND,
    *,
    interval: float = 0.005,
) -> None:
    """Poll ``predicate`` every ``interval`` s until true.

    Raises AssertionError naming ``what`` after ``timeout`` real seconds.  Only for conditions
    that real I/O makes true; time the code under test waits on moves by its FakeClock.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)

"""What every platform driver needs the same way: the intake it is attached to, its one loop
task, the supervised round loop with its backoff, and rate-limited warnings.

A driver (``relay.matrix``, ``relay.telegram``, ``relay.slack``, ``relay.discord``) imports
these from the connector's layer, never from another driver:

* :class:`IntakeSlot`: ``attach`` keeps the connector's :class:`DriverIntake` (anything else
  is a ``TypeError``); calling the slot returns it, or raises ``RuntimeError`` before attach.
* :class:`LoopTask`: the driver's background task, created once, cancelled and waited for
  (bounded) on stop, which never raises.
* :class:`RoundLoop` and :class:`Backoff`: run a round again and again; after a failure, sleep
  on the driver's clock for what the driver says (the next step of :data:`BACKOFF_S`, or what
  the platform asked for); cancellation always goes through.
* :meth:`Backoff.sleep_within`: the wait before an outbound request is asked again, unless it
  would end past the send budget (:data:`SEND_BACKOFF_S`).
* :func:`warn_limited`: a warning line through :class:`LogLimits`, so a failing platform
  cannot fill the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Final

from relay.connector.intake import DriverIntake
from relay.connector.platform import Intake
from relay.wire.throttle import LogLimits
from statecore.clock import Clock

__all__ = [
    "BACKOFF_S",
    "SEND_BACKOFF_S",
    "Backoff",
    "IntakeSlot",
    "LoopTask",
    "RoundLoop",
    "warn_limited",
]

BACKOFF_S: Final = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
"""The waits after consecutive failed rounds (the last one repeats)."""
SEND_BACKOFF_S: Final = (0.25, 0.5, 1.0, 2.0, 5.0)
"""The waits between the attempts of one outbound request, within its send budget."""


class IntakeSlot:
    """The connector's intake of one driver, once attached.

    ``IntakeSlot("Matrix", needs="notes, rejections")``: the names go into the errors
    (``the Matrix driver needs a connector's DriverIntake (notes, rejections), not dict``).
    """

    def __init__(self, driver: str, *, needs: str) -> None:
        self.driver = driver
        self.needs = needs
        self.intake: DriverIntake | None = None
        """The attached intake (None before :meth:`attach`)."""

    def attach(self, intake: Intake) -> DriverIntake:
        """Keep ``intake`` and return it; raises ``TypeError`` unless it is a
        :class:`DriverIntake` (a plain callable has no notes or rejections)."""
        if not isinstance(intake, DriverIntake):
            raise TypeError(
                f"the {self.driver} driver needs a connector's DriverIntake ({self.needs}), "
                f"not {type(intake).__name__}"
            )
        self.intake = intake
        return intake

    def __call__(self) -> DriverIntake:
        """The attached intake; raises ``RuntimeError`` before :meth:`attach`."""
        if self.intake is None:
            raise RuntimeError(f"the {self.driver} driver is not attached to a connector")
        return self.intake


class LoopTask:
    """A driver's one background task (its sync, poll or gateway loop)."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """True while the task is there and not done (a second start is then a no-op)."""
        return self._task is not None and not self._task.done()

    def start(self, loop: Coroutine[Any, Any, None], *, name: str) -> None:
        """Run ``loop`` as the task; when one is running already, ``loop`` is closed unrun."""
        if self.running:
            loop.close()
            return
        self._task = asyncio.create_task(loop, name=name)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Cancel the task and wait for it, at most ``timeout_s``; idempotent, never raises."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, timeout_s)


class Backoff:
    """The wait after each of a run of consecutive failures: ``steps[0]`` after the first,
    then the next step, the last one repeating; :meth:`reset` once a round went through."""

    def __init__(self, steps: Sequence[float] = BACKOFF_S) -> None:
        if not steps or any(step < 0 for step in steps):
            raise ValueError("steps must be one or more waits, none negative")
        self.steps = tuple(float(step) for step in steps)
        self.failures = 0
        """Consecutive failures counted since the last :meth:`reset`."""

    @property
    def longest(self) -> float:
        """The last (longest) step."""
        return self.steps[-1]

    def current(self) -> float:
        """The step for the failures counted so far (nothing is counted)."""
        return self.steps[min(self.failures, len(self.steps) - 1)]

    def fail(self, wait_s: float | None = None) -> float:
        """Count one failure; returns ``wait_s`` when given (the platform said how long),
        else the step for the failures before this one."""
        delay = self.current() if wait_s is None else wait_s
        self.failures += 1
        return delay

    def reset(self) -> None:
        """A round went through: the next failure waits ``steps[0]`` again."""
        self.failures = 0

    async def sleep_within(self, clock: Clock, deadline: float) -> bool:
        """Count one failure and sleep its step on ``clock``; False, without sleeping, when
        the step would end past ``deadline`` (on ``clock.monotonic()``): give up."""
        delay = self.fail()
        if clock.monotonic() + delay > deadline:
            return False
        await clock.sleep(delay)
        return True


class RoundLoop:
    """Runs a driver's rounds until cancelled (or a round says it is done).

    ``await loop.run(one_round, failed)``: ``one_round()`` returns True when nothing is left to
    do (the loop returns), False to go on; each one that returns is counted in :attr:`rounds`
    and resets the backoff (unless ``reset_on_round=False``).  A round that raises is counted
    in :attr:`failed_rounds`, and ``failed(exc)`` returns how long to wait before the next one
    (it warns, counts the failure in :attr:`backoff`, may raise to end the loop); a wait of 0
    is no wait.  ``CancelledError`` is never caught.
    """

    def __init__(self, clock: Clock, *, steps: Sequence[float] = BACKOFF_S) -> None:
        self.clock = clock
        self.backoff = Backoff(steps)
        self.rounds = 0
        """Rounds that returned."""
        self.failed_rounds = 0
        """Rounds that raised (each followed by the wait ``failed`` chose)."""

    async def run(
        self,
        one_round: Callable[[], Awaitable[bool]],
        failed: Callable[[Exception], Awaitable[float]],
        *,
        reset_on_round: bool = True,
    ) -> None:
        """Run rounds (see the class docs); returns only when a round returned True."""
        while True:
            try:
                done = await one_round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failed_rounds += 1
                delay = await failed(exc)
                if delay > 0:
                    await self.clock.sleep(delay)
                continue
            self.rounds += 1
            if reset_on_round:
                self.backoff.reset()
            if done:
                return


def warn_limited(limits: LogLimits, logger: logging.Logger, kind: str, line: str) -> None:
    """Log ``line`` as a WARNING unless ``limits`` holds lines of ``kind`` back just now (what
    was held back is counted, and said at the end of the next line logged)."""
    more = limits.check(logger, logging.WARNING, kind)
    if more is not None:
        logger.warning("%s%s", line, more)

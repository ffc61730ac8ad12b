"""Sends in flight: each reply's send and the ledger write that settles it, run as one task that
nobody else's cancellation reaches.

A bot's handler, a redelivery loop or the retry timer *asks* for a send; the send itself runs in
a task of its own (:meth:`Flights.launch`) that the asker awaits through ``asyncio.shield``.
When the asker is cancelled -- the relay closing a handler's lane as the gateway stops, a
redelivery loop cancelled by ``stop()`` -- the send goes on, and so does the write that records
its outcome: a platform's acknowledgement is never lost between the send and the ledger's mark.
``Gateway.stop()`` waits for the flights (:meth:`Flights.land`) within what is left of its
budget, after the adapters were disconnected (which ends the sends still waiting for an
answer), and only then cancels what is still in the air.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from statecore.clock import Deadline

__all__ = ["Flights"]

log = logging.getLogger("statecore.gateway.runtime")

T = TypeVar("T")

_CANCEL_WAIT_S = 0.1
"""How long a cancelled flight is given to unwind (its ``finally`` blocks) before stop goes on."""


class Flights:
    """The gateway's tasks that must not be cut short by their asker's cancellation."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def launch(
        self, coro: Coroutine[Any, Any, T], *, landed: Callable[[], None] | None = None
    ) -> asyncio.Task[T]:
        """Run ``coro`` as a flight; ``landed()`` is called once it ended, however it ended.
        Await the task through ``asyncio.shield`` so that the asker's cancellation does not
        reach it.  An exception nobody awaited is logged, never left unretrieved."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(finished: asyncio.Task[T]) -> None:
            self._tasks.discard(finished)
            if landed is not None:
                landed()
            if not finished.cancelled() and finished.exception() is not None:
                log.debug("a send in flight failed", exc_info=finished.exception())

        task.add_done_callback(done)
        return task

    async def land(self, deadline: Deadline) -> int:
        """Wait for every flight while ``deadline`` allows, then cancel those still in the air
        (a send that never got its answer: its row stays owed).  Returns how many were
        cancelled."""
        waiting = {task for task in self._tasks if not task.done()}
        while waiting and deadline.remaining() > 0:
            _, unfinished = await asyncio.wait(waiting, timeout=deadline.remaining())
            if unfinished:
                break  # the budget ran out
            # Flights launched meanwhile (a release of unsent claims) are waited for too.
            waiting = {task for task in self._tasks if not task.done()}
        stranded = [task for task in self._tasks if not task.done()]
        for task in stranded:
            task.cancel()
        if stranded:
            await asyncio.wait(stranded, timeout=_CANCEL_WAIT_S)
            log.warning(
                "stop: %d sends still unanswered when the stop budget ran out; their replies "
                "stay owed (resent, labelled, by the next start)",
                len(stranded),
                extra={"unanswered": len(stranded)},
            )
        return len(stranded)

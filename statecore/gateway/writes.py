"""The send path's ledger writes, tried again on a transient store error.

A write of the send path (mark attempting, delivered, failed; release) that raises
``StoreError`` -- a lock another process holds, a busy disk -- is tried again after each delay
of the gateway's ``settle_retry_delays_s``, on the gateway's clock.  A definite refusal
(``InvalidTransition``, ``StaleState``, ``UnknownEntity``) is raised at once: trying it again
cannot help.  A *settling* write (delivered, failed, release) is shielded: once handed to the
ledger it is written even if the task that asked for it is cancelled meanwhile (the ledger
finishes what is queued before it closes), so that a send's outcome is never dropped between
the platform's answer and the ledger's mark.

A try that raised ``StoreOutcomeUnknown`` (the connection was lost during its commit, and the
server could not say) may have been kept.  The next try then learns it: a definite refusal
after such a try means the earlier one most probably committed (the row moved on), so it is
logged and the write gives up without raising, leaving the row to be read afresh (the send
path's caller treats a None like any given-up write) -- never a loud error for a write that
took.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from statecore.clock import Clock
from statecore.errors import InvalidTransition, StaleState, StoreError, StoreOutcomeUnknown

__all__ = ["retried_write"]

log = logging.getLogger("statecore.gateway.runtime")

T = TypeVar("T")


async def retried_write(
    what: str,
    obligation_id: str,
    write: Callable[[], Awaitable[T]],
    *,
    clock: Clock,
    delays: Sequence[float],
    settling: bool = False,
) -> T | None:
    """Run ``write()`` (the ledger write ``what`` of ``obligation_id``), trying it again after
    each of ``delays`` while it raises ``StoreError``; shielded from cancellation when
    ``settling`` (see the module docs).

    Returns the write's result, or None once every try failed (logged at WARNING with the
    obligation id; the row stays where it is, for the stuck-row recovery).  A definite refusal
    (``InvalidTransition``, ``StaleState``) is raised at once -- unless an earlier try's commit
    outcome was unknown (``StoreOutcomeUnknown``): then it says that try was kept, and None is
    returned (logged at INFO).
    """
    tried = 0
    unknown = False  # whether an earlier try's commit outcome is unknown (it may have been kept)
    while True:
        try:
            return await (asyncio.shield(write()) if settling else write())
        except (InvalidTransition, StaleState) as exc:
            if not unknown:
                raise
            log.info(
                "%s for %s refused after a try whose commit outcome was unknown (%s): that try "
                "was most probably kept; the row is left as the store has it",
                what,
                obligation_id,
                exc,
                extra={"obligation_id": obligation_id, "write": what, "tries": tried + 1},
            )
            return None
        except StoreError as exc:
            unknown = unknown or isinstance(exc, StoreOutcomeUnknown)
            if tried == len(delays):
                log.warning(
                    "gave up %s for %s after %d tries (%s); the row is left for the "
                    "stuck-row recovery",
                    what,
                    obligation_id,
                    tried + 1,
                    exc,
                    extra={"obligation_id": obligation_id, "write": what, "tries": tried + 1},
                )
                return None
            log.info(
                "%s for %s failed (%s); trying again",
                what,
                obligation_id,
                exc,
                extra={"obligation_id": obligation_id, "write": what},
            )
        await clock.sleep(delays[tried])
        tried += 1

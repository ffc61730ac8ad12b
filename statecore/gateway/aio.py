"""Synchronous store-backed APIs for asyncio code: the one shape every ``.aio`` facade has.

:class:`~statecore.gateway.sessions.SessionStore` and
:class:`~statecore.gateway.delegations.Delegations` are synchronous (they are used from worker
threads, scripts and tests alike).  Each carries an ``aio`` attribute: the same public methods,
with the same arguments, results and errors, as coroutine functions that run the synchronous
method on a worker thread (``asyncio.to_thread``), so a handler awaits them without blocking
the event loop::

    session = await sessions.aio.start(turn.message.session_key)
    job = await delegations.aio.get(delegation_id)

:func:`off_loop` builds each of those methods; it keeps the wrapped method's signature for the
type checker.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

__all__ = ["off_loop"]

P = ParamSpec("P")
R = TypeVar("R")


def off_loop(method: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """``method`` as a coroutine function that runs it on a worker thread (the event loop's
    default executor, through ``asyncio.to_thread``): same arguments, result and errors."""

    @functools.wraps(method)
    async def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(method, *args, **kwargs)

    return run

"""The gateway transport's teardown budget: how long a disconnect may take, and how it is spent.

A disconnect drains in-flight requests for at most :func:`drain_grace_s` of its budget, then
performs :data:`TEARDOWN_AWAITS` bounded awaits of :data:`TEARDOWN_AWAIT_S` each (supervisor,
socket close, reader, dispatcher).  The default budget comes from the environment
(:data:`DISCONNECT_TIMEOUT_ENV`).  The bounded-wait helpers the transport uses for it are here
too: each waits on an injected clock, or is bounded by the event loop's own timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from statecore.clock import Clock, Deadline, SystemClock

__all__ = [
    "DISCONNECT_TIMEOUT_ENV",
    "MAX_DRAIN_GRACE_S",
    "MAX_TEARDOWN_S",
    "TEARDOWN_AWAITS",
    "TEARDOWN_AWAIT_S",
    "bounded",
    "cancel",
    "default_disconnect_budget_s",
    "drain_grace_s",
    "tear_down",
    "wait_event",
    "wait_future",
]

MAX_DRAIN_GRACE_S = 5.0
"""The longest a disconnect waits for in-flight requests to finish."""

TEARDOWN_AWAIT_S = 1.0
"""The bound on each teardown await (supervisor, socket close, reader, dispatcher)."""

TEARDOWN_AWAITS = 4
"""How many bounded awaits a teardown performs after the drain: supervisor, socket close,
reader, dispatcher.  The drain grace reserves time for every one of them."""

DISCONNECT_TIMEOUT_ENV = "STATECORE_ADAPTER_DISCONNECT_TIMEOUT"
"""Environment variable: the default disconnect budget in seconds (default 5)."""

_DEFAULT_DISCONNECT_BUDGET_S = 5.0
_RESERVED_S = TEARDOWN_AWAITS * TEARDOWN_AWAIT_S + 0.5

MAX_TEARDOWN_S = _RESERVED_S + MAX_DRAIN_GRACE_S
"""The longest one teardown takes whatever its budget: the drain plus every bounded await."""


def default_disconnect_budget_s() -> float:
    """The disconnect budget from ``STATECORE_ADAPTER_DISCONNECT_TIMEOUT`` (seconds).

    Unset, empty or not a finite number → 5; negative → 0.
    """
    raw = os.environ.get(DISCONNECT_TIMEOUT_ENV, "").strip()
    try:
        value = float(raw) if raw else _DEFAULT_DISCONNECT_BUDGET_S
    except ValueError:
        return _DEFAULT_DISCONNECT_BUDGET_S
    if not math.isfinite(value):
        return _DEFAULT_DISCONNECT_BUDGET_S
    return max(0.0, value)


def drain_grace_s(budget_s: float | None = None) -> float:
    """How long a disconnect with ``budget_s`` may drain in-flight requests.

    ``max(0, min(MAX_DRAIN_GRACE_S, budget - reserved))`` where ``reserved`` covers the
    ``TEARDOWN_AWAITS`` bounded teardown awaits plus a margin; no budget → the environment
    default.  Never negative.
    """
    budget = default_disconnect_budget_s() if budget_s is None else budget_s
    if not math.isfinite(budget):
        budget = _DEFAULT_DISCONNECT_BUDGET_S
    return max(0.0, min(MAX_DRAIN_GRACE_S, budget - _RESERVED_S))


async def wait_event(clock: Clock, event: asyncio.Event, timeout_s: float) -> bool:
    """Wait for ``event`` at most ``timeout_s`` on ``clock``; True if it was set."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        return await wait_future(clock, waiter, timeout_s)
    finally:
        if not waiter.done():
            waiter.cancel()


async def wait_future(clock: Clock, future: asyncio.Future[Any], timeout_s: float) -> bool:
    """Wait for ``future`` at most ``timeout_s`` on ``clock`` without cancelling it.

    True if it finished.  The real clock uses one timer handle; a fake clock races a sleep.
    """
    if future.done():
        return True
    if isinstance(clock, SystemClock):
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()

        def wake(_: object = None) -> None:
            if not waiter.done():
                waiter.set_result(None)

        handle = loop.call_later(max(0.0, timeout_s), wake)
        future.add_done_callback(wake)
        try:
            await waiter
        finally:
            handle.cancel()
            future.remove_done_callback(wake)
        return future.done()
    sleeper = asyncio.ensure_future(clock.sleep(timeout_s))
    try:
        await asyncio.wait({future, sleeper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
    return future.done()


async def bounded(awaitable: Awaitable[Any], timeout_s: float) -> None:
    """Await with a bound; a timeout or a closed-connection error is not the caller's problem."""
    with contextlib.suppress(TimeoutError, ConnectionClosed, OSError):
        await asyncio.wait_for(awaitable, timeout=max(0.0, timeout_s))


async def cancel(task: asyncio.Task[Any] | None, timeout_s: float) -> None:
    """Cancel a task and wait (bounded) for it to finish; never the current task."""
    if task is None or task.done() or task is asyncio.current_task():
        return
    task.cancel()
    await asyncio.wait({task}, timeout=max(0.0, timeout_s))


async def tear_down(
    deadline: Deadline,
    *,
    drain: list[asyncio.Future[Any]],
    grace_s: float,
    supervisor: asyncio.Task[Any] | None,
    ws: ClientConnection | None,
    reader: asyncio.Task[Any] | None,
    dispatcher_close: Callable[[float], Awaitable[None]],
) -> None:
    """The bounded steps of one deliberate teardown, in order: drain ``drain`` (the in-flight
    requests) for at most ``grace_s``, then stop the supervisor, close the socket, stop the
    reader and close the dispatcher, each bounded by :data:`TEARDOWN_AWAIT_S` and by what is
    left of ``deadline``.  Never raises but for cancellation; the caller's ``finally`` must
    cut whatever did not finish (fail pending requests, cancel tasks, abort the socket)."""
    if drain and grace_s > 0:
        await asyncio.wait(drain, timeout=grace_s)
    await cancel(supervisor, min(TEARDOWN_AWAIT_S, deadline.remaining()))
    if ws is not None:
        await bounded(ws.close(1000, "disconnect"), min(TEARDOWN_AWAIT_S, deadline.remaining()))
    await cancel(reader, min(TEARDOWN_AWAIT_S, deadline.remaining()))
    await dispatcher_close(min(TEARDOWN_AWAIT_S, deadline.remaining()))

"""The connector's background tasks: each one referenced until it ends, all cancelled on stop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["Tasks"]

T = TypeVar("T")


class Tasks:
    """The background tasks of one connector.

    The event loop keeps only a weak reference to a task: each one is held here until it is
    done, so none is collected mid-flight, and :meth:`cancel_all` reaches every one still
    running.
    """

    def __init__(self) -> None:
        self._running: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``coro`` in the background; return its task."""
        task = asyncio.ensure_future(coro)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    def cancel_all(self) -> None:
        """Cancel every task still running (the connector is stopping)."""
        for task in list(self._running):
            task.cancel()

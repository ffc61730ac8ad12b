"""A metrics double for the runtime and relay tests: it records every call it gets, in order,
from any thread (the relay reports from its store thread)."""

from __future__ import annotations

import threading
from typing import Any


class RecordingMetrics:
    """Implements :class:`statecore.metrics.Metrics` by recording ``(method, args)`` tuples."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def _record(self, name: str, *args: Any) -> None:
        with self._lock:
            self.calls.append((name, args))

    def of(self, name: str) -> list[tuple[Any, ...]]:
        """The arguments of every call of ``name``, in order."""
        with self._lock:
            return [args for called, args in self.calls if called == name]

    def transition(self, lifecycle: str, event: str, outcome: str, count: int = 1) -> None:
        """Recorded."""
        self._record("transition", lifecycle, event, outcome, count)

    def latency(self, operation: str, seconds: float) -> None:
        """Recorded."""
        self._record("latency", operation, seconds)

    def sweep(self, kind: str, claimed: int, abandoned: int, seconds: float) -> None:
        """Recorded."""
        self._record("sweep", kind, claimed, abandoned, seconds)

    def reconnect(self, target: str) -> None:
        """Recorded."""
        self._record("reconnect", target)

    def dormant(self, target: str, seconds: float) -> None:
        """Recorded."""
        self._record("dormant", target, seconds)

    def buffer(self, gateway_id: str, depth: int, replay_lag_s: float | None) -> None:
        """Recorded."""
        self._record("buffer", gateway_id, depth, replay_lag_s)

    def pruned(self, what: str, rows: int) -> None:
        """Recorded."""
        self._record("pruned", what, rows)

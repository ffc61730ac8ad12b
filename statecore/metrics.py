"""The metrics hook: what the framework reports as it works, to whatever an application plugs in.

The kernel, the chat runtime and the relay call one :class:`Metrics` object at the points that
matter to an operator: every guarded transition with its outcome, claim and settle latency,
every sweep, reconnections and dormancy, buffer depth and replay lag, housekeeping.  Nothing is
reported unless an application passes an object: the default, :data:`NO_METRICS`, does nothing,
and callers on hot paths skip even building the arguments when they hold it
(``if metrics is not NO_METRICS``).  Gauges that are a property of stored rows (rows per state,
the oldest owed reply's age) are not pushed here: an exporter reads them from the stores when it
is scraped (see :mod:`statecore.prometheus`).

Implementations must be cheap and must not raise; they may be called from any thread.
"""

from __future__ import annotations

from typing import Final, Protocol

__all__ = ["NO_METRICS", "Metrics", "NullMetrics", "Outcome"]


class Outcome:
    """The outcomes a transition is counted under."""

    OK: Final = "ok"
    """The guarded write happened."""
    REFUSED: Final = "refused"
    """The lifecycle does not allow the event from the row's state (``InvalidTransition``)."""
    STALE: Final = "stale"
    """Another writer changed or owns the row (``StaleState``)."""
    UNKNOWN: Final = "unknown"
    """No such row (``UnknownEntity``)."""
    ERROR: Final = "error"
    """The store failed (``StoreError``)."""


class Metrics(Protocol):
    """What the framework reports (every method must be cheap and never raise)."""

    def transition(self, lifecycle: str, event: str, outcome: str, count: int = 1) -> None:
        """``count`` guarded writes of ``event`` on ``lifecycle`` ended with ``outcome`` (an
        :class:`Outcome` value); a batched write reports each of its rows."""
        ...

    def latency(self, operation: str, seconds: float) -> None:
        """One ``operation`` took ``seconds``: ``"claim"`` (a sweep's claim of one chunk) or
        ``"settle"`` (from a send's start to its delivered or failed mark)."""
        ...

    def sweep(self, kind: str, claimed: int, abandoned: int, seconds: float) -> None:
        """One ledger sweep finished: ``kind`` is ``"startup"``, ``"runtime"`` or ``"stuck"``."""
        ...

    def reconnect(self, target: str) -> None:
        """A relay connection to ``target`` (a connector URL) was re-established."""
        ...

    def dormant(self, target: str, seconds: float) -> None:
        """A relay connection to ``target`` woke after ``seconds`` dormant."""
        ...

    def buffer(self, gateway_id: str, depth: int, replay_lag_s: float | None) -> None:
        """The connector's buffer for ``gateway_id`` holds ``depth`` unacked entries, the oldest
        waiting ``replay_lag_s`` seconds (None: none waiting)."""
        ...

    def pruned(self, what: str, rows: int) -> None:
        """Housekeeping deleted ``rows`` settled rows of ``what`` past their retention."""
        ...


class NullMetrics:
    """Reports nothing: the default."""

    __slots__ = ()

    def transition(self, lifecycle: str, event: str, outcome: str, count: int = 1) -> None:
        """Nothing."""

    def latency(self, operation: str, seconds: float) -> None:
        """Nothing."""

    def sweep(self, kind: str, claimed: int, abandoned: int, seconds: float) -> None:
        """Nothing."""

    def reconnect(self, target: str) -> None:
        """Nothing."""

    def dormant(self, target: str, seconds: float) -> None:
        """Nothing."""

    def buffer(self, gateway_id: str, depth: int, replay_lag_s: float | None) -> None:
        """Nothing."""

    def pruned(self, what: str, rows: int) -> None:
        """Nothing."""


NO_METRICS: Final[Metrics] = NullMetrics()
"""The default metrics object: reports nothing, costs a method call at most."""

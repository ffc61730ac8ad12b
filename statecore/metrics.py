"""The metrics hook: what the framework reports as it works, to whatever an application plugs in.

The kernel, the chat runtime and the relay call one :class:`Metrics` object at the points that
matter to an operator: every guarded transition with its outcome, claim and settle latency,
every sweep, reconnections and dormancy, buffer depth and replay lag, housekeeping.  Nothing is
reported unless an application passes an object: the default, :data:`NO_METRICS`, does nothing,
and callers on hot paths skip even building the arguments when they hold it
(``if metrics is not NO_METRICS``).  Gauges that are a property of stored rows (rows per state,
the oldest owed reply's age) are not pushed here: an exporter reads them from the stores when it
is scraped (see :mod:`statecore.prometheus`).  A connector also reports its intake (the depth
of its hold, copies skipped, rejected events) to an object that implements
:class:`IntakeMetrics` as well.

Implementations must be cheap and must not raise; they may be called from any thread.

:func:`outcome_of` names the outcome a refused or failed write is counted under,
:class:`TransitionMeter` counts one lifecycle's writes and times its sends for a service that
reports (the ledger), and :class:`HeldMetrics` holds the reports of writes made inside a
transaction until it commits (``AsyncLedger`` reports a group commit's transitions only once
they are durable).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final, Protocol, TypeVar, runtime_checkable

from statecore.errors import InvalidTransition, StaleState, UnknownEntity

__all__ = [
    "NO_METRICS",
    "HeldMetrics",
    "IntakeMetrics",
    "IntakeOutcome",
    "Metrics",
    "NullMetrics",
    "Outcome",
    "TransitionMeter",
    "outcome_of",
]

_T = TypeVar("_T")


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
    """The store failed (``StoreError``), or the write failed some other unexpected way."""


_BAD_INPUT = (TypeError, ValueError, KeyError)


def outcome_of(error: BaseException) -> str | None:
    """The :class:`Outcome` a guarded write that raised ``error`` is counted under; None for
    bad input (``TypeError``, ``ValueError``, ``KeyError``: refused before any write was
    tried, so no transition is counted).  Never raises."""
    if isinstance(error, InvalidTransition):
        return Outcome.REFUSED
    if isinstance(error, StaleState):
        return Outcome.STALE
    if isinstance(error, UnknownEntity):
        return Outcome.UNKNOWN
    if isinstance(error, _BAD_INPUT):
        return None
    return Outcome.ERROR


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


class IntakeOutcome:
    """What :meth:`IntakeMetrics.intake` counts of a connector's inbound events."""

    DUPLICATE: Final = "duplicate"
    """A copy of an event taken before (by its platform id), not routed again."""
    REJECTED: Final = "rejected"
    """An event its platform's driver could not map, recorded for operators."""


@runtime_checkable
class IntakeMetrics(Protocol):
    """What a connector also reports of its intake, to a :class:`Metrics` object that has
    these methods too (the connector checks with ``isinstance``; a hook without them gets
    everything else).  Same rules: cheap, never raising, from any thread."""

    def held(self, platform: str, depth: int) -> None:
        """The connector holds ``depth`` events of ``platform`` that no gateway listened to."""
        ...

    def intake(self, platform: str, outcome: str, count: int = 1) -> None:
        """``count`` inbound events of ``platform`` ended with ``outcome`` (an
        :class:`IntakeOutcome` value)."""
        ...


class NullMetrics:
    """Reports nothing: the default."""

    __slots__ = ()

    def __repr__(self) -> str:
        # What a signature's default shows (docs/configuration.md lists ``metrics=NO_METRICS``).
        return "NO_METRICS"

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

    def held(self, platform: str, depth: int) -> None:
        """Nothing."""

    def intake(self, platform: str, outcome: str, count: int = 1) -> None:
        """Nothing."""


NO_METRICS: Final[Metrics] = NullMetrics()
"""The default metrics object: reports nothing, costs a method call at most."""


class HeldMetrics:
    """A :class:`Metrics` that holds what one thread reports while it has a transaction open,
    and passes it on to ``inner`` only once the transaction's fate is known.

    The thread that owns a transaction calls :meth:`hold` before it begins, then exactly one
    of :meth:`commit` (everything held is reported as it was), :meth:`rollback` (the work
    will be replayed and report again: held reports are dropped, except with
    ``keep_errors`` the transitions that failed, which will not be replayed) or :meth:`fail`
    (nothing was written: every held transition is reported as :attr:`Outcome.ERROR`, the
    rest dropped).  Reports from other threads, or made while nothing is held, pass straight
    through.  Never raises (unless ``inner`` does, which a :class:`Metrics` must not).
    """

    __slots__ = ("_held", "_holder", "inner")

    def __init__(self, inner: Metrics) -> None:
        self.inner = inner
        self._holder: int | None = None
        # Only the holding thread appends to or drains this list.
        self._held: list[tuple[str, tuple[Any, ...]]] = []

    def hold(self) -> None:
        """Hold this thread's reports from now until :meth:`commit`, :meth:`rollback` or
        :meth:`fail`."""
        self._held.clear()
        self._holder = threading.get_ident()

    def commit(self) -> None:
        """The transaction committed: report everything held, in order."""
        held = self._release()
        for name, args in held:
            getattr(self.inner, name)(*args)

    def rollback(self, *, keep_errors: bool = False) -> None:
        """The transaction was rolled back to be replayed: drop what was held (keeping, with
        ``keep_errors``, the transitions counted as errors)."""
        held = self._release()
        if keep_errors:
            for name, args in held:
                if name == "transition" and args[2] == Outcome.ERROR:
                    self.inner.transition(*args)

    def fail(self) -> None:
        """The transaction failed as a whole: every held transition becomes an error."""
        for name, args in self._release():
            if name == "transition":
                lifecycle, event, _, count = args
                self.inner.transition(lifecycle, event, Outcome.ERROR, count)

    def _release(self) -> list[tuple[str, tuple[Any, ...]]]:
        held = list(self._held)
        self._held.clear()
        self._holder = None
        return held

    def _report(self, name: str, *args: Any) -> None:
        if self._holder == threading.get_ident():
            self._held.append((name, args))
        else:
            getattr(self.inner, name)(*args)

    def transition(self, lifecycle: str, event: str, outcome: str, count: int = 1) -> None:
        """Held (see the class docs), then :meth:`Metrics.transition`."""
        self._report("transition", lifecycle, event, outcome, count)

    def latency(self, operation: str, seconds: float) -> None:
        """Held, then :meth:`Metrics.latency`."""
        self._report("latency", operation, seconds)

    def sweep(self, kind: str, claimed: int, abandoned: int, seconds: float) -> None:
        """Held, then :meth:`Metrics.sweep`."""
        self._report("sweep", kind, claimed, abandoned, seconds)

    def reconnect(self, target: str) -> None:
        """Held, then :meth:`Metrics.reconnect`."""
        self._report("reconnect", target)

    def dormant(self, target: str, seconds: float) -> None:
        """Held, then :meth:`Metrics.dormant`."""
        self._report("dormant", target, seconds)

    def buffer(self, gateway_id: str, depth: int, replay_lag_s: float | None) -> None:
        """Held, then :meth:`Metrics.buffer`."""
        self._report("buffer", gateway_id, depth, replay_lag_s)

    def pruned(self, what: str, rows: int) -> None:
        """Held, then :meth:`Metrics.pruned`."""
        self._report("pruned", what, rows)


class TransitionMeter:
    """Reports one lifecycle's guarded writes to ``metrics`` and times its sends.

    ``TransitionMeter(metrics, lifecycle, monotonic, *, begins, settles, starts_max=10_000)``:
    every write is counted as a transition of ``lifecycle`` with its outcome.  A successful
    write of an event in ``begins`` (or :meth:`began`) starts a send of that entity, read on
    ``monotonic``; a successful write of an event in ``settles`` ends it and reports its
    ``"settle"`` latency; any other successful write of the entity forgets its start.  At
    most ``starts_max`` starts are kept (the oldest is dropped first, its settle then not
    timed), so sends that are never settled cannot grow the meter.  Safe to use from several
    threads.  A service builds one only when it has metrics to report, so the meter's cost is
    never paid without them.
    """

    __slots__ = (
        "_begins",
        "_lock",
        "_max",
        "_monotonic",
        "_settles",
        "_starts",
        "lifecycle",
        "metrics",
    )

    def __init__(
        self,
        metrics: Metrics,
        lifecycle: str,
        monotonic: Callable[[], float],
        *,
        begins: Collection[str],
        settles: Collection[str],
        starts_max: int = 10_000,
    ) -> None:
        self.metrics = metrics
        self.lifecycle = lifecycle
        self._monotonic = monotonic
        self._begins = frozenset(begins)
        self._settles = frozenset(settles)
        self._max = starts_max
        self._lock = threading.Lock()
        # Monotonic start of each send under way, by entity id, oldest first.
        self._starts: dict[str, float] = {}

    def count(self, event: str, outcome: str = Outcome.OK, rows: int = 1) -> None:
        """Report ``rows`` writes of ``event`` that ended with ``outcome``."""
        if rows:
            self.metrics.transition(self.lifecycle, event, outcome, rows)

    def write(
        self,
        event: str,
        call: Callable[[], _T],
        entity_id: str | None = None,
        *,
        counted: bool = False,
    ) -> _T:
        """Run ``call``, one write of ``event`` (of ``entity_id`` when given), and count it
        with its outcome: a refusal or failure is counted and re-raised, bad input
        (:func:`outcome_of` None) is not counted.  ``counted``: ``call`` counts its own
        success (it knows whether it wrote), only failures are counted here."""
        try:
            result = call()
        except Exception as exc:
            self._failed(event, exc, 1)
            raise
        if not counted:
            self.count(event)
        if entity_id is not None:
            self._sent(entity_id, event)
        return result

    def batch(
        self,
        events: Sequence[str],
        call: Callable[[], list[_T | Exception]],
        entity_ids: Sequence[str] | None = None,
        *,
        counted: bool = False,
    ) -> list[_T | Exception]:
        """Run ``call``, a batch of one write per event with one outcome each (a result or the
        exception its single write would have raised), and count every write as :meth:`write`
        counts a single one; a batch that raises counts each of its writes with that outcome
        and re-raises."""
        try:
            outcomes = call()
        except Exception as exc:
            for event in events:
                self._failed(event, exc, 1)
            raise
        for index, (event, result) in enumerate(zip(events, outcomes, strict=True)):
            if isinstance(result, Exception):
                self._failed(event, result, 1)
                continue
            if not counted:
                self.count(event)
            if entity_ids is not None:
                self._sent(entity_ids[index], event)
        return outcomes

    def began(self, entity_id: str) -> None:
        """A send of ``entity_id`` began now (restarting one already under way)."""
        now = self._monotonic()
        with self._lock:
            starts = self._starts
            starts.pop(entity_id, None)  # re-inserted last: the newest
            starts[entity_id] = now
            if len(starts) > self._max:
                del starts[next(iter(starts))]

    def forget(self, entity_id: str) -> None:
        """``entity_id``'s send ended untimed (handed back, abandoned)."""
        with self._lock:
            self._starts.pop(entity_id, None)

    def sends(self) -> int:
        """How many sends are under way (started and neither settled nor forgotten)."""
        with self._lock:
            return len(self._starts)

    def _failed(self, event: str, error: BaseException, rows: int) -> None:
        outcome = outcome_of(error)
        if outcome is not None:
            self.count(event, outcome, rows)

    def _sent(self, entity_id: str, event: str) -> None:
        if event in self._begins:
            self.began(entity_id)
            return
        with self._lock:
            started = self._starts.pop(entity_id, None)
        if started is not None and event in self._settles:
            self.metrics.latency("settle", self._monotonic() - started)

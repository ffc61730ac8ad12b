"""The Prometheus exporter: :class:`PrometheusMetrics`, a :class:`~statecore.metrics.Metrics`
on ``prometheus-client`` (install the extra: ``pip install 'statecore[prometheus]'``).

What the framework reports becomes counters and histograms; what is a property of stored rows
(rows per state, the age of the oldest owed reply) is read from the stores when the registry is
scraped (:meth:`PrometheusMetrics.track_ledger`), so a stalled queue shows even when nothing
reports anything.  With the default namespace ``statecore``:

==========================================================  ===================================
series                                                      what it counts
==========================================================  ===================================
``statecore_transitions_total{lifecycle,event,outcome}``    guarded writes, by outcome (ok,
                                                            refused, stale, unknown, error)
``statecore_latency_seconds{operation}``                    histogram: ``claim`` (one sweep
                                                            chunk), ``settle`` (send start to
                                                            delivered/failed)
``statecore_sweeps_total{kind}``                            sweeps run (startup, runtime,
                                                            stuck)
``statecore_sweep_seconds{kind}``                           histogram: how long each took
``statecore_swept_rows_total{kind,result}``                 rows the sweeps claimed / abandoned
``statecore_reconnects_total{target}``                      relay reconnections
``statecore_dormant_seconds``                               histogram: dormancy before a wake
``statecore_buffer_depth{gateway_id}``                      unacked buffered entries
``statecore_replay_lag_seconds{gateway_id}``                age of the oldest unacked entry
``statecore_pruned_rows_total{what}``                       rows housekeeping deleted
``statecore_held_depth{platform}``                          inbound events held for a gateway
                                                            that has not said hello
``statecore_intake_total{platform,outcome}``                inbound events skipped as copies
                                                            (``duplicate``) or recorded as
                                                            ``rejected`` by their driver
``statecore_rows{store,kind,state}``                        rows per state, read at scrape
``statecore_oldest_owed_age_seconds{store}``                age of the oldest owed obligation,
                                                            read at scrape (0: none owed)
``statecore_store_up{store}``                               1 when the last scrape read the
                                                            store, 0 when it failed
==========================================================  ===================================

This module imports ``prometheus_client``; nothing else in statecore imports this module, so
``import statecore`` never needs the extra.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Final

try:
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        REGISTRY,
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        generate_latest,
    )
    from prometheus_client.metrics_core import GaugeMetricFamily, Metric
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "statecore.prometheus needs prometheus-client: pip install 'statecore[prometheus]'"
    ) from exc

from statecore.async_ledger import AsyncLedger
from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind
from statecore.errors import StoreError
from statecore.ledger import Ledger
from statecore.lifecycles import OBLIGATION
from statecore.obligation import OBLIGATION_KIND
from statecore.store import Store

__all__ = ["CONTENT_TYPE", "LATENCY_BUCKETS", "PrometheusMetrics"]

log = logging.getLogger(__name__)

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
"""The ``Content-Type`` of :meth:`PrometheusMetrics.render`'s output."""

LATENCY_BUCKETS: Final = (
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.5,
    1.0,
    5.0,
    15.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    float("inf"),
)
"""Histogram buckets (seconds): a store write takes milliseconds, a send may take minutes."""

_OWED: Final = frozenset(OBLIGATION.states) - OBLIGATION.terminal


class PrometheusMetrics:
    """:class:`~statecore.metrics.Metrics` (and :class:`~statecore.metrics.IntakeMetrics`) as
    Prometheus counters, histograms and gauges.

    ``PrometheusMetrics(registry=None, *, namespace="statecore")`` registers its series in
    ``registry`` (default: prometheus-client's global ``REGISTRY``; a registry holds one
    instance per namespace: a second raises ``ValueError``).  Pass it as ``metrics=`` to
    ``Ledger``, ``AsyncLedger`` and the other services, call :meth:`track_ledger` for the
    gauges read from stores, then serve :meth:`render` (or the registry, with any of
    prometheus-client's exporters) on ``/metrics``.  Every reporting method is cheap, safe
    from any thread and never raises for values the framework reports.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, namespace: str = "statecore"
    ) -> None:
        self.registry = REGISTRY if registry is None else registry
        self.namespace = namespace
        into = self.registry

        def counter(name: str, doc: str, labels: Iterable[str]) -> Counter:
            return Counter(name, doc, labels, namespace=namespace, registry=into)

        self._transitions = counter(
            "transitions", "Guarded writes, by outcome.", ("lifecycle", "event", "outcome")
        )
        self._latency = Histogram(
            "latency_seconds",
            "Claim (one sweep chunk) and settle (send start to settle) latency.",
            ("operation",),
            namespace=namespace,
            registry=into,
            buckets=LATENCY_BUCKETS,
        )
        self._sweeps = counter("sweeps", "Ledger sweeps run.", ("kind",))
        self._sweep_seconds = Histogram(
            "sweep_seconds",
            "How long each ledger sweep took.",
            ("kind",),
            namespace=namespace,
            registry=into,
            buckets=LATENCY_BUCKETS,
        )
        self._swept = counter(
            "swept_rows", "Rows the ledger sweeps claimed or abandoned.", ("kind", "result")
        )
        self._reconnects = counter("reconnects", "Relay connections re-established.", ("target",))
        self._dormant = Histogram(
            "dormant_seconds",
            "How long relay connections stayed dormant before they woke.",
            namespace=namespace,
            registry=into,
            buckets=LATENCY_BUCKETS,
        )
        self._depth = Gauge(
            "buffer_depth",
            "Unacked entries in the connector's buffer.",
            ("gateway_id",),
            namespace=namespace,
            registry=into,
        )
        self._lag = Gauge(
            "replay_lag_seconds",
            "Age of the oldest unacked buffer entry (0: none waiting).",
            ("gateway_id",),
            namespace=namespace,
            registry=into,
        )
        self._pruned = counter("pruned_rows", "Settled rows deleted by housekeeping.", ("what",))
        self._held = Gauge(
            "held_depth",
            "Inbound events the connector holds because no gateway listened to them.",
            ("platform",),
            namespace=namespace,
            registry=into,
        )
        self._intake = counter(
            "intake",
            "Inbound events skipped as copies (duplicate) or rejected by their driver.",
            ("platform", "outcome"),
        )
        self._rows = _StoreCollector(namespace)
        self._tracking = False
        self._track_lock = threading.Lock()

    # -- the Metrics protocol ----------------------------------------------------------------

    def transition(self, lifecycle: str, event: str, outcome: str, count: int = 1) -> None:
        """Add ``count`` to ``transitions_total{lifecycle,event,outcome}``."""
        if count > 0:
            self._transitions.labels(lifecycle, event, outcome).inc(count)

    def latency(self, operation: str, seconds: float) -> None:
        """Observe ``seconds`` in ``latency_seconds{operation}``."""
        self._latency.labels(operation).observe(max(0.0, seconds))

    def sweep(self, kind: str, claimed: int, abandoned: int, seconds: float) -> None:
        """Count the sweep, its duration and the rows it claimed and abandoned."""
        self._sweeps.labels(kind).inc()
        self._sweep_seconds.labels(kind).observe(max(0.0, seconds))
        if claimed > 0:
            self._swept.labels(kind, "claimed").inc(claimed)
        if abandoned > 0:
            self._swept.labels(kind, "abandoned").inc(abandoned)

    def reconnect(self, target: str) -> None:
        """Count one reconnection to ``target``."""
        self._reconnects.labels(target).inc()

    def dormant(self, target: str, seconds: float) -> None:
        """Observe one dormancy of ``seconds`` (every target in one histogram)."""
        self._dormant.observe(max(0.0, seconds))

    def buffer(self, gateway_id: str, depth: int, replay_lag_s: float | None) -> None:
        """Set ``buffer_depth`` and ``replay_lag_seconds`` of ``gateway_id`` (lag 0: none
        waiting)."""
        self._depth.labels(gateway_id).set(depth)
        self._lag.labels(gateway_id).set(0.0 if replay_lag_s is None else max(0.0, replay_lag_s))

    def pruned(self, what: str, rows: int) -> None:
        """Add ``rows`` to ``pruned_rows_total{what}``."""
        if rows > 0:
            self._pruned.labels(what).inc(rows)

    # -- the IntakeMetrics additions -------------------------------------------------------

    def held(self, platform: str, depth: int) -> None:
        """Set ``held_depth{platform}``."""
        self._held.labels(platform).set(max(0, depth))

    def intake(self, platform: str, outcome: str, count: int = 1) -> None:
        """Add ``count`` to ``intake_total{platform,outcome}``."""
        if count > 0:
            self._intake.labels(platform, outcome).inc(count)

    # -- gauges read from the stores at scrape time ------------------------------------------

    def track_ledger(
        self,
        source: Ledger | AsyncLedger | Store,
        *,
        name: str = "ledger",
        clock: Clock | None = None,
        kinds: Iterable[EntityKind[Any]] = (),
    ) -> None:
        """Read ``source``'s store at every scrape: ``rows{store=name,kind,state}`` for the
        obligations and every kind in ``kinds`` (each must be registered with the store), and
        ``oldest_owed_age_seconds{store=name}``, the age of the oldest owed (pending,
        attempting, failed) obligation by ``clock`` (default: the ledger's, or the system
        clock for a bare store).

        Each scrape costs one count per state and one read of the oldest owed row.  A store
        that fails to answer reports ``store_up{store=name} 0`` and no rows (logged at
        WARNING); the scrape goes on.  Raises ``ValueError`` when ``name`` is already
        tracked; nothing else is done until a scrape.
        """
        if isinstance(source, AsyncLedger):
            store, when = source.store, clock or source.ledger.clock
        elif isinstance(source, Ledger):
            store, when = source.store, clock or source.clock
        else:
            store, when = source, clock or SystemClock()
        watched: tuple[EntityKind[Any], ...] = (OBLIGATION_KIND, *kinds)
        self._rows.add(name, store, when, watched)
        with self._track_lock:
            if not self._tracking:
                self.registry.register(self._rows)
                self._tracking = True

    # -- exposition ----------------------------------------------------------------------------

    def render(self) -> bytes:
        """The registry's samples in the Prometheus text format (:data:`CONTENT_TYPE`): the
        body of a ``/metrics`` response.  Reads the tracked stores (see
        :meth:`track_ledger`)."""
        return generate_latest(self.registry)


class _StoreCollector:
    """The gauges read from tracked stores when the registry is collected."""

    def __init__(self, namespace: str) -> None:
        self._prefix = f"{namespace}_"
        self._lock = threading.Lock()
        self._tracked: dict[str, tuple[Store, Clock, tuple[EntityKind[Any], ...]]] = {}

    def add(
        self, name: str, store: Store, clock: Clock, kinds: tuple[EntityKind[Any], ...]
    ) -> None:
        with self._lock:
            if name in self._tracked:
                raise ValueError(f"a store named {name!r} is already tracked")
            self._tracked[name] = (store, clock, kinds)

    def describe(self) -> Iterator[Metric]:
        """The families :meth:`collect` yields, without reading any store (the registry
        calls this when the collector is registered)."""
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        """Read every tracked store; a store that fails is reported down, the rest go on."""
        rows, oldest, up = self._families()
        with self._lock:
            tracked = list(self._tracked.items())
        for name, (store, clock, kinds) in tracked:
            try:
                counts = [
                    (kind.name, state.value, store.count(kind, states=(state,)))
                    for kind in kinds
                    for state in kind.lifecycle.states
                ]
                first = store.select(OBLIGATION_KIND, states=_OWED, order_by="created_at", limit=1)
                age = max(0.0, clock.now() - first[0]["created_at"]) if first else 0.0
            except StoreError as exc:
                log.warning("metrics: the store %r could not be read: %s", name, exc)
                up.add_metric([name], 0.0)
                continue
            up.add_metric([name], 1.0)
            for kind_name, state, count in counts:
                rows.add_metric([name, kind_name, str(state)], float(count))
            oldest.add_metric([name], age)
        return iter((rows, oldest, up))

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        p = self._prefix
        return (
            GaugeMetricFamily(
                f"{p}rows", "Stored rows per state.", labels=("store", "kind", "state")
            ),
            GaugeMetricFamily(
                f"{p}oldest_owed_age_seconds",
                "Age of the oldest owed obligation (0: none owed); rising means a stalled queue.",
                labels=("store",),
            ),
            GaugeMetricFamily(
                f"{p}store_up",
                "1 when the last scrape read the store, 0 when it failed.",
                labels=("store",),
            ),
        )

"""The Prometheus exporter: what the framework reports, rendered as prometheus-client renders it
for a scrape, and the gauges it reads from the stores at scrape time (rows per state, the
oldest owed obligation's age) -- asserted on the exposition text."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from statecore import AsyncLedger, FakeClock, LedgerPolicy
from statecore.prometheus import CONTENT_TYPE, PrometheusMetrics
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from tests.statecore.ledger_helpers import DEAD, LIVE, FakeProbe, _live_procs, make, record

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def registry() -> CollectorRegistry:
    """A registry of the test's own (never the global one)."""
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> PrometheusMetrics:
    """The exporter, registered in the test's registry."""
    return PrometheusMetrics(registry)


def scrape(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a scrape, parsed back from the exposition text: (name, labels, value)."""
    text = generate_latest(registry).decode()
    return [
        (found.name, dict(found.labels), found.value)
        for family in text_string_to_metric_families(text)
        for found in family.samples
    ]


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """The value of the one sample ``name{labels}`` in a scrape (fails when absent)."""
    found = [value for n, got, value in scrape(registry) if n == name and got == labels]
    assert len(found) == 1, f"{name}{labels} not in the scrape"
    return found[0]


def test_a_ledgers_writes_become_transition_and_latency_series(
    registry: CollectorRegistry, metrics: PrometheusMetrics
) -> None:
    """Records, marks and a refusal through a Ledger, scraped: transitions by
    lifecycle/event/outcome, and the settle latency histogram on the ledger's clock."""
    clock = FakeClock()
    ledger = make(InMemoryStore(), clock, FakeProbe(_live_procs()), metrics=metrics)
    for oid in ("ob-1", "ob-2"):
        record(ledger, oid)
        ledger.mark_attempting(oid)
    clock.advance(3.0)
    ledger.mark_delivered("ob-1")
    with pytest.raises(Exception, match="deliver"):
        ledger.mark_delivered("ob-1")

    def transitions(event: str, outcome: str) -> float:
        return sample(
            registry,
            "statecore_transitions_total",
            lifecycle="obligation",
            event=event,
            outcome=outcome,
        )

    assert transitions("record", "ok") == 2
    assert transitions("attempt", "ok") == 2
    assert transitions("deliver", "ok") == 1
    assert transitions("deliver", "refused") == 1
    assert sample(registry, "statecore_latency_seconds_count", operation="settle") == 1
    assert sample(registry, "statecore_latency_seconds_sum", operation="settle") == 3.0
    assert sample(registry, "statecore_latency_seconds_bucket", le="1.0", operation="settle") == 0
    assert sample(registry, "statecore_latency_seconds_bucket", le="5.0", operation="settle") == 1


def test_sweeps_become_sweep_and_swept_row_series(
    registry: CollectorRegistry, metrics: PrometheusMetrics
) -> None:
    """A startup sweep that claims two rows and abandons one (stale)."""
    clock = FakeClock()
    store = InMemoryStore()
    probe = FakeProbe(_live_procs())
    dead = make(store, clock, probe, DEAD)
    record(dead, "ob-old")
    clock.advance(LedgerPolicy().stale_after + 1)
    record(dead, "ob-1")
    record(dead, "ob-2")
    live = make(store, clock, probe, LIVE, metrics=metrics)
    assert len(live.sweep_recoverable()) == 2

    assert sample(registry, "statecore_sweeps_total", kind="startup") == 1
    assert sample(registry, "statecore_sweep_seconds_count", kind="startup") == 1
    assert sample(registry, "statecore_swept_rows_total", kind="startup", result="claimed") == 2
    assert sample(registry, "statecore_swept_rows_total", kind="startup", result="abandoned") == 1
    assert sample(registry, "statecore_latency_seconds_count", operation="claim") == 1
    assert (
        sample(
            registry,
            "statecore_transitions_total",
            lifecycle="obligation",
            event="abandon",
            outcome="ok",
        )
        == 1
    )


def test_the_relay_and_housekeeping_reports(
    registry: CollectorRegistry, metrics: PrometheusMetrics
) -> None:
    """Reconnects, dormancy, buffer depth and replay lag, pruned rows: each its own series."""
    metrics.reconnect("wss://connector")
    metrics.reconnect("wss://connector")
    metrics.dormant("wss://connector", 42.0)
    metrics.buffer("gw-1", 17, 2.5)
    metrics.buffer("gw-2", 0, None)
    metrics.pruned("buffer", 120)
    metrics.pruned("buffer", 0)
    assert sample(registry, "statecore_reconnects_total", target="wss://connector") == 2
    assert sample(registry, "statecore_dormant_seconds_sum") == 42.0
    assert sample(registry, "statecore_dormant_seconds_bucket", le="60.0") == 1
    assert sample(registry, "statecore_buffer_depth", gateway_id="gw-1") == 17
    assert sample(registry, "statecore_replay_lag_seconds", gateway_id="gw-1") == 2.5
    assert sample(registry, "statecore_replay_lag_seconds", gateway_id="gw-2") == 0
    assert sample(registry, "statecore_pruned_rows_total", what="buffer") == 120


def test_rows_per_state_and_the_oldest_owed_age_are_read_at_scrape_time(
    registry: CollectorRegistry, metrics: PrometheusMetrics, tmp_path: Path
) -> None:
    """Tracked, a ledger's SQLite store is read at every scrape: rows per state, and the age
    of the oldest owed obligation, which grows while the queue is stalled and drops to 0
    once nothing is owed."""
    clock = FakeClock()
    store = SQLiteStore(tmp_path / "bot.db")
    try:
        ledger = make(store, clock, FakeProbe(_live_procs()))
        metrics.track_ledger(ledger)
        record(ledger, "ob-1")
        clock.advance(100)
        record(ledger, "ob-2")
        ledger.mark_attempting("ob-2")
        ledger.mark_delivered("ob-2")

        def rows(state: str) -> float:
            return sample(
                registry, "statecore_rows", store="ledger", kind="obligation", state=state
            )

        assert (rows("pending"), rows("delivered"), rows("failed")) == (1, 1, 0)
        assert sample(registry, "statecore_oldest_owed_age_seconds", store="ledger") == 100
        clock.advance(50)  # stalled: nothing sent
        assert sample(registry, "statecore_oldest_owed_age_seconds", store="ledger") == 150
        ledger.mark_attempting("ob-1")
        ledger.mark_delivered("ob-1")
        assert sample(registry, "statecore_oldest_owed_age_seconds", store="ledger") == 0
        assert rows("delivered") == 2
        assert sample(registry, "statecore_store_up", store="ledger") == 1
    finally:
        store.close()


def test_a_store_that_cannot_be_read_is_reported_down_and_the_scrape_goes_on(
    registry: CollectorRegistry, metrics: PrometheusMetrics
) -> None:
    """Two tracked stores, one closed: it reports store_up 0 and no rows, the other its
    rows; the scrape itself succeeds."""
    broken, working = InMemoryStore(), InMemoryStore()
    clock = FakeClock()
    probe = FakeProbe(_live_procs())
    make(broken, clock, probe)
    record(make(working, clock, probe), "ob-1")
    metrics.track_ledger(broken, name="broken", clock=clock)
    metrics.track_ledger(working, name="working", clock=clock)
    broken.close()
    assert sample(registry, "statecore_store_up", store="broken") == 0
    assert sample(registry, "statecore_store_up", store="working") == 1
    assert not [
        n
        for n, labels, _ in scrape(registry)
        if labels.get("store") == "broken" and n.endswith("rows")
    ]
    assert (
        sample(registry, "statecore_rows", store="working", kind="obligation", state="pending") == 1
    )


def test_an_async_ledger_reports_and_is_tracked(
    registry: CollectorRegistry, metrics: PrometheusMetrics, tmp_path: Path
) -> None:
    """AsyncLedger passes the exporter to its ledger (reports land once committed) and can be
    tracked itself, by its clock."""
    clock = FakeClock()
    store = SQLiteStore(tmp_path / "bot.db")

    async def run() -> None:
        async with AsyncLedger(
            store, clock=clock, incarnation=LIVE, probe=FakeProbe(_live_procs()), metrics=metrics
        ) as ledger:
            metrics.track_ledger(ledger, name="async")
            await asyncio.gather(
                *(
                    ledger.record(session_key="s", platform="slack", chat_id="C1", content=f"{n}")
                    for n in range(5)
                )
            )

    try:
        asyncio.run(asyncio.wait_for(run(), 30.0))
        clock.advance(7)
        assert (
            sample(
                registry,
                "statecore_transitions_total",
                lifecycle="obligation",
                event="record",
                outcome="ok",
            )
            == 5
        )
        assert sample(registry, "statecore_oldest_owed_age_seconds", store="async") == 7
    finally:
        store.close()


def test_names_and_registries_are_checked(registry: CollectorRegistry) -> None:
    """A tracked name is taken once; a second exporter of one namespace in one registry is
    refused; another namespace is not."""
    metrics = PrometheusMetrics(registry)
    store = InMemoryStore()
    metrics.track_ledger(store, name="a")
    with pytest.raises(ValueError, match="already tracked"):
        metrics.track_ledger(store, name="a")
    with pytest.raises(ValueError, match="Duplicated"):
        PrometheusMetrics(registry)
    other = PrometheusMetrics(registry, namespace="bot")
    other.reconnect("x")
    assert sample(registry, "bot_reconnects_total", target="x") == 1


def test_render_is_the_scrape_body(registry: CollectorRegistry, metrics: PrometheusMetrics) -> None:
    """render() is what a /metrics endpoint serves, in the text format named by CONTENT_TYPE."""
    metrics.reconnect("x")
    body = metrics.render()
    assert body == generate_latest(registry)
    assert b'statecore_reconnects_total{target="x"} 1.0' in body
    assert CONTENT_TYPE.startswith("text/plain")


def test_importing_statecore_does_not_import_prometheus_client() -> None:
    """The exporter is an extra: ``import statecore`` (and the ledger) never load it."""
    code = (
        "import sys, statecore, statecore.ledger, statecore.async_ledger;"
        " print('prometheus_client' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False"]

"""The intake additions of the metrics hook (statecore.metrics.IntakeMetrics): optional for a
hook (the connector checks), implemented by NO_METRICS and by the Prometheus exporter."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from statecore.metrics import NO_METRICS, IntakeMetrics, IntakeOutcome
from statecore.prometheus import PrometheusMetrics
from tests.recording_metrics import RecordingMetrics


def test_no_metrics_takes_the_intake_reports_and_a_plain_hook_need_not() -> None:
    """NO_METRICS implements the additions (doing nothing); a hook written before them is
    still a Metrics without being an IntakeMetrics."""
    assert isinstance(NO_METRICS, IntakeMetrics)
    NO_METRICS.held("matrix", 3)
    NO_METRICS.intake("matrix", IntakeOutcome.DUPLICATE)
    assert not isinstance(RecordingMetrics(), IntakeMetrics)


def test_prometheus_renders_the_held_depth_and_the_intake_counts() -> None:
    """held sets statecore_held_depth{platform}; intake adds to
    statecore_intake_total{platform,outcome} (nothing for a count of 0)."""
    metrics = PrometheusMetrics(CollectorRegistry())
    assert isinstance(metrics, IntakeMetrics)
    metrics.held("matrix", 4)
    metrics.held("matrix", 2)
    metrics.intake("matrix", IntakeOutcome.DUPLICATE)
    metrics.intake("matrix", IntakeOutcome.DUPLICATE, 2)
    metrics.intake("slack", IntakeOutcome.REJECTED)
    metrics.intake("slack", IntakeOutcome.REJECTED, 0)
    body = metrics.render().decode()
    assert 'statecore_held_depth{platform="matrix"} 2.0' in body
    assert 'statecore_intake_total{outcome="duplicate",platform="matrix"} 3.0' in body
    assert 'statecore_intake_total{outcome="rejected",platform="slack"} 1.0' in body

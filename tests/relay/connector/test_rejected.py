"""Events a driver could not map (``intake.reject``) are recorded durably
(relay.connector.rejected): raw form cut to a bound, once per platform event id, visible to
operators through ``statecore buffer rejected`` (read-only), dismissed and then pruned; bad
input refused."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from relay.connector.rejected import (
    MAX_REJECTED_RAW_CHARS,
    REJECTED_KIND,
    RejectedEvents,
    RejectedState,
)
from statecore.clock import FakeClock
from stores.sqlite import SQLiteStore
from tests.cli_run import run, run_json, snapshot, url
from tests.recording_metrics import RecordingMetrics
from tests.relay.connector.connector_harness import Harness

CONNECTOR_LOGGER = "relay.connector.server"


class IntakeRecordingMetrics(RecordingMetrics):
    """Records the intake's reports too (it implements statecore.metrics.IntakeMetrics)."""

    def held(self, platform: str, depth: int) -> None:
        """Recorded."""
        self._record("held", platform, depth)

    def intake(self, platform: str, outcome: str, count: int = 1) -> None:
        """Recorded."""
        self._record("intake", platform, outcome, count)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "connector.db"


@pytest.mark.asyncio
async def test_rejected_events_are_recorded_once_and_shown_by_the_cli(
    db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two rejections, one redelivered (same event id: recorded once), one huge (cut, its
    length kept): counted, reported, logged at WARNING; ``buffer rejected`` lists them oldest
    first as JSON and text, and changes nothing in the store."""
    metrics = IntakeRecordingMetrics()
    h = Harness(SQLiteStore(db))
    try:
        connector = await h.start(metrics=metrics)
        intake = connector.driver_intake
        with caplog.at_level(logging.WARNING, logger=CONNECTOR_LOGGER):
            await intake.reject(
                "matrix", '{"type": "m.weird"}', "unknown event type", event_id="$ev1"
            )
            await intake.reject(
                "matrix", '{"type": "m.weird"}', "unknown event type", event_id="$ev1"
            )
            await intake.reject("matrix", "z" * (MAX_REJECTED_RAW_CHARS + 10), "no body")
        assert connector.rejections == 2
        assert metrics.of("intake") == [("matrix", "rejected", 1)] * 2
        assert any("recorded as rejected" in r.getMessage() for r in caplog.records)
    finally:
        await h.close()
        h.store.close()

    before = snapshot(db)
    data = run_json("buffer", "rejected", store=url(db))
    assert data["total"] == 2
    first, second = data["records"]
    assert (first["event_id"], first["reason"], first["raw"]) == (
        "$ev1",
        "unknown event type",
        '{"type": "m.weird"}',
    )
    assert first["state"] == "recorded"
    assert second["event_id"] is None
    assert len(second["raw"]) == MAX_REJECTED_RAW_CHARS
    assert second["raw_chars"] == MAX_REJECTED_RAW_CHARS + 10
    text = run("buffer", "rejected", store=url(db))
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[0].split() == [
        "ID",
        "STATE",
        "PLATFORM",
        "EVENT",
        "AGE",
        "REASON",
        "RAW",
    ]
    assert "unknown event type" in text.stdout
    assert snapshot(db) == before


@pytest.mark.asyncio
async def test_bad_rejections_are_refused_and_write_nothing(mh: Harness) -> None:
    """Arguments of the wrong kind, an empty reason or platform, an event id too long: typed
    errors, no record."""
    connector = await mh.start()
    intake = connector.driver_intake
    with pytest.raises(TypeError):
        await intake.reject("matrix", b"raw", "why")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await intake.reject("matrix", "raw", "why", event_id=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reason"):
        await intake.reject("matrix", "raw", "")
    with pytest.raises(ValueError, match="platform"):
        await intake.reject("", "raw", "why")
    with pytest.raises(ValueError, match="event_id"):
        await intake.reject("matrix", "raw", "why", event_id="e" * 600)
    assert mh.store.select(REJECTED_KIND) == []
    assert connector.rejections == 0


def test_dismissed_records_show_with_all_and_are_pruned_after_the_retention(db: Path) -> None:
    """A dismissed record leaves the default listing (``--all`` shows it) and is deleted once
    dismissed longer than the retention; one nobody dismissed never is."""
    store = SQLiteStore(db)
    clock = FakeClock(time.time() - 100)
    records = RejectedEvents(store, clock=clock)
    records.record("slack", "raw-1", "bad envelope", event_id="Ev1")
    records.record("slack", "raw-2", "bad envelope", event_id="Ev2")
    records.dismiss(next(r.record_id for r in records.records() if r.event_id == "Ev1"))
    store.close()
    assert [r["event_id"] for r in run_json("buffer", "rejected", store=url(db))["records"]] == [
        "Ev2"
    ]
    every = run_json("buffer", "rejected", "--all", "--platform", "slack", store=url(db))
    assert sorted(r["state"] for r in every["records"]) == ["dismissed", "recorded"]
    store = SQLiteStore(db)
    try:
        records = RejectedEvents(store, clock=clock)
        assert records.prune(older_than_s=50) == 0
        clock.advance(60)
        assert records.prune(older_than_s=50) == 1
        assert [(r.event_id, r.state) for r in records.records(include_dismissed=True)] == [
            ("Ev2", RejectedState.RECORDED)
        ]
    finally:
        store.close()

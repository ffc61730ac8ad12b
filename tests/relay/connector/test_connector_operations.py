"""Operating the connector: ``GET /healthz`` and ``GET /metrics`` on its own port (a real HTTP
client on loopback), the housekeeping timer that prunes settled rows on the connector's clock,
the buffer depth and replay lag it reports, the one INFO line per replay, and ``async with``."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from relay.connector.buffer import BUFFER_KIND, BufferState
from relay.connector.platform import LoopbackPlatform
from relay.connector.provenance import PROVENANCE_KIND
from relay.connector.server import Connector
from statecore.clock import FakeClock
from stores.memory import InMemoryStore
from tests.recording_metrics import RecordingMetrics
from tests.relay.connector.connector_harness import SECRETS, Harness, Recorder, make_event
from tests.waiting import BOUND, eventually

CONNECTOR_LOGGER = "relay.connector.server"

Answer = tuple[int, dict[str, str], bytes]


def http_get(connector: Connector, path: str) -> Answer:
    """GET ``path`` from the connector's port over plain HTTP: (status, headers, body)."""
    url = connector.url.replace("ws://", "http://", 1) + path
    try:
        with urllib.request.urlopen(url, timeout=BOUND) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), refused.read()


async def get(connector: Connector, path: str) -> Answer:
    """:func:`http_get` on a worker thread (the connector answers on this loop)."""
    return await asyncio.to_thread(http_get, connector, path)


@pytest.fixture
def store() -> Iterator[InMemoryStore]:
    """The connector's store."""
    opened = InMemoryStore()
    yield opened
    opened.close()


@pytest.mark.asyncio
async def test_healthz_reports_the_connected_gateways_and_the_backlog(mh: Harness) -> None:
    """/healthz answers 200 with JSON: status, how many gateways are connected, how many
    entries wait unacked in the buffer and for how long the oldest has waited."""
    clock = FakeClock(time.time())
    connector = await mh.start(clock=clock)
    status, headers, body = await get(connector, "/healthz")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {
        "status": "ok",
        "gateways": 0,
        "buffered": 0,
        "oldest_buffered_s": None,
    }
    await mh.gateway(connector, "gw-a", Recorder())
    for n in range(3):
        connector.buffer.append("gw-b", "loopback", make_event(n))  # gw-b is asleep
    clock.advance(30.0)
    status, _, body = await get(connector, "/healthz?verbose=1")
    assert status == 200
    assert json.loads(body) == {
        "status": "ok",
        "gateways": 1,
        "buffered": 3,
        "oldest_buffered_s": 30.0,
    }


@pytest.mark.asyncio
async def test_healthz_says_503_when_the_store_cannot_be_read(mh: Harness) -> None:
    """A store that fails makes /healthz answer 503 with the error, not hang or 200."""
    connector = await mh.start()

    def broken(gateway_id: str | None = None) -> tuple[int, float | None]:
        raise RuntimeError("disk on fire")

    connector.buffer.backlog_stats = broken  # type: ignore[method-assign]
    status, _, body = await get(connector, "/healthz")
    assert status == 503
    answer = json.loads(body)
    assert answer["status"] == "store_unavailable"
    assert "disk on fire" in answer["error"]


@pytest.mark.asyncio
async def test_metrics_serves_the_configured_text_404_without_and_500_when_it_fails(
    mh: Harness,
) -> None:
    """/metrics answers what http_metrics() returns as Prometheus text; a connector without
    one answers 404; one whose callable raises answers 500."""
    exposition = b"# TYPE statecore_up gauge\nstatecore_up 1\n"
    with_metrics = await mh.start(http_metrics=lambda: exposition)
    status, headers, body = await get(with_metrics, "/metrics")
    assert (status, body) == (200, exposition)
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")

    without = await mh.start()
    status, _, _ = await get(without, "/metrics")
    assert status == 404

    def failing() -> bytes:
        raise RuntimeError("registry broken")

    broken = await mh.start(http_metrics=failing)
    status, _, _ = await get(broken, "/metrics")
    assert status == 500


@pytest.mark.asyncio
async def test_other_plain_requests_keep_their_answers(mh: Harness) -> None:
    """A plain GET of the relay's path is still refused as a WebSocket endpoint (426), any other
    path still 404s, and gateways still connect on the same port."""
    connector = await mh.start()
    status, _, body = await get(connector, "/relay")
    assert status == 426
    assert b"WebSocket" in body
    status, _, body = await get(connector, "/elsewhere")
    assert (status, body) == (404, b"the relay lives at /relay\n")
    await mh.gateway(connector, "gw-a", Recorder())
    assert connector.connected("gw-a")


def test_http_metrics_must_be_callable_and_intervals_valid(store: InMemoryStore) -> None:
    """Bad options are refused when the connector is built."""
    drivers = {"loopback": LoopbackPlatform()}
    with pytest.raises(TypeError, match="http_metrics"):
        Connector(store, secrets=SECRETS, drivers=drivers, http_metrics=b"text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="buffer_retention_s"):
        Connector(store, secrets=SECRETS, drivers=drivers, buffer_retention_s=0)
    with pytest.raises(ValueError, match="prune_interval_s"):
        Connector(store, secrets=SECRETS, drivers=drivers, prune_interval_s=-1)


@pytest.mark.asyncio
async def test_the_timer_prunes_settled_entries_and_forgotten_targets_never_owed_ones(
    mh: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Every prune_interval_s on the connector's clock one round runs: acked entries and
    forgotten targets settled longer ago than buffer_retention_s go; unacked entries and known
    targets stay.  Each count goes to metrics.pruned; each round logs one INFO line."""
    clock = FakeClock(time.time())
    metrics = RecordingMetrics()
    connector = await mh.start(
        clock=clock,
        metrics=metrics,
        buffer_retention_s=100.0,
        prune_interval_s=60.0,
        retention_s=10_000.0,
    )
    buffer = connector.buffer
    acked = [buffer.append("gw-a", "loopback", make_event(n)) for n in range(2)]
    assert buffer.ack("gw-a", acked) == 2
    waiting = buffer.append("gw-b", "loopback", make_event(9))
    connector.provenance.learn("gw-a", "loopback", ["c1", "c2"])
    connector.provenance.forget("gw-a", "loopback", "c1")

    with caplog.at_level(logging.INFO, logger=CONNECTOR_LOGGER):
        for round_ in (1, 2):
            await eventually(lambda: clock.next_deadline is not None, "the timer to sleep")
            clock.advance(60.0)
            await eventually(lambda n=round_: len(metrics.of("pruned")) == 6 * n, "a round")
    tables = ("buffer", "provenance", "seen", "held", "rejected", "notes")
    assert metrics.of("pruned") == [
        *((table, 0) for table in tables),
        ("buffer", 2),
        ("provenance", 1),
        *((table, 0) for table in tables[2:]),
    ]
    assert [r.id for r in mh.store.select(BUFFER_KIND)] == [waiting]
    assert mh.store.select(BUFFER_KIND)[0].state is BufferState.BUFFERED
    assert [r["target"] for r in mh.store.select(PROVENANCE_KIND)] == ["c2"]
    assert connector.provenance.allows("gw-a", "loopback", "c2")
    rounds = [r for r in caplog.records if "housekeeping" in r.getMessage()]
    nothing = dict.fromkeys(tables, 0)
    assert [r.__dict__["pruned"] for r in rounds] == [
        nothing,
        {**nothing, "buffer": 2, "provenance": 1},
    ]
    assert all(r.levelno == logging.INFO for r in rounds)
    assert await connector.housekeep() == nothing


@pytest.mark.asyncio
async def test_a_replay_reports_its_depth_and_lag_and_logs_one_line(
    mh: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """A gateway that connects to a backlog of 3 entries waiting 5 s: the replay reports
    buffer(gw-a, 3, 5.0) as it starts, logs one INFO line with its count once done, and the
    acks bring the reported depth to 0."""
    clock = FakeClock(time.time())
    metrics = RecordingMetrics()
    connector = await mh.start(clock=clock, metrics=metrics)
    for n in range(3):
        connector.buffer.append("gw-a", "loopback", make_event(n))
    clock.advance(5.0)
    recorder = Recorder()
    with caplog.at_level(logging.INFO, logger=CONNECTOR_LOGGER):
        await mh.gateway(connector, "gw-a", recorder)
        await eventually(lambda: connector.buffered("gw-a") == 0, "the backlog acked")
        await eventually(lambda: ("gw-a", 0, None) in metrics.of("buffer"), "depth 0 reported")
    assert recorder.texts == ["e0", "e1", "e2"]
    assert metrics.of("buffer")[0] == ("gw-a", 3, 5.0)
    [line] = [r for r in caplog.records if "replayed" in r.getMessage()]
    assert line.levelno == logging.INFO
    assert (line.__dict__["gateway_id"], line.__dict__["replayed"]) == ("gw-a", 3)
    assert isinstance(line.__dict__["duration_s"], float)


@pytest.mark.asyncio
async def test_async_with_starts_and_stops_the_connector(store: InMemoryStore) -> None:
    """``async with Connector(...)`` listens inside the block and stops at its end."""
    connector = Connector(store, secrets=SECRETS, drivers={"loopback": LoopbackPlatform()})
    async with connector as running:
        assert running is connector
        status, _, _ = await get(connector, "/healthz")
        assert status == 200
    with pytest.raises(urllib.error.URLError):  # nothing listens any more
        http_get(connector, "/healthz")


@pytest.mark.asyncio
async def test_async_with_stops_a_connector_whose_start_failed(store: InMemoryStore) -> None:
    """A start that fails part-way (after it began listening) is undone: the error propagates
    and the port is closed again."""
    connector = Connector(store, secrets=SECRETS, drivers={"loopback": LoopbackPlatform()})
    real_start = connector.start

    async def failing_start(host: str = "127.0.0.1", port: int = 0) -> None:
        await real_start(host, port)
        raise RuntimeError("a late failure")

    connector.start = failing_start  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="late failure"):
        async with connector:
            pytest.fail("the block must not run")
    assert connector.url
    with pytest.raises(urllib.error.URLError):
        http_get(connector, "/healthz")

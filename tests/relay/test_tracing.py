"""OpenTelemetry traces across processes (statecore.tracing): one trace per user message.

The connector runs in the test process with its own ``TracerProvider`` (service
``connector``, an ``InMemorySpanExporter``); the gateway in a subprocess
(``tests/relay/tracing_child.py``, service ``gateway``) exporting every span to a file.  The
merged spans must form one trace from the platform event to the settle, parent by parent; the
obligation's creation audit entry keeps its traceparent, and a redelivery by another owner joins
that trace.  The trace context goes only to peers that announced it (original-contract peers
never see the field), a malformed one is ignored, and with tracing off nothing changes.

Every wait is bounded; the child is killed and reaped in a ``finally``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from relay import Connector, LoopbackPlatform, RelayAdapter, WebSocketRelayTransport
from relay.client.delivery import Deliveries
from relay.wire.codec import FrameDecoder, encode
from relay.wire.compat import OUR_FEATURES, TRACE_CONTEXT
from relay.wire.frames import EventSource, Inbound, InboundEvent, Outbound
from relay.wire.throttle import LogLimits
from statecore import tracing
from statecore.async_ledger import AsyncLedger
from statecore.gateway import Gateway, SendResult
from statecore.ledger import Ledger
from statecore.ownership import Incarnation
from stores import SQLiteStore
from tests import waiting
from tests.relay.conformance.original_peers import (
    BOT_ID,
    GATEWAY_ID,
    PLATFORM,
    SECRET,
    OriginalConnector,
    OriginalGateway,
)
from tests.relay.connector.connector_harness import is_live
from tests.relay.tracing_child import span_record

REPO = Path(__file__).resolve().parents[2]
BOUND = 20.0
"""Real seconds any single wait may take before the test fails."""
GOOD = "00-" + "a1" * 16 + "-" + "b2" * 8 + "-01"

Spans = list[dict[str, Any]]


def provider_for(service: str) -> tuple[TracerProvider, InMemorySpanExporter]:
    """A tracer provider of its own (resource ``service.name``) exporting to memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture
def traced() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process (service ``connector``); off again afterwards."""
    provider, exporter = provider_for("connector")
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


@pytest_asyncio.fixture
async def loopback(tmp_path: Path) -> AsyncIterator[tuple[Connector, LoopbackPlatform]]:
    """A connector on SQLite fronting the loopback chat (built after tracing was chosen)."""
    platform = LoopbackPlatform(PLATFORM)
    store = SQLiteStore(tmp_path / "connector.db")
    connector = Connector(store, secrets={GATEWAY_ID: [SECRET]}, drivers={PLATFORM: platform})
    await connector.start(port=0)
    try:
        yield connector, platform
    finally:
        await asyncio.wait_for(connector.stop(), BOUND)
        store.close()


def records(exporter: InMemorySpanExporter) -> Spans:
    """The exporter's finished spans as the child writes them."""
    return [span_record(s) for s in exporter.get_finished_spans()]


def read_spans(path: Path) -> Spans:
    """The spans a child wrote so far (complete lines only)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def only(spans: Spans, name: str) -> dict[str, Any]:
    """The one span called ``name``."""
    found = [s for s in spans if s["name"] == name]
    assert len(found) == 1, (name, [s["name"] for s in spans])
    return found[0]


def spawn_gateway(url: str, tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    """Start the traced gateway child; the caller kills and reaps it."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.relay.tracing_child",
            "--url",
            url,
            "--secret",
            SECRET,
            "--gateway-id",
            GATEWAY_ID,
            "--platform",
            PLATFORM,
            "--db",
            str(tmp_path / "gateway.db"),
            "--spans",
            str(tmp_path / "spans.jsonl"),
            *extra,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def ready(child: subprocess.Popen[str]) -> None:
    """Wait (bounded) for the child's READY line."""
    assert child.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), BOUND)
    assert line.startswith("READY"), line + (child.stderr.read() if child.stderr else "")


def reap(child: subprocess.Popen[str]) -> None:
    """Kill the child and wait for it."""
    if child.poll() is None:
        child.kill()
    child.wait(timeout=BOUND)
    for stream in (child.stdout, child.stderr):
        if stream is not None:
            stream.close()


@pytest.mark.asyncio
async def test_one_trace_spans_the_connector_and_gateway_processes(
    traced: InMemorySpanExporter, loopback: tuple[Connector, LoopbackPlatform], tmp_path: Path
) -> None:
    """A user message gives one trace across the two processes: the connector's inbound span,
    the gateway's transport inbound, handler, record, deliver, the outbound request, the
    connector's send and the settle, each the child of the one before it in that order; the
    obligation's audit keeps the trace, and no span carries the message's text."""
    connector, platform = loopback
    child = spawn_gateway(connector.url, tmp_path)
    spans_file = tmp_path / "spans.jsonl"
    try:
        await ready(child)
        await waiting.eventually(lambda: is_live(connector, GATEWAY_ID), "live", timeout=BOUND)
        await platform.inject("chat-1", "secret words")
        await waiting.eventually(
            lambda: any(a.content == "echo: secret words" for a in platform.sent),
            "the echo",
            timeout=BOUND,
        )
        await waiting.eventually(
            lambda: any(s["name"] == "obligation settle" for s in read_spans(spans_file)),
            "the settle span",
            timeout=BOUND,
        )
    finally:
        reap(child)
    ours, theirs = records(traced), read_spans(spans_file)
    inbound = only(ours, "connector inbound")
    trace_id = inbound["trace_id"]
    trace = [s for s in ours + theirs if s["trace_id"] == trace_id]
    by_name = {name: only(trace, name) for name in {s["name"] for s in trace}}
    chain = [
        ("connector inbound", None, "connector"),
        ("transport inbound", "connector inbound", "gateway"),
        ("gateway handle", "transport inbound", "gateway"),
        ("obligation record", "gateway handle", "gateway"),
        ("obligation deliver", "gateway handle", "gateway"),
        ("transport outbound", "obligation deliver", "gateway"),
        ("connector send", "transport outbound", "connector"),
        ("obligation settle", "obligation deliver", "gateway"),
    ]
    for name, parent, service in chain:
        span = by_name[name]
        assert span["service"] == service, name
        assert span["parent_id"] == (None if parent is None else by_name[parent]["span_id"]), name
    # Within the gateway's process: the record ends before the send begins.  Across the two
    # processes only starts are ordered (the connector's span ends after it answered).
    assert by_name["obligation record"]["end"] <= by_name["obligation deliver"]["start"]
    assert by_name["transport outbound"]["start"] <= by_name["connector send"]["start"]
    assert by_name["connector send"]["start"] <= by_name["obligation settle"]["start"]
    record = by_name["obligation record"]["attributes"]
    assert record["statecore.chat_id"] == "chat-1"
    assert by_name["connector send"]["attributes"]["relay.op"] == "send"
    assert all("secret words" not in str(s["attributes"]) for s in trace)
    # The obligation keeps the record span's context durably, in its creation audit entry.
    store = SQLiteStore(tmp_path / "gateway.db")
    try:
        first = Ledger(store).history(str(record["statecore.obligation_id"]))[0]
    finally:
        store.close()
    kept = tracing.traceparent_of_reason(first.reason)
    assert kept is not None
    assert kept.split("-")[1:3] == [trace_id, by_name["obligation record"]["span_id"]]


class Adapter:
    """A plain adapter that records what it was asked to send."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send(
        self, chat_id: str, content: str, metadata: Any = None
    ) -> SendResult:  # the PlatformAdapter method
        self.sent.append(content)
        return SendResult.ok(f"m{len(self.sent)}")


@pytest.mark.asyncio
async def test_a_redelivery_by_another_owner_joins_the_trace_that_recorded_it(
    tmp_path: Path,
) -> None:
    """A reply recorded under one incarnation (its own tracer provider), whose owner then died,
    is redelivered by another gateway (another provider): its ``obligation redeliver`` span is
    a child of the recording span -- the same trace id -- and the send and settle follow."""
    store = SQLiteStore(tmp_path / "ledger.db")
    me = Incarnation.current()
    assert me.started_at is not None
    dead = Incarnation(me.host, me.pid, me.started_at - 1000, "dead-owner-token")
    first, first_spans = provider_for("gateway-1")
    second, second_spans = provider_for("gateway-2")
    adapter = Adapter()
    try:
        tracing.enable(first)
        ledger = AsyncLedger(store, incarnation=dead)
        with tracing.span("obligation record") as recording:
            assert recording is not None
            await ledger.record(
                session_key="s",
                platform="loopback",
                chat_id="c1",
                content="hi",
                message_ref="m",
                trace=tracing.current_traceparent(),
            )
        await ledger.aclose()
        tracing.disable()
        tracing.enable(second)
        gateway = Gateway(store, recover_interval_s=0.0)
        gateway.add_adapter("loopback", adapter)
        await gateway.start()
        await waiting.eventually(lambda: len(adapter.sent) == 1, "the redelivery", timeout=BOUND)
        await gateway.stop()
    finally:
        tracing.disable()
        store.close()
    recorded = only(records(first_spans), "obligation record")
    later = records(second_spans)
    redeliver = only(later, "obligation redeliver")
    assert (redeliver["trace_id"], redeliver["parent_id"]) == (
        recorded["trace_id"],
        recorded["span_id"],
    )
    assert redeliver["service"] == "gateway-2"
    assert redeliver["attributes"]["statecore.fence"] >= 1
    deliver = only(later, "obligation deliver")
    assert deliver["parent_id"] == redeliver["span_id"]
    assert only(later, "obligation settle")["parent_id"] == deliver["span_id"]


@pytest.mark.asyncio
async def test_no_traceparent_goes_to_an_original_connector(traced: InMemorySpanExporter) -> None:
    """A traced gateway facing an original-contract connector (no features announced) sends
    its outbound frames without the field, though it makes its spans."""
    peer = OriginalConnector(secrets={GATEWAY_ID: [SECRET]})
    await peer.start()
    transport = WebSocketRelayTransport(
        peer.url, PLATFORM, BOT_ID, gateway_id=GATEWAY_ID, secret=SECRET
    )
    try:
        adapter = RelayAdapter(transport)
        assert await asyncio.wait_for(adapter.connect(), BOUND)
        with tracing.span("gateway handle"):
            assert (await adapter.send("c1", "hello")).success
    finally:
        await asyncio.wait_for(transport.disconnect(budget_s=1.0), BOUND)
        await peer.stop()
    outbound = [f for f in peer.received if f.get("type") == "outbound"]
    assert outbound
    assert all("traceparent" not in f for f in outbound)
    assert all("traceparent" not in m for m in peer.raw_messages)
    assert "transport outbound" in {s["name"] for s in records(traced)}


@pytest.mark.asyncio
async def test_no_traceparent_goes_to_an_original_gateway(
    traced: InMemorySpanExporter, loopback: tuple[Connector, LoopbackPlatform]
) -> None:
    """A traced connector announces the feature, but delivers to an original-contract gateway
    (no features) without the field."""
    connector, platform = loopback
    assert TRACE_CONTEXT in connector.descriptors[PLATFORM].features
    gateway = OriginalGateway(connector.url)
    await gateway.start()
    try:
        await gateway.wait_connected(BOUND)
        await waiting.eventually(lambda: is_live(connector, GATEWAY_ID), "live", timeout=BOUND)
        await platform.inject("c1", "hello")
        await gateway.wait_until(lambda: bool(gateway.received_events), BOUND)
    finally:
        await gateway.stop()
    inbound = [m for m in gateway.raw_messages if '"inbound"' in m]
    assert inbound
    assert all("traceparent" not in m for m in inbound)
    assert "connector inbound" in {s["name"] for s in records(traced)}


def test_a_malformed_or_mistyped_traceparent_is_never_refused() -> None:
    """Frames read a traceparent of another type as absent and keep a string as sent; neither
    is a protocol error."""
    event = {"text": "x", "source": {"platform": "p", "chat_id": "c"}}
    for value, kept in ((123, None), ("garbage", "garbage"), (GOOD, GOOD)):
        line = json.dumps({"type": "inbound", "event": event, "traceparent": value}) + "\n"
        (frame,) = FrameDecoder().feed(line)
        assert isinstance(frame, Inbound)
        assert frame.traceparent == kept
        out = {"type": "outbound", "requestId": "r", "action": {"op": "send"}, "traceparent": value}
        (request,) = FrameDecoder().feed(json.dumps(out) + "\n")
        assert isinstance(request, Outbound)
        assert request.traceparent == kept
    for bad in ("garbage", "00-" + "0" * 32 + "-" + "b2" * 8 + "-01", GOOD.upper(), GOOD + "x"):
        assert not tracing.is_traceparent(bad)
    assert tracing.is_traceparent(GOOD)


@pytest.mark.asyncio
async def test_a_malformed_traceparent_is_ignored_and_logged_at_debug(
    traced: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    """A delivery whose traceparent is malformed is handled as any other, in a trace of its
    own (its span has no parent), with one DEBUG line saying it was ignored."""
    handled: list[str] = []

    async def handler(event: InboundEvent) -> None:
        handled.append(event.text)

    deliveries = Deliveries("test", None, LogLimits())
    deliveries.handler = handler
    event = InboundEvent("hi", source=EventSource("p", "c", "dm"))
    with caplog.at_level(logging.DEBUG, logger="statecore.tracing"):
        assert await deliveries.handle(Inbound(event, "b1", "00-not-a-trace")) == "b1"
        assert await deliveries.handle(Inbound(event, "b2", GOOD)) == "b2"
    assert handled == ["hi", "hi"]
    assert [r.levelno for r in caplog.records if "malformed traceparent" in r.message] == [
        logging.DEBUG
    ]
    spans = [s for s in records(traced) if s["name"] == "transport inbound"]
    assert [s["parent_id"] for s in spans] == [None, "b2" * 8]
    assert spans[1]["trace_id"] == "a1" * 16


@pytest.mark.asyncio
async def test_tracing_off_makes_no_spans_and_changes_no_frame(
    loopback: tuple[Connector, LoopbackPlatform],
) -> None:
    """With tracing off (a provider exists but was never enabled) a round trip makes no span,
    nobody announces the feature and no frame carries the field."""
    provider, exporter = provider_for("unused")
    assert not tracing.enabled
    connector, platform = loopback
    assert list(connector.descriptors[PLATFORM].features) == list(OUR_FEATURES)
    transport = WebSocketRelayTransport(
        connector.url, PLATFORM, BOT_ID, gateway_id=GATEWAY_ID, secret=SECRET
    )
    try:
        adapter = RelayAdapter(transport)
        seen: list[Inbound] = []

        async def handler(event: InboundEvent) -> None:
            seen.append(Inbound(event))

        adapter.on_message(handler)
        assert await asyncio.wait_for(adapter.connect(), BOUND)
        assert TRACE_CONTEXT not in transport._dialer._features
        await waiting.eventually(lambda: is_live(connector, GATEWAY_ID), "live", timeout=BOUND)
        await platform.inject("c1", "hello")
        await waiting.eventually(lambda: bool(seen), "the delivery", timeout=BOUND)
        assert (await adapter.send("c1", "answer")).success
    finally:
        await asyncio.wait_for(transport.disconnect(budget_s=1.0), BOUND)
        provider.shutdown()
    assert exporter.get_finished_spans() == ()
    assert "traceparent" not in encode(seen[0])
    assert tracing.current_traceparent() is None


def test_without_the_api_tracing_stays_off_and_enable_says_what_to_install() -> None:
    """Where opentelemetry is not installed, statecore imports, tracing stays off, and
    ``enable`` raises ModuleNotFoundError naming the extra."""
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from statecore import tracing\n"
        "assert not tracing.api_installed() and not tracing.refresh() and not tracing.enabled\n"
        "with tracing.span('x') as s: assert s is None\n"
        "try:\n    tracing.enable()\nexcept ModuleNotFoundError as e:\n    print(e)\n"
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    assert "statecore[otel]" in result.stdout
    assert time.monotonic() - started < 60

"""One traced gateway process of tests/relay/test_tracing.py (run as a module, never collected).

``python -m tests.relay.tracing_child --url URL --secret S --db PATH --spans PATH
[--gateway-id ID] [--service NAME] [--platform P] [--no-trace]`` runs a ``Gateway`` whose
ledger is the SQLite file ``PATH``, connected to the connector at ``URL`` on platform ``P``
(default ``loopback``), answering
every message with the ledgered reply ``echo: <text>``.  Unless ``--no-trace``, tracing is on
(:func:`statecore.tracing.enable`) with its own ``TracerProvider`` (resource ``service.name`` =
``--service``) whose every ended span is appended at once, as one JSON line, to ``--spans``.

It prints ``READY pid=<pid>`` once the gateway started and serves until it is killed; it exits
on its own (status 3) when its parent goes away or after ``--max-life`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from relay import RelayAdapter, StoreBufferDedupe, WebSocketRelayTransport
from statecore import tracing
from statecore.gateway import Gateway, Turn
from stores import SQLiteStore

PLATFORM = "loopback"


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """One ended span as the JSON object the test merges (ids in hex)."""
    context = span.get_span_context()
    assert context is not None
    parent = span.parent
    return {
        "name": span.name,
        "service": span.resource.attributes.get("service.name"),
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": None if parent is None else f"{parent.span_id:016x}",
        "kind": span.kind.name,
        "start": span.start_time,
        "end": span.end_time,
        "attributes": dict(span.attributes or {}),
    }


class JsonLinesExporter(SpanExporter):
    """Appends every exported span to a file, one JSON object a line, flushed at once (the
    process is SIGKILLed: nothing may wait in a buffer)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            self.out.write(json.dumps(span_record(span)) + "\n")
        self.out.flush()
        return SpanExportResult.SUCCESS


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (see the module docs)."""
    parser = argparse.ArgumentParser(description="a traced echo gateway, serving until killed")
    parser.add_argument("--url", required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--spans", required=True)
    parser.add_argument("--gateway-id", default="gw-a")
    parser.add_argument("--service", default="gateway")
    parser.add_argument("--platform", default=PLATFORM)
    parser.add_argument("--no-trace", action="store_true")
    parser.add_argument("--max-life", type=float, default=60.0)
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    """Turn tracing on, build the gateway, start it, say READY and serve until killed."""
    parent = os.getppid()
    out = open(args.spans, "a", encoding="utf-8")  # noqa: SIM115 -- kept open until killed
    if not args.no_trace:
        provider = TracerProvider(resource=Resource.create({"service.name": args.service}))
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(out)))
        tracing.enable(provider)
    store = SQLiteStore(args.db)
    transport = WebSocketRelayTransport(
        args.url,
        args.platform,
        "bot",
        gateway_id=args.gateway_id,
        secret=args.secret,
        dedupe=StoreBufferDedupe(store),
        reconnect_backoff_s=0.05,
        reconnect_max_s=0.5,
    )
    gateway = Gateway(store, recover_interval_s=0.0)
    gateway.add_adapter(args.platform, RelayAdapter(transport))

    async def echo(turn: Turn) -> None:
        await turn.reply(f"echo: {turn.message.text}")

    gateway.on_message(echo)
    await gateway.start()
    print(f"READY pid={os.getpid()}", flush=True)
    deadline = time.monotonic() + args.max_life
    while time.monotonic() < deadline and os.getppid() == parent:
        await asyncio.sleep(0.1)
    return 3


def main() -> int:
    """Run the gateway; its normal end is SIGKILL."""
    return asyncio.run(serve(parse_args(sys.argv[1:])))


if __name__ == "__main__":
    sys.exit(main())

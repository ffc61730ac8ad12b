"""The connector process of tests/relay/slack/test_crash.py (run as a module, never collected).

``python -m tests.relay.slack.connector_child --api-url URL --bot-token T --app-token A
--db DB --secret SECRET --port PORT`` (from the repository root) runs the reference connector
on the SQLite file ``DB`` with the Slack driver in Socket Mode against ``URL`` (the fake Slack
of the test process), listening on ``127.0.0.1:PORT`` (a fixed port: the gateway redials the
same URL after a restart) for the gateway ``gw`` with ``SECRET``.

It prints ``READY pid=<pid> url=<url>`` once ``Connector.start()`` returned, and ``T <message
id>`` each time the connector's intake returned for an event (the driver's ack follows it).
Every line is flushed at once.  It exits on its own (status 3) if its parent goes away or after
``--max-life`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time

from relay.connector.intake import DriverIntake
from relay.connector.platform import Intake
from relay.connector.server import Connector
from relay.slack import SlackDriver
from relay.wire.frames import InboundEvent
from stores import SQLiteStore

GATEWAY_ID = "gw"
PLATFORM = "slack"


class TracedIntake:
    """The connector's intake, passed through, printing a line after each call returned."""

    def __init__(self, inner: DriverIntake) -> None:
        self.inner = inner

    async def __call__(self, platform: str, event: InboundEvent) -> None:
        """Take the event; ``T <message id>`` once the connector has it."""
        await self.inner(platform, event)
        print(f"T {event.message_id}", flush=True)

    async def reject(
        self, platform: str, raw: str, reason: str, *, event_id: str | None = None
    ) -> None:
        """Record a rejected event; ``R <event id>`` once recorded."""
        await self.inner.reject(platform, raw, reason, event_id=event_id)
        print(f"R {event_id}", flush=True)

    async def load(self, platform: str, name: str) -> str | None:
        """A note of the driver, as stored."""
        return await self.inner.load(platform, name)

    async def save(self, platform: str, name: str, value: str) -> None:
        """Save a note of the driver."""
        await self.inner.save(platform, name, value)


class TracedDriver(SlackDriver):
    """The Slack driver, attached to the connector's intake through :class:`TracedIntake`."""

    def attach(self, intake: Intake) -> None:
        """Attach to the connector's intake, traced."""
        if not isinstance(intake, DriverIntake):
            raise TypeError("the traced driver needs a connector's DriverIntake")
        super().attach(TracedIntake(intake))


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (see the module docs)."""
    parser = argparse.ArgumentParser(description="a Slack connector that serves until killed")
    parser.add_argument("--api-url", required=True, help="the Web API's base URL")
    parser.add_argument("--bot-token", required=True, help="the bot token")
    parser.add_argument("--app-token", required=True, help="the app-level token")
    parser.add_argument("--db", required=True, help="the connector's SQLite file")
    parser.add_argument("--secret", required=True, help="the gateway's shared secret")
    parser.add_argument("--port", type=int, required=True, help="the port to listen on")
    parser.add_argument("--connections", type=int, default=2, help="Socket Mode connections")
    parser.add_argument("--max-life", type=float, default=900.0, help="exit after this (s)")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    """Build the connector, start it, announce READY and serve until killed (or orphaned)."""
    parent = os.getppid()
    store = SQLiteStore(args.db)
    driver = TracedDriver(
        args.bot_token,
        app_token=args.app_token,
        api_url=args.api_url,
        connections=args.connections,
    )
    connector = Connector(store, secrets={GATEWAY_ID: [args.secret]}, drivers={PLATFORM: driver})
    await connector.start(port=args.port)
    print(f"READY pid={os.getpid()} url={connector.url}", flush=True)
    deadline = time.monotonic() + args.max_life
    while time.monotonic() < deadline:
        if os.getppid() != parent:
            print(f"orphaned: pid {os.getpid()} exits", file=sys.stderr, flush=True)
            return 3
        await asyncio.sleep(0.2)
    print(f"max life reached: pid {os.getpid()} exits", file=sys.stderr, flush=True)
    return 3


def main(argv: list[str] | None = None) -> int:
    """Run the connector; the normal end of this process is SIGKILL."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return asyncio.run(serve(parse_args(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())

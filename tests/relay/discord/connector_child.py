"""The connector process of tests/relay/discord/test_crash.py (run as a module, never collected).

``python -m tests.relay.discord.connector_child --api-base URL --token TOKEN --db DB
--secret SECRET --port PORT`` (from the repository root) runs the reference connector on the
SQLite file ``DB`` with the Discord driver (REST base ``URL``: the test's fake Discord),
listening on ``127.0.0.1:PORT`` (a fixed port: the gateway redials the same URL after a
restart) for the gateway ``gw`` with ``SECRET``.

It prints ``READY pid=<pid> url=<url>`` once ``Connector.start()`` returned and the gateway
session is live, and, as it goes, one line for what the driver did with the connector's
intake: ``T <message id>`` when the intake returned for an event (the event is the
connector's), ``s`` when the driver begins to save its seq and ``S`` once it is saved.  Every
line is flushed at once, so that the parent can tell, after a SIGKILL, whether the process died
with a dispatch half taken (taken, the save of its seq not begun).  It exits on its own
(status 3) if its parent goes away or after ``--max-life`` seconds.
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
from relay.discord import DiscordDriver
from relay.discord._gateway import NOTE_SESSION
from relay.wire.frames import InboundEvent
from stores import SQLiteStore

GATEWAY_ID = "gw"
PLATFORM = "discord"


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
        """Save a note; for the seq ``s`` before and ``S`` once it is on disk."""
        if name == NOTE_SESSION:
            print("s", flush=True)
        await self.inner.save(platform, name, value)
        if name == NOTE_SESSION:
            print("S", flush=True)


class TracedDriver(DiscordDriver):
    """The Discord driver, attached to the connector's intake through :class:`TracedIntake`."""

    def attach(self, intake: Intake) -> None:
        """Attach to the connector's intake, traced."""
        if not isinstance(intake, DriverIntake):
            raise TypeError("the traced driver needs a connector's DriverIntake")
        super().attach(TracedIntake(intake))


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (see the module docs)."""
    parser = argparse.ArgumentParser(description="a Discord connector that serves until killed")
    parser.add_argument("--api-base", required=True, help="the REST base URL")
    parser.add_argument("--token", required=True, help="the bot's token")
    parser.add_argument("--db", required=True, help="the connector's SQLite file")
    parser.add_argument("--secret", required=True, help="the gateway's shared secret")
    parser.add_argument("--port", type=int, required=True, help="the port to listen on")
    parser.add_argument("--max-life", type=float, default=900.0, help="exit after this (s)")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    """Build the connector, start it, announce READY and serve until killed (or orphaned)."""
    parent = os.getppid()
    store = SQLiteStore(args.db)
    driver = TracedDriver(args.token, api_base=args.api_base)
    connector = Connector(store, secrets={GATEWAY_ID: [args.secret]}, drivers={PLATFORM: driver})
    await connector.start(port=args.port)
    await asyncio.wait_for(driver.gateway.connected.wait(), 30.0)
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

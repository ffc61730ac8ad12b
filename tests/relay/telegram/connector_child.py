"""The connector process of tests/relay/telegram/test_crash.py (run as a module, never
collected).

``python -m tests.relay.telegram.connector_child --api-url URL --token TOKEN --db DB --secret
SECRET --port PORT`` (from the repository root) runs the reference connector on the SQLite file
``DB`` with the Telegram driver long-polling the Bot API at ``URL`` (the test's fake server),
listening on ``127.0.0.1:PORT`` (a fixed port: the gateway redials the same URL after a
restart) for the gateway ``gw`` with ``SECRET``.

It prints ``READY pid=<pid> url=<url>`` once ``Connector.start()`` returned (the driver is
started then), and, as it goes, one line for what the driver did with the connector's intake:
``T <event id>`` when the intake returned for an event (the event is the connector's), ``s``
when the driver begins to save its offset and ``S`` once it is saved.  Every line is flushed at
once, so that the parent can tell, after a SIGKILL, whether the process died with a batch half
taken (events taken, the offset's save not begun); ``--save-delay S`` waits ``S`` seconds
before each save of the offset (a slow store), so that such kills happen.  It exits on its own
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
from relay.telegram import TelegramDriver
from relay.telegram._polling import NOTE_OFFSET
from relay.wire.frames import InboundEvent
from stores import SQLiteStore

GATEWAY_ID = "gw"
PLATFORM = "telegram"


class TracedIntake:
    """The connector's intake, passed through, printing a line after each call returned."""

    def __init__(self, inner: DriverIntake, save_delay_s: float = 0.0) -> None:
        self.inner = inner
        self.save_delay_s = save_delay_s

    async def __call__(self, platform: str, event: InboundEvent) -> None:
        """Take the event; ``T <event id>`` once the connector has it."""
        await self.inner(platform, event)
        print(f"T {event.message_id}", flush=True)

    async def reject(
        self, platform: str, raw: str, reason: str, *, event_id: str | None = None
    ) -> None:
        """Record a rejected update; ``R <id>`` once recorded."""
        await self.inner.reject(platform, raw, reason, event_id=event_id)
        print(f"R {event_id}", flush=True)

    async def load(self, platform: str, name: str) -> str | None:
        """A note of the driver, as stored."""
        return await self.inner.load(platform, name)

    async def save(self, platform: str, name: str, value: str) -> None:
        """Save a note; for the offset ``s`` before and ``S`` once it is on disk (after
        ``save_delay_s``: a slow store, so that a kill can land with a batch half taken)."""
        if name == NOTE_OFFSET:
            if self.save_delay_s > 0:
                await asyncio.sleep(self.save_delay_s)
            print("s", flush=True)
        await self.inner.save(platform, name, value)
        if name == NOTE_OFFSET:
            print("S", flush=True)


class TracedDriver(TelegramDriver):
    """The Telegram driver, attached to the connector's intake through :class:`TracedIntake`."""

    save_delay_s = 0.0

    def attach(self, intake: Intake) -> None:
        """Attach to the connector's intake, traced."""
        if not isinstance(intake, DriverIntake):
            raise TypeError("the traced driver needs a connector's DriverIntake")
        super().attach(TracedIntake(intake, self.save_delay_s))


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (see the module docs)."""
    parser = argparse.ArgumentParser(description="a Telegram connector that serves until killed")
    parser.add_argument("--api-url", required=True, help="the Bot API's base URL")
    parser.add_argument("--token", required=True, help="the bot's token")
    parser.add_argument("--db", required=True, help="the connector's SQLite file")
    parser.add_argument("--secret", required=True, help="the gateway's shared secret")
    parser.add_argument("--port", type=int, required=True, help="the port to listen on")
    parser.add_argument("--request-timeout", type=float, default=3.0, help="seconds a call")
    parser.add_argument("--save-delay", type=float, default=0.0, help="s before an offset save")
    parser.add_argument("--max-life", type=float, default=900.0, help="exit after this (s)")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    """Build the connector, start it, announce READY and serve until killed (or orphaned)."""
    parent = os.getppid()
    store = SQLiteStore(args.db)
    driver = TracedDriver(
        args.token,
        api_url=args.api_url,
        poll_timeout_s=2,
        chat_rate_per_s=10.0,
        group_rate_per_min=600.0,
        request_timeout_s=args.request_timeout,
        send_budget_s=10.0,
    )
    driver.save_delay_s = args.save_delay
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

"""The connector process of tests/relay/matrix/test_crash.py (run as a module, never collected).

``python -m tests.relay.matrix.connector_child --homeserver URL --user ID --password PW
--db DB --secret SECRET --port PORT [--intake-delay S]`` (from the repository root) runs the
reference connector on the SQLite file ``DB`` with the Matrix driver logged in as ``ID``,
listening on ``127.0.0.1:PORT`` (a fixed port: the gateway redials the same URL after a
restart) for the gateway ``gw`` with ``SECRET``.  ``S`` seconds pass after the intake took each
event before the driver goes on (a slow intake: it widens the moments at which a kill finds a
sync batch half taken).

It prints ``READY pid=<pid> url=<url>`` once ``Connector.start()`` returned (the driver is
started then), and, as it goes, one line for what the driver did with the connector's intake:
``T <event id>`` when the intake returned for an event (the event is the connector's), ``s``
when the driver begins to save its sync token and ``S`` once it is saved; ``P <txn id>`` when
a send under an idempotency key begins and ``D <txn id>`` once the server accepted it.  Every
line is flushed at once, so that the parent can tell, after a SIGKILL, whether the process
died with a batch half taken (events taken, the token's save not begun).  It exits on its
own (status 3) if its parent goes away or after ``--max-life`` seconds, so that a test that
dies never leaves it behind.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from relay.connector.intake import DriverIntake
from relay.connector.platform import Intake
from relay.connector.server import Connector
from relay.matrix import MatrixDriver
from relay.matrix._session import NOTE_NEXT_BATCH
from relay.matrix.driver import txn_id
from relay.wire.frames import InboundEvent, OutboundOutcome
from stores import SQLiteStore

GATEWAY_ID = "gw"
PLATFORM = "matrix"


class TracedIntake:
    """The connector's intake, passed through, printing a line after each call returned."""

    def __init__(self, inner: DriverIntake, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s

    async def __call__(self, platform: str, event: InboundEvent) -> None:
        """Take the event; ``T <event id>`` once the connector has it, then the delay."""
        await self.inner(platform, event)
        print(f"T {event.message_id}", flush=True)
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)

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
        """Save a note; for the sync token ``s`` before and ``S`` once it is on disk."""
        if name == NOTE_NEXT_BATCH:
            print("s", flush=True)
        await self.inner.save(platform, name, value)
        if name == NOTE_NEXT_BATCH:
            print("S", flush=True)


class TracedDriver(MatrixDriver):
    """The Matrix driver, attached to the connector's intake through :class:`TracedIntake`,
    its sends under a key traced."""

    intake_delay_s = 0.0

    def attach(self, intake: Intake) -> None:
        """Attach to the connector's intake, traced."""
        if not isinstance(intake, DriverIntake):
            raise TypeError("the traced driver needs a connector's DriverIntake")
        super().attach(TracedIntake(intake, self.intake_delay_s))

    async def perform_once(self, action: Mapping[str, Any], key: str) -> OutboundOutcome:
        """Perform under ``key``: ``P <txn id>`` before, ``D <txn id>`` once it succeeded."""
        txn = txn_id(key)
        print(f"P {txn}", flush=True)
        outcome = await super().perform_once(action, key)
        if outcome.success:
            print(f"D {txn}", flush=True)
        return outcome


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (see the module docs)."""
    parser = argparse.ArgumentParser(description="a Matrix connector that serves until killed")
    parser.add_argument("--homeserver", required=True, help="the homeserver's URL")
    parser.add_argument("--user", required=True, help="the bot's Matrix id")
    parser.add_argument("--password", required=True, help="the bot's password")
    parser.add_argument("--db", required=True, help="the connector's SQLite file")
    parser.add_argument("--secret", required=True, help="the gateway's shared secret")
    parser.add_argument("--port", type=int, required=True, help="the port to listen on")
    parser.add_argument(
        "--intake-delay", type=float, default=0.0, help="seconds after each event taken"
    )
    parser.add_argument("--max-life", type=float, default=900.0, help="exit after this (s)")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    """Build the connector, start it, announce READY and serve until killed (or orphaned)."""
    parent = os.getppid()
    store = SQLiteStore(args.db)
    driver = TracedDriver(args.homeserver, args.user, password=args.password)
    driver.intake_delay_s = args.intake_delay
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

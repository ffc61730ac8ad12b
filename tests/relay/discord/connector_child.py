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
(status 3) if its parent goes away or after ``--max-life`` seconds (tests/relay/child_kit.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from relay.connector.platform import Intake
from relay.discord import DiscordDriver
from relay.discord._gateway import NOTE_SESSION
from tests.relay.child_kit import connector_main, traced

PLATFORM = "discord"
LIVE_WITHIN_S = 30.0
"""The bound on the gateway session going live before READY."""


class TracedDriver(DiscordDriver):
    """The Discord driver, attached to the connector's intake traced (its session's seq the
    cursor note)."""

    def attach(self, intake: Intake) -> None:
        """Attach to the connector's intake, traced."""
        super().attach(traced(intake, NOTE_SESSION))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The Discord options (see the module docs)."""
    parser.add_argument("--api-base", required=True, help="the REST base URL")
    parser.add_argument("--token", required=True, help="the bot's token")


def make_driver(args: argparse.Namespace) -> TracedDriver:
    """The traced Discord driver of the command line."""
    return TracedDriver(args.token, api_base=args.api_base)


async def live(driver: TracedDriver) -> None:
    """Until the driver's gateway session is live (TimeoutError after the bound)."""
    await asyncio.wait_for(driver.gateway.connected.wait(), LIVE_WITHIN_S)


def main(argv: list[str] | None = None) -> int:
    """Run the connector; the normal end of this process is SIGKILL."""
    return connector_main(PLATFORM, add_arguments, make_driver, live=live, argv=argv)


if __name__ == "__main__":
    sys.exit(main())

"""The connector process of tests/relay/slack/test_crash.py (run as a module, never collected).

``python -m tests.relay.slack.connector_child --api-url URL --bot-token T --app-token A
--db DB --secret SECRET --port PORT`` (from the repository root) runs the reference connector
on the SQLite file ``DB`` with the Slack driver in Socket Mode against ``URL`` (the fake Slack
of the test process), listening on ``127.0.0.1:PORT`` (a fixed port: the gateway redials the
same URL after a restart) for the gateway ``gw`` with ``SECRET``.

It prints ``READY pid=<pid> url=<url>`` once ``Connector.start()`` returned, and ``T <message
id>`` each time the connector's intake returned for an event (the driver's ack follows it).
Every line is flushed at once.  It exits on its own (status 3) if its parent goes away or after
``--max-life`` seconds (tests/relay/child_kit.py).
"""

from __future__ import annotations

import argparse
import sys

from relay.connector.platform import Intake
from relay.slack import SlackDriver
from tests.relay.child_kit import connector_main, traced

PLATFORM = "slack"


class TracedDriver(SlackDriver):
    """The Slack driver, attached to the connector's intake traced (no cursor note: Slack's
    cursor is the ack)."""

    def attach(self, intake: Intake) -> None:
        """Attach to the connector's intake, traced."""
        super().attach(traced(intake))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The Slack options (see the module docs)."""
    parser.add_argument("--api-url", required=True, help="the Web API's base URL")
    parser.add_argument("--bot-token", required=True, help="the bot token")
    parser.add_argument("--app-token", required=True, help="the app-level token")
    parser.add_argument("--connections", type=int, default=2, help="Socket Mode connections")


def make_driver(args: argparse.Namespace) -> TracedDriver:
    """The traced Slack driver of the command line."""
    return TracedDriver(
        args.bot_token,
        app_token=args.app_token,
        api_url=args.api_url,
        connections=args.connections,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the connector; the normal end of this process is SIGKILL."""
    return connector_main(PLATFORM, add_arguments, make_driver, argv=argv)


if __name__ == "__main__":
    sys.exit(main())

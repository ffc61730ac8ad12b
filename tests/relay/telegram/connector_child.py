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
(status 3) if its parent goes away or after ``--max-life`` seconds (tests/relay/child_kit.py).
"""

from __future__ import annotations

import argparse
import sys

from relay.connector.platform import Intake
from relay.telegram import TelegramDriver
from relay.telegram._polling import NOTE_OFFSET
from tests.relay.child_kit import connector_main, traced

PLATFORM = "telegram"


class TracedDriver(TelegramDriver):
    """The Telegram driver, attached to the connector's intake traced (its offset the cursor
    note, saved slowly)."""

    save_delay_s = 0.0

    def attach(self, intake: Intake) -> None:
        """Attach to the connector's intake, traced."""
        super().attach(traced(intake, NOTE_OFFSET, save_delay_s=self.save_delay_s))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The Telegram options (see the module docs)."""
    parser.add_argument("--api-url", required=True, help="the Bot API's base URL")
    parser.add_argument("--token", required=True, help="the bot's token")
    parser.add_argument("--request-timeout", type=float, default=3.0, help="seconds a call")
    parser.add_argument("--save-delay", type=float, default=0.0, help="s before an offset save")


def make_driver(args: argparse.Namespace) -> TracedDriver:
    """The traced Telegram driver of the command line."""
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
    return driver


def main(argv: list[str] | None = None) -> int:
    """Run the connector; the normal end of this process is SIGKILL."""
    return connector_main(PLATFORM, add_arguments, make_driver, argv=argv)


if __name__ == "__main__":
    sys.exit(main())

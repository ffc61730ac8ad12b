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
dies never leaves it behind (tests/relay/child_kit.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from relay.connector.platform import Intake
from relay.matrix import MatrixDriver
from relay.matrix._session import NOTE_NEXT_BATCH
from relay.matrix.driver import txn_id
from relay.wire.frames import OutboundOutcome
from tests.relay.child_kit import connector_main, traced

PLATFORM = "matrix"


class TracedDriver(MatrixDriver):
    """The Matrix driver, attached to the connector's intake traced (its sync token the cursor
    note), its sends under a key traced."""

    intake_delay_s = 0.0

    def attach(self, intake: Intake) -> None:
        """Attach to the connector's intake, traced."""
        super().attach(traced(intake, NOTE_NEXT_BATCH, intake_delay_s=self.intake_delay_s))

    async def perform_once(self, action: Mapping[str, Any], key: str) -> OutboundOutcome:
        """Perform under ``key``: ``P <txn id>`` before, ``D <txn id>`` once it succeeded."""
        txn = txn_id(key)
        print(f"P {txn}", flush=True)
        outcome = await super().perform_once(action, key)
        if outcome.success:
            print(f"D {txn}", flush=True)
        return outcome


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The Matrix options (see the module docs)."""
    parser.add_argument("--homeserver", required=True, help="the homeserver's URL")
    parser.add_argument("--user", required=True, help="the bot's Matrix id")
    parser.add_argument("--password", required=True, help="the bot's password")
    parser.add_argument(
        "--intake-delay", type=float, default=0.0, help="seconds after each event taken"
    )


def make_driver(args: argparse.Namespace) -> TracedDriver:
    """The traced Matrix driver of the command line."""
    driver = TracedDriver(args.homeserver, args.user, password=args.password)
    driver.intake_delay_s = args.intake_delay
    return driver


def main(argv: list[str] | None = None) -> int:
    """Run the connector; the normal end of this process is SIGKILL."""
    return connector_main(PLATFORM, add_arguments, make_driver, argv=argv)


if __name__ == "__main__":
    sys.exit(main())

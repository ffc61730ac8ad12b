"""The bot process of the crash tests (tests/relay/test_crash_under_load.py and
tests/relay/{matrix,slack,telegram,discord}/test_crash.py; run as a module, never collected).

``python -m tests.relay.crash_child --url URL --db DB --secret SECRET [--handler-sleep S]
[--platform NAME] [--max-attempts N --retry-backoff S,S,... --retry-interval S]`` (from the
repository root) runs an echo bot: a ``Gateway`` whose ledger, sessions and handled bufferIds
live in the SQLite file ``DB``, connected to the connector at ``URL`` as gateway ``gw`` on the
platform ``NAME`` (default ``loopback``; each platform's crash test runs it on its own).  Every
message ``text`` is answered with the ledgered reply ``echo: <text>`` (in the message's thread
or topic, as a reply to it), after ``S`` seconds of work.

The ledger keeps the gateway's defaults unless told otherwise: ``--max-attempts`` and
``--retry-backoff`` make its policy's budget and in-process retry delays, ``--retry-interval``
the period of its sweep (the Telegram crash run retries after 0.5 s and 1 s, sweeping every
0.5 s, up to 10 attempts, so that a send that reached Telegram without an answer is resent
within the run, labelled).

It prints ``READY pid=<pid> claimed=<n>`` once ``gateway.start()`` returned and then serves
until it is killed.  It exits on its own (status 3) if its parent goes away or after
``--max-life`` seconds, so that a test that dies never leaves it behind
(tests/relay/child_kit.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from relay import RelayAdapter, StoreBufferDedupe, WebSocketRelayTransport
from statecore import LedgerPolicy
from statecore.gateway import Gateway, Turn
from stores import SQLiteStore
from tests.relay.child_kit import GATEWAY_ID, serve_until_killed

PLATFORM = "loopback"
BOT_ID = "bot"


def backoff(text: str) -> tuple[float, ...]:
    """``0.5,1`` as ``(0.5, 1.0)``."""
    return tuple(float(part) for part in text.split(","))


def ledger_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``Gateway`` keywords of the ledger options given (none: the gateway's defaults)."""
    options: dict[str, Any] = {}
    policy: dict[str, Any] = {}
    if args.max_attempts is not None:
        policy["max_attempts"] = args.max_attempts
    if args.retry_backoff is not None:
        policy["retry_backoff"] = args.retry_backoff
    if policy:
        options["policy"] = LedgerPolicy(**policy)
    if args.retry_interval is not None:
        options["retry_interval_s"] = args.retry_interval
    return options


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (see the module docs)."""
    parser = argparse.ArgumentParser(description="an echo bot that serves until it is killed")
    parser.add_argument("--url", required=True, help="the connector's ws:// URL")
    parser.add_argument("--db", required=True, help="the bot's SQLite file")
    parser.add_argument("--secret", required=True, help="the gateway's shared secret")
    parser.add_argument("--platform", default=PLATFORM, help="the platform the bot serves")
    parser.add_argument("--handler-sleep", type=float, default=0.0, help="seconds of work")
    parser.add_argument("--backoff", type=float, default=0.05, help="reconnect backoff base (s)")
    parser.add_argument("--max-life", type=float, default=900.0, help="exit after this (s)")
    parser.add_argument("--max-attempts", type=int, help="the ledger's redelivery budget")
    parser.add_argument(
        "--retry-backoff",
        type=backoff,
        help="the ledger's in-process retry delays, comma-separated seconds",
    )
    parser.add_argument("--retry-interval", type=float, help="the ledger sweep's period (s)")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    """Build the bot, start it, announce READY and serve until killed (or orphaned)."""
    parent = os.getppid()
    store = SQLiteStore(args.db)
    transport = WebSocketRelayTransport(
        args.url,
        args.platform,
        BOT_ID,
        gateway_id=GATEWAY_ID,
        secret=args.secret,
        dedupe=StoreBufferDedupe(store),
        reconnect_backoff_s=args.backoff,
        reconnect_max_s=max(args.backoff, 0.5),
    )
    adapter = RelayAdapter(transport)
    gateway = Gateway(store, **ledger_options(args))
    gateway.add_adapter(args.platform, adapter)
    handler_sleep: float = args.handler_sleep

    async def echo(turn: Turn) -> None:
        """The bot's logic: some work, then the ledgered reply."""
        if handler_sleep > 0:
            await asyncio.sleep(handler_sleep)
        await turn.reply(f"echo: {turn.message.text}")

    gateway.on_message(echo)
    claimed = await gateway.start()
    print(f"READY pid={os.getpid()} claimed={claimed}", flush=True)
    return await serve_until_killed(parent, args.max_life)


def main(argv: list[str] | None = None) -> int:
    """Run the bot; the normal end of this process is SIGKILL."""
    return asyncio.run(serve(parse_args(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())

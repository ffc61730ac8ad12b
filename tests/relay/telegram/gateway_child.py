"""The bot process of tests/relay/telegram/test_crash.py (run as a module, never collected).

``python -m tests.relay.telegram.gateway_child --url URL --db DB --secret SECRET
[--handler-sleep S]`` (from the repository root) runs an echo bot: a ``Gateway`` whose ledger,
sessions and handled bufferIds live in the SQLite file ``DB``, connected to the connector at
``URL`` as gateway ``gw`` on the ``telegram`` platform.  Every message ``text`` is answered
with the ledgered reply ``echo: <text>`` (in the message's topic, as a reply to it), after ``S``
seconds of work.  Its ledger retries a failed send after 0.5 s and 1 s (and its sweep runs every
0.5 s), up to 10 attempts: the run's platform faults (a send that reached Telegram without an
answer) are resent within the run, labelled.

It prints ``READY pid=<pid> claimed=<n>`` once ``gateway.start()`` returned and then serves
until it is killed.  It exits on its own (status 3) if its parent goes away or after
``--max-life`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from relay import RelayAdapter, StoreBufferDedupe, WebSocketRelayTransport
from statecore import LedgerPolicy
from statecore.gateway import Gateway, Turn
from stores import SQLiteStore

GATEWAY_ID = "gw"
PLATFORM = "telegram"
BOT_ID = "bot"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (see the module docs)."""
    parser = argparse.ArgumentParser(description="an echo bot that serves until it is killed")
    parser.add_argument("--url", required=True, help="the connector's ws:// URL")
    parser.add_argument("--db", required=True, help="the bot's SQLite file")
    parser.add_argument("--secret", required=True, help="the gateway's shared secret")
    parser.add_argument("--handler-sleep", type=float, default=0.0, help="seconds of work")
    parser.add_argument("--max-life", type=float, default=900.0, help="exit after this (s)")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    """Build the bot, start it, announce READY and serve until killed (or orphaned)."""
    parent = os.getppid()
    store = SQLiteStore(args.db)
    transport = WebSocketRelayTransport(
        args.url,
        PLATFORM,
        BOT_ID,
        gateway_id=GATEWAY_ID,
        secret=args.secret,
        dedupe=StoreBufferDedupe(store),
        reconnect_backoff_s=0.05,
        reconnect_max_s=0.5,
    )
    policy = LedgerPolicy(max_attempts=10, retry_backoff=(0.5, 1.0, 1.0, 1.0, 1.0))
    gateway = Gateway(store, policy=policy, retry_interval_s=0.5)
    gateway.add_adapter(PLATFORM, RelayAdapter(transport))
    handler_sleep: float = args.handler_sleep

    async def echo(turn: Turn) -> None:
        """The bot's logic: some work, then the ledgered reply."""
        if handler_sleep > 0:
            await asyncio.sleep(handler_sleep)
        await turn.reply(f"echo: {turn.message.text}")

    gateway.on_message(echo)
    claimed = await gateway.start()
    print(f"READY pid={os.getpid()} claimed={claimed}", flush=True)
    deadline = time.monotonic() + args.max_life
    while time.monotonic() < deadline:
        if os.getppid() != parent:
            print(f"orphaned: pid {os.getpid()} exits", file=sys.stderr, flush=True)
            return 3
        await asyncio.sleep(0.2)
    print(f"max life reached: pid {os.getpid()} exits", file=sys.stderr, flush=True)
    return 3


def main(argv: list[str] | None = None) -> int:
    """Run the bot; the normal end of this process is SIGKILL."""
    return asyncio.run(serve(parse_args(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())

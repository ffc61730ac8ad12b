"""One gateway process of tests/statecore/gateway/test_fleet_processes.py (run as a module, never
collected).

``python -m tests.statecore.gateway.fleet_child --url URL --index I --gateways N --secret S
--schema SCHEMA [--handler-sleep S] [--recover-interval S]`` (from the repository root, with the
ledger's PostgreSQL conninfo in ``$STATECORE_FLEET_PG_URL``, never on the command line: it may
hold a password) runs gateway ``gw-I`` of a fleet of ``N``: a ``Gateway`` whose ledger, sessions
and handled bufferIds live in the PostgreSQL schema ``SCHEMA`` shared by the whole fleet,
connected to the connector at ``URL`` on the ``loopback`` platform, re-sweeping dead owners'
rows every ``--recover-interval`` seconds.

Every gateway of the fleet sees every message of the platform (the connector fans it out to
each gateway that said hello); a gateway answers only the chats it serves
(:func:`serves`), with the ledgered reply ``echo: <text>`` after ``--handler-sleep`` seconds of
work.  A reply it recorded and could not settle before its SIGKILL is the fleet's: another
process claims it through the shared ledger.

It prints ``READY index=<I> pid=<pid> label=<ledger owner label> claimed=<n>`` once
``gateway.start()`` returned, then serves until it is killed.  It exits on its own (status 3) if
its parent goes away or after ``--max-life`` seconds, so a test that dies never leaves it behind.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from relay import RelayAdapter, StoreBufferDedupe, WebSocketRelayTransport
from statecore.gateway import Gateway, Turn
from stores import PostgresStore

PG_URL_ENV = "STATECORE_FLEET_PG_URL"
PLATFORM = "loopback"
BOT_ID = "bot"


def gateway_id(index: int) -> str:
    """The identity gateway number ``index`` has at the connector."""
    return f"gw-{index}"


def chat_of(n: int) -> str:
    """The chat id of chat number ``n``."""
    return f"chat-{n}"


def serves(index: int, gateways: int, chat_id: str) -> bool:
    """True when gateway ``index`` of ``gateways`` answers ``chat_id`` (chat n: gateway n % N)."""
    prefix, _, number = chat_id.partition("-")
    return prefix == "chat" and number.isdigit() and int(number) % gateways == index


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (see the module docs)."""
    parser = argparse.ArgumentParser(description="one gateway of a fleet, serving until killed")
    parser.add_argument("--url", required=True, help="the connector's ws:// URL")
    parser.add_argument("--index", type=int, required=True, help="this gateway's number")
    parser.add_argument("--gateways", type=int, required=True, help="the fleet's size")
    parser.add_argument("--secret", required=True, help="this gateway's shared secret")
    parser.add_argument("--schema", required=True, help="the ledger's PostgreSQL schema")
    parser.add_argument("--handler-sleep", type=float, default=0.0, help="seconds of work")
    parser.add_argument("--recover-interval", type=float, default=1.0, help="recover tick (s)")
    parser.add_argument("--backoff", type=float, default=0.05, help="reconnect backoff base (s)")
    parser.add_argument("--max-life", type=float, default=300.0, help="exit after this (s)")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    """Build the gateway, start it, announce READY and serve until killed (or orphaned)."""
    parent = os.getppid()
    store = PostgresStore(os.environ[PG_URL_ENV], schema=args.schema, pool_size=4)
    transport = WebSocketRelayTransport(
        args.url,
        PLATFORM,
        BOT_ID,
        gateway_id=gateway_id(args.index),
        secret=args.secret,
        dedupe=StoreBufferDedupe(store),
        reconnect_backoff_s=args.backoff,
        reconnect_max_s=max(args.backoff, 0.5),
    )
    gateway = Gateway(store, recover_interval_s=args.recover_interval, retry_interval_s=1.0)
    gateway.add_adapter(PLATFORM, RelayAdapter(transport))
    index: int = args.index
    gateways: int = args.gateways
    handler_sleep: float = args.handler_sleep

    async def echo(turn: Turn) -> None:
        """Answer the chats this gateway serves; leave the others to their gateways."""
        if not serves(index, gateways, turn.message.chat_id):
            return
        if handler_sleep > 0:
            await asyncio.sleep(handler_sleep)
        await turn.reply(f"echo: {turn.message.text}")

    gateway.on_message(echo)
    claimed = await gateway.start()
    label = gateway.ledger.incarnation.label
    print(f"READY index={index} pid={os.getpid()} label={label} claimed={claimed}", flush=True)
    deadline = time.monotonic() + args.max_life
    while time.monotonic() < deadline:
        if os.getppid() != parent:
            print(f"orphaned: pid {os.getpid()} exits", file=sys.stderr, flush=True)
            return 3
        await asyncio.sleep(0.2)
    print(f"max life reached: pid {os.getpid()} exits", file=sys.stderr, flush=True)
    return 3


def main(argv: list[str] | None = None) -> int:
    """Run the gateway; the normal end of this process is SIGKILL."""
    return asyncio.run(serve(parse_args(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())

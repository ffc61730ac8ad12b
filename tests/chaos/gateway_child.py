"""One gateway process of a chaos run (run as a module, never collected).

``python -m tests.chaos.gateway_child --url URL --index I --gateways N --secret S --schema
SCHEMA --lease S [--recover-interval S] [--max-life S]`` (from the repository root; the
ledger's conninfo in ``$STATECORE_CHAOS_PG_URL``, the clock offset in
``$STATECORE_CHAOS_CLOCK_OFFSET``) runs gateway ``gw-I`` of a fleet of ``N``: a ``Gateway``
whose ledger lives in the PostgreSQL schema ``SCHEMA`` shared by the fleet, with a
``RelayAdapter`` + ``WebSocketRelayTransport`` to the connector cluster at ``URL``.

Each gateway is its own host to its peers (incarnation host ``chaos-host-I``), so a peer
judges it by its owner lease (``--lease`` seconds, renewed every third of it), never by the
process probe: a gateway that is paused past its lease is presumed dead and its owed rows are
claimed -- every claim and settle still fenced.  It answers the chats it serves (chat ``k``:
gateway ``k % N``) with the ledgered reply ``echo: <text>``.

It prints ``READY index=<I> pid=<pid> label=<owner label> claimed=<n> offset=<s>`` once
``gateway.start()`` returned, then serves until it is killed (or orphaned: status 3).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from tests.chaos.child_kit import (
    PG_URL_ENV,
    apply_clock_offset,
    apply_pool_delay,
    log_to_stderr,
    watch_parent,
)
from tests.chaos.driver import PLATFORM

# The fleet test's identities and chat split (chat k: gateway k % N), shared.
from tests.statecore.gateway.fleet_child import gateway_id, serves

__all__ = ["BOT_ID", "REPLY_PREFIX", "gateway_id", "secret_of", "serves"]

BOT_ID = "bot"
REPLY_PREFIX = "echo: "
"""A reply is this prefix and the text it answers."""


def secret_of(index: int) -> str:
    """Gateway ``index``'s shared secret."""
    return f"chaos-secret-{index}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (see the module docs)."""
    parser = argparse.ArgumentParser(description="one gateway of a chaos run")
    parser.add_argument("--url", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--gateways", type=int, required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--lease", type=float, required=True)
    parser.add_argument("--recover-interval", type=float, default=0.5)
    parser.add_argument("--max-life", type=float, default=3600.0)
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace, offset: float) -> int:
    """Build the gateway, start it, announce READY and serve until killed (or orphaned)."""
    from relay import RelayAdapter, StoreBufferDedupe, WebSocketRelayTransport  # noqa: PLC0415
    from statecore.gateway import Gateway, Turn  # noqa: PLC0415
    from statecore.ownership import Incarnation, PsutilProbe  # noqa: PLC0415
    from statecore.policy import LedgerPolicy  # noqa: PLC0415
    from stores import PostgresStore  # noqa: PLC0415

    store = PostgresStore(os.environ[PG_URL_ENV], schema=args.schema, pool_size=4)
    transport = WebSocketRelayTransport(
        args.url,
        PLATFORM,
        BOT_ID,
        gateway_id=gateway_id(args.index),
        secret=args.secret,
        dedupe=StoreBufferDedupe(store),
        reconnect_backoff_s=0.1,
        reconnect_max_s=1.0,
        request_timeout_s=5.0,
        handshake_timeout_s=3.0,
        open_timeout_s=3.0,
    )
    pid = os.getpid()
    own = Incarnation.current(PsutilProbe())
    incarnation = Incarnation(f"chaos-host-{args.index}", pid, own.started_at, own.token)
    policy = LedgerPolicy(
        lease_s=args.lease, max_attempts=20, retry_backoff=(0.5, 1.0) + (2.0,) * 17
    )
    gateway = Gateway(
        store,
        incarnation=incarnation,
        policy=policy,
        recover_interval_s=args.recover_interval,
        retry_interval_s=0.5,
    )
    gateway.add_adapter(PLATFORM, RelayAdapter(transport))
    index: int = args.index
    gateways: int = args.gateways

    async def echo(turn: Turn) -> None:
        """Answer the chats this gateway serves; leave the others to their gateways."""
        if serves(index, gateways, turn.message.chat_id):
            await turn.reply(f"{REPLY_PREFIX}{turn.message.text}")

    gateway.on_message(echo)
    claimed = await gateway.start()
    label = gateway.ledger.incarnation.label
    print(
        f"READY index={index} pid={pid} label={label} claimed={claimed} offset={offset:g}",
        flush=True,
    )
    return await watch_parent(args.max_life)


def main(argv: list[str] | None = None) -> int:
    """Run the gateway; the normal end of this process is SIGKILL."""
    offset = apply_clock_offset()
    log_to_stderr()
    apply_pool_delay()
    return asyncio.run(serve(parse_args(sys.argv[1:] if argv is None else argv), offset))


if __name__ == "__main__":
    sys.exit(main())

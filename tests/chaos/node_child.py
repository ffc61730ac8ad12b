"""One connector node of a chaos run (run as a module, never collected).

``python -m tests.chaos.node_child --name NAME --port P --hook-port H --api-url URL --schema
SCHEMA --gateways N [--max-life S]`` (from the repository root; the store's conninfo in
``$STATECORE_CHAOS_PG_URL``, the clock offset in ``$STATECORE_CHAOS_CLOCK_OFFSET``) runs one
node of the connector cluster: a ``Connector`` on a ``PostgresStore`` of ``SCHEMA`` (shared by
every node: the nodes talk to each other only through its tables and NOTIFY), listening for
gateways on ``P``, fronting the chaos platform through :class:`tests.chaos.driver.ChaosDriver`
(hook on ``H``, sends to ``URL``).  Gateways ``gw-0`` .. ``gw-<N-1>`` are admitted with their
secrets, each approved for both tenants (the tenant guard runs on every send).

It prints ``READY name=<NAME> pid=<pid> offset=<s>`` once the connector listens, then serves
until it is killed (or orphaned: status 3).
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
from tests.chaos.gateway_child import gateway_id, secret_of

TENANTS = ("tenant-a", "tenant-b")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (see the module docs)."""
    parser = argparse.ArgumentParser(description="one connector node of a chaos run")
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hook-port", type=int, required=True)
    parser.add_argument("--api-url", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--gateways", type=int, required=True)
    parser.add_argument("--sweep", type=float, default=1.0)
    parser.add_argument("--max-life", type=float, default=3600.0)
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace, offset: float) -> int:
    """Start the node, announce READY and serve until killed (or orphaned)."""
    from relay.connector.server import Connector  # noqa: PLC0415
    from stores import PostgresStore  # noqa: PLC0415
    from tests.chaos.driver import PLATFORM, ChaosDriver  # noqa: PLC0415

    store = PostgresStore(os.environ[PG_URL_ENV], schema=args.schema, pool_size=6)
    ids = [gateway_id(i) for i in range(args.gateways)]
    driver = ChaosDriver(api_url=args.api_url, hook_port=args.hook_port, node=args.name)
    connector = Connector(
        store,
        secrets={g: [secret_of(i)] for i, g in enumerate(ids)},
        drivers={PLATFORM: driver},
        tenants=dict.fromkeys(ids, TENANTS),
        cluster=True,
        cluster_sweep_s=args.sweep,
        liveness_probe_s=2.0,
    )
    await connector.start(port=args.port)
    print(f"READY name={args.name} pid={os.getpid()} offset={offset:g}", flush=True)
    return await watch_parent(args.max_life)


def main(argv: list[str] | None = None) -> int:
    """Run the node; the normal end of this process is SIGKILL."""
    offset = apply_clock_offset()
    log_to_stderr()
    apply_pool_delay()
    return asyncio.run(serve(parse_args(sys.argv[1:] if argv is None else argv), offset))


if __name__ == "__main__":
    sys.exit(main())

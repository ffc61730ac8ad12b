"""What the child processes of the crash runs share (never collected): the connector children
of tests/relay/{matrix,slack,telegram,discord}/connector_child.py and the bot of
tests/relay/crash_child.py.

:func:`serve_until_killed` is their life after READY: serve until SIGKILL, exit on its own
(status 3) if the parent goes away or after the maximum life, so that a test that dies never
leaves a child behind.  :class:`TracedIntake` is the connector's intake passed through, printing
one flushed line for what the driver did with it: ``T <id>`` once the intake returned for an
event (the event is the connector's), ``R <id>`` once a rejection is recorded, ``s`` when the
driver begins to save its cursor note and ``S`` once it is saved, so that the parent can tell,
after a SIGKILL, whether the process died with a batch half taken.  :func:`connector_main` is a
connector child's whole program: the common options, the connector on a SQLite file with the
platform's driver (built by the child's factory), READY, and serving until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from relay.connector.intake import DriverIntake
from relay.connector.platform import Intake, PlatformDriver
from relay.connector.server import Connector
from relay.wire.frames import InboundEvent
from stores import SQLiteStore

GATEWAY_ID = "gw"
ORPHAN_CHECK_S = 0.2
"""How often a child looks whether its parent is still there."""

D = TypeVar("D", bound=PlatformDriver)


async def serve_until_killed(parent: int, max_life_s: float) -> int:
    """Serve until killed; 3 once ``parent`` is gone or after ``max_life_s`` seconds."""
    deadline = time.monotonic() + max_life_s
    while time.monotonic() < deadline:
        if os.getppid() != parent:
            print(f"orphaned: pid {os.getpid()} exits", file=sys.stderr, flush=True)
            return 3
        await asyncio.sleep(ORPHAN_CHECK_S)
    print(f"max life reached: pid {os.getpid()} exits", file=sys.stderr, flush=True)
    return 3


class TracedIntake:
    """The connector's intake, passed through, printing a line after each call returned.

    ``cursor_note`` is the note whose saves are traced (``s``/``S``; none for a driver whose
    cursor is no note); ``intake_delay_s`` passes after each event taken (a slow intake),
    ``save_delay_s`` before each save of the cursor note (a slow store), so that kills land
    with a batch half taken.
    """

    def __init__(
        self,
        inner: DriverIntake,
        cursor_note: str | None = None,
        *,
        intake_delay_s: float = 0.0,
        save_delay_s: float = 0.0,
    ) -> None:
        self.inner = inner
        self.cursor_note = cursor_note
        self.intake_delay_s = intake_delay_s
        self.save_delay_s = save_delay_s

    async def __call__(self, platform: str, event: InboundEvent) -> None:
        """Take the event; ``T <id>`` once the connector has it, then the intake delay."""
        await self.inner(platform, event)
        print(f"T {event.message_id}", flush=True)
        if self.intake_delay_s > 0:
            await asyncio.sleep(self.intake_delay_s)

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
        """Save a note; for the cursor note ``s`` before (after the save delay) and ``S`` once
        it is on disk."""
        cursor = self.cursor_note is not None and name == self.cursor_note
        if cursor:
            if self.save_delay_s > 0:
                await asyncio.sleep(self.save_delay_s)
            print("s", flush=True)
        await self.inner.save(platform, name, value)
        if cursor:
            print("S", flush=True)


def traced(
    intake: Intake,
    cursor_note: str | None = None,
    *,
    intake_delay_s: float = 0.0,
    save_delay_s: float = 0.0,
) -> TracedIntake:
    """``intake`` (a connector's :class:`DriverIntake`) traced; TypeError for anything else."""
    if not isinstance(intake, DriverIntake):
        raise TypeError("the traced driver needs a connector's DriverIntake")
    return TracedIntake(
        intake, cursor_note, intake_delay_s=intake_delay_s, save_delay_s=save_delay_s
    )


def connector_main(
    platform: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    make_driver: Callable[[argparse.Namespace], D],
    *,
    live: Callable[[D], Awaitable[object]] | None = None,
    argv: list[str] | None = None,
) -> int:
    """A connector child's program: parse ``--db DB --secret SECRET --port PORT
    [--max-life S]`` and the platform's own options (``add_arguments``), run the reference
    connector on the SQLite file ``DB`` with the driver ``make_driver`` builds, listening on
    ``127.0.0.1:PORT`` (a fixed port: the gateway redials the same URL after a restart) for the
    gateway ``gw`` with ``SECRET``; print ``READY pid=<pid> url=<url>`` once
    ``Connector.start()`` returned (and ``live`` awaited, when given), then serve until
    killed."""
    parser = argparse.ArgumentParser(
        description=f"a {platform.capitalize()} connector that serves until killed"
    )
    add_arguments(parser)
    parser.add_argument("--db", required=True, help="the connector's SQLite file")
    parser.add_argument("--secret", required=True, help="the gateway's shared secret")
    parser.add_argument("--port", type=int, required=True, help="the port to listen on")
    parser.add_argument("--max-life", type=float, default=900.0, help="exit after this (s)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    async def serve() -> int:
        parent = os.getppid()
        store = SQLiteStore(args.db)
        driver = make_driver(args)
        connector = Connector(
            store, secrets={GATEWAY_ID: [args.secret]}, drivers={platform: driver}
        )
        await connector.start(port=args.port)
        if live is not None:
            await live(driver)
        print(f"READY pid={os.getpid()} url={connector.url}", flush=True)
        return await serve_until_killed(parent, args.max_life)

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return asyncio.run(serve())

"""What both kinds of chaos child process share: the environment they are configured by (a
conninfo holds a password, so never the command line), the clock offset each life runs with,
and the watch that ends a child whose harness went away or whose life ran too long."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time

__all__ = ["OFFSET_ENV", "PG_URL_ENV", "apply_clock_offset", "log_to_stderr", "watch_parent"]

PG_URL_ENV = "STATECORE_CHAOS_PG_URL"
"""The PostgreSQL conninfo the child uses (the harness's proxy in front of the server)."""
OFFSET_ENV = "STATECORE_CHAOS_CLOCK_OFFSET"
"""Seconds added to this process's wall clock (``time.time``), e.g. ``-1.5``."""


def apply_clock_offset() -> float:
    """Shift this process's wall clock by ``$STATECORE_CHAOS_CLOCK_OFFSET`` seconds; returns
    the offset (0 when unset).  ``time.time`` is replaced, so every wall-clock reading of the
    process moves: the gateway's :class:`~statecore.clock.SystemClock` (row leases, the owner
    heartbeat's lease, due times), the stores' audit stamps and the relay's hello tokens --
    as on a host whose clock is off.  ``time.monotonic`` is untouched (it has no epoch).
    ``ValueError`` for a value that is not a number."""
    raw = os.environ.get(OFFSET_ENV, "").strip()
    offset = float(raw) if raw else 0.0
    if offset:
        real = time.time

        def shifted() -> float:
            return real() + offset

        time.time = shifted
    return offset


async def watch_parent(max_life_s: float) -> int:
    """Return 3 when the parent process went away or after ``max_life_s``: a harness that died
    never leaves a child behind.  Polls every 0.2 s."""
    parent = os.getppid()
    deadline = time.monotonic() + max_life_s
    while time.monotonic() < deadline:
        if os.getppid() != parent:
            print(f"orphaned: pid {os.getpid()} exits", file=sys.stderr, flush=True)
            return 3
        await asyncio.sleep(0.2)
    print(f"max life reached: pid {os.getpid()} exits", file=sys.stderr, flush=True)
    return 3


POOL_DELAY_ENV = "STATECORE_CHAOS_POOL_DELAY"
"""An experiment's knob: psycopg_pool's first reconnect delay (s) in this process (its own
default is 1 s, doubling after each failed attempt)."""


def apply_pool_delay() -> None:
    """Set psycopg_pool's first reconnect delay from ``$STATECORE_CHAOS_POOL_DELAY`` (unset:
    the library's own)."""
    raw = os.environ.get(POOL_DELAY_ENV, "").strip()
    if raw:
        from psycopg_pool import base  # noqa: PLC0415

        base.AttemptWithBackoff.INITIAL_DELAY = float(raw)


def log_to_stderr() -> None:
    """Log INFO and above of the relay, WARNING and above of everything else, to stderr (the
    slot's log file), each line with the harness-comparable time (this process's clock
    offset included: the offset is in the READY line)."""
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger("relay").setLevel(logging.INFO)
    logging.getLogger("statecore.gateway").setLevel(logging.INFO)

"""The child processes of a crash test: every life spawned, killed with SIGKILL and reaped
(bounded), with the count of kills under load and of lives that ended otherwise; and how the
quiet period after the load ended.  Shared by the crash tests of one gateway (tests/relay) and
of a gateway fleet (tests/statecore/gateway)."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import attrs

REAP_S = 10.0
"""The bound on reaping one killed child."""


class Lives:
    """Every child process spawned (``lives``), and what ended them."""

    def __init__(self) -> None:
        self.lives: list[asyncio.subprocess.Process] = []
        self.kills = 0
        """SIGKILLs that ended a running child under load."""
        self.other_exits: list[int] = []
        """Exit statuses of lives that ended otherwise (each one is a harness or child failure)."""

    async def kill_one(self, proc: asyncio.subprocess.Process, *, crash: bool = True) -> None:
        """SIGKILL ``proc`` (if it still runs) and reap it, bounded; counted as a kill under
        load when ``crash`` (a final stop after the quiet period is not)."""
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
        code = await asyncio.wait_for(proc.wait(), REAP_S)
        if code != -signal.SIGKILL:
            self.other_exits.append(code)
        elif crash:
            self.kills += 1

    async def kill_all(self) -> None:
        """Kill and reap every life still running (teardown: never raises for one child)."""
        for proc in self.lives:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
        for proc in self.lives:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), REAP_S)


@attrs.define
class Quiet:
    """How the quiet period after the load ended."""

    settled: bool = False
    seconds: float = 0.0
    owed: int | None = None
    buffered: int | None = None

"""The child processes of a chaos run: one slot per gateway and per connector node, each a
succession of lives (spawned, maybe paused with SIGSTOP and resumed, SIGKILLed and reaped,
spawned again), each life's output appended to its slot's log file.

Every wait is bounded; :meth:`Children.kill_all` kills and reaps every life still running
(teardown: it never raises for one child)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

__all__ = ["READY_S", "Children", "Life", "Slot"]

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_S = 40.0
"""The bound on a life printing READY (spawn to serving), on a loaded machine."""
REAP_S = 10.0


@attrs.define
class Life:
    """One process of a slot."""

    proc: asyncio.subprocess.Process
    spawned_at: float
    offset: float
    """The clock offset (s) it was started with."""
    paused: bool = False
    killed: bool = False


@attrs.define
class Slot:
    """How to start one child (its module and arguments), where it logs, and its lives."""

    name: str
    module: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    log: Path
    lives: list[Life] = attrs.field(factory=list)

    @property
    def current(self) -> Life | None:
        """The life running now (None when it is dead)."""
        if self.lives and self.lives[-1].proc.returncode is None and not self.lives[-1].killed:
            return self.lives[-1]
        return None


class Children:
    """Every slot of a run, by name."""

    def __init__(self) -> None:
        self.slots: dict[str, Slot] = {}
        self.unexpected: list[str] = []
        """Lives that ended other than by the harness's SIGKILL (each is a failure)."""

    def add(
        self, name: str, module: str, args: Sequence[str], env: Mapping[str, str], log: Path
    ) -> Slot:
        """Declare slot ``name`` (nothing is started)."""
        slot = Slot(name, module, tuple(args), env, log)
        self.slots[name] = slot
        return slot

    async def spawn(self, name: str, offset: float = 0.0) -> Life:
        """Start a new life of ``name`` with clock offset ``offset``; returns once it printed
        READY.  Raises ``RuntimeError`` (the log's tail in the message) when it exits first or
        is not ready within :data:`READY_S`."""
        slot = self.slots[name]
        env = {**os.environ, **slot.env, "STATECORE_CHAOS_CLOCK_OFFSET": f"{offset:.3f}"}
        with slot.log.open("ab") as log:
            start = log.tell()
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                slot.module,
                *slot.args,
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        life = Life(proc, time.time(), offset)
        slot.lives.append(life)
        marker = f"pid={proc.pid} "
        deadline = time.monotonic() + READY_S
        while True:
            if any(line.startswith("READY") and marker in line for line in _lines(slot.log, start)):
                return life
            if proc.returncode is not None or time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await asyncio.wait_for(proc.wait(), REAP_S)
                life.killed = True
                tail = "\n".join(_lines(slot.log, start)[-25:])
                raise RuntimeError(
                    f"{name} (pid {proc.pid}) not ready within {READY_S:g} s "
                    f"(exit status {proc.returncode}); its log ends:\n{tail}"
                )
            await asyncio.sleep(0.05)

    async def kill(self, name: str) -> bool:
        """SIGKILL the current life of ``name`` and reap it (bounded); False when none runs."""
        life = self.slots[name].current
        if life is None:
            return False
        life.killed = True
        with contextlib.suppress(ProcessLookupError):
            life.proc.send_signal(signal.SIGKILL)
        code = await asyncio.wait_for(life.proc.wait(), REAP_S)
        if code != -signal.SIGKILL:
            self.unexpected.append(f"{name} pid {life.proc.pid} exited with {code}")
        return True

    def pause(self, name: str) -> bool:
        """SIGSTOP the current life of ``name``; False when none runs."""
        life = self.slots[name].current
        if life is None:
            return False
        life.proc.send_signal(signal.SIGSTOP)
        life.paused = True
        return True

    def resume(self, name: str) -> None:
        """SIGCONT every paused life of ``name`` (the zombie wakes up)."""
        for life in self.slots[name].lives:
            if life.paused and life.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    life.proc.send_signal(signal.SIGCONT)
            life.paused = False

    def check(self) -> None:
        """Note every life that ended on its own since the last check (a crash of a child)."""
        for slot in self.slots.values():
            for life in slot.lives:
                code = life.proc.returncode
                if code is not None and not life.killed:
                    life.killed = True
                    self.unexpected.append(f"{slot.name} pid {life.proc.pid} exited with {code}")

    async def kill_all(self) -> None:
        """Kill and reap every life still running (teardown: never raises for one child)."""
        lives = [life for slot in self.slots.values() for life in slot.lives]
        for life in lives:
            if life.proc.returncode is None:
                life.killed = True
                with contextlib.suppress(ProcessLookupError):
                    life.proc.send_signal(signal.SIGKILL)
        for life in lives:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(life.proc.wait(), REAP_S)

    def pids(self) -> dict[int, str]:
        """Every pid ever spawned -> its slot's name."""
        return {life.proc.pid: s.name for s in self.slots.values() for life in s.lives}


def _lines(path: Path, start: int = 0) -> list[str]:
    """The lines of ``path`` from byte ``start`` on."""
    try:
        with path.open("rb") as file:
            file.seek(start)
            return file.read().decode(errors="replace").splitlines()
    except OSError:
        return []

"""A deterministic asyncio event loop on virtual time, on which the real runtime runs.

:class:`SimLoop` is an ordinary asyncio loop (the real ``Gateway``, ``Connector`` and
``websockets`` run on it unchanged) with four differences, each what a simulation needs:

* **Virtual time.**  ``time()`` is the loop's own clock.  When nothing is ready, the loop jumps
  it to the next timer instead of waiting, so an hour of timers costs no real time, and what
  runs when depends only on what was scheduled -- never on how fast the machine is.
* **No threads.**  ``run_in_executor`` (and so ``asyncio.to_thread``) runs its function inline
  and hands back a finished future: store work happens at a point of the loop's order, not when
  a thread gets scheduled.  Parts with their own worker threads take ``threads=False``.
* **Processes.**  Code runs in a process *life* (:class:`Life`), carried by a context variable
  into every task and callback it starts.  :meth:`SimLoop.kill` is a SIGKILL: from then on no
  callback of that life runs again (no ``finally``, no ``except CancelledError``), and its
  sockets vanish (:mod:`relay.sim.sockets`).  What it wrote to a store stays.
* **An in-memory network.**  ``create_connection`` and ``create_server`` use
  :class:`relay.sim.sockets.SimNetwork` instead of the kernel's sockets.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, TypeVarTuple, Unpack

from relay.sim.lives import PROCESS, Life
from relay.sim.sockets import SimNetwork
from relay.sim.world import EPOCH, ProcessClock, SimClock

__all__ = ["EPOCH", "PROCESS", "Deadlock", "Life", "LoopClock", "SimLoop", "collect_quietly"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

log = logging.getLogger(__name__)


class Deadlock(RuntimeError):
    """Nothing is ready and nothing is scheduled: the simulated system can never move again."""


class _Clockwork:
    """The loop's selector: there is nothing to select on, so waiting is jumping the clock."""

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        if timeout is None:
            raise Deadlock("nothing is ready and no timer is set")
        self._loop.advance(timeout)
        return []

    def close(self) -> None:
        """Nothing to release."""


class SimLoop(asyncio.BaseEventLoop):
    """The deterministic loop (see the module docs).  ``SimLoop(rng)``: ``rng`` (a
    ``random.Random``) is the network's only source of chance."""

    def __init__(self, rng: Any) -> None:
        super().__init__()
        self._now = 0.0
        self._clock_resolution = 1e-6
        self._selector = _Clockwork(self)
        self.dead: set[Life] = set()
        """Lives that were killed: none of their callbacks runs again."""
        self.net = SimNetwork(self, rng, dead=self.dead)
        """The network every life's sockets go through."""
        self.steps = 0
        """Turns of the loop so far."""
        self.tasks: list[asyncio.Task[Any]] = []
        """Every task of every life, held so that a killed life's coroutines are never
        collected (collecting one runs its ``finally`` blocks: not what a SIGKILL does)."""
        self.errors: list[str] = []
        """What the loop's exception handler saw (unexpected errors of living code)."""
        self.set_exception_handler(self._record_error)

    # -- time --------------------------------------------------------------------------------

    def time(self) -> float:
        """Virtual time (seconds since the world began)."""
        return self._now

    def _run_once(self) -> None:
        self.steps += 1
        super()._run_once()  # type: ignore[misc]

    def advance(self, seconds: float) -> None:
        """Jump the clock forward (the loop does this itself when it would wait)."""
        self._now += max(0.0, seconds)

    # -- processes ---------------------------------------------------------------------------

    def spawn(self, life: Life, main: Callable[[], Any]) -> asyncio.Task[Any]:
        """Start ``main()`` (a coroutine function) as the first task of ``life``."""
        context = contextvars.copy_context()
        context.run(PROCESS.set, life)
        return self.create_task(main(), name=str(life), context=context)

    def kill(self, life: Life) -> None:
        """SIGKILL ``life``: none of its callbacks runs again, its listeners go and its sockets
        vanish (each peer reset)."""
        self.dead.add(life)
        self.net.vanish(life)

    def create_task(self, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = super().create_task(coro, **kwargs)
        self.tasks.append(task)
        return task

    def bury(self) -> None:
        """After the world ended: let go of every task, handle and socket, without letting a
        dead life's ``finally`` blocks speak (see :func:`collect_quietly`).  Call
        :func:`collect_quietly` again once the world's last reference is gone."""
        self.tasks.clear()
        self._ready.clear()  # type: ignore[attr-defined]
        self._scheduled.clear()  # type: ignore[attr-defined]
        self.net.ends.clear()
        self.net.listeners.clear()
        collect_quietly()

    def call_soon(
        self,
        callback: Callable[[Unpack[Ts]], object],
        *args: *Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        return super().call_soon(self._guarded(callback, context), *args, context=context)

    def call_at(
        self,
        when: float,
        callback: Callable[[Unpack[Ts]], object],
        *args: *Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        return super().call_at(when, self._guarded(callback, context), *args, context=context)

    def _guarded(
        self, callback: Callable[[Unpack[Ts]], object], context: contextvars.Context | None
    ) -> Callable[[Unpack[Ts]], object]:
        """``callback``, made a no-op once the life it belongs to is killed."""
        life = PROCESS.get() if context is None else context.get(PROCESS)
        if life is None:
            return callback
        dead = self.dead

        def guarded(*args: *Ts) -> None:
            if life not in dead:
                callback(*args)

        return guarded

    # -- no threads --------------------------------------------------------------------------

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        """Run ``func(*args)`` now, on the loop; its result (or error) in a finished future."""
        future: asyncio.Future[T] = self.create_future()
        try:
            result = func(*args)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # handed to the awaiting caller, as an executor does
            future.set_exception(exc)
        else:
            future.set_result(result)
        return future

    def _write_to_self(self) -> None:
        """Nothing to wake: the loop never waits."""

    def _process_events(self, event_list: list[Any]) -> None:
        """No events: sockets are in memory."""

    # -- the network -------------------------------------------------------------------------

    async def create_connection(  # type: ignore[override]
        self, protocol_factory: Callable[[], asyncio.BaseProtocol], host: str, port: int, **_: Any
    ) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        """Dial ``host:port`` on the simulated network (see :meth:`SimNetwork.connect`)."""
        return await self.net.connect(protocol_factory, host, port)

    async def create_server(  # type: ignore[override]
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        host: str,
        port: int,
        **_: Any,
    ) -> Any:
        """Listen on ``host:port`` of the simulated network (see :meth:`SimNetwork.listen`)."""
        return self.net.listen(protocol_factory, host, port)

    # -- errors ------------------------------------------------------------------------------

    def _record_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        exc = context.get("exception")
        text = f"{message}: {exc!r}" if exc is not None else message
        self.errors.append(text)
        log.debug("loop error: %s", text)


def collect_quietly() -> None:
    """Collect the garbage a simulated world left, now, and silently: a killed life's
    coroutines run their ``finally`` blocks as they are collected (no SIGKILL would let them),
    and whatever they say or raise then is not the world's.  Collecting here, not at some later
    allocation, keeps that code from running inside unrelated work."""
    hook, sys.unraisablehook = sys.unraisablehook, lambda _: None
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(5):  # what dying coroutines leave behind goes too
                if not gc.collect():
                    break
    finally:
        logging.disable(logging.NOTSET)
        sys.unraisablehook = hook


class _LoopTime(SimClock):
    """The world's clocks read off the loop: its virtual time is the monotonic clock."""

    def __init__(self, loop: SimLoop) -> None:
        super().__init__()
        self.loop = loop

    def now(self) -> float:
        """The wall clock (seconds since the epoch)."""
        return self.loop.time() + self.wall_offset

    def monotonic(self) -> float:
        """The loop's virtual time."""
        return self.loop.time()


class LoopClock(ProcessClock):
    """The project's clock seam for one simulated process: a
    :class:`~relay.sim.world.ProcessClock` on the loop's virtual time (a wall clock with the
    process's own ``offset``), whose ``sleep`` waits on the loop."""

    def __init__(self, loop: SimLoop) -> None:
        super().__init__(_LoopTime(loop))

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of virtual time (negative or NaN: zero)."""
        await asyncio.sleep(seconds if seconds > 0 else 0.0)

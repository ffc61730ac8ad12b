"""The deterministic loop: virtual time, inline executor work, lives that a kill stops dead,
and the in-memory network's connections, resets, partitions and half-open sockets."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from relay.sim.lives import PROCESS, Life
from relay.sim.loop import EPOCH, Deadlock, LoopClock, SimLoop, collect_quietly

T = TypeVar("T")


def run(main: Callable[[SimLoop], Coroutine[Any, Any, T]]) -> T:
    loop = SimLoop(random.Random(1))
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.bury()
        loop.close()
        del loop
        collect_quietly()


class Recorder(asyncio.Protocol):
    """A protocol that keeps what it received and how it ended."""

    def __init__(self) -> None:
        self.data = b""
        self.eof = False
        self.lost: list[Exception | None] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.data += data

    def eof_received(self) -> bool:
        self.eof = True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)


def test_an_hour_of_timers_takes_no_real_time() -> None:
    async def main(loop: SimLoop) -> tuple[float, float]:
        clock = LoopClock(loop)
        clock.offset = -30.0
        await asyncio.sleep(3600)
        await clock.sleep(1.5)
        return loop.time(), clock.now()

    began = time.monotonic()
    virtual, wall = run(main)
    assert virtual == pytest.approx(3601.5)
    assert wall == pytest.approx(EPOCH + 3601.5 - 30.0)
    assert time.monotonic() - began < 5.0


def test_executor_work_runs_inline_on_the_loop_thread() -> None:
    async def main(loop: SimLoop) -> int:
        ident = await asyncio.to_thread(threading.get_ident)
        with pytest.raises(ZeroDivisionError):
            await loop.run_in_executor(None, lambda: 1 / 0)
        return ident

    assert run(main) == threading.get_ident()


def test_nothing_to_do_is_a_deadlock_not_a_hang() -> None:
    async def main(loop: SimLoop) -> None:
        await loop.create_future()  # nobody will ever set it

    with pytest.raises(Deadlock):
        run(main)


def test_a_killed_life_runs_no_callback_and_no_finally() -> None:
    ran: list[str] = []

    async def victim() -> None:
        try:
            while True:
                await asyncio.sleep(1.0)
                ran.append(f"tick {PROCESS.get()}")
        finally:
            ran.append("finally")  # a SIGKILL never gets here

    async def main(loop: SimLoop) -> list[str]:
        life = Life("victim", "host-a", 1)
        loop.spawn(life, victim)
        await asyncio.sleep(2.5)
        loop.kill(life)
        await asyncio.sleep(5.0)
        return list(ran)

    assert run(main) == ["tick victim#1", "tick victim#1"]


def test_bytes_arrive_in_order_and_a_kill_resets_the_peer() -> None:
    async def main(loop: SimLoop) -> tuple[bytes, list[Exception | None], type]:
        server_side = Recorder()
        server = Life("server", "host-s", 1)
        client = Life("client", "host-c", 2)

        async def listen() -> None:
            await loop.create_server(lambda: server_side, "10.0.0.1", 80)
            await asyncio.Event().wait()

        loop.spawn(server, listen)
        await asyncio.sleep(0.1)
        mine = Recorder()

        async def dial() -> None:
            transport, _ = await loop.create_connection(lambda: mine, "10.0.0.1", 80)
            for n in range(50):
                transport.write(b"%d," % n)
            await asyncio.Event().wait()

        loop.spawn(client, dial)
        await asyncio.sleep(1.0)
        loop.kill(server)
        await asyncio.sleep(1.0)
        refused: type = type(None)

        async def redial() -> None:
            nonlocal refused
            try:
                await loop.create_connection(Recorder, "10.0.0.1", 80)
            except ConnectionRefusedError as exc:
                refused = type(exc)

        await loop.spawn(Life("client", "host-c", 3), redial)
        return server_side.data, mine.lost, refused

    data, lost, refused = run(main)
    assert data == b"".join(b"%d," % n for n in range(50))
    assert len(lost) == 1
    assert isinstance(lost[0], ConnectionResetError)
    assert refused is ConnectionRefusedError


def test_a_partition_holds_traffic_and_a_half_open_socket_loses_it_silently() -> None:
    async def main(loop: SimLoop) -> tuple[bytes, bytes, list[Exception | None]]:
        far = Recorder()
        loop.spawn(Life("server", "host-s", 1), lambda: _listen(loop, far))
        await asyncio.sleep(0.1)
        near = Recorder()
        held: list[asyncio.Transport] = []

        async def dial() -> None:
            transport, _ = await loop.create_connection(lambda: near, "10.0.0.1", 80)
            held.append(transport)
            await asyncio.Event().wait()

        loop.spawn(Life("client", "host-c", 2), dial)
        await asyncio.sleep(0.5)
        loop.net.partition("host-c", True)
        held[0].write(b"during")
        await asyncio.sleep(10.0)
        during = far.data
        loop.net.partition("host-c", False)
        await asyncio.sleep(1.0)
        healed = far.data
        assert loop.net.black_hole("host-c") == 1
        held[0].write(b"lost")
        await asyncio.sleep(5.0)
        assert far.data == healed
        return during, healed, near.lost

    during, healed, lost = run(main)
    assert (during, healed, lost) == (b"", b"during", [])


def test_held_data_waits_until_both_of_its_hosts_are_healed() -> None:
    """Both hosts partitioned: healing the receiver's host alone sends nothing (the sender is
    still cut off); healing the sender's too sends everything held, in order."""

    async def main(loop: SimLoop) -> tuple[bytes, bytes, bytes]:
        far = Recorder()
        loop.spawn(Life("server", "host-s", 1), lambda: _listen(loop, far))
        await asyncio.sleep(0.1)
        held: list[asyncio.Transport] = []

        async def dial() -> None:
            transport, _ = await loop.create_connection(Recorder, "10.0.0.1", 80)
            held.append(transport)
            await asyncio.Event().wait()

        loop.spawn(Life("client", "host-c", 2), dial)
        await asyncio.sleep(0.5)
        loop.net.partition("host-c", True)
        loop.net.partition("host-s", True)
        for n in range(20):
            held[0].write(b"%d," % n)
        await asyncio.sleep(5.0)
        during = far.data
        loop.net.partition("host-s", False)
        await asyncio.sleep(5.0)
        half_healed = far.data
        loop.net.partition("host-c", False)
        await asyncio.sleep(5.0)
        return during, half_healed, far.data

    during, half_healed, healed = run(main)
    assert (during, half_healed) == (b"", b"")
    assert healed == b"".join(b"%d," % n for n in range(20))


async def _listen(loop: SimLoop, protocol: asyncio.Protocol) -> None:
    await loop.create_server(lambda: protocol, "10.0.0.1", 80)
    await asyncio.Event().wait()


def test_a_graceful_close_delivers_eof_and_ends_both_sides() -> None:
    async def main(loop: SimLoop) -> tuple[bool, int, int]:
        far = Recorder()
        loop.spawn(Life("server", "host-s", 1), lambda: _listen(loop, far))
        await asyncio.sleep(0.1)
        near = Recorder()
        transport, _ = await loop.create_connection(lambda: near, "10.0.0.1", 80)
        transport.write(b"bye")
        transport.close()
        await asyncio.sleep(1.0)
        return far.eof, len(far.lost), len(near.lost)

    assert run(main) == (True, 1, 1)

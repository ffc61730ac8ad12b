"""The in-memory network of :class:`relay.sim.loop.SimLoop`: asyncio transports whose bytes
travel between two protocols on virtual time, and listeners in place of server sockets.

A connection is a pair of :class:`_End` transports.  Bytes (and the end-of-stream) arrive in
order, after a latency drawn from the world's ``rng`` (longer during a delay spike).  What a
host in a partition sends or should receive is held until neither host of its connection
is partitioned any more (TCP keeps retransmitting); a black-holed connection loses everything
silently (a half-open socket).  When a life is killed its ends vanish and each peer gets a
reset.  Data that reaches an end already closed is answered with a reset, as a kernel does.
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import itertools
import socket
from collections.abc import Callable
from typing import Any

from relay.sim.lives import PROCESS, Life

__all__ = ["SimNetwork", "SimServer"]

_EOF = None
_STEP_S = 1e-5
"""The least time between two arrivals on one direction of a connection."""


def _host_of(life: Life | None) -> str:
    """The host ``life`` runs on (the world's own code runs on host ``world``)."""
    return life.host if life is not None else "world"


class _End(asyncio.Transport):
    """One end of an in-memory connection, owned by one life."""

    def __init__(
        self,
        net: SimNetwork,
        life: Life | None,
        context: contextvars.Context,
        sockname: tuple[str, int],
        peername: tuple[str, int],
    ) -> None:
        super().__init__()
        self.net = net
        self.life = life
        self.context = context
        self.peer: _End | None = None
        self.protocol: asyncio.Protocol | None = None
        self.closing = False  # close() or abort() called, or the connection is gone
        self.lost = False  # connection_lost delivered
        self.eof_sent = False
        self.black_hole = False  # this end's traffic is lost silently (half-open)
        self.paused = False
        self.inbox: list[bytes | None] = []  # arrived while reading was paused
        self.arrival = 0.0  # when the last thing sent reaches the peer (order holds)
        self.held: list[bytes | None] = []  # sent during a partition
        self._extra = {"sockname": sockname, "peername": peername, "socket": None}

    @property
    def host(self) -> str:
        """The host this end lives on."""
        return _host_of(self.life)

    # -- asyncio.Transport -------------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol  # type: ignore[assignment]

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None
        return self.protocol

    def is_closing(self) -> bool:
        return self.closing

    def is_reading(self) -> bool:
        return not self.paused

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        if not self.paused:
            return
        self.paused = False
        inbox, self.inbox = self.inbox, []
        for item in inbox:
            self.net.loop.call_soon(self.arrive, item, context=self.context)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """Writes never back up: the in-memory network takes everything at once."""

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 0)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closing or self.eof_sent or not data:
            return
        self.net.carry(self, bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if self.closing or self.eof_sent:
            return
        self.eof_sent = True
        self.net.carry(self, _EOF)

    def close(self) -> None:
        if self.closing:
            return
        if not self.eof_sent:
            self.eof_sent = True
            self.net.carry(self, _EOF)
        self.closing = True
        self.net.loop.call_soon(self.connection_lost, None, context=self.context)

    def abort(self) -> None:
        if self.lost:
            return
        self.closing = True
        self.net.reset_peer(self)
        self.net.loop.call_soon(self.connection_lost, None, context=self.context)

    # -- what the network calls ----------------------------------------------------------------

    def arrive(self, item: bytes | None) -> None:
        """Bytes (or the end of the stream) from the peer reach this end."""
        if self.lost or self.protocol is None:
            if item is not _EOF and self.peer is not None:
                self.net.reset_peer(self)  # nobody reads here any more: the kernel resets
            return
        if self.paused:
            self.inbox.append(item)
            return
        if item is _EOF:
            if not self.protocol.eof_received():
                self.close()
            return
        self.protocol.data_received(item)

    def reset(self) -> None:
        """The peer reset the connection."""
        if not self.lost:
            self.closing = True
            self.connection_lost(ConnectionResetError(errno.ECONNRESET, "connection reset"))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lost:
            return
        self.lost = self.closing = True
        self.net.forget(self)
        if self.protocol is not None:
            self.protocol.connection_lost(exc)


class _Sock:
    """What a listener shows as its socket: a name (IPv4)."""

    family = socket.AF_INET

    def __init__(self, name: tuple[str, int]) -> None:
        self._name = name

    def getsockname(self) -> tuple[str, int]:
        return self._name


class SimServer:
    """What ``create_server`` returns: enough of ``asyncio.Server`` for ``websockets``."""

    def __init__(self, net: SimNetwork, key: tuple[str, int]) -> None:
        self._net = net
        self._key = key
        self.sockets = (_Sock(key),)

    def close(self) -> None:
        self._net.listeners.pop(self._key, None)

    def is_serving(self) -> bool:
        return self._key in self._net.listeners

    async def start_serving(self) -> None:
        """Listening starts at once."""

    async def wait_closed(self) -> None:
        """Nothing to wait for."""

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._net.loop


class _Listener:
    def __init__(
        self, life: Life | None, context: contextvars.Context, factory: Callable[[], Any]
    ) -> None:
        self.life = life
        self.context = context
        self.factory = factory

    @property
    def host(self) -> str:
        """The host the listening life runs on."""
        return _host_of(self.life)


class SimNetwork:
    """The network (see the module docs).  ``latency_s`` bounds a one-way trip; a spike (see
    :attr:`spike_until`) adds up to ``spike_s``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        rng: Any,
        *,
        dead: set[Life],
        latency_s: tuple[float, float] = (0.0005, 0.02),
        spike_s: float = 1.5,
    ) -> None:
        self.loop = loop
        self.rng = rng
        self.dead = dead  # the lives that were killed (the loop's)
        self.latency_s = latency_s
        self.spike_s = spike_s
        self.spike_until = -1.0
        """Until this virtual time, trips take up to ``spike_s`` longer."""
        self.partitioned: set[str] = set()
        """Hosts cut off from the others (their traffic is held)."""
        self.listeners: dict[tuple[str, int], _Listener] = {}
        self.ends: list[_End] = []
        self._ports = itertools.count(40000)

    def trip(self) -> float:
        """One one-way latency."""
        low, high = self.latency_s
        extra = self.rng.uniform(0.0, self.spike_s) if self.loop.time() < self.spike_until else 0
        return float(self.rng.uniform(low, high) + extra)

    # -- connecting ----------------------------------------------------------------------------

    def listen(self, factory: Callable[[], Any], host: str, port: int) -> SimServer:
        """Listen on ``host:port`` (0: a free port) for the running life; ``OSError`` when a
        living listener has it."""
        port = port or next(self._ports)
        key = (host, port)
        holder = self.listeners.get(key)
        if holder is not None and holder.life not in self.dead:
            raise OSError(errno.EADDRINUSE, f"address already in use: {host}:{port}")
        self.listeners[key] = _Listener(PROCESS.get(), contextvars.copy_context(), factory)
        return SimServer(self, key)

    async def connect(
        self, factory: Callable[[], Any], host: str, port: int
    ) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        """Dial ``host:port`` for the running life: one round trip, longer while either side
        is partitioned (a SYN retried); ``ConnectionRefusedError`` when nothing (alive)
        listens there."""
        life = PROCESS.get()
        me = _host_of(life)
        await asyncio.sleep(self.trip() * 2)
        listener = self.listeners.get((host, port))
        while listener is not None and (
            me in self.partitioned or listener.host in self.partitioned
        ):
            await asyncio.sleep(1.0)
            listener = self.listeners.get((host, port))
        if listener is None or listener.life in self.dead:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"connection refused: {host}:{port}")
        local = (me, next(self._ports))
        client = _End(self, life, contextvars.copy_context(), local, (host, port))
        server = _End(self, listener.life, listener.context, (host, port), local)
        client.peer, server.peer = server, client
        self.ends += (client, server)
        server_protocol = listener.context.run(listener.factory)
        server.set_protocol(server_protocol)
        listener.context.run(server_protocol.connection_made, server)
        protocol = factory()
        client.set_protocol(protocol)
        protocol.connection_made(client)
        return client, protocol

    # -- carrying ------------------------------------------------------------------------------

    def carry(self, sender: _End, item: bytes | None) -> None:
        """Send ``item`` (bytes, or None for the end of the stream) to ``sender``'s peer."""
        peer = sender.peer
        if peer is None or sender.black_hole or peer.black_hole:
            return
        if sender.host in self.partitioned or peer.host in self.partitioned:
            sender.held.append(item)
            return
        self._schedule(sender, peer, item)

    def _schedule(self, sender: _End, peer: _End, item: bytes | None) -> None:
        # Strictly later than what went before: timers due at one instant run in no set
        # order, and a stream's bytes must arrive in the order they were sent.
        sender.arrival = max(sender.arrival + _STEP_S, self.loop.time() + self.trip())
        self.loop.call_at(sender.arrival, peer.arrive, item, context=peer.context)

    def reset_peer(self, end: _End) -> None:
        """``end`` resets its connection: the peer hears of it after a trip."""
        peer = end.peer
        if peer is None or peer.lost or end.black_hole or peer.black_hole:
            return
        if end.host in self.partitioned or peer.host in self.partitioned:
            return  # the RST is lost; the peer finds out by its own timeouts
        self.loop.call_at(self.loop.time() + self.trip(), peer.reset, context=peer.context)

    def forget(self, end: _End) -> None:
        """``end`` is gone: stop tracking it."""
        if end in self.ends:
            self.ends.remove(end)

    # -- faults --------------------------------------------------------------------------------

    def vanish(self, life: Life) -> None:
        """``life`` was killed: its listeners go; its ends are gone, each peer reset."""
        for key, listener in list(self.listeners.items()):
            if listener.life == life:
                del self.listeners[key]
        for end in [e for e in self.ends if e.life == life]:
            self.reset_peer(end)
            end.lost = end.closing = True
            self.forget(end)

    def partition(self, host: str, cut: bool) -> None:
        """Cut ``host`` off (``cut``) or heal it: on heal, what was held on a connection whose
        two hosts are both out of every partition now is sent, in order."""
        if cut:
            self.partitioned.add(host)
            return
        self.partitioned.discard(host)
        for end in list(self.ends):
            peer = end.peer
            if (
                end.held
                and peer is not None
                and end.host not in self.partitioned
                and peer.host not in self.partitioned
            ):
                held, end.held = end.held, []
                for item in held:
                    self._schedule(end, peer, item)

    def black_hole(self, host: str) -> int:
        """Make every connection of ``host`` half-open: nothing more arrives either way and
        neither side is told.  Returns how many connections it took."""
        hit = 0
        for end in self.ends:
            if end.host == host and not end.black_hole:
                end.black_hole = True
                hit += 1
        return hit

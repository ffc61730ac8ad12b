"""The fault proxy: an asyncio TCP forwarder on 127.0.0.1 in front of every link a chaos run
may partition (each process -> PostgreSQL, each gateway -> the connector nodes).

One :class:`Link` is one listening port with one or more upstreams (the connector link has
both nodes: each new connection goes to the next one that accepts, so the proxy is also the
"one URL" in front of the cluster).  A link's :attr:`Link.mode` applies to every connection of
the link, the live ones and the new ones:

* ``pass``: bytes flow both ways;
* ``blackhole``: bytes flow neither way.  Nothing is dropped and nothing is reset: what a side
  wrote is held (in the proxy and in the kernel's buffers, which fill and close the TCP window)
  and flows when the link heals, as TCP retransmission would deliver it after a real partition.
  A new connection is accepted (the kernel does that) but its upstream is not dialled until the
  link heals, so a client's connect completes and its protocol handshake hangs;
* ``up`` / ``down``: one-way loss -- only the client-to-upstream (``up``) or only the
  upstream-to-client (``down``) direction is held, the other flows;
* :meth:`Link.reset` closes every live connection of the link at once (both sides see the
  socket end), new ones pass.

Why a proxy rather than the kernel: this machine has no ``tc netem`` and no ``iptables``;
network namespaces would need both to drop packets.  The proxy's price: its own kernel
acknowledges what a client sends, so a client's TCP keepalives and ``tcp_user_timeout`` never
fire during a black hole -- only the client's own protocol timeouts can notice.  That is the
harder case for the system under test (a silent peer, like a stuck middlebox), not an easier
one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Sequence
from typing import Literal

__all__ = ["MODES", "Link", "Mode", "Proxy"]

Mode = Literal["pass", "blackhole", "up", "down"]
MODES: tuple[Mode, ...] = ("pass", "blackhole", "up", "down")
_CHUNK = 65_536
_CONNECT_S = 3.0
"""The bound on dialling one upstream (a node that is down refuses at once)."""


class _Conn:
    """One proxied connection: the client's socket, the upstream's, and the two pumps."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                transport = writer.transport
                with contextlib.suppress(Exception):
                    transport.abort()


class Link:
    """One partitionable link (see the module docs); built by :meth:`Proxy.link`."""

    def __init__(self, name: str, upstreams: Sequence[int], first: int = 0) -> None:
        self.name = name
        self.upstreams = list(upstreams)
        self.port = 0
        self._mode: Mode = "pass"
        self._up_open = asyncio.Event()
        self._down_open = asyncio.Event()
        self._up_open.set()
        self._down_open.set()
        self._conns: set[_Conn] = set()
        self._next = itertools.count(first)
        self._server: asyncio.Server | None = None
        self.accepted = 0
        self.resets = 0

    @property
    def mode(self) -> Mode:
        """The link's current mode."""
        return self._mode

    def set_mode(self, mode: Mode) -> None:
        """Switch every connection of the link (live and new) to ``mode``; ``ValueError`` for
        anything but :data:`MODES`."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self._mode = mode
        for gate, held in (
            (self._up_open, ("blackhole", "up")),
            (self._down_open, ("blackhole", "down")),
        ):
            if mode in held:
                gate.clear()
            else:
                gate.set()

    def heal(self) -> None:
        """Back to ``pass``: what was held flows."""
        self.set_mode("pass")

    def reset(self) -> int:
        """Close every live connection of the link (both sides); returns how many."""
        conns = list(self._conns)
        for conn in conns:
            conn.abort()
        self.resets += len(conns)
        return len(conns)

    @property
    def live(self) -> int:
        """Connections open through the link now."""
        return len(self._conns)

    async def start(self) -> None:
        """Listen on a fresh port of 127.0.0.1 (:attr:`port`)."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and close every connection; bounded, never raises."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self.set_mode("pass")
        tasks = [task for conn in self._conns for task in conn.tasks]
        self.reset()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 2.0)

    async def _dial(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        start = next(self._next)
        for step in range(len(self.upstreams)):
            port = self.upstreams[(start + step) % len(self.upstreams)]
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port), _CONNECT_S
                )
            except (OSError, TimeoutError):
                continue
        return None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        conn = _Conn(writer)
        self._conns.add(conn)
        try:
            # A black-holed link holds the connection before it is even dialled upstream.
            await self._up_open.wait()
            dialled = await self._dial()
            if dialled is None:
                return
            up_reader, up_writer = dialled
            conn.upstream = up_writer
            up = asyncio.ensure_future(self._pump(reader, up_writer, self._up_open))
            down = asyncio.ensure_future(self._pump(up_reader, writer, self._down_open))
            conn.tasks = [up, down]
            await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_COMPLETED)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(conn)
            for task in conn.tasks:
                task.cancel()
            conn.abort()

    @staticmethod
    async def _pump(
        source: asyncio.StreamReader, sink: asyncio.StreamWriter, gate: asyncio.Event
    ) -> None:
        """Copy ``source`` to ``sink``, holding each chunk (and the end) while ``gate`` is
        shut."""
        with contextlib.suppress(OSError, ConnectionError):
            while True:
                data = await source.read(_CHUNK)
                await gate.wait()
                if not data:
                    if sink.can_write_eof():
                        sink.write_eof()
                    await asyncio.sleep(0.05)
                    return
                sink.write(data)
                await sink.drain()


class Proxy:
    """Every link of a run, by name."""

    def __init__(self) -> None:
        self.links: dict[str, Link] = {}

    async def link(self, name: str, upstreams: Sequence[int]) -> Link:
        """Start a new link ``name`` in front of ``upstreams`` (ports on 127.0.0.1).  The links
        take turns for their first upstream, so the first connections of several links in front
        of the same nodes spread over them (as a load balancer would)."""
        if name in self.links:
            raise ValueError(f"a link named {name!r} exists already")
        link = Link(name, upstreams, first=sum(len(x.upstreams) > 1 for x in self.links.values()))
        await link.start()
        self.links[name] = link
        return link

    def heal_all(self) -> None:
        """Every link back to ``pass``."""
        for link in self.links.values():
            link.heal()

    async def stop(self) -> None:
        """Stop every link (bounded, never raises)."""
        for link in self.links.values():
            await link.stop()

"""The in-memory network: one connection per gateway dial, carrying wire lines both ways.

Each direction delivers in order (like TCP) after a delay drawn from the run's random source;
a connection that is cut tells both ends (after a short delay, as a reset would); a partitioned
connection (half-open) silently loses what is sent until it is healed or cut.
"""

from __future__ import annotations

from collections.abc import Callable

from relay.sim.world import World
from relay.wire.codec import FrameDecoder
from relay.wire.errors import ProtocolError
from relay.wire.frames import Frame

__all__ = ["Connection", "Network"]

Receiver = Callable[["Connection", Frame], None]
Closed = Callable[["Connection"], None]


class Network:
    """Delays and the connections made so far."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.base_delay = (0.001, 0.02)
        self.spike_until = -1.0
        self.count = 0
        self.protocol_errors = 0
        """Lines a decoder could not read (the simulated parts never write one: must be 0)."""

    def delay(self) -> float:
        """One message's latency (longer during a delay spike)."""
        low, high = self.base_delay
        if self.world.now < self.spike_until:
            low, high = 0.2, 1.5
        return self.world.rng.uniform(low, high)

    def connect(self, gateway_id: str) -> Connection:
        """A new connection of ``gateway_id`` (its ends are attached by the caller)."""
        self.count += 1
        return Connection(self, f"{gateway_id}#{self.count}", gateway_id)


class Connection:
    """Both ends of one connection; ``to_connector`` / ``to_gateway`` send one encoded line."""

    def __init__(self, net: Network, name: str, gateway_id: str) -> None:
        self.net = net
        self.name = name
        self.gateway_id = gateway_id
        self.open = True
        self.token = ""
        """The bearer token the gateway dialled with."""
        self.reason = ""
        """Why it was cut (once it was)."""
        self._partitioned_at: float | None = None
        self._last = {"c": 0.0, "g": 0.0}
        self._decoders = {"c": FrameDecoder(), "g": FrameDecoder()}
        self.on_connector: Receiver | None = None
        self.on_gateway: Receiver | None = None
        self.closed_connector: Closed | None = None
        self.closed_gateway: Closed | None = None

    @property
    def partitioned(self) -> bool:
        """True while what is sent either way is silently lost (half-open)."""
        return self._partitioned_at is not None

    def partition(self, on: bool) -> None:
        """Start (``on``) or heal the partition of this connection."""
        if on and self._partitioned_at is None:
            self._partitioned_at = self.net.world.now
        elif not on:
            self._partitioned_at = None

    def silent_for(self) -> float:
        """How long the far end has not answered a ping (0 when the link works)."""
        if self._partitioned_at is None:
            return 0.0
        return self.net.world.now - self._partitioned_at

    def to_connector(self, line: str) -> None:
        """Send one wire line to the connector's end."""
        self._send("c", line)

    def to_gateway(self, line: str) -> None:
        """Send one wire line to the gateway's end."""
        self._send("g", line)

    def _send(self, end: str, line: str) -> None:
        world = self.net.world
        if not self.open:
            return
        if self.partitioned:
            world.log(f"net {self.name}: lost to the partition")
            return
        when = max(self._last[end], world.now + self.net.delay())
        self._last[end] = when
        world.at(when - world.now, f"deliver {self.name}", lambda: self._arrive(end, line))

    def _arrive(self, end: str, line: str) -> None:
        if not self.open or self.partitioned:
            return
        receiver = self.on_connector if end == "c" else self.on_gateway
        for item in self._decoders[end].feed(line if line.endswith("\n") else line + "\n"):
            if isinstance(item, ProtocolError):
                self.net.protocol_errors += 1
                self.net.world.log(f"net {self.name}: protocol error {item.code}")
            elif receiver is not None:
                receiver(self, item)

    def cut(self, why: str) -> None:
        """End the connection; each end hears of it after a network delay."""
        if not self.open:
            return
        self.open = False
        self.reason = why
        world = self.net.world
        world.log(f"net {self.name}: cut ({why})")
        for closed in (self.closed_connector, self.closed_gateway):
            if closed is not None:
                world.at(self.net.delay(), f"closed {self.name}", self._telling(closed))

    def _telling(self, closed: Closed) -> Callable[[], None]:
        return lambda: closed(self)

"""The connector's record of one authenticated gateway connection: what it announced, where it
is in the :data:`~relay.connector.connection.CONNECTION` lifecycle, and the delivery state the
collaborators keep on it (replay records, the live outbox, the window)."""

from __future__ import annotations

import asyncio
import collections
import contextlib

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from relay.connector.connection import CONNECTION, ConnectionState
from relay.wire.compat import ACKED_LIVE
from relay.wire.frames import Hello
from relay.wire.throttle import LogLimits
from statecore.clock import Clock

__all__ = ["DEFAULT_WINDOW", "Instance"]

DEFAULT_WINDOW = 64
"""Unacked deliveries a gateway that acks live deliveries is sent at once, unless its hello
announced another ``window``."""

_C = ConnectionState


class Instance:
    """One authenticated connection of one gateway; its state is the CONNECTION machine.

    The collaborators read its state through the properties and ``is_*`` calls below (never by
    comparing states themselves), so the lifecycle's states are known to this module alone.
    """

    def __init__(
        self, gateway_id: str, ws: ServerConnection, features: frozenset[str], clock: Clock
    ) -> None:
        self.gateway_id = gateway_id
        self.ws = ws
        # What the gateway announced (upgrade header, then hellos); empty: an original gateway,
        # which is sent nothing the original contract did not have.
        self.features = features
        self.protocol_hello = False  # a hello carried ``protocol``: not an original gateway
        self.identities: list[tuple[str, str]] = []
        self.machine = CONNECTION.track()  # many per connector: the table alone
        self.held_hellos: list[Hello] = []  # said while on standby, answered once promoted
        self.appended = 0  # events buffered for this instance while it replays
        self.violations = 0
        # What the peer can cause never floods the log: each kind of line is rate-limited on
        # its own (relay.connector._log); what it suppressed is reported when this closes.
        self.log_limit = LogLimits(clock=clock)
        # Replayed bufferIds, in send order, with when they were sent (loop time), whose replay
        # is not recorded yet and that have not been acked on this connection.
        self.unrecorded: dict[str, float] = {}
        self.record_timer: asyncio.Task[None] | None = None
        # Durable live delivery (ACKED_LIVE): buffered lines waiting for the pump, the seq of
        # the newest line handed to the socket (never sent twice), the pump and its wake-up.
        self.outbox: collections.deque[tuple[str, int, str]] = collections.deque()
        self.last_sent_seq: int | None = None
        self.pump: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()
        # The window: bufferIds sent on this connection and not acked yet; with ACKED_LIVE no
        # more than ``window`` of them at once (the gateway's bound on what it holds).
        self.window = DEFAULT_WINDOW
        self.unacked: set[str] = set()
        self.window_open = asyncio.Event()
        # A cluster node's delivery of entries other nodes appended: whether a catch-up is due,
        # the task running it, and the foreign bufferIds waiting in ``outbox`` (they never move
        # ``last_sent_seq``: seqs of different nodes are not in commit order).
        self.catch_up_due = False
        self.catch_up_task: asyncio.Task[None] | None = None
        self.foreign_queued: set[str] = set()
        # While a catch-up read is in flight: the bufferIds that left ``unacked`` or
        # ``unrecorded`` meanwhile (acked, or recorded as sent) -- the read may have seen them
        # still ``buffered``, and they must not be sent again.
        self.left_during_read: set[str] | None = None

    @property
    def acked_live(self) -> bool:
        """True when the gateway acks live deliveries: every event goes through the buffer."""
        return ACKED_LIVE in self.features

    @property
    def state(self) -> ConnectionState:
        """Where the connection is in its lifecycle."""
        return self.machine.state

    @property
    def live(self) -> bool:
        """True when inbound may be delivered live (not buffered) to this connection."""
        return self.is_live()

    @property
    def awake(self) -> bool:
        """True when the gateway said hello and has not asked to be buffered for."""
        return self.machine.state in (_C.REPLAYING, _C.LIVE)

    @property
    def announced(self) -> bool:
        """True when the gateway announced itself (features on the upgrade, or ``protocol`` in a
        hello): not an original-contract gateway."""
        return self.protocol_hello or bool(self.features)

    def platforms(self) -> set[str]:
        """The platforms it said hello for."""
        return {platform for platform, _ in self.identities}

    # Calls, not properties: the state changes across awaits, and a type checker would narrow a
    # property read before an await to what it was then.

    def is_handshaken(self) -> bool:
        """True once it said hello, until it closes (replaying, live or buffered-only)."""
        return self.machine.state in (_C.REPLAYING, _C.LIVE, _C.BUFFERED_ONLY)

    def is_live(self) -> bool:
        """True while inbound may be delivered live (not buffered) to this connection."""
        return self.machine.state is _C.LIVE

    def is_standby(self) -> bool:
        """True while it waits unserved for the served connection of its gateway to go."""
        return self.machine.state is _C.STANDBY

    def is_replaying(self) -> bool:
        """True while its buffered backlog is being replayed."""
        return self.machine.state is _C.REPLAYING

    def is_closed(self) -> bool:
        """True once the connection ended."""
        return self.machine.state is _C.CLOSED

    async def send(self, text: str) -> bool:
        """Send one line; False (not ``ConnectionClosed``) when the connection is closed."""
        try:
            await self.ws.send(text)
        except ConnectionClosed:
            return False
        return True

    async def close(self, code: int, reason: str) -> None:
        """Close the connection with ``code`` (a connection already closed is left as is)."""
        with contextlib.suppress(ConnectionClosed):
            await self.ws.close(code, reason)

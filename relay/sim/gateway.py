"""A gateway of a world: the real :class:`~statecore.Ledger` on its store, with the event flow
of the gateway runtime around it.

For every buffered message it receives it records the reply (idempotent: the same message
handled twice records one obligation) and only then acks the bufferId; a reply it owns and that
is still ``pending`` is sent at once.  A send that fails, times out or loses its connection is
marked failed (an ambiguous one as such) and retried by the runtime sweep, labelled; a send
stuck by a failed store write is reclaimed by the stuck sweep; a new life claims what its dead
predecessors owed (the recovery sweep) and resends it, labelled.  Liveness of a previous life
is answered by the world (:class:`SimProbe`), as the process table answers it on a host.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from relay.sim.faults import FlakyStore
from relay.sim.net import Connection, Network
from relay.sim.platform import PLATFORM
from relay.sim.world import ProcessClock, World
from relay.wire.auth import mint_token
from relay.wire.codec import encode
from relay.wire.frames import (
    EGRESS_DECLINED,
    Frame,
    Hello,
    Inbound,
    InboundAck,
    InboundEvent,
    Outbound,
    OutboundOutcome,
    OutboundResult,
)
from statecore.errors import InvalidTransition, StaleState, StoreError, UnknownEntity
from statecore.ledger import Ledger
from statecore.lifecycles import ObligationState
from statecore.obligation import Claim
from statecore.ownership import Incarnation
from statecore.policy import ErrorKind, LedgerPolicy

__all__ = ["HOST", "POLICY", "SimGateway", "SimProbe"]

HOST = "sim-host"
POLICY = LedgerPolicy(max_attempts=6, retry_backoff=(0.5, 2.0), stale_after=86_400.0)
REQUEST_TIMEOUT_S = 6.0
TICK_S = 1.0
KEEPALIVE_S = 5.0
"""A connection whose pings went unanswered this long is cut (websockets' keepalive)."""
_SETTLE_ERRORS = (StoreError, StaleState, InvalidTransition, UnknownEntity)


class SimProbe:
    """The world's process table: a pid lives while its life runs."""

    def __init__(self) -> None:
        self.alive: dict[int, int] = {}  # pid -> start time

    def pid_exists(self, pid: int) -> bool:
        """True while that life runs."""
        return pid in self.alive

    def start_time(self, pid: int) -> int | None:
        """The life's start (its pid's identity), None when gone."""
        return self.alive.get(pid)


class SimGateway:
    """See the module docs.  ``connector_attach`` connects a new connection's far end."""

    def __init__(
        self,
        world: World,
        net: Network,
        gateway_id: str,
        *,
        store: FlakyStore,
        probe: SimProbe,
        connector_attach: Callable[[Connection], None],
        on_handled: Callable[[str, str], None],
    ) -> None:
        self.world = world
        self.net = net
        self.gateway_id = gateway_id
        self.store = store
        self.probe = probe
        self.connector_attach = connector_attach
        self.on_handled = on_handled
        self.up = False
        self.life = 0
        self.pid = 0
        self.ledger: Ledger | None = None
        self.conn: Connection | None = None
        self.pending: dict[str, str] = {}  # request id -> obligation id
        self.secret = f"{gateway_id}-secret-1"
        """The secret it mints its tokens with (a rotation hands it a new one)."""
        self.clock = ProcessClock(world.clock)
        self.refusals = 0
        self._requests = itertools.count(1)

    # -- life -------------------------------------------------------------------------------

    def start(self) -> None:
        """A new life: a new incarnation on the same store; claim what dead lives owed."""
        if self.up:
            raise RuntimeError(f"{self.gateway_id} is running: crash it first")
        self.life += 1
        self.pid = self.world.next_pid()
        self.probe.alive[self.pid] = self.life
        incarnation = Incarnation(HOST, self.pid, self.life, f"{self.gateway_id}-{self.life}")
        self.ledger = Ledger(
            self.store,
            policy=POLICY,
            clock=self.clock,
            incarnation=incarnation,
            probe=self.probe,
        )
        self.up = True
        self.pending = {}
        self.world.log(f"{self.gateway_id}: life {self.life} up (pid {self.pid})")
        self._dial()
        life = self.life
        self.world.at(TICK_S, f"{self.gateway_id} tick", lambda: self._tick(life))

    def crash(self) -> None:
        """Lose every in-memory object; the store stays."""
        if not self.up:
            return
        self.up = False
        del self.probe.alive[self.pid]
        self.world.log(f"{self.gateway_id}: crash (life {self.life})")
        if self.conn is not None:
            self.conn.cut("gateway crashed")
        self.conn = None
        self.ledger = None
        self.pending = {}

    def redial(self) -> None:
        """Drop the current connection and dial again (a healed network, a fresh start)."""
        if self.up and self.conn is not None:
            self.conn.cut("redial")

    # -- the connection ---------------------------------------------------------------------

    def _dial(self) -> None:
        if not self.up or self.conn is not None:
            return
        life = self.life
        conn = self.net.connect(self.gateway_id)
        conn.on_gateway = lambda c, frame: self._frame(life, c, frame)
        conn.closed_gateway = lambda c: self._closed(life, c)
        self.conn = conn
        # A fresh token per dial, on this process's own wall clock.
        conn.token = mint_token(self.gateway_id, self.secret, ttl_s=60.0, now=self.clock.now())
        self.connector_attach(conn)
        conn.to_connector(encode(Hello(PLATFORM, "bot")))

    def _closed(self, life: int, conn: Connection) -> None:
        if life != self.life or conn is not self.conn:
            return
        self.conn = None
        if conn.reason.startswith("auth"):
            self.refusals += 1
        for request_id in list(self.pending):
            self._settle(request_id, None, "connection lost")
        life_now = self.life
        self.world.at(self.world.rng.uniform(0.05, 1.0), "redial", lambda: self._redial(life_now))

    def _redial(self, life: int) -> None:
        if life == self.life:
            self._dial()

    def _frame(self, life: int, conn: Connection, frame: Frame) -> None:
        if life != self.life or not self.up or conn is not self.conn:
            return
        if isinstance(frame, Inbound) and frame.buffer_id is not None:
            work = self.world.rng.uniform(0.01, 0.3)
            buffer_id, event = frame.buffer_id, frame.event
            self.world.at(work, "handler", lambda: self._handle(life, conn, buffer_id, event))
        elif isinstance(frame, OutboundResult):
            self._settle(frame.request_id, frame.result, None)

    # -- handling and sending ---------------------------------------------------------------

    def _handle(self, life: int, conn: Connection, buffer_id: str, event: InboundEvent) -> None:
        if life != self.life or self.ledger is None:
            return
        try:
            ob = self.ledger.record(
                session_key=event.source.chat_id,
                platform=PLATFORM,
                chat_id=event.source.chat_id,
                content=f"echo: {event.text}",
                message_ref=event.message_id,
            )
        except StoreError as exc:  # the handler raised: no ack, delivered again later
            self.world.log(f"{self.gateway_id}: handling {buffer_id} failed ({exc})")
            return
        self.on_handled(self.gateway_id, buffer_id)
        if conn.open and conn is self.conn:
            conn.to_connector(encode(InboundAck(buffer_id)))
        mine = ob.owner.token == self.ledger.incarnation.token
        if ob.state is ObligationState.PENDING and mine:
            try:
                self.ledger.mark_attempting(ob.obligation_id)
            except _SETTLE_ERRORS as exc:  # stays pending: the stuck sweep takes it
                self.world.log(f"{self.gateway_id}: attempt of {ob.obligation_id} ({exc})")
                return
            self._send(ob.obligation_id, ob.chat_id, ob.content)

    def _send(self, obligation_id: str, chat_id: str, text: str) -> None:
        conn = self.conn
        if conn is None or not conn.open:
            self._fail(obligation_id, "not connected", ErrorKind.RECONNECT, ambiguous=False)
            return
        request_id = f"{self.gateway_id}-{self.life}-{next(self._requests)}"
        self.pending[request_id] = obligation_id
        self.world.log(f"{self.gateway_id}: send {obligation_id} as {request_id}: {text!r}")
        action = {"op": "send", "chat_id": chat_id, "content": text}
        conn.to_connector(encode(Outbound(request_id, action, idempotency_key=obligation_id)))
        life = self.life
        self.world.at(REQUEST_TIMEOUT_S, "timeout", lambda: self._timeout(life, request_id))

    def _timeout(self, life: int, request_id: str) -> None:
        if life == self.life and request_id in self.pending:
            self._settle(request_id, None, "timed out")
            if self.conn is not None:
                self.conn.cut("a request timed out (half-open?)")

    def _settle(self, request_id: str, outcome: OutboundOutcome | None, lost: str | None) -> None:
        obligation_id = self.pending.pop(request_id, None)
        if obligation_id is None or self.ledger is None:
            return
        if outcome is None:  # no answer: the platform may have performed it
            self._fail(obligation_id, lost or "lost", ErrorKind.TRANSIENT, ambiguous=True)
            return
        try:
            if outcome.success:
                self.ledger.mark_delivered(obligation_id)
                return
        except _SETTLE_ERRORS as exc:
            self.world.log(f"{self.gateway_id}: settling {obligation_id} failed ({exc})")
            return
        kind = ErrorKind.PERMANENT if outcome.code == EGRESS_DECLINED else ErrorKind.TRANSIENT
        self._fail(obligation_id, outcome.error or "refused", kind, ambiguous=False)

    def _fail(self, obligation_id: str, error: str, kind: ErrorKind, *, ambiguous: bool) -> None:
        if self.ledger is None:
            return
        try:
            self.ledger.mark_failed(obligation_id, error, kind=kind, ambiguous=ambiguous)
        except _SETTLE_ERRORS as exc:  # left attempting: the stuck sweep takes it
            self.world.log(f"{self.gateway_id}: failing {obligation_id} failed ({exc})")

    def _send_claims(self, claims: list[Claim]) -> None:
        for claim in claims:
            ob = claim.obligation
            self.world.log(f"{self.gateway_id}: resend {ob.obligation_id} ({claim.reason})")
            self._send(ob.obligation_id, ob.chat_id, claim.render())

    # -- the timer --------------------------------------------------------------------------

    def _tick(self, life: int) -> None:
        if life != self.life or self.ledger is None:
            return
        ledger = self.ledger
        conn = self.conn
        if conn is not None and conn.silent_for() > KEEPALIVE_S:
            conn.cut("keepalive: no pong")  # a half-open connection, found by its pings
        try:
            ledger.heartbeat()
            claims = ledger.sweep_recoverable()
            claims += ledger.sweep_failed_for_runtime(PLATFORM)
            claims += ledger.sweep_stuck_own(
                older_than_s=2 * REQUEST_TIMEOUT_S, exclude=set(self.pending.values())
            )
        except StoreError as exc:
            self.world.log(f"{self.gateway_id}: a sweep failed ({exc})")
            claims = []
        self._send_claims(claims)
        self.world.at(TICK_S, f"{self.gateway_id} tick", lambda: self._tick(life))

"""The connector of a world: the durable buffer (the real :class:`InboundBuffer` on its store),
the tenant guard, idempotent egress, replay on hello and retirement on ack.

Its event flow follows :class:`relay.connector.Connector` with acked live delivery: every
accepted event is appended to the buffer first, then sent with its bufferId to the gateway's
connection if it has one; a hello replays the gateway's whole unacked backlog in order; only an
``inbound_ack`` retires an entry.  What lives in memory -- connections, the idempotency memory of
egress -- is lost in a crash; the buffer is not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from relay.connector.buffer import InboundBuffer
from relay.sim.faults import FlakyStore
from relay.sim.net import Connection
from relay.sim.platform import PLATFORM, SimPlatform, tenant_of
from relay.sim.world import ProcessClock, World
from relay.wire.auth import verify_token
from relay.wire.codec import encode
from relay.wire.errors import AuthError
from relay.wire.frames import (
    EGRESS_DECLINED,
    Frame,
    Hello,
    InboundAck,
    InboundEvent,
    Outbound,
    OutboundOutcome,
    OutboundResult,
)
from statecore.errors import StoreError

__all__ = ["SimConnector"]

AckCheck = Callable[[str, str], None]


class SimConnector:
    """See the module docs.  ``gateways`` maps each gateway id to the one tenant it serves;
    ``on_ack(gateway_id, buffer_id)`` is told of every ack before it is applied (the
    invariants check the handler had returned)."""

    def __init__(
        self,
        world: World,
        platform: SimPlatform,
        store: FlakyStore,
        gateways: Mapping[str, str],
        on_ack: AckCheck,
    ) -> None:
        self.world = world
        self.platform = platform
        self.store = store
        self.gateways = dict(gateways)
        self.secrets: dict[str, list[str]] = {g: [f"{g}-secret-1"] for g in gateways}
        """Each gateway's accepted secrets, newest first (a rotation adds one in front)."""
        self.clock = ProcessClock(world.clock)
        self._by_tenant = {tenant: g for g, tenant in gateways.items()}
        self.on_ack = on_ack
        self.up = False
        self.life = 0
        self.buffer: InboundBuffer | None = None
        self.served: dict[str, Connection] = {}
        self._outcomes: dict[str, OutboundOutcome | list[Callable[[OutboundOutcome], None]]] = {}

    # -- life -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start a new life: the buffer reopened on the store, nothing else remembered."""
        if self.up:
            raise RuntimeError("the connector is running: crash it first")
        self.life += 1
        self.up = True
        self.buffer = InboundBuffer(self.store, clock=self.clock, origin=f"c{self.life}")
        self.world.log(f"connector: life {self.life} up")

    def crash(self) -> None:
        """Lose every in-memory object; the store stays."""
        if not self.up:
            return
        self.up = False
        self.world.log(f"connector: crash (life {self.life})")
        for conn in list(self.served.values()):
            conn.cut("connector crashed")
        self.served.clear()
        self._outcomes.clear()
        self.buffer = None

    # -- the platform's side ----------------------------------------------------------------

    def accept(self, event: InboundEvent) -> bool:
        """Take one event from the platform: appended for its tenant's gateway, then sent live
        when that gateway is connected.  False when down; raises ``StoreError`` when the
        append failed (nothing was taken)."""
        if not self.up or self.buffer is None:
            return False
        tenant = event.source.scope_id or ""
        gateway_id = self._by_tenant[tenant]
        ((buffer_id, _seq, line),) = self.buffer.append_many([(gateway_id, PLATFORM, event)])
        self.world.log(f"connector: {event.message_id} buffered as {buffer_id} for {gateway_id}")
        conn = self.served.get(gateway_id)
        if conn is not None and conn.open:
            conn.to_gateway(line)
        return True

    # -- the gateways' side -----------------------------------------------------------------

    def attach(self, conn: Connection) -> None:
        """A gateway dialled: its frames come here from now on."""
        if not self.up:
            conn.cut("connector down")
            return
        try:
            verify_token(conn.token, self.secrets, now=self.clock.now())
        except AuthError as exc:  # refused at the upgrade, as the real connector refuses
            conn.cut(f"auth: {exc.reason}")
            return
        life = self.life
        conn.on_connector = lambda c, frame: self._frame(life, c, frame)
        conn.closed_connector = lambda c: self._closed(life, c)

    def _closed(self, life: int, conn: Connection) -> None:
        if life == self.life and self.served.get(conn.gateway_id) is conn:
            del self.served[conn.gateway_id]

    def _frame(self, life: int, conn: Connection, frame: Frame) -> None:
        if life != self.life or not self.up or not conn.open or self.buffer is None:
            return
        if isinstance(frame, Hello):
            self._hello(conn)
        elif isinstance(frame, InboundAck):
            self.on_ack(conn.gateway_id, frame.buffer_id)
            try:
                self.buffer.ack(conn.gateway_id, [frame.buffer_id])
            except StoreError as exc:  # not retired: delivered again on the next connection
                self.world.log(f"connector: ack of {frame.buffer_id} not recorded ({exc})")
        elif isinstance(frame, Outbound):
            self._outbound(life, conn, frame)

    def _hello(self, conn: Connection) -> None:
        assert self.buffer is not None
        old = self.served.get(conn.gateway_id)
        if old is not None and old is not conn:
            old.cut("replaced by a new connection")
        self.served[conn.gateway_id] = conn
        try:
            backlog = self.buffer.replay_lines(conn.gateway_id, limit=100_000)
        except StoreError as exc:
            self.world.log(f"connector: replay for {conn.gateway_id} failed ({exc})")
            conn.cut("replay failed")
            return
        self.world.log(f"connector: hello from {conn.name}, replaying {len(backlog)}")
        for _buffer_id, _seq, line in backlog:
            conn.to_gateway(line)

    def _outbound(self, life: int, conn: Connection, frame: Outbound) -> None:
        action = frame.action
        chat_id = str(action.get("chat_id"))

        def answer(outcome: OutboundOutcome) -> None:
            if life == self.life and self.up and conn.open:
                conn.to_gateway(encode(OutboundResult(frame.request_id, outcome)))

        if tenant_of(chat_id) != self.gateways.get(conn.gateway_id):
            self.world.log(f"connector: egress of {conn.gateway_id} to {chat_id} declined")
            answer(OutboundOutcome(False, None, "egress declined", EGRESS_DECLINED))
            return
        key = frame.idempotency_key
        if key is not None:
            earlier = self._outcomes.get(key)
            if isinstance(earlier, OutboundOutcome):
                answer(earlier)  # performed already: never twice
                return
            if isinstance(earlier, list):
                earlier.append(answer)  # being performed: wait for its outcome
                return
            self._outcomes[key] = [answer]

        def done(outcome: OutboundOutcome) -> None:
            if life != self.life:
                return  # crashed meanwhile: the user may have seen it, nobody is told
            waiters = self._outcomes.pop(key, []) if key is not None else [answer]
            if key is not None and outcome.success:
                self._outcomes[key] = outcome
            for waiter in waiters if isinstance(waiters, list) else [answer]:
                waiter(outcome)

        self.world.log(f"connector: performing {frame.request_id} (key {key})")
        self.platform.perform(conn.gateway_id, action, done)

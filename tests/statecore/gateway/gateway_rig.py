"""The gateway rig shared by the gateway tests: fake adapters and sessions, incarnations, a
real loopback connector (:class:`Relay`) and gateways over a store (:class:`Rig`), and small
bounded helpers."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from relay.client.adapter import RelayAdapter
from relay.client.transport import WebSocketRelayTransport
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from statecore.clock import Clock
from statecore.gateway import Gateway
from statecore.gateway.adapter import AdapterAbilities, SendResult
from statecore.gateway.runtime import SessionFlags
from statecore.ids import compute_obligation_id
from statecore.ledger import Ledger
from statecore.lifecycles import ObligationState
from statecore.obligation import (
    OBLIGATION_KIND,
    Obligation,
)
from statecore.ownership import Incarnation, PsutilProbe
from statecore.policy import LedgerPolicy
from statecore.store import Store
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from tests.waiting import BOUND

SLACK = "slack"

KEY = "agent:main:slack:channel:C1"

ANSWER = "the final answer"

FAKE_PIDS = 999_000
"""Pids from here up are the fake owners of these tests: the probe reports them gone."""

_O = ObligationState


@attrs.frozen
class Sent:
    """One call of a fake adapter's ``send``."""

    chat_id: str
    content: str
    metadata: dict[str, Any]


Outcome = SendResult | Exception
"""What a fake adapter answers one send with: a result, or an exception it raises."""


class FakeAdapter:
    """A platform adapter double: records every send and answers with the queued outcomes
    (then success).  Optional: a ``hang`` event every send waits for, a shared ``log`` of
    ``("send", content)`` entries, an ``on_send`` hook run as the send begins, and a
    ``connected`` flag that ``connect()`` sets to ``can_connect``."""

    abilities: AdapterAbilities = AdapterAbilities(connects=True)

    def __init__(
        self,
        *outcomes: Outcome,
        connected: bool = True,
        can_connect: bool = True,
        hang: asyncio.Event | None = None,
        log: list[tuple[str, str]] | None = None,
        on_send: Callable[[Sent], None] | None = None,
    ) -> None:
        self.outcomes = list(outcomes)
        self.connected = connected
        self.can_connect = can_connect
        self.hang = hang
        self.log = log
        self.on_send = on_send
        self.calls: list[Sent] = []
        self.finished = 0
        self.connects = 0

    async def connect(self) -> bool:
        """Try to connect: succeeds only when ``can_connect``."""
        self.connects += 1
        self.connected = self.can_connect
        return self.connected

    async def send(
        self, chat_id: str, content: str, metadata: Mapping[str, Any] | None = None
    ) -> SendResult:
        """Record the send, then answer with the next queued outcome."""
        sent = Sent(chat_id, content, dict(metadata or {}))
        self.calls.append(sent)
        if self.log is not None:
            self.log.append(("send", content))
        if self.on_send is not None:
            self.on_send(sent)
        if self.hang is not None:
            await self.hang.wait()
        self.finished += 1
        outcome = self.outcomes.pop(0) if self.outcomes else SendResult.ok(f"pm{len(self.calls)}")
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    @property
    def contents(self) -> list[str]:
        """The content of every send, in order."""
        return [call.content for call in self.calls]


class FakeSessions:
    """The session flags double: records every ``clear_resume_pending``; may fail or hang."""

    def __init__(
        self,
        *,
        fail: bool = False,
        hang: asyncio.Event | None = None,
        log: list[tuple[str, str]] | None = None,
    ) -> None:
        self.fail = fail
        self.hang = hang
        self.log = log
        self.cleared: list[str] = []

    async def clear_resume_pending(self, session_key: str) -> object:
        """Record the clear; then wait for ``hang`` and raise when ``fail``."""
        self.cleared.append(session_key)
        if self.log is not None:
            self.log.append(("clear", session_key))
        if self.hang is not None:
            await self.hang.wait()
        if self.fail:
            raise RuntimeError("session store unavailable")
        return None


class FakePidProbe:
    """The real probe, except that the fake owners' pids (>= FAKE_PIDS) are gone."""

    def __init__(self) -> None:
        self._real = PsutilProbe()

    def pid_exists(self, pid: int) -> bool:
        """False for a fake pid, else what psutil says."""
        return pid < FAKE_PIDS and self._real.pid_exists(pid)

    def start_time(self, pid: int) -> int | None:
        """None for a fake pid, else the real start time."""
        return None if pid >= FAKE_PIDS else self._real.start_time(pid)


PROBE = FakePidProbe()

DEAD = Incarnation(Incarnation.current().host, 999_999, 1, "dead")
"""A previous run on this host that has died."""


def live_incarnation() -> Incarnation:
    """A new incarnation of this very process (a fresh token): what a gateway booting now is."""
    return attrs.evolve(Incarnation.current(), token=secrets.token_hex(8))


def boot_incarnation(n: int) -> Incarnation:
    """The incarnation of boot ``n`` of a gateway on this host that is dead once the next
    boot runs (its pid is a fake one)."""
    return Incarnation(Incarnation.current().host, FAKE_PIDS + n, 1, f"boot-{n}")


def open_store(kind: str, tmp_path: Path) -> Store:
    """A fresh store of ``kind`` ("memory" or "sqlite")."""
    return InMemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "gateway.db")


def row(store: Store, obligation_id: str) -> Obligation:
    """The obligation as stored now."""
    found = store.get(OBLIGATION_KIND, obligation_id)
    assert found is not None, f"no obligation {obligation_id}"
    return Obligation.from_row(found)


def rows(store: Store) -> list[Obligation]:
    """Every obligation in the store, whatever its state."""
    return [Obligation.from_row(r) for r in store.select(OBLIGATION_KIND, order_by="created_at")]


def events(store: Store, obligation_id: str) -> list[str]:
    """The obligation's audited events, oldest first."""
    return [entry.event for entry in store.history(OBLIGATION_KIND, obligation_id)]


def owe(
    store: Store,
    *,
    owner: Incarnation = DEAD,
    state: ObligationState = _O.PENDING,
    error: str = "upstream timeout",
    clock: Clock | None = None,
    session_key: str = KEY,
    platform: str = SLACK,
    chat_id: str = "C1",
    content: str = ANSWER,
    message_ref: str = "m1",
    thread_id: str | None = "171.001",
    reply_to: str | None = "m1",
    profile: str | None = None,
) -> str:
    """Record an owed reply as ``owner`` would have (pending, attempting or failed with
    ``error``) and return its id."""
    ledger = Ledger(store, incarnation=owner, clock=clock, probe=PROBE)
    obligation = ledger.record(
        session_key=session_key,
        platform=platform,
        chat_id=chat_id,
        content=content,
        message_ref=message_ref,
        thread_id=thread_id,
        reply_to=reply_to,
        adapter_profile=profile,
    )
    oid = obligation.obligation_id
    if state in (_O.ATTEMPTING, _O.FAILED):
        ledger.mark_attempting(oid)
    if state is _O.FAILED:
        ledger.mark_failed(oid, error)
    assert row(store, oid).state is state
    return oid


class Rig:
    """Builds gateways over one store and stops every one of them at the end (bounded)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.gateways: list[Gateway] = []

    def gateway(
        self,
        *,
        sessions: SessionFlags | None = None,
        real_sessions: bool = False,
        incarnation: Incarnation | None = None,
        clock: Clock | None = None,
        policy: LedgerPolicy | None = None,
        retry_interval_s: float = 3600.0,
        stuck_after_s: float = 30.0,
    ) -> Gateway:
        """A gateway on the rig's store: fake session flags unless ``real_sessions``; a retry
        timer that never fires unless asked for."""
        gateway = Gateway(
            self.store,
            sessions=None if real_sessions else (sessions or FakeSessions()),
            clock=clock,
            incarnation=incarnation or live_incarnation(),
            probe=PROBE,
            policy=policy,
            retry_interval_s=retry_interval_s,
            stuck_after_s=stuck_after_s,
        )
        self.gateways.append(gateway)
        return gateway

    async def close(self) -> None:
        for gateway in reversed(self.gateways):
            await asyncio.wait_for(gateway.stop(budget_s=1.0), BOUND)


SECRETS: dict[str, list[str | bytes]] = {"gw-a": ["secret-a"]}


class Relay:
    """The reference connector in front of a loopback chat, restartable on the same port (its
    buffer store survives restarts)."""

    def __init__(self) -> None:
        self.platform = LoopbackPlatform()
        self.store = InMemoryStore()
        self.connector: Connector | None = None
        self.port = 0
        self.transports: list[WebSocketRelayTransport] = []

    async def start(self) -> Connector:
        # Replies here go to chats the test names directly, not always ones that wrote first:
        # egress is opened explicitly (the provenance default is pinned by the connector tests).
        connector = Connector(
            self.store,
            secrets=SECRETS,
            drivers={"loopback": self.platform},
            open_egress=True,
        )
        await connector.start(port=self.port)
        self.port = int(connector.url.rsplit(":", 1)[1])
        self.connector = connector
        return connector

    async def stop(self) -> None:
        if self.connector is not None:
            await asyncio.wait_for(self.connector.stop(), BOUND)
            self.connector = None

    async def restart(self) -> Connector:
        """Stop the connector (every connection drops) and start it again on the same port."""
        await self.stop()
        return await self.start()

    def adapter(self, **options: Any) -> tuple[WebSocketRelayTransport, RelayAdapter]:
        """A relay adapter for gateway id ``gw-a`` (quick re-dials), not yet connected."""
        assert self.connector is not None
        options.setdefault("reconnect_backoff_s", 0.05)
        options.setdefault("reconnect_max_s", 0.2)
        transport = WebSocketRelayTransport(
            self.connector.url,
            "loopback",
            "bot-gw-a",
            gateway_id="gw-a",
            secret="secret-a",
            **options,
        )
        self.transports.append(transport)
        return transport, RelayAdapter(transport)

    def connected(self) -> bool:
        """True while ``gw-a`` has a handshaken connection to the connector."""
        return self.connector is not None and self.connector.connected("gw-a")

    def buffered(self) -> int:
        """Unacked inbound entries buffered for ``gw-a``."""
        assert self.connector is not None
        return self.connector.buffered("gw-a")

    async def close(self) -> None:
        for transport in self.transports:
            await asyncio.wait_for(transport.disconnect(budget_s=1.0), BOUND)
        await self.stop()
        self.store.close()


async def reply(
    gateway: Gateway,
    content: str = ANSWER,
    *,
    message_ref: str = "m1",
    profile: str = "default",
    thread_id: str | None = "171.001",
    reply_to: str | None = "m1",
    session_key: str = KEY,
    platform: str = SLACK,
    chat_id: str = "C1",
) -> SendResult:
    """``send_final`` with this module's defaults."""
    return await gateway.send_final(
        session_key=session_key,
        platform=platform,
        chat_id=chat_id,
        content=content,
        message_ref=message_ref,
        thread_id=thread_id,
        reply_to=reply_to,
        profile=profile,
    )


def oid_of(content: str = ANSWER, *, message_ref: str = "m1", session_key: str = KEY) -> str:
    """The obligation id ``send_final`` records for a reply."""
    return compute_obligation_id(session_key, message_ref, content)

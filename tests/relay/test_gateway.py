"""The Gateway runtime's send path, inbound turns and shutdown.

``send_final`` records, marks attempting, sends and settles; failures (returned, raised, no
adapter) are recorded and kept owed; repeats and bad input are refused before anything is sent or
recorded.  Inbound messages reach the bot's handler as turns through a real relay (reference
connector, loopback platform), and ``stop`` respects its budget.  Every test runs on the in-memory
store and on SQLite; every wait is bounded.

The doubles and helpers here are shared with ``test_gateway_recovery.py``.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest

from relay.adapter import RelayAdapter
from relay.connector import Connector
from relay.gateway import Gateway, Message, SessionFlags, Turn, session_key_for
from relay.platform import LoopbackPlatform
from relay.transport import WebSocketRelayTransport
from statecore.adapter import SendResult
from statecore.clock import Clock, Deadline, FakeClock
from statecore.errors import StoreError
from statecore.ids import compute_obligation_id
from statecore.ledger import Ledger
from statecore.lifecycles import ObligationState, TransportState
from statecore.obligation import (
    OBLIGATION_KIND,
    RECONNECTED_MARKER,
    Obligation,
)
from statecore.ownership import Incarnation, PsutilProbe
from statecore.policy import LedgerPolicy
from statecore.store import Store
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore

BOUND = 5.0
"""Real seconds any single wait may take before the test fails."""

SLACK = "slack"
KEY = "agent:main:slack:channel:C1"
ANSWER = "the final answer"
FAKE_PIDS = 999_000
"""Pids from here up are the fake owners of these tests: the probe reports them gone."""

_O = ObligationState


# -- doubles -------------------------------------------------------------------------------------


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


# -- stores, rows and gateways -------------------------------------------------------------------


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


async def eventually(predicate: Callable[[], bool], what: str, timeout: float = BOUND) -> None:
    """Poll ``predicate`` until it holds; fail after ``timeout`` real seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.005)


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


# -- send_final ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_send_final_records_marks_attempting_sends_with_metadata_and_settles(
    rig: Rig, store: Store
) -> None:
    """A final reply is recorded, marked attempting before the send, sent with thread, reply-to
    and the obligation id as idempotency key, and settled delivered."""
    seen_states: list[ObligationState] = []
    adapter = FakeAdapter(
        on_send=lambda sent: seen_states.append(row(store, sent.metadata["idempotency_key"]).state)
    )
    gateway = rig.gateway()
    gateway.add_adapter(SLACK, adapter)

    result = await reply(gateway)

    oid = oid_of()
    assert result.success
    assert adapter.calls == [
        Sent("C1", ANSWER, {"thread_id": "171.001", "reply_to": "m1", "idempotency_key": oid})
    ]
    assert seen_states == [_O.ATTEMPTING]
    stored = row(store, oid)
    assert (stored.state, stored.attempts, stored.last_error) == (_O.DELIVERED, 0, None)
    assert (stored.session_key, stored.chat_id, stored.content) == (KEY, "C1", ANSWER)
    assert stored.owner.token == gateway.ledger.incarnation.token
    assert events(store, oid) == ["record", "attempt", "deliver"]
    assert gateway.delivered == 1

    bare = await reply(gateway, "no thread", thread_id=None, reply_to=None)
    assert bare.success
    assert adapter.calls[-1].metadata == {"idempotency_key": oid_of("no thread")}


@pytest.mark.asyncio
async def test_failed_send_is_recorded_failed_with_its_error(rig: Rig, store: Store) -> None:
    """A send the platform refuses is returned to the caller and recorded failed with its error,
    without spending an attempt (the first send is free)."""
    refusal = SendResult.failed("upstream timeout")
    adapter = FakeAdapter(refusal)
    gateway = rig.gateway()
    gateway.add_adapter(SLACK, adapter)

    result = await reply(gateway)

    assert result == refusal
    stored = row(store, oid_of())
    assert (stored.state, stored.attempts) == (_O.FAILED, 0)
    assert stored.last_error == "upstream timeout"
    assert stored.error_kind == "transient"
    assert events(store, stored.obligation_id) == ["record", "attempt", "fail"]
    assert gateway.delivered == 0


@pytest.mark.asyncio
async def test_adapter_send_that_raises_is_recorded_failed_ambiguous_and_gateway_keeps_working(
    rig: Rig, store: Store
) -> None:
    """An adapter whose send raises yields an ambiguous failure recorded with the exception's
    text, and the next reply goes out normally."""
    adapter = FakeAdapter(ConnectionResetError("socket reset mid-request"))
    gateway = rig.gateway()
    gateway.add_adapter(SLACK, adapter)

    result = await reply(gateway)

    assert not result.success
    assert result.ambiguous
    assert result.error is not None
    assert "socket reset mid-request" in result.error
    stored = row(store, oid_of())
    assert stored.state is _O.FAILED
    assert stored.last_error == result.error

    after = await reply(gateway, "still alive", message_ref="m2")
    assert after.success
    assert row(store, oid_of("still alive", message_ref="m2")).state is _O.DELIVERED
    assert adapter.contents == [ANSWER, "still alive"]


@pytest.mark.asyncio
async def test_no_adapter_keeps_reply_owed_until_runtime_path_delivers_it(
    rig: Rig, store: Store
) -> None:
    """With no adapter for (platform, profile) the reply is kept owed, released with
    send_path_degraded and no attempt spent, and the runtime path delivers it once that
    adapter is there (another profile's adapter never sends it)."""
    default = FakeAdapter()
    gateway = rig.gateway()
    gateway.add_adapter(SLACK, default)

    result = await reply(gateway, profile="reviewer")

    assert not result.success
    oid = oid_of()
    stored = row(store, oid)
    assert (stored.state, stored.attempts) == (_O.FAILED, 0)
    assert stored.last_error == "send_path_degraded"
    assert stored.adapter_profile == "reviewer"
    assert events(store, oid) == ["record", "attempt", "release"]
    assert await gateway.redeliver_failed(SLACK) == 0  # the default profile's sweep
    assert default.calls == []

    reviewer = FakeAdapter()
    gateway.add_adapter(SLACK, reviewer, profile="reviewer")
    assert await gateway.redeliver_failed(SLACK, profile="reviewer") == 1

    assert default.calls == []
    assert len(reviewer.calls) == 1
    assert reviewer.calls[0].content.startswith(RECONNECTED_MARKER)
    assert reviewer.calls[0].content.endswith(ANSWER)
    assert reviewer.calls[0].metadata["idempotency_key"] == oid
    stored = row(store, oid)
    assert (stored.state, stored.attempts) == (_O.DELIVERED, 1)


@pytest.mark.asyncio
async def test_repeated_identical_reply_to_the_same_message_is_not_sent_twice(
    rig: Rig, store: Store
) -> None:
    """The same text replied to the same message again is not sent again (one obligation);
    another text, or the same text to another message, is."""
    adapter = FakeAdapter()
    gateway = rig.gateway()
    gateway.add_adapter(SLACK, adapter)

    first = await reply(gateway)
    again = await reply(gateway)

    assert first.success
    assert again.success
    assert adapter.contents == [ANSWER]
    assert [ob.obligation_id for ob in rows(store)] == [oid_of()]
    assert events(store, oid_of()) == ["record", "attempt", "deliver"]

    assert (await reply(gateway, "another text")).success
    assert (await reply(gateway, message_ref="m2")).success
    assert adapter.contents == [ANSWER, "another text", ANSWER]


@pytest.mark.asyncio
async def test_repeat_while_the_first_send_is_in_flight_is_not_sent(rig: Rig, store: Store) -> None:
    """A repeat of a reply whose first send is still in flight does not send it a second
    time."""
    hang = asyncio.Event()
    adapter = FakeAdapter(hang=hang)
    gateway = rig.gateway()
    gateway.add_adapter(SLACK, adapter)

    first = asyncio.create_task(reply(gateway))
    await eventually(lambda: len(adapter.calls) == 1, "the first send in flight")
    again = await asyncio.wait_for(reply(gateway), BOUND)
    hang.set()

    assert (await asyncio.wait_for(first, BOUND)).success
    assert not again.success
    assert adapter.contents == [ANSWER]
    assert row(store, oid_of()).state is _O.DELIVERED


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("content", b"bytes, not text", TypeError),
        ("content", None, TypeError),
        ("chat_id", "", ValueError),
        ("session_key", "", ValueError),
        ("platform", "", ValueError),
    ],
)
@pytest.mark.asyncio
async def test_bad_input_raises_before_anything_is_recorded_or_sent(
    rig: Rig, store: Store, field: str, value: object, error: type[Exception]
) -> None:
    """Bad input raises TypeError/ValueError with nothing recorded or sent, and the gateway
    goes on working."""
    adapter = FakeAdapter()
    gateway = rig.gateway()
    gateway.add_adapter(SLACK, adapter)
    arguments: dict[str, Any] = {
        "session_key": KEY,
        "platform": SLACK,
        "chat_id": "C1",
        "content": ANSWER,
        "message_ref": "m1",
    }
    arguments[field] = value

    with pytest.raises(error):
        await gateway.send_final(**arguments)

    assert rows(store) == []
    assert adapter.calls == []
    assert (await reply(gateway)).success
    assert [ob.state for ob in rows(store)] == [_O.DELIVERED]


# -- inbound turns -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_inbound_message_reaches_the_handler_as_a_turn_and_its_reply_reaches_the_chat(
    rig: Rig, store: Store, relay: Relay
) -> None:
    """A relay adapter registered for a profile delivers inbound messages to the handler as
    turns carrying every message field and the session key of (profile, platform, chat,
    thread); the turn's reply lands in that chat and thread, ledgered under that profile."""
    turns: list[Turn] = []
    results: list[SendResult] = []

    async def bot(turn: Turn) -> None:
        turns.append(turn)
        results.append(await turn.reply(f"echo: {turn.message.text}"))

    _, adapter = relay.adapter()
    gateway = rig.gateway()
    gateway.add_adapter("loopback", adapter, profile="reviewer")
    gateway.on_message(bot)
    await asyncio.wait_for(gateway.start(), BOUND)
    await eventually(relay.connected, "the gateway connected")

    message_id = await relay.platform.inject(
        "c1",
        "hello",
        user_id="u1",
        user_name="Ann",
        scope_id="team-1",
        chat_type="group",
        thread_id="t1",
    )
    await eventually(lambda: relay.platform.texts("c1") == ["echo: hello"], "the echo")

    assert len(turns) == 1
    assert turns[0].message == Message(
        platform="loopback",
        profile="reviewer",
        chat_id="c1",
        chat_type="group",
        text="hello",
        message_id=message_id,
        thread_id="t1",
        user_id="u1",
        user_name="Ann",
        scope_id="team-1",
        session_key=session_key_for("reviewer", "loopback", "group", "c1", "t1"),
    )
    assert turns[0].message.session_key != session_key_for("reviewer", "loopback", "group", "c1")
    assert turns[0].message.session_key != session_key_for("default", "loopback", "group", "c1")
    assert [r.success for r in results] == [True]
    [sent] = [s for s in relay.platform.sent if s.op == "send"]
    assert (sent.chat_id, sent.thread_id, sent.reply_to) == ("c1", "t1", message_id)
    [stored] = rows(store)
    assert stored.state is _O.DELIVERED
    assert stored.adapter_profile == "reviewer"
    assert stored.session_key == turns[0].message.session_key
    assert (stored.chat_id, stored.thread_id, stored.reply_to) == ("c1", "t1", message_id)


@pytest.mark.asyncio
async def test_handler_that_raises_neither_kills_the_gateway_nor_loses_replies_it_sent(
    rig: Rig, store: Store, relay: Relay
) -> None:
    """A handler that raises after replying keeps that reply (delivered), and the gateway goes
    on handling the next message."""

    async def bot(turn: Turn) -> None:
        await turn.reply(f"part 1 of {turn.message.text}")
        if turn.message.text == "boom":
            raise RuntimeError("the bot's logic failed")
        await turn.reply(f"part 2 of {turn.message.text}")

    _, adapter = relay.adapter()
    gateway = rig.gateway()
    gateway.add_adapter("loopback", adapter)
    gateway.on_message(bot)
    await asyncio.wait_for(gateway.start(), BOUND)
    await eventually(relay.connected, "the gateway connected")

    await relay.platform.inject("c1", "boom", user_id="u1")
    await eventually(lambda: relay.platform.texts("c1") == ["part 1 of boom"], "the first part")
    await relay.platform.inject("c1", "fine", user_id="u1")
    expected = ["part 1 of boom", "part 1 of fine", "part 2 of fine"]
    await eventually(lambda: relay.platform.texts("c1") == expected, "the next message answered")

    assert [ob.state for ob in rows(store)] == [_O.DELIVERED] * 3
    assert sorted(ob.content for ob in rows(store)) == sorted(expected)


@pytest.mark.asyncio
async def test_replayed_turn_does_not_send_its_earlier_reply_twice(
    rig: Rig, store: Store, relay: Relay
) -> None:
    """A buffered message whose handler replied and then raised stays unacked and is replayed;
    the replayed turn's identical reply is not sent again, and the message is then acked."""
    texts: list[str] = []
    results: list[SendResult] = []

    async def bot(turn: Turn) -> None:
        texts.append(turn.message.text)
        results.append(await turn.reply("the answer"))
        if len(texts) == 1:
            raise RuntimeError("crashed after answering")

    clock = FakeClock(start=time.time())
    transport, adapter = relay.adapter(clock=clock, dormant_redial_s=5)
    gateway = rig.gateway()
    gateway.add_adapter("loopback", adapter)
    gateway.on_message(bot)
    await asyncio.wait_for(gateway.start(), BOUND)
    await eventually(relay.connected, "the gateway connected")

    assert await adapter.go_dormant()
    await eventually(lambda: not relay.connected(), "the gateway asleep")
    await relay.platform.inject("c1", "question", user_id="u1")
    await eventually(lambda: relay.buffered() == 1, "the message buffered")

    await eventually(lambda: clock.sleepers >= 1, "the dormant re-dial waiting")
    clock.advance(5)  # the dormant cadence: re-dial, the buffered message is replayed
    await eventually(lambda: len(texts) == 1, "the first handling")
    await eventually(lambda: relay.platform.texts("c1") == ["the answer"], "the reply")
    await eventually(lambda: transport.state is TransportState.CONNECTED, "connected")
    await asyncio.sleep(0.2)  # an ack would have gone out by now
    assert relay.buffered() == 1, "a handler that raised must leave its message unacked"

    assert await adapter.go_dormant()
    await eventually(lambda: not relay.connected(), "asleep again")
    await eventually(lambda: clock.sleepers >= 1, "the dormant re-dial waiting again")
    clock.advance(5)  # the next wake replays the unacked message
    await eventually(lambda: len(texts) == 2, "the replayed handling")
    await eventually(lambda: relay.buffered() == 0, "the replayed message acked")

    assert texts == ["question", "question"]
    assert [r.success for r in results] == [True, True]
    assert relay.platform.texts("c1") == ["the answer"]
    assert [ob.state for ob in rows(store)] == [_O.DELIVERED]


# -- stopping ------------------------------------------------------------------------------------


class HangingDisconnect(FakeAdapter):
    """An adapter whose ``disconnect`` never returns on its own; records the budget it got."""

    def __init__(self) -> None:
        super().__init__()
        self.budgets: list[float | None] = []

    async def disconnect(self, budget_s: float | None = None) -> None:
        self.budgets.append(budget_s)
        await asyncio.Event().wait()


class RecordingDisconnect(FakeAdapter):
    """An adapter whose ``disconnect`` returns at once; records the budget it got."""

    def __init__(self) -> None:
        super().__init__()
        self.budgets: list[float | None] = []

    async def disconnect(self, budget_s: float | None = None) -> None:
        self.budgets.append(budget_s)


@pytest.mark.asyncio
async def test_stop_finishes_within_its_budget_and_closes_the_ledger(
    rig: Rig, store: Store
) -> None:
    """stop(budget) with a redelivery hung mid-send returns within about the budget, hands each
    adapter's disconnect the budget that is left, closes the ledger, and leaves the hung reply
    owed (attempting), never dropped."""
    oid = owe(store)
    hung = FakeAdapter(hang=asyncio.Event())
    gateway = rig.gateway()
    gateway.add_adapter(SLACK, hung)
    other = RecordingDisconnect()
    gateway.add_adapter("discord", other)
    assert await asyncio.wait_for(gateway.start(), BOUND) == 1
    await eventually(lambda: len(hung.calls) == 1, "the redelivery send hung")

    budget = 0.6
    began = time.monotonic()
    await asyncio.wait_for(gateway.stop(budget_s=budget), BOUND)
    elapsed = time.monotonic() - began

    assert elapsed <= budget + 0.3, f"stop({budget}) took {elapsed:.2f} s"
    assert len(other.budgets) == 1
    given = other.budgets[0]
    assert given is not None
    assert 0 < given <= budget
    with pytest.raises(StoreError):
        await gateway.ledger.get(oid)
    with pytest.raises(StoreError):
        await reply(gateway, "after stop", message_ref="m9")
    assert hung.finished == 0
    assert row(store, oid).state is _O.ATTEMPTING


class DeadlineDisconnect(FakeAdapter):
    """An adapter whose ``disconnect`` takes an absolute deadline; records what it got."""

    def __init__(self) -> None:
        super().__init__()
        self.deadlines: list[Deadline | None] = []
        self.budgets: list[float | None] = []

    async def disconnect(
        self, *, budget_s: float | None = None, deadline: Deadline | None = None
    ) -> None:
        self.budgets.append(budget_s)
        self.deadlines.append(deadline)


@pytest.mark.asyncio
async def test_stop_hands_an_adapter_that_takes_one_the_deadline_itself(rig: Rig) -> None:
    """An adapter whose disconnect takes a deadline gets stop()'s own absolute deadline (not a
    duration re-derived from it), with the time still left on it."""
    adapter = DeadlineDisconnect()
    gateway = rig.gateway()
    gateway.add_adapter(SLACK, adapter)
    await asyncio.wait_for(gateway.start(), BOUND)
    await asyncio.wait_for(gateway.stop(budget_s=5.0), BOUND)
    assert adapter.budgets == [None]
    [deadline] = adapter.deadlines
    assert deadline is not None
    assert 0 < deadline.remaining() <= 5.0


@pytest.mark.asyncio
async def test_stop_stays_within_its_budget_when_adapter_disconnects_hang() -> None:
    """stop(budget) returns within about its budget even when adapters' disconnects hang."""
    store = InMemoryStore()
    try:
        rig = Rig(store)
        gateway = rig.gateway()
        stuck = [HangingDisconnect(), HangingDisconnect()]
        for n, adapter in enumerate(stuck):
            gateway.add_adapter(f"platform-{n}", adapter)
        await asyncio.wait_for(gateway.start(), BOUND)

        budget = 0.5
        began = time.monotonic()
        await asyncio.wait_for(gateway.stop(budget_s=budget), BOUND)
        elapsed = time.monotonic() - began

        assert [len(a.budgets) for a in stuck] == [1, 1]
        assert elapsed <= budget + 0.3, f"stop({budget}) took {elapsed:.2f} s"
    finally:
        store.close()

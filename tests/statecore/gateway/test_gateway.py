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
import time
from typing import Any

import pytest

from relay.client.lifecycle import TransportState
from statecore.clock import Deadline, FakeClock
from statecore.errors import StoreError
from statecore.gateway import Gateway, Message, Turn
from statecore.gateway.adapter import AdapterAbilities, SendResult
from statecore.gateway.turn import session_key_for
from statecore.lifecycles import ObligationState
from statecore.obligation import OBLIGATION_KIND, RECONNECTED_MARKER
from statecore.policy import ErrorKind
from statecore.store import Store
from stores.memory import InMemoryStore
from tests.statecore.gateway.gateway_rig import (
    _O,
    ANSWER,
    BOUND,
    KEY,
    SLACK,
    FakeAdapter,
    FakeSessions,
    Relay,
    Rig,
    Sent,
    events,
    oid_of,
    owe,
    reply,
    row,
    rows,
)
from tests.waiting import eventually

# -- doubles -------------------------------------------------------------------------------------


# -- stores, rows and gateways -------------------------------------------------------------------


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
async def test_a_typed_failure_reaches_the_ledger_as_its_kind(rig: Rig, store: Store) -> None:
    """The adapter's kind is what the ledger stores (no text is matched): a refusal typed
    permanent stays failed whatever its text; an ambiguous one is never a reconnect error."""
    adapter = FakeAdapter(
        SendResult.failed("upstream said no", kind=ErrorKind.PERMANENT),
        SendResult.failed("send_path_degraded", ambiguous=True),
    )
    gateway = rig.gateway()
    gateway.add_adapter(SLACK, adapter)

    await reply(gateway)
    await reply(gateway, "second", message_ref="m2")

    assert row(store, oid_of()).error_kind == "permanent"
    ambiguous = row(store, oid_of("second", message_ref="m2"))
    assert ambiguous.error_kind == "transient"
    (last,) = store.history(OBLIGATION_KIND, ambiguous.obligation_id)[-1:]
    assert last.reason == "may have gone out: send_path_degraded"


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
    # The platform shows the reply before the ledger's mark returns to the handler.
    await eventually(lambda: len(results) == 1, "the reply's result")

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

    # The platform shows a reply as soon as it is performed; its delivered mark follows.
    await eventually(
        lambda: [ob.state for ob in rows(store)] == [_O.DELIVERED] * 3, "all marked delivered"
    )
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
    """An adapter whose ``disconnect`` never returns on its own; records the time it had."""

    abilities = AdapterAbilities(connects=True, disconnects=True)

    def __init__(self) -> None:
        super().__init__()
        self.budgets: list[float] = []

    async def disconnect(self, *, deadline: Deadline) -> None:
        self.budgets.append(deadline.remaining())
        await asyncio.Event().wait()


class RecordingDisconnect(FakeAdapter):
    """An adapter whose ``disconnect`` returns at once; records the time it had."""

    abilities = AdapterAbilities(connects=True, disconnects=True)

    def __init__(self) -> None:
        super().__init__()
        self.budgets: list[float] = []

    async def disconnect(self, *, deadline: Deadline) -> None:
        self.budgets.append(deadline.remaining())


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
    assert 0 < given <= budget
    with pytest.raises(StoreError):
        await gateway.ledger.get(oid)
    with pytest.raises(StoreError):
        await reply(gateway, "after stop", message_ref="m9")
    assert hung.finished == 0
    assert row(store, oid).state is _O.ATTEMPTING


class DeadlineDisconnect(FakeAdapter):
    """An adapter that disconnects within an absolute deadline; records what it got."""

    abilities = AdapterAbilities(connects=True, disconnects=True)

    def __init__(self) -> None:
        super().__init__()
        self.deadlines: list[Deadline] = []

    async def disconnect(self, *, deadline: Deadline) -> None:
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
    [deadline] = adapter.deadlines
    assert 0 < deadline.remaining() <= 5.0


@pytest.mark.asyncio
async def test_stop_measures_its_budget_on_the_teardown_clock_it_was_given(store: Store) -> None:
    """The stop deadline is on the injected teardown clock, not a hard-coded one: an adapter
    gets a deadline on that clock, with the whole budget left while that clock stands still."""
    teardown = FakeClock()
    gateway = Gateway(store, sessions=FakeSessions(), teardown_clock=teardown)
    adapter = DeadlineDisconnect()
    gateway.add_adapter(SLACK, adapter)
    await asyncio.wait_for(gateway.start(), BOUND)
    await asyncio.wait_for(gateway.stop(budget_s=5.0), BOUND)
    [deadline] = adapter.deadlines
    assert deadline.clock is teardown
    assert deadline.remaining() == 5.0


class _Undeclared:
    """Has connect, on_message and disconnect, but declares no abilities: send-only."""

    connected = False

    def __init__(self) -> None:
        self.called: list[str] = []

    async def connect(self) -> None:
        self.called.append("connect")

    def on_message(self, handler: object) -> None:
        self.called.append("on_message")

    async def disconnect(self, *, deadline: Deadline) -> None:
        self.called.append("disconnect")

    async def send(self, chat_id: str, content: str, metadata: object = None) -> SendResult:
        self.called.append("send")
        return SendResult.ok()


@pytest.mark.asyncio
async def test_an_adapter_is_asked_only_what_it_declares(rig: Rig) -> None:
    """The runtime reads the declared abilities, never the methods an adapter happens to have:
    an undeclared adapter is only ever sent to (and counts as connected)."""
    adapter = _Undeclared()
    gateway = rig.gateway()
    gateway.add_adapter(SLACK, adapter)  # type: ignore[arg-type]
    gateway.on_message(lambda turn: asyncio.sleep(0))
    await asyncio.wait_for(gateway.start(), BOUND)
    assert gateway.connected_targets() == {(SLACK, "default")}
    assert (await reply(gateway)).success
    await asyncio.wait_for(gateway.stop(budget_s=1.0), BOUND)
    assert adapter.called == ["send"]


@pytest.mark.parametrize("abilities", ["connects", {"connects": True}, None])
def test_an_adapter_with_malformed_abilities_is_refused(rig: Rig, abilities: object) -> None:
    """abilities that are not an AdapterAbilities raise TypeError and register nothing."""
    adapter = FakeAdapter()
    adapter.abilities = abilities  # type: ignore[assignment]
    gateway = rig.gateway()
    with pytest.raises(TypeError, match="AdapterAbilities"):
        gateway.add_adapter(SLACK, adapter)
    assert gateway.adapter(SLACK) is None


def test_abilities_refuse_non_bool_values() -> None:
    """A truthy non-bool is refused, so a declaration means exactly what it says."""
    with pytest.raises(TypeError, match="connects"):
        AdapterAbilities(connects=1)  # type: ignore[arg-type]


def test_an_object_without_send_is_not_an_adapter(rig: Rig) -> None:
    """add_adapter refuses an object that cannot send, before registering anything."""
    gateway = rig.gateway()
    with pytest.raises(TypeError, match="send"):
        gateway.add_adapter(SLACK, object())  # type: ignore[arg-type]
    assert gateway.adapter(SLACK) is None


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

"""The Gateway runtime's recovery: the startup redelivery of dead owners' rows and the runtime
retry of this incarnation's own failures (on demand, on a timer, on an adapter's reconnect).

Dead owners are injected incarnations on this host whose pid the probe reports gone; a "boot" is
a new Gateway over the same store.  Every test runs on the in-memory store and on SQLite; every
wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import pytest

from relay.client.lifecycle import TransportState
from statecore.batch import transition_each_sequentially
from statecore.clock import FakeClock
from statecore.entity import EntityKind
from statecore.errors import StoreError
from statecore.gateway.adapter import SendResult
from statecore.gateway.sessions import SessionStore
from statecore.lifecycles import ObligationState
from statecore.obligation import RECONNECTED_MARKER, RECOVERED_MARKER
from statecore.policy import LedgerPolicy
from statecore.store import Row, Store
from tests.statecore.gateway.gateway_rig import (
    ANSWER,
    BOUND,
    DEAD,
    KEY,
    SLACK,
    FakeAdapter,
    FakeSessions,
    Relay,
    Rig,
    boot_incarnation,
    events,
    live_incarnation,
    oid_of,
    owe,
    reply,
    row,
    rows,
)
from tests.waiting import eventually

_O = ObligationState
OWNER_KEY = "agent:routed-profile:slack:channel:C1"


async def tick(clock: FakeClock, seconds: float) -> None:
    """Move fake time by ``seconds`` once the retry timer waits, then wait until it has run
    and waits again."""
    await eventually(lambda: clock.sleepers == 1, "the retry timer waiting")
    clock.advance(seconds)
    await eventually(lambda: clock.sleepers == 1, "the retry timer's round done")


# -- startup: what a dead owner left -------------------------------------------------------------


@pytest.mark.asyncio
async def test_dead_owners_pending_row_is_redelivered_plain_and_its_resume_flag_cleared_once(
    rig: Rig, store: Store
) -> None:
    """A pending row of a dead owner is claimed, its session's resume_pending is cleared once
    with its key, and it is sent plain (no marker) with its thread and reply-to, then
    delivered; a second sweep claims nothing."""
    oid = owe(store)
    sessions = FakeSessions()
    adapter = FakeAdapter()
    gateway = rig.gateway(sessions=sessions)
    gateway.add_adapter(SLACK, adapter)

    assert await asyncio.wait_for(gateway.redeliver_pending(), BOUND) == 1

    assert [c.content for c in adapter.calls] == [ANSWER]
    assert adapter.calls[0].chat_id == "C1"
    assert adapter.calls[0].metadata == {
        "thread_id": "171.001",
        "reply_to": "m1",
        "idempotency_key": oid,
    }
    assert sessions.cleared == [KEY]
    stored = row(store, oid)
    assert (stored.state, stored.attempts) == (_O.DELIVERED, 1)
    assert stored.owner.token == gateway.ledger.incarnation.token
    assert events(store, oid) == ["record", "claim", "deliver"]
    assert (gateway.redelivered, gateway.labelled) == (1, 0)

    assert await asyncio.wait_for(gateway.redeliver_pending(), BOUND) == 0
    assert len(adapter.calls) == 1
    assert sessions.cleared == [KEY]


@pytest.mark.parametrize("state", [_O.ATTEMPTING, _O.FAILED])
@pytest.mark.asyncio
async def test_row_whose_send_may_have_begun_is_redelivered_with_the_recovered_marker(
    rig: Rig, store: Store, state: ObligationState
) -> None:
    """A dead owner's attempting (or failed) row is redelivered with RECOVERED_MARKER at the
    start and the content at the end."""
    oid = owe(store, state=state)
    adapter = FakeAdapter()
    gateway = rig.gateway()
    gateway.add_adapter(SLACK, adapter)

    assert await asyncio.wait_for(gateway.redeliver_pending(), BOUND) == 1

    [sent] = adapter.calls
    assert sent.content.startswith(RECOVERED_MARKER)
    assert sent.content.endswith(ANSWER)
    assert RECONNECTED_MARKER not in sent.content
    assert sent.metadata["idempotency_key"] == oid
    assert row(store, oid).state is _O.DELIVERED
    assert gateway.labelled == 1


@pytest.mark.asyncio
async def test_profile_owners_row_goes_through_that_profiles_adapter_only(
    rig: Rig, store: Store
) -> None:
    """A row recorded for a credential-owner profile is redelivered through that profile's
    adapter, never the default one of the same platform."""
    oid = owe(store, session_key=OWNER_KEY, profile="credential-owner")
    default = FakeAdapter()
    owner = FakeAdapter()
    sessions = FakeSessions()
    gateway = rig.gateway(sessions=sessions)
    gateway.add_adapter(SLACK, default)
    gateway.add_adapter(SLACK, owner, profile="credential-owner")

    assert await asyncio.wait_for(gateway.redeliver_pending(), BOUND) == 1

    assert default.calls == []
    assert [c.content for c in owner.calls] == [ANSWER]
    assert sessions.cleared == [OWNER_KEY]
    assert row(store, oid).state is _O.DELIVERED


@pytest.mark.parametrize("absence", ["no adapter for the platform", "no adapter for the profile"])
@pytest.mark.asyncio
async def test_row_without_an_adapter_is_not_claimed_at_startup(
    rig: Rig, store: Store, absence: str
) -> None:
    """A dead owner's row whose (platform, profile) has no adapter here is not claimed: state
    and attempts untouched, nothing sent, no flag cleared, no other adapter used."""
    oid = owe(store, session_key=OWNER_KEY, profile="credential-owner")
    other = FakeAdapter()
    sessions = FakeSessions()
    gateway = rig.gateway(sessions=sessions)
    if absence == "no adapter for the platform":
        gateway.add_adapter("discord", other, profile="credential-owner")
    else:
        gateway.add_adapter(SLACK, other)

    assert await asyncio.wait_for(gateway.redeliver_pending(), BOUND) == 0

    stored = row(store, oid)
    assert (stored.state, stored.attempts) == (_O.PENDING, 0)
    assert stored.owner.token == DEAD.token
    assert other.calls == []
    assert sessions.cleared == []


@pytest.mark.parametrize("down", ["adapter missing", "adapter fails to connect"])
@pytest.mark.asyncio
async def test_unconnected_rows_keep_their_budget_across_boots_and_deliver_once_connected(
    rig: Rig, store: Store, down: str
) -> None:
    """Across more boots than max_attempts where the row's (platform, profile) adapter is
    missing or cannot connect, the row is never claimed (attempting, attempts 0, never
    abandoned); the first boot where it connects delivers it, labelled."""
    policy = LedgerPolicy()
    oid = owe(store, state=_O.ATTEMPTING, session_key=OWNER_KEY, profile="credential-owner")
    boots = policy.max_attempts + 2
    for n in range(boots):
        default = FakeAdapter()
        sessions = FakeSessions()
        gateway = rig.gateway(sessions=sessions, incarnation=boot_incarnation(n), policy=policy)
        gateway.add_adapter(SLACK, default)
        owner: FakeAdapter | None = None
        if down == "adapter fails to connect":
            owner = FakeAdapter(connected=False, can_connect=False)
            gateway.add_adapter(SLACK, owner, profile="credential-owner")

        assert await asyncio.wait_for(gateway.start(), BOUND) == 0
        await asyncio.wait_for(gateway.stop(budget_s=1.0), BOUND)

        stored = row(store, oid)
        assert (stored.state, stored.attempts) == (_O.ATTEMPTING, 0), f"boot {n}"
        assert stored.owner.token == DEAD.token
        assert default.calls == []
        assert sessions.cleared == []
        if owner is not None:
            assert owner.connects == 1
            assert owner.calls == []
    assert events(store, oid) == ["record", "attempt"]

    owner = FakeAdapter(connected=False, can_connect=True)
    default = FakeAdapter()
    gateway = rig.gateway(incarnation=boot_incarnation(boots), policy=policy)
    gateway.add_adapter(SLACK, default)
    gateway.add_adapter(SLACK, owner, profile="credential-owner")
    assert await asyncio.wait_for(gateway.start(), BOUND) == 1
    await eventually(lambda: row(store, oid).state is _O.DELIVERED, "the row delivered")

    assert owner.connects == 1
    assert len(owner.calls) == 1
    assert owner.calls[0].content.startswith(RECOVERED_MARKER)
    assert owner.calls[0].content.endswith(ANSWER)
    assert default.calls == []
    assert row(store, oid).attempts == 1


@pytest.mark.asyncio
async def test_attempts_are_spent_only_on_real_sends_then_the_row_is_abandoned(
    rig: Rig, store: Store
) -> None:
    """Each boot that really sends spends one attempt; once max_attempts sends failed, the
    next boot abandons the row visibly instead of sending it again."""
    policy = LedgerPolicy()
    oid = owe(store)
    adapters: list[FakeAdapter] = []
    for n in range(policy.max_attempts + 1):
        adapter = FakeAdapter(SendResult.failed("upstream timeout"))
        adapters.append(adapter)
        gateway = rig.gateway(incarnation=boot_incarnation(n), policy=policy)
        gateway.add_adapter(SLACK, adapter)
        assert await asyncio.wait_for(gateway.redeliver_pending(), BOUND) == 0
        await asyncio.wait_for(gateway.stop(budget_s=1.0), BOUND)

    assert [len(a.calls) for a in adapters] == [1] * policy.max_attempts + [0]
    stored = row(store, oid)
    assert (stored.state, stored.attempts) == (_O.ABANDONED, policy.max_attempts)
    assert events(store, oid)[-1] == "abandon"


@pytest.mark.asyncio
async def test_resume_pending_is_cleared_before_a_send_that_hangs(rig: Rig, store: Store) -> None:
    """The session's resume flag is cleared before the redelivery send begins: while that send
    hangs the clear has already happened; released, the redelivery counts one delivered."""
    owe(store)
    log: list[tuple[str, str]] = []
    hang = asyncio.Event()
    sessions = FakeSessions(log=log)
    adapter = FakeAdapter(hang=hang, log=log)
    gateway = rig.gateway(sessions=sessions)
    gateway.add_adapter(SLACK, adapter)

    task = asyncio.create_task(gateway.redeliver_pending())
    await eventually(lambda: len(adapter.calls) == 1, "the send began")

    assert sessions.cleared == [KEY]
    assert log == [("clear", KEY), ("send", ANSWER)]
    assert not task.done()
    hang.set()
    assert await asyncio.wait_for(task, BOUND) == 1


@pytest.mark.asyncio
async def test_real_session_store_flag_is_cleared_before_the_redelivery_send(
    rig: Rig, store: Store
) -> None:
    """With the default (persisted) session store, the session's resume_pending is already
    false when the redelivery send begins."""
    sessions = SessionStore(store)
    sessions.start(KEY, platform=SLACK, chat_id="C1")
    current = sessions.set_resume_pending(KEY, True)
    assert current is not None
    assert current.resume_pending
    oid = owe(store)
    flags: list[bool] = []

    def at_send(_: object) -> None:
        now = sessions.current(KEY)
        assert now is not None
        flags.append(now.resume_pending)

    adapter = FakeAdapter(on_send=at_send)
    gateway = rig.gateway(real_sessions=True)
    gateway.add_adapter(SLACK, adapter)

    assert await asyncio.wait_for(gateway.redeliver_pending(), BOUND) == 1

    assert flags == [False]
    assert row(store, oid).state is _O.DELIVERED


@pytest.mark.asyncio
async def test_startup_redelivery_sends_even_when_the_clear_fails(rig: Rig, store: Store) -> None:
    """At startup a resume-flag clear that raises does not stop the redelivery."""
    oid = owe(store)
    sessions = FakeSessions(fail=True)
    adapter = FakeAdapter()
    gateway = rig.gateway(sessions=sessions)
    gateway.add_adapter(SLACK, adapter)

    assert await asyncio.wait_for(gateway.redeliver_pending(), BOUND) == 1

    assert sessions.cleared == [KEY]
    assert [c.content for c in adapter.calls] == [ANSWER]
    assert row(store, oid).state is _O.DELIVERED


def batches_one_by_one(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the store's batched writes go through its (patched) single transition()."""
    monkeypatch.setattr(
        store,
        "transition_each",
        lambda kind, moves: transition_each_sequentially(store, kind, moves),
        raising=False,  # a store without the capability gets it, routed the same way
    )


@pytest.mark.parametrize(
    ("slow_event", "send_ok"), [("claim", True), ("deliver", True), ("fail", False)]
)
@pytest.mark.asyncio
async def test_store_work_never_blocks_the_event_loop(
    rig: Rig, store: Store, monkeypatch: pytest.MonkeyPatch, slow_event: str, send_ok: bool
) -> None:
    """While a store transition (claim, deliver or fail) blocks for 0.2 s, a ticker coroutine
    keeps ticking: the store work runs off the event loop."""
    oid = owe(store)
    adapter = FakeAdapter(SendResult.ok() if send_ok else SendResult.failed("upstream timeout"))
    gateway = rig.gateway()
    gateway.add_adapter(SLACK, adapter)
    ticks = 0
    during: list[int] = []
    real, real_many = store.transition, store.transition_many

    def stall(event: str) -> None:
        if event == slow_event and not during:
            before = ticks
            time.sleep(0.2)
            during.append(ticks - before)

    def slow_once(kind: EntityKind[Any], entity_id: str, event: str, **kwargs: Any) -> Row[Any]:
        stall(event)
        return real(kind, entity_id, event, **kwargs)

    def slow_many(
        kind: EntityKind[Any], entity_ids: Sequence[str], event: str, **kwargs: Any
    ) -> list[Row[Any]]:
        stall(event)  # sweeps claim in bulk
        return real_many(kind, entity_ids, event, **kwargs)

    monkeypatch.setattr(store, "transition", slow_once)
    monkeypatch.setattr(store, "transition_many", slow_many)
    batches_one_by_one(store, monkeypatch)
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    ticking = asyncio.create_task(ticker())
    try:
        delivered = await asyncio.wait_for(gateway.redeliver_pending(), BOUND)
    finally:
        done.set()
        await asyncio.wait_for(ticking, BOUND)

    assert delivered == int(send_ok)
    assert len(during) == 1, f"no {slow_event} transition happened"
    assert during[0] >= 5, f"the event loop ticked {during[0]} times in 0.2 s"
    assert row(store, oid).state is (_O.DELIVERED if send_ok else _O.FAILED)


@pytest.mark.asyncio
async def test_start_claims_and_clears_inline_and_sends_in_the_background(
    rig: Rig, store: Store
) -> None:
    """start() returns once the claims and flag clears are done, while the (slow) redelivery
    send is still in flight; the send then completes in the background."""
    oid = owe(store)
    hang = asyncio.Event()
    sessions = FakeSessions()
    adapter = FakeAdapter(hang=hang)
    gateway = rig.gateway(sessions=sessions)
    gateway.add_adapter(SLACK, adapter)

    assert await asyncio.wait_for(gateway.start(), BOUND) == 1

    assert sessions.cleared == [KEY]
    stored = row(store, oid)
    assert (stored.state, stored.attempts) == (_O.ATTEMPTING, 1)
    assert stored.owner.token == gateway.ledger.incarnation.token
    await eventually(lambda: len(adapter.calls) == 1, "the background send began")
    assert adapter.finished == 0
    assert row(store, oid).state is _O.ATTEMPTING
    hang.set()
    await eventually(lambda: row(store, oid).state is _O.DELIVERED, "the background delivery")
    assert [c.content for c in adapter.calls] == [ANSWER]


@pytest.mark.asyncio
async def test_redeliver_pending_returns_the_number_delivered(rig: Rig, store: Store) -> None:
    """redeliver_pending counts deliveries, not claims: of three redeliveries one refused, it
    returns two, and the refused one is recorded failed."""
    oids = [
        owe(store, session_key=f"{KEY}:{n}", content=f"answer {n}", message_ref=f"m{n}")
        for n in range(3)
    ]
    adapter = FakeAdapter(SendResult.ok(), SendResult.failed("upstream timeout"), SendResult.ok())
    sessions = FakeSessions()
    gateway = rig.gateway(sessions=sessions)
    gateway.add_adapter(SLACK, adapter)

    assert await asyncio.wait_for(gateway.redeliver_pending(), BOUND) == 2

    assert len(adapter.calls) == 3
    assert sorted(sessions.cleared) == sorted(f"{KEY}:{n}" for n in range(3))
    states = sorted(row(store, oid).state for oid in oids)
    assert states == sorted([_O.DELIVERED, _O.DELIVERED, _O.FAILED])


@pytest.mark.asyncio
async def test_a_store_error_settling_one_redelivery_strands_no_other_claim(
    rig: Rig, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When settling one redelivery fails in the store, the other claims of the sweep are
    still sent or released, never left attempting unsent."""
    for n in range(2):
        owe(store, session_key=f"{KEY}:{n}", content=f"answer {n}", message_ref=f"m{n}")
    adapter = FakeAdapter()
    gateway = rig.gateway()
    gateway.add_adapter(SLACK, adapter)
    real = store.transition
    failed: list[str] = []

    def flaky(kind: EntityKind[Any], entity_id: str, event: str, **kwargs: Any) -> Row[Any]:
        if event == "deliver" and not failed:
            failed.append(entity_id)
            raise StoreError("disk I/O error")
        return real(kind, entity_id, event, **kwargs)

    monkeypatch.setattr(store, "transition", flaky)
    batches_one_by_one(store, monkeypatch)
    with contextlib.suppress(StoreError):
        await asyncio.wait_for(gateway.redeliver_pending(), BOUND)

    assert len(failed) == 1
    sent = set(adapter.contents)
    stranded = [
        ob.content for ob in rows(store) if ob.state is _O.ATTEMPTING and ob.content not in sent
    ]
    assert stranded == []


# -- runtime: this incarnation's own failures ----------------------------------------------------


@pytest.mark.asyncio
async def test_runtime_retry_resends_send_path_degraded_with_the_reconnected_marker(
    rig: Rig, store: Store
) -> None:
    """A send_path_degraded failure of this gateway is re-claimed by redeliver_failed(platform,
    profile=...), its flag cleared before the send, resent with RECONNECTED_MARKER through
    that profile's adapter and delivered; the default profile's failure is left alone."""
    log: list[tuple[str, str]] = []
    sessions = FakeSessions(log=log)
    default = FakeAdapter(SendResult.failed("send_path_degraded"), log=log)
    reviewer = FakeAdapter(SendResult.failed("send_path_degraded"), log=log)
    gateway = rig.gateway(sessions=sessions)
    gateway.add_adapter(SLACK, default)
    gateway.add_adapter(SLACK, reviewer, profile="reviewer")
    review_key = "agent:reviewer:slack:channel:C1"
    assert not (await reply(gateway, "default's answer")).success
    assert not (await reply(gateway, session_key=review_key, profile="reviewer")).success
    mine = oid_of(session_key=review_key)
    assert row(store, mine).state is _O.FAILED
    assert row(store, mine).error_kind == "reconnect"
    log.clear()

    assert await asyncio.wait_for(gateway.redeliver_failed(SLACK, profile="reviewer"), BOUND) == 1

    assert len(default.calls) == 1  # only its own first send
    assert len(reviewer.calls) == 2
    assert reviewer.calls[1].content.startswith(RECONNECTED_MARKER)
    assert reviewer.calls[1].content.endswith(ANSWER)
    assert reviewer.calls[1].metadata["idempotency_key"] == mine
    assert sessions.cleared == [review_key]
    assert log == [("clear", review_key), ("send", reviewer.calls[1].content)]
    stored = row(store, mine)
    assert (stored.state, stored.attempts) == (_O.DELIVERED, 1)
    other = row(store, oid_of("default's answer"))
    assert (other.state, other.attempts) == (_O.FAILED, 0)


@pytest.mark.parametrize(
    ("error", "wait"), [("send_path_degraded", 0.0), ("upstream timeout", 30.0)]
)
@pytest.mark.asyncio
async def test_runtime_retry_without_an_adapter_releases_the_claim_unsent(
    rig: Rig, store: Store, error: str, wait: float
) -> None:
    """redeliver_failed for a profile with no adapter claims the row, sends nothing and
    releases it: failed, attempts refunded to 0, its previous error kept."""
    clock = FakeClock()
    incarnation = live_incarnation()
    oid = owe(
        store,
        owner=incarnation,
        state=_O.FAILED,
        error=error,
        clock=clock,
        profile="reviewer",
    )
    default = FakeAdapter()
    sessions = FakeSessions()
    gateway = rig.gateway(sessions=sessions, incarnation=incarnation, clock=clock)
    gateway.add_adapter(SLACK, default)
    clock.advance(wait)  # a transient failure is due once its backoff passed

    assert await asyncio.wait_for(gateway.redeliver_failed(SLACK, profile="reviewer"), BOUND) == 0

    assert default.calls == []
    stored = row(store, oid)
    assert (stored.state, stored.attempts, stored.last_error) == (_O.FAILED, 0, error)
    assert events(store, oid)[-2:] == ["claim", "release"]


@pytest.mark.asyncio
async def test_runtime_retry_with_a_failing_clear_releases_the_claim_unsent(
    rig: Rig, store: Store
) -> None:
    """At runtime a resume-flag clear that raises sends nothing: the claim is released
    (failed, attempts 0, error kept), and a later retry with a working clear delivers it."""
    sessions = FakeSessions(fail=True)
    adapter = FakeAdapter(SendResult.failed("send_path_degraded"))
    gateway = rig.gateway(sessions=sessions)
    gateway.add_adapter(SLACK, adapter)
    assert not (await reply(gateway)).success
    oid = oid_of()

    assert await asyncio.wait_for(gateway.redeliver_failed(SLACK), BOUND) == 0

    assert sessions.cleared == [KEY]
    assert len(adapter.calls) == 1  # the original send only
    stored = row(store, oid)
    assert (stored.state, stored.attempts, stored.last_error) == (
        _O.FAILED,
        0,
        "send_path_degraded",
    )
    assert events(store, oid)[-2:] == ["claim", "release"]

    sessions.fail = False
    assert await asyncio.wait_for(gateway.redeliver_failed(SLACK), BOUND) == 1
    assert row(store, oid).state is _O.DELIVERED


@pytest.mark.asyncio
async def test_permanent_failures_are_never_retried(rig: Rig, store: Store) -> None:
    """A permanent failure (bot blocked) is never re-sent: neither by redeliver_failed nor by
    the retry timer, however much time passes; its budget stays intact."""
    clock = FakeClock()
    adapter = FakeAdapter(SendResult.failed("Forbidden: bot was blocked by the user"))
    gateway = rig.gateway(clock=clock, retry_interval_s=30)
    gateway.add_adapter(SLACK, adapter)
    await asyncio.wait_for(gateway.start(), BOUND)
    assert not (await reply(gateway)).success
    oid = oid_of()
    assert row(store, oid).error_kind == "permanent"

    assert await asyncio.wait_for(gateway.redeliver_failed(SLACK), BOUND) == 0
    for seconds in (30, 120, 3600):
        await tick(clock, seconds)

    assert len(adapter.calls) == 1
    stored = row(store, oid)
    assert (stored.state, stored.attempts) == (_O.FAILED, 0)
    assert events(store, oid) == ["record", "attempt", "fail"]


@pytest.mark.asyncio
async def test_retry_timer_retries_a_transient_failure_once_its_backoff_passed(
    rig: Rig, store: Store
) -> None:
    """The retry timer leaves a transient failure alone until its backoff (30 s) has passed,
    then resends it labelled and delivers it."""
    clock = FakeClock()
    adapter = FakeAdapter(SendResult.failed("upstream timeout"))
    sessions = FakeSessions()
    gateway = rig.gateway(sessions=sessions, clock=clock, retry_interval_s=10)
    gateway.add_adapter(SLACK, adapter)
    await asyncio.wait_for(gateway.start(), BOUND)
    assert not (await reply(gateway)).success
    oid = oid_of()
    assert row(store, oid).next_attempt_at == clock.now() + 30

    await tick(clock, 10)
    await tick(clock, 10)
    assert len(adapter.calls) == 1, "retried before its backoff passed"
    assert row(store, oid).state is _O.FAILED

    await tick(clock, 10)
    assert len(adapter.calls) == 2
    assert adapter.calls[1].content.startswith(RECONNECTED_MARKER)
    assert adapter.calls[1].content.endswith(ANSWER)
    assert sessions.cleared == [KEY]
    stored = row(store, oid)
    assert (stored.state, stored.attempts) == (_O.DELIVERED, 1)


@pytest.mark.asyncio
async def test_retry_timer_stops_retrying_and_keeps_the_last_attempt_for_a_restart(
    rig: Rig, store: Store
) -> None:
    """A transient failure that keeps failing is retried by the timer after each backoff (30 s,
    120 s) and then no more: the last budgeted attempt is kept for a restart."""
    clock = FakeClock()
    failure = SendResult.failed("upstream timeout")
    adapter = FakeAdapter(*[failure] * 10)
    policy = LedgerPolicy()
    gateway = rig.gateway(clock=clock, policy=policy, retry_interval_s=30)
    gateway.add_adapter(SLACK, adapter)
    await asyncio.wait_for(gateway.start(), BOUND)
    assert not (await reply(gateway)).success
    oid = oid_of()

    await tick(clock, 30)
    assert len(adapter.calls) == 2
    for _ in range(3):
        await tick(clock, 30)
    assert len(adapter.calls) == 2, "retried before the second backoff passed"
    await tick(clock, 30)  # 120 s after the first retry
    assert len(adapter.calls) == 3
    for _ in range(10):
        await tick(clock, 3600)

    assert len(adapter.calls) == 3
    stored = row(store, oid)
    assert stored.state is _O.FAILED
    assert stored.attempts == policy.max_attempts - 1
    assert stored.next_attempt_at is None


# -- runtime: an adapter's reconnect -------------------------------------------------------------


@pytest.mark.asyncio
async def test_adapter_reconnect_triggers_the_runtime_retry(
    rig: Rig, store: Store, relay: Relay
) -> None:
    """A reply the platform refused with send_path_degraded stays failed and unsent; when the
    relay connection breaks and is re-established, it is resent labelled RECONNECTED and
    delivered, once."""
    transport, adapter = relay.adapter()
    sessions = FakeSessions()
    gateway = rig.gateway(sessions=sessions)
    gateway.add_adapter("loopback", adapter)
    await asyncio.wait_for(gateway.start(), BOUND)
    await eventually(relay.connected, "the gateway connected")
    key = "agent:main:loopback:dm:c1"

    relay.platform.fail_next("send_path_degraded")
    result = await reply(gateway, platform="loopback", chat_id="c1", session_key=key)
    assert (result.success, result.error) == (False, "send_path_degraded")
    oid = oid_of(session_key=key)
    assert relay.platform.texts("c1") == []
    assert row(store, oid).state is _O.FAILED

    await relay.restart()  # the connection breaks; the transport re-dials
    await eventually(lambda: len(relay.platform.texts("c1")) == 1, "the resend after reconnect")
    await eventually(lambda: row(store, oid).state is _O.DELIVERED, "the resend settled")

    [text] = relay.platform.texts("c1")
    assert text.startswith(RECONNECTED_MARKER)
    assert text.endswith(ANSWER)
    assert transport.connections == 2
    assert sessions.cleared == [key]
    assert row(store, oid).attempts == 1
    await asyncio.sleep(0.1)
    assert len(relay.platform.texts("c1")) == 1


@pytest.mark.asyncio
async def test_reply_that_failed_because_the_relay_was_down_is_resent_on_reconnect(
    rig: Rig, store: Store, relay: Relay
) -> None:
    """A reply sent while the relay connection is down is delivered as soon as the connection
    is re-established."""
    transport, adapter = relay.adapter()
    gateway = rig.gateway()
    gateway.add_adapter("loopback", adapter)
    await asyncio.wait_for(gateway.start(), BOUND)
    await eventually(relay.connected, "the gateway connected")
    await relay.stop()
    await eventually(lambda: transport.state is not TransportState.CONNECTED, "the drop noticed")
    key = "agent:main:loopback:dm:c1"

    assert not (await reply(gateway, platform="loopback", chat_id="c1", session_key=key)).success
    await relay.start()
    await eventually(lambda: transport.connections == 2, "re-established")

    await eventually(lambda: len(relay.platform.texts("c1")) == 1, "the resend", timeout=1.0)


@pytest.mark.asyncio
async def test_retry_timer_spends_no_attempt_while_the_relay_is_down(
    rig: Rig, store: Store, relay: Relay
) -> None:
    """While the relay connection is down, the retry timer does not spend a failed reply's
    attempts."""
    clock = FakeClock(start=time.time())
    transport, adapter = relay.adapter()
    gateway = rig.gateway(clock=clock, retry_interval_s=30)
    gateway.add_adapter("loopback", adapter)
    await asyncio.wait_for(gateway.start(), BOUND)
    await eventually(relay.connected, "the gateway connected")
    relay.platform.fail_next("upstream timeout")
    key = "agent:main:loopback:dm:c1"
    assert not (await reply(gateway, platform="loopback", chat_id="c1", session_key=key)).success
    await relay.stop()
    await eventually(lambda: transport.state is not TransportState.CONNECTED, "the drop noticed")

    for _ in range(6):
        await tick(clock, 30)

    assert row(store, oid_of(session_key=key)).attempts == 0

"""Several gateways on one store: a running gateway picks up what a dead peer left.

The peers run in this test process with distinct incarnations; a scripted probe says which
same-host pids live, and a peer on "another host" is judged by its heartbeat.  A peer "dies" as
under SIGKILL: its timer is cancelled (no more beats, no leave, no release) and, on this host,
the probe stops knowing its pid.  Every test runs on the in-memory store and on SQLite, on a
fake clock; every wait is bounded.
"""

from __future__ import annotations

import asyncio

import pytest

from statecore import repair
from statecore.clock import FakeClock
from statecore.errors import StaleState
from statecore.gateway import Gateway
from statecore.gateway.adapter import SendResult
from statecore.leases import OWNER_KIND, OwnerState
from statecore.lifecycles import ObligationState
from statecore.obligation import RECOVERED_MARKER
from statecore.ownership import Incarnation
from statecore.store import Store
from tests.statecore.gateway.gateway_rig import (
    ANSWER,
    BOUND,
    SLACK,
    FakeAdapter,
    FakeSessions,
    Rig,
    events,
    oid_of,
    owe,
    reply,
    row,
)
from tests.waiting import eventually

_O = ObligationState
HOST = Incarnation.current().host
LEASE = 300.0
RECOVER = 30.0

A = Incarnation(HOST, 999_501, 11, "gw-a-token")
B = Incarnation(HOST, 999_502, 12, "gw-b-token")
REMOTE_A = Incarnation("peer-host/m-77/boot-77/pidns-1", 999_503, 13, "gw-remote-token")
DEAD = Incarnation(HOST, 999_504, 14, "gw-dead-token")
LABELLED = f"{RECOVERED_MARKER}\n\n{ANSWER}"


class FleetProbe:
    """Scripted liveness of this host's fake gateway pids: alive until :meth:`kill`."""

    def __init__(self, *alive: Incarnation) -> None:
        self.procs = {inc.pid: inc.started_at for inc in alive}

    def kill(self, incarnation: Incarnation) -> None:
        self.procs.pop(incarnation.pid, None)

    def pid_exists(self, pid: int) -> bool:
        return pid in self.procs

    def start_time(self, pid: int) -> int | None:
        return self.procs.get(pid)


def peer(
    rig: Rig, clock: FakeClock, incarnation: Incarnation, probe: FleetProbe, adapter: FakeAdapter
) -> Gateway:
    """A gateway of the fleet: its retry round never fires, its recover tick every 30 s."""
    gateway = Gateway(
        rig.store,
        sessions=FakeSessions(),
        clock=clock,
        incarnation=incarnation,
        probe=probe,
        retry_interval_s=3600.0,
        recover_interval_s=RECOVER,
    )
    gateway.add_adapter(SLACK, adapter)
    rig.gateways.append(gateway)
    return gateway


async def die(gateway: Gateway) -> None:
    """SIGKILL, as far as the store can tell: the timer stops (no beat, no leave)."""
    loop = gateway._retry_loop
    assert loop is not None
    loop.cancel()
    await asyncio.wait([loop], timeout=BOUND)


async def step(clock: FakeClock, seconds: float, timers: int = 1) -> None:
    """Once the ``timers`` running gateways' timers wait, move time by ``seconds`` and wait
    until each has finished its round and waits again."""
    await eventually(lambda: clock.sleepers == timers, "the timers waiting")
    clock.advance(seconds)
    await eventually(lambda: clock.sleepers == timers, "the timers' rounds done")


@pytest.mark.asyncio
async def test_a_same_host_dead_owners_row_is_reclaimed_by_the_next_recover_tick(
    rig: Rig, store: Store
) -> None:
    """A row a dead process of this host left after this gateway started is claimed by the
    first recover tick (not before it) and delivered labelled, since it was attempting."""
    clock = FakeClock()
    adapter = FakeAdapter()
    gateway = peer(rig, clock, B, FleetProbe(B), adapter)
    assert await asyncio.wait_for(gateway.start(), BOUND) == 0
    oid = owe(store, owner=DEAD, state=_O.ATTEMPTING, clock=clock)
    await step(clock, RECOVER - 1)
    assert row(store, oid).owner.token == DEAD.token
    await step(clock, 1)
    await eventually(lambda: row(store, oid).state is _O.DELIVERED, "the redelivery")
    assert adapter.contents == [LABELLED]
    assert row(store, oid).owner.token == B.token


@pytest.mark.asyncio
async def test_recover_interval_zero_leaves_the_timer_to_its_other_chores(
    rig: Rig, store: Store
) -> None:
    """recover_interval_s=0: a dead owner's row waits for the next start or reconnect."""
    clock = FakeClock()
    gateway = Gateway(
        store, sessions=FakeSessions(), clock=clock, probe=FleetProbe(B), incarnation=B,
        retry_interval_s=60.0, recover_interval_s=0,
    )  # fmt: skip
    gateway.add_adapter(SLACK, FakeAdapter())
    rig.gateways.append(gateway)
    await asyncio.wait_for(gateway.start(), BOUND)
    oid = owe(store, owner=DEAD, clock=clock)
    for _ in range(5):
        await step(clock, 60.0)
    assert row(store, oid).owner.token == DEAD.token
    assert await gateway.recover_dead_owners() == 1  # on demand, it is the same sweep


@pytest.mark.asyncio
async def test_a_killed_peer_on_this_host_is_replaced_at_once_and_cannot_settle_after(
    rig: Rig, store: Store
) -> None:
    """Two gateways share a store; A is sending a reply (attempting) and owes another
    (pending) when it is killed.  B's next recover tick claims both: the one that may have
    gone out is sent labelled, the other plainly.  A's send then returns: its settle is
    refused (fenced out) and the row stays B's, delivered once by B."""
    clock = FakeClock()
    probe = FleetProbe(A, B)
    hang = asyncio.Event()
    adapter_a, adapter_b = FakeAdapter(hang=hang), FakeAdapter()
    a = peer(rig, clock, A, probe, adapter_a)
    b = peer(rig, clock, B, probe, adapter_b)
    await asyncio.wait_for(a.start(), BOUND)
    await asyncio.wait_for(b.start(), BOUND)
    sending = asyncio.create_task(reply(a))
    await eventually(lambda: len(adapter_a.calls) == 1, "A's send under way")
    pending = owe(store, owner=A, clock=clock, content="second answer", message_ref="m2")
    await step(clock, RECOVER, timers=2)
    assert row(store, oid_of()).owner.token == A.token  # A lives: B leaves its rows alone

    await die(a)
    probe.kill(A)
    await step(clock, RECOVER)
    await eventually(lambda: row(store, pending).state is _O.DELIVERED, "the redeliveries")
    await eventually(lambda: row(store, oid_of()).state is _O.DELIVERED, "the redeliveries")
    assert sorted(adapter_b.contents) == sorted([LABELLED, "second answer"])

    hang.set()  # the zombie's send comes back
    with pytest.raises(StaleState):
        await asyncio.wait_for(sending, BOUND)
    sent = row(store, oid_of())
    assert (sent.state, sent.owner.token, sent.attempts) == (_O.DELIVERED, B.token, 1)
    assert events(store, oid_of()) == ["record", "attempt", "claim", "deliver"]


@pytest.mark.asyncio
async def test_a_peer_on_another_host_keeps_its_rows_while_it_beats_and_loses_them_at_its_lease(
    rig: Rig, store: Store
) -> None:
    """A runs on another host: while its timer beats, B's recover ticks leave its rows alone
    for two leases; once A is killed, its rows are reclaimed by the first tick at or after
    the end of the lease of its last beat -- not a tick before -- and delivered labelled."""
    clock = FakeClock()
    probe = FleetProbe(B)  # A's pid means nothing here: it is another host's
    hang = asyncio.Event()
    adapter_a, adapter_b = FakeAdapter(hang=hang), FakeAdapter()
    a = peer(rig, clock, REMOTE_A, probe, adapter_a)
    b = peer(rig, clock, B, probe, adapter_b)
    await asyncio.wait_for(a.start(), BOUND)
    await asyncio.wait_for(b.start(), BOUND)
    sending = asyncio.create_task(reply(a))
    await eventually(lambda: len(adapter_a.calls) == 1, "A's send under way")
    for _ in range(int(2 * LEASE / RECOVER)):
        await step(clock, RECOVER, timers=2)
    assert row(store, oid_of()).owner.token == REMOTE_A.token

    await die(a)
    [record] = store.select(OWNER_KIND, where={"owner_token": REMOTE_A.token})
    assert record.state is OwnerState.ALIVE
    lease_end = record["lease_expires_at"]
    while clock.now() + RECOVER < lease_end:
        await step(clock, RECOVER)
        assert row(store, oid_of()).owner.token == REMOTE_A.token
    await step(clock, RECOVER)
    assert clock.now() >= lease_end
    assert row(store, oid_of()).owner.token == B.token
    await eventually(lambda: row(store, oid_of()).state is _O.DELIVERED, "the redelivery")
    assert adapter_b.contents == [LABELLED]
    hang.set()
    with pytest.raises(StaleState):
        await asyncio.wait_for(sending, BOUND)


@pytest.mark.asyncio
async def test_a_peer_that_stopped_cleanly_is_replaced_at_the_next_tick(
    rig: Rig, store: Store
) -> None:
    """A (another host) stops: its lease ends with the stop, so B's next recover tick claims
    what A still owed -- well before A's lease would have run out -- and sends it labelled."""
    clock = FakeClock()
    probe = FleetProbe(B)
    adapter_b = FakeAdapter()
    a = peer(rig, clock, REMOTE_A, probe, FakeAdapter(SendResult.failed("upstream timeout")))
    b = peer(rig, clock, B, probe, adapter_b)
    await asyncio.wait_for(a.start(), BOUND)
    await asyncio.wait_for(b.start(), BOUND)
    assert not (await asyncio.wait_for(reply(a), BOUND)).success
    assert row(store, oid_of()).state is _O.FAILED
    await asyncio.wait_for(a.stop(budget_s=1.0), BOUND)
    [record] = store.select(OWNER_KIND, where={"owner_token": REMOTE_A.token})
    assert record.state is OwnerState.GONE
    await step(clock, RECOVER)
    await eventually(lambda: row(store, oid_of()).state is _O.DELIVERED, "the redelivery")
    assert clock.now() < record["lease_expires_at"]
    assert adapter_b.contents == [LABELLED]
    assert row(store, oid_of()).owner.token == B.token


@pytest.mark.asyncio
async def test_a_running_gateway_sends_an_operators_retry_at_its_next_recover_tick(
    rig: Rig, store: Store
) -> None:
    """An operator's retry of an abandoned reply (a new pending row with no owner) is claimed
    by a running gateway's recover tick and sent; no restart is needed."""
    clock = FakeClock()
    adapter = FakeAdapter()
    gateway = peer(rig, clock, B, FleetProbe(B), adapter)
    assert await asyncio.wait_for(gateway.start(), BOUND) == 0
    old = owe(store, owner=DEAD, state=_O.PENDING, clock=clock)
    repair.abandon(store, old, by="alice", reason="gave up", clock=clock)
    retried = repair.retry_abandoned(store, old, by="alice", reason="still waiting", clock=clock)
    assert retried.owner.token is None
    await step(clock, RECOVER)
    new = retried.obligation_id
    await eventually(lambda: row(store, new).state is _O.DELIVERED, "the retry delivered")
    assert row(store, new).owner.token == B.token
    assert row(store, old).state is _O.ABANDONED

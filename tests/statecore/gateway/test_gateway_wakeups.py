"""Wake-ups instead of polling: a gateway that stops cleanly with replies owed wakes its peers.

On PostgreSQL the leaving ledger announces on ``statecore_obligations`` in the transaction that
ends its owner record, and a peer's recovery loop, listening on it, runs its dead-owner recovery
at once -- long before its ``recover_interval_s``.  On a store without notifications nothing is
sent and nothing listens: the peer recovers on its recover tick, as before.  The peers run in
this test process with distinct incarnations; the leaver is on "another host", so it is judged by
its owner record.  Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from statecore.claims import NotifyingStore
from statecore.clock import Clock, FakeClock
from statecore.gateway import Gateway
from statecore.leases import OWNER_KIND, OwnerState
from statecore.ledger import Ledger
from statecore.lifecycles import ObligationState
from statecore.ownership import Incarnation
from statecore.store import Store
from statecore.wakeups import CHANNEL
from stores.memory import InMemoryStore
from stores.postgres import PostgresStore
from tests.statecore.gateway.gateway_rig import (
    ANSWER,
    SLACK,
    FakeAdapter,
    FakeSessions,
    live_incarnation,
    owe,
    row,
)
from tests.waiting import eventually

_O = ObligationState
INTERVAL = 60.0
"""The peers' recover interval: far longer than any wait below."""
WOKEN_WITHIN = 2.0
"""Real seconds within which a woken peer has claimed and delivered the rows."""
LEAVER = Incarnation("peer-host/m-1/boot-1/pidns-1", 999_601, 21, "wake-leaver-token")


class Probe:
    """This host's live pids: only the sweeping gateway's (the leaver is on another host)."""

    def __init__(self, alive: Incarnation) -> None:
        self.alive = alive

    def pid_exists(self, pid: int) -> bool:
        return pid == self.alive.pid

    def start_time(self, pid: int) -> int | None:
        return self.alive.started_at if pid == self.alive.pid else None


@pytest.fixture
def pg(postgres_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore(postgres_url, schema=f"w_{uuid.uuid4().hex[:16]}", pool_size=8)
    yield store
    store.close()


class Fleet:
    """Gateways on one store, each stopped (bounded) at the end."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.gateways: list[Gateway] = []

    def gateway(self, incarnation: Incarnation, adapter: FakeAdapter, clock: Clock) -> Gateway:
        gateway = Gateway(
            self.store,
            sessions=FakeSessions(),
            clock=clock,
            incarnation=incarnation,
            probe=Probe(incarnation),
            retry_interval_s=3600.0,
            recover_interval_s=INTERVAL,
        )
        gateway.add_adapter(SLACK, adapter)
        self.gateways.append(gateway)
        return gateway

    async def close(self) -> None:
        for gateway in reversed(self.gateways):
            await asyncio.wait_for(gateway.stop(budget_s=1.0), 10.0)


@pytest_asyncio.fixture
async def pg_fleet(pg: PostgresStore) -> AsyncIterator[Fleet]:
    fleet = Fleet(pg)
    try:
        yield fleet
    finally:
        await fleet.close()


def _owe_as_leaver(store: Store, count: int, clock: Clock) -> list[str]:
    return [owe(store, owner=LEAVER, message_ref=f"m{i}", clock=clock) for i in range(count)]


@pytest.mark.asyncio
async def test_a_peer_recovers_at_once_when_a_gateway_leaves_with_rows_owed(
    pg: PostgresStore, pg_fleet: Fleet
) -> None:
    """Gateway A (another host) owes three replies and stops cleanly; gateway B, whose recover
    tick is a minute away, has claimed and delivered them within two seconds."""
    assert isinstance(pg, NotifyingStore)
    clock = FakeClock()  # time never moves: no timer ever fires
    a_adapter, b_adapter = FakeAdapter(), FakeAdapter()
    a = pg_fleet.gateway(LEAVER, a_adapter, clock)
    b_inc = live_incarnation()
    b = pg_fleet.gateway(b_inc, b_adapter, clock)
    assert await asyncio.wait_for(a.start(), 10.0) == 0
    assert await asyncio.wait_for(b.start(), 10.0) == 0
    await eventually(lambda: len(pg._listeners) == 2, "both recovery loops listening")
    oids = _owe_as_leaver(pg, 3, clock)
    await asyncio.sleep(0.2)
    assert {row(pg, oid).owner.token for oid in oids} == {LEAVER.token}  # A beats: alive
    left = time.monotonic()
    await asyncio.wait_for(a.stop(budget_s=1.0), 10.0)
    await eventually(
        lambda: all(row(pg, oid).state is _O.DELIVERED for oid in oids),
        "B's woken recovery",
        timeout=WOKEN_WITHIN,
    )
    assert time.monotonic() - left < WOKEN_WITHIN
    assert {row(pg, oid).owner.token for oid in oids} == {b_inc.token}
    assert b_adapter.contents == [ANSWER] * 3
    assert a_adapter.contents == []


@pytest.mark.asyncio
async def test_leave_announces_only_when_rows_are_owed(pg: PostgresStore) -> None:
    """The ledger announces on its channel in the transaction that ends its owner record, and
    only when its incarnation still owes rows; a rolled-back leave announces nothing."""
    clock = FakeClock()
    heard: list[str] = []
    unsubscribe = pg.listen(CHANNEL, heard.append)
    try:
        idle = Ledger(pg, clock=clock, incarnation=live_incarnation(), probe=Probe(LEAVER))
        idle.heartbeat()
        assert idle.leave() is True
        owing = Ledger(pg, clock=clock, incarnation=LEAVER, probe=Probe(LEAVER))
        owing.heartbeat()
        _owe_as_leaver(pg, 1, clock)

        def leave_rolled_back() -> None:
            with pg.atomic():
                assert owing.leave() is True
                raise RuntimeError("rolled back")

        with pytest.raises(RuntimeError):
            leave_rolled_back()
        await asyncio.sleep(0.5)
        assert heard == []
        records = pg.select(OWNER_KIND, where={"owner_token": LEAVER.token})
        assert [r.state for r in records] == [OwnerState.ALIVE]
        owing.heartbeat()  # the heartbeat forgot its record: it joins again
        assert owing.leave() is True
        await eventually(lambda: heard == [LEAVER.token], "the announcement")
        assert owing.leave() is False  # nothing ended: nothing sent
        await asyncio.sleep(0.3)
        assert heard == [LEAVER.token]
    finally:
        unsubscribe()


@pytest.mark.asyncio
async def test_without_notifications_the_peer_waits_for_its_recover_tick() -> None:
    """On the in-memory store nothing is announced or heard: the rows stay with the leaver
    until the peer's recover tick, which then claims and delivers them."""
    store = InMemoryStore()
    fleet = Fleet(store)
    try:
        clock = FakeClock()
        a = fleet.gateway(LEAVER, FakeAdapter(), clock)
        b_inc = live_incarnation()
        b_adapter = FakeAdapter()
        b = fleet.gateway(b_inc, b_adapter, clock)
        await asyncio.wait_for(a.start(), 10.0)
        await asyncio.wait_for(b.start(), 10.0)
        oids = _owe_as_leaver(store, 2, clock)
        await asyncio.wait_for(a.stop(budget_s=1.0), 10.0)
        await asyncio.sleep(0.3)
        assert not hasattr(store, "listen")
        assert {row(store, oid).owner.token for oid in oids} == {LEAVER.token}
        await eventually(lambda: clock.sleepers == 1, "B's timer waiting")
        clock.advance(INTERVAL)
        await eventually(
            lambda: all(row(store, oid).state is _O.DELIVERED for oid in oids), "the tick"
        )
        assert {row(store, oid).owner.token for oid in oids} == {b_inc.token}
        assert b_adapter.contents == [ANSWER] * 2
    finally:
        await fleet.close()

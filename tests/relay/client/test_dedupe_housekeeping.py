"""The dedupe store's housekeeping: handled-replay keys and dismissed undeliverable records are
pruned past a retention, records nobody dismissed never; the relay adapter hands the gateway
those jobs when its transport has such a store.  Runs on the in-memory store and on SQLite."""

from __future__ import annotations

import pytest

from relay.client.adapter import RelayAdapter
from relay.client.dedupe import DEDUPE_KIND, UNDELIVERABLE_KIND, StoreBufferDedupe
from relay.client.transport import WebSocketRelayTransport
from statecore.clock import FakeClock
from statecore.store import Store
from tests.relay.client.connector_stub import MemoryDedupe, StubConnector

RETENTION = 100.0


async def record(dedupe: StoreBufferDedupe, buffer_id: str) -> None:
    """Record one undeliverable delivery."""
    await dedupe.record_undeliverable(
        buffer_id, frame_type="inbound", reason="poison", raw_line="x"
    )


@pytest.mark.asyncio
async def test_only_records_dismissed_longer_ago_than_the_retention_are_pruned(
    store: Store,
) -> None:
    """An old record dismissed long ago goes (with its history); one dismissed recently and one
    never dismissed -- however old -- stay."""
    clock = FakeClock()
    dedupe = StoreBufferDedupe(store, clock=clock)
    for buffer_id in ("b-old", "b-recent", "b-open"):
        await record(dedupe, buffer_id)
    dedupe.dismiss("b-old")
    clock.advance(RETENTION * 2)
    dedupe.dismiss("b-recent")
    assert dedupe.prune_dismissed(RETENTION) == 1
    assert sorted(r.id for r in store.select(UNDELIVERABLE_KIND)) == ["b-open", "b-recent"]
    assert store.history(UNDELIVERABLE_KIND, "b-old") == []
    assert [u.buffer_id for u in dedupe.undeliverable()] == ["b-open"]
    clock.advance(RETENTION * 2)
    assert dedupe.prune_dismissed(RETENTION) == 1
    assert [r.id for r in store.select(UNDELIVERABLE_KIND)] == ["b-open"]


@pytest.mark.asyncio
async def test_the_housekeeping_jobs_prune_keys_and_dismissed_records(store: Store) -> None:
    """housekeeping(retention) names two jobs; each deletes what is past the retention and says
    how many; a key handled recently is kept.  A retention that is not positive is refused."""
    clock = FakeClock()
    dedupe = StoreBufferDedupe(store, clock=clock)
    await dedupe.remember("b-handled")
    await record(dedupe, "b-poison")
    dedupe.dismiss("b-poison")
    clock.advance(RETENTION * 2)
    await dedupe.remember("b-fresh")
    jobs = dedupe.housekeeping(RETENTION)
    assert sorted(jobs) == ["dedupe", "undeliverable"]
    assert await jobs["dedupe"]() == 2  # b-handled and the poison record's own key
    assert await jobs["undeliverable"]() == 1
    assert [r.id for r in store.select(DEDUPE_KIND)] == ["b-fresh"]
    assert await dedupe.seen("b-fresh")
    assert store.select(UNDELIVERABLE_KIND) == []
    for bad in (0, -5.0):
        with pytest.raises(ValueError, match="retention_s"):
            dedupe.housekeeping(bad)


def test_the_relay_adapter_keeps_house_for_its_transports_dedupe(
    store: Store, connector: StubConnector
) -> None:
    """A relay adapter declares keeps_house; it names its dedupe store's jobs, and none when the
    transport has no dedupe or one that names no jobs."""
    with_store = RelayAdapter(
        WebSocketRelayTransport(connector.url, "p", "b", dedupe=StoreBufferDedupe(store))
    )
    assert RelayAdapter.abilities.keeps_house
    assert sorted(with_store.housekeeping(RETENTION)) == ["dedupe", "undeliverable"]
    bare = RelayAdapter(WebSocketRelayTransport(connector.url, "p", "b"))
    assert bare.housekeeping(RETENTION) == {}
    in_memory = RelayAdapter(
        WebSocketRelayTransport(connector.url, "p", "b", dedupe=MemoryDedupe(connector))
    )
    assert in_memory.housekeeping(RETENTION) == {}

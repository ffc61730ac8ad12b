"""The connector's durable inbound dedupe (relay.connector.seen): an event whose platform id was
taken before is not routed again -- within one connector, after a restart on the same SQLite
file, and never at the price of a key without its event (one transaction)."""

from __future__ import annotations

import logging
import math
import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from relay.connector.buffer import BUFFER_KIND
from relay.connector.intake import DriverIntake, IntakeFull
from relay.connector.platform import LoopbackPlatform
from relay.connector.seen import SEEN_KIND, SeenState
from relay.connector.server import MIN_SEEN_RETENTION_S, Connector
from relay.connector.subscriptions import Subscriptions
from relay.wire.frames import EventSource, InboundEvent
from statecore.batch import Creation
from statecore.clock import FakeClock
from statecore.entity import EntityKind
from statecore.errors import StoreError
from statecore.store import Row
from stores.sqlite import SQLiteStore
from tests.recording_metrics import RecordingMetrics
from tests.relay.connector.connector_harness import (
    SECRETS,
    Harness,
    Recorder,
    is_live,
    make_event,
    nothing_arrives,
    raw_hello,
    recv_frame,
)
from tests.waiting import eventually

CONNECTOR_LOGGER = "relay.connector.server"


class IntakeRecordingMetrics(RecordingMetrics):
    """Records the intake's reports too (it implements statecore.metrics.IntakeMetrics)."""

    def held(self, platform: str, depth: int) -> None:
        """Recorded."""
        self._record("held", platform, depth)

    def intake(self, platform: str, outcome: str, count: int = 1) -> None:
        """Recorded."""
        self._record("intake", platform, outcome, count)


class FailingStore(SQLiteStore):
    """A SQLite store whose buffer appends fail while ``armed`` (after the round's key insert,
    in the same transaction)."""

    armed = False

    def insert_each(
        self, kind: EntityKind[Any], creations: Sequence[Creation]
    ) -> list[tuple[Row[Any], bool] | Exception]:
        if self.armed and kind is BUFFER_KIND:
            raise StoreError("disk full")
        return super().insert_each(kind, creations)

    def insert(
        self,
        kind: EntityKind[Any],
        entity_id: str,
        values: Mapping[str, object],
        *,
        event: str,
        audit: Any,
    ) -> tuple[Row[Any], bool]:
        if self.armed and kind is BUFFER_KIND:
            raise StoreError("disk full")
        return super().insert(kind, entity_id, values, event=event, audit=audit)


def _subscribe(path: Path, *gateways: str) -> None:
    """Record the gateways as listening to the loopback platform (asleep: they said hello to an
    earlier connector)."""
    store = SQLiteStore(path)
    try:
        for gateway_id in gateways:
            Subscriptions(store).add(gateway_id, "loopback")
    finally:
        store.close()


def _rows(path: Path, table: str) -> list[tuple[Any, ...]]:
    """The rows of one table, read through a connection of its own (what is committed)."""
    conn = sqlite3.connect(path)
    try:
        return list(conn.execute(f'SELECT * FROM "{table}"'))
    finally:
        conn.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "connector.db"


@pytest.mark.asyncio
async def test_a_redelivered_event_after_reopening_the_store_is_not_routed_twice(
    db: Path,
) -> None:
    """A connector takes an event for a sleeping gateway and stops; the store is closed.  A
    new connector on the same file gets the same event again (the platform redelivered it):
    it is recognised as a copy -- nothing more is buffered -- and the gateway, waking up,
    receives it once."""
    _subscribe(db, "gw-a")
    first = Harness(SQLiteStore(db))
    try:
        connector = await first.start()
        await connector.driver_intake("loopback", make_event(1))
        assert connector.buffered("gw-a") == 1
        assert connector.duplicates == 0
    finally:
        await first.close()
        first.store.close()

    second = Harness(SQLiteStore(db))
    try:
        connector = await second.start()
        await connector.driver_intake("loopback", make_event(1))  # the platform's copy
        assert connector.duplicates == 1
        assert connector.buffered("gw-a") == 1
        await connector.driver_intake("loopback", make_event(2))  # a new event still goes
        recorder = Recorder()
        await second.gateway(connector, "gw-a", recorder)
        await eventually(lambda: recorder.texts == ["e1", "e2"], "the backlog, once each")
        await connector.driver_intake("loopback", make_event(1))  # and once more, live
        await eventually(lambda: connector.duplicates == 2, "the second copy skipped")
        assert recorder.texts == ["e1", "e2"]
    finally:
        await second.close()
        second.store.close()


@pytest.mark.asyncio
async def test_the_key_and_the_appends_commit_together_or_not_at_all(db: Path) -> None:
    """Two sleeping gateways; the store fails writing the buffer entries after the event's key
    was written in the same transaction: nothing is left (no key, no entry) and the driver
    sees IntakeFull.  Offered again once the store works, the event reaches both."""
    _subscribe(db, "gw-a", "gw-b")
    store = FailingStore(db)
    h = Harness(store)
    try:
        connector = await h.start()
        store.armed = True
        with pytest.raises(StoreError, match="disk full"):
            await connector.intake("loopback", make_event(1))
        with pytest.raises(IntakeFull) as refused:
            await connector.driver_intake("loopback", make_event(1))
        assert isinstance(refused.value.__cause__, StoreError)
        assert _rows(db, "relay_inbound_seen") == []
        assert _rows(db, "relay_inbound_buffer") == []
        store.armed = False
        await connector.driver_intake("loopback", make_event(1))
        assert (connector.buffered("gw-a"), connector.buffered("gw-b")) == (1, 1)
        assert len(_rows(db, "relay_inbound_seen")) == 1
        assert connector.duplicates == 0
    finally:
        await h.close()
        store.close()


@pytest.mark.asyncio
async def test_copies_are_skipped_counted_and_logged_rate_limited(
    mh: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Copies the connector took itself are skipped from its cache: counted, reported to a
    metrics hook that counts intake outcomes, and logged at INFO, at most a few lines."""
    metrics = IntakeRecordingMetrics()
    mh.store.register(BUFFER_KIND)
    Subscriptions(mh.store).add("gw-a", "loopback")
    connector = await mh.start(metrics=metrics)
    await connector.intake("loopback", make_event(1))
    with caplog.at_level(logging.INFO, logger=CONNECTOR_LOGGER):
        for _ in range(50):
            await connector.intake("loopback", make_event(1))
    assert connector.duplicates == 50
    assert connector.buffered("gw-a") == 1
    assert metrics.of("intake") == [("loopback", "duplicate", 1)] * 50
    lines = [r for r in caplog.records if "taken before" in r.getMessage()]
    assert 1 <= len(lines) <= 5
    assert all(r.levelno == logging.INFO for r in lines)


@pytest.mark.asyncio
async def test_a_live_delivery_writes_the_key_before_it_goes_out(mh: Harness) -> None:
    """A gateway that does not ack live deliveries gets an event live (nothing buffered), and
    the event's key is stored by then: a copy is not sent again."""
    connector = await mh.start()
    ws = await mh.raw(connector)
    descriptor = await raw_hello(ws)
    assert descriptor["type"] == "descriptor"
    await eventually(lambda: is_live(connector, "gw-a"), "live")
    await connector.intake("loopback", make_event(7))
    frame = await recv_frame(ws)
    assert frame["type"] == "inbound"
    assert "bufferId" not in frame
    assert frame["event"]["text"] == "e7"
    [key] = mh.store.select(SEEN_KIND)
    assert (key["platform"], key["event_id"], key.state) == ("loopback", "x7", SeenState.TAKEN)
    assert connector.buffered("gw-a") == 0
    await connector.intake("loopback", make_event(7))
    assert connector.duplicates == 1
    assert await nothing_arrives(ws)


@pytest.mark.asyncio
async def test_events_without_a_message_id_are_not_deduped(mh: Harness) -> None:
    """An event without a platform id has no key: each one is routed."""
    Subscriptions(mh.store).add("gw-a", "loopback")
    connector = await mh.start()
    event = InboundEvent(
        text="no id",
        source=EventSource(platform="loopback", chat_id="c1", chat_type="dm", user_id="u"),
    )
    await connector.intake("loopback", event)
    await connector.intake("loopback", event)
    assert connector.buffered("gw-a") == 2
    assert connector.duplicates == 0
    assert mh.store.select(SEEN_KIND) == []


@pytest.mark.asyncio
async def test_keys_are_pruned_after_their_retention(mh: Harness) -> None:
    """The housekeeping forgets and deletes the keys taken longer ago than seen_retention_s
    (counted as ``seen``); a younger key stays and still stops its copy."""
    clock = FakeClock(time.time())
    Subscriptions(mh.store).add("gw-a", "loopback")
    connector = await mh.start(
        clock=clock,
        seen_retention_s=MIN_SEEN_RETENTION_S,
        retention_s=4 * MIN_SEEN_RETENTION_S,
        prune_interval_s=0,  # no timer: the fake clock's jumps would also run its rounds
    )
    await connector.intake("loopback", make_event(1))
    clock.advance(MIN_SEEN_RETENTION_S / 2)
    await connector.intake("loopback", make_event(2))
    clock.advance(MIN_SEEN_RETENTION_S / 2 + 1)
    counts = await connector.housekeep()
    assert counts["seen"] == 1
    assert [r["event_id"] for r in mh.store.select(SEEN_KIND)] == ["x2"]
    await connector.intake("loopback", make_event(2))
    assert connector.duplicates == 1
    await connector.intake("loopback", make_event(1))  # past its retention: taken anew
    assert connector.duplicates == 1
    assert connector.buffered("gw-a") == 3


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"seen_retention_s": 3600.0}, ValueError, "seen_retention_s"),
        ({"seen_retention_s": math.nan}, ValueError, "seen_retention_s"),
        ({"seen_retention_s": math.inf}, ValueError, "seen_retention_s"),
        ({"seen_retention_s": True}, TypeError, "seen_retention_s"),
        ({"seen_retention_s": "2d"}, TypeError, "seen_retention_s"),
        ({"max_held": 0}, ValueError, "max_held"),
        ({"max_held": -5}, ValueError, "max_held"),
        ({"max_held": 10.0}, TypeError, "max_held"),
        ({"max_held": False}, TypeError, "max_held"),
    ],
)
def test_bad_options_are_refused_before_anything_is_registered(
    db: Path, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    """An intake option out of range or of the wrong kind is a typed error, and the store is
    left as it was (no table of the connector's created)."""
    store = SQLiteStore(db)
    try:
        with pytest.raises(error, match=match):
            Connector(store, secrets=SECRETS, drivers={"loopback": LoopbackPlatform()}, **options)
    finally:
        store.close()
    conn = sqlite3.connect(db)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_schema WHERE type='table'")]
    finally:
        conn.close()
    assert not [t for t in tables if t.startswith("relay_")]


def test_every_driver_is_handed_the_driver_intake(mh: Harness) -> None:
    """attach gets a DriverIntake (callable as the plain intake, with reject/load/save)."""
    got: list[object] = []

    class Attaching(LoopbackPlatform):
        def attach(self, intake: Any) -> None:
            got.append(intake)
            super().attach(intake)

    connector = Connector(mh.store, secrets=SECRETS, drivers={"loopback": Attaching()})
    assert got == [connector.driver_intake]
    assert isinstance(got[0], DriverIntake)

"""Events no gateway listens to are held durably (relay.connector.held), bounded by max_held,
released in order to the first gateway that says hello -- before its replay, so before any
later live event -- and expired when none comes in time."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

import pytest

from relay.connector.held import HOLD_KIND, HeldState
from relay.connector.intake import IntakeFull
from relay.connector.platform import LoopbackPlatform
from relay.connector.seen import SEEN_KIND
from relay.wire.compat import ACKED_LIVE
from statecore.clock import FakeClock
from stores.sqlite import SQLiteStore
from tests.recording_metrics import RecordingMetrics
from tests.relay.connector.connector_harness import (
    Harness,
    Recorder,
    is_live,
    make_event,
    raw_hello,
    recv_frame,
    send_line,
)
from tests.waiting import BOUND, eventually

CONNECTOR_LOGGER = "relay.connector.server"


class IntakeRecordingMetrics(RecordingMetrics):
    """Records the intake's reports too (it implements statecore.metrics.IntakeMetrics)."""

    def held(self, platform: str, depth: int) -> None:
        """Recorded."""
        self._record("held", platform, depth)

    def intake(self, platform: str, outcome: str, count: int = 1) -> None:
        """Recorded."""
        self._record("intake", platform, outcome, count)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "connector.db"


def _count(path: Path, table: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])
    finally:
        conn.close()


@pytest.mark.asyncio
async def test_held_events_go_to_the_first_gateway_that_says_hello_in_order(
    mh: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Three events arrive before any gateway said hello: held (counted as undeliverable,
    logged at WARNING), nothing buffered.  The first gateway to say hello receives them in
    order and only then an event written after it connected; a second gateway gets none of
    them."""
    metrics = IntakeRecordingMetrics()
    connector = await mh.start(metrics=metrics)
    with caplog.at_level(logging.WARNING, logger=CONNECTOR_LOGGER):
        for text in ("h1", "h2", "h3"):
            await mh.platform.inject("c1", text, user_id="u1")
    assert (connector.held(), connector.held("loopback"), connector.held("other")) == (3, 3, 0)
    assert connector.undeliverable == 3
    assert connector.buffered("gw-a") == 0
    assert any("held until one says hello" in r.getMessage() for r in caplog.records)
    # The hold's depth is reported from the store thread, after the intake answered.
    await eventually(lambda: metrics.of("held")[-1:] == [("loopback", 3)], "the depth reported")

    first = Recorder()
    await mh.gateway(connector, "gw-a", first)
    await mh.platform.inject("c1", "later", user_id="u1")
    await eventually(lambda: first.texts == ["h1", "h2", "h3", "later"], "held, then live")
    assert connector.held() == 0
    assert metrics.of("held")[-1] == ("loopback", 0)
    rows = mh.store.select(HOLD_KIND, order_by="seq")
    assert [(r.state, r["gateway_id"]) for r in rows] == [(HeldState.RELEASED, "gw-a")] * 3

    second = Recorder()
    await mh.gateway(connector, "gw-b", second)
    await mh.platform.inject("c1", "both", user_id="u1")
    await eventually(lambda: second.texts == ["both"], "only what came after its hello")
    await eventually(lambda: connector.buffered("gw-a") == 0, "everything acked")


@pytest.mark.asyncio
async def test_the_gateway_a_held_event_is_released_to_may_answer_its_chat(mh: Harness) -> None:
    """Released events teach the provenance as routed ones do: the gateway's answer to the
    held chat (and to its user) is performed, not declined by the egress guard."""
    connector = await mh.start(open_egress=False)  # the provenance guard, as by default
    await mh.platform.inject("c-held", "anyone there?", user_id="u-held")
    recorder = Recorder()
    gateway = await mh.gateway(connector, "gw-a", recorder)
    await eventually(lambda: recorder.texts == ["anyone there?"], "the held event")

    to_chat = await gateway.request(
        {"op": "send", "chat_id": "c-held", "content": "yes"}, timeout_s=BOUND
    )
    to_user = await gateway.request(
        {"op": "send", "chat_id": "u-held", "content": "and you"}, timeout_s=BOUND
    )
    never_seen = await gateway.request(
        {"op": "send", "chat_id": "c-other", "content": "no"}, timeout_s=BOUND
    )

    assert (to_chat.success, to_user.success) == (True, True)
    assert not never_seen.success  # the guard still declines what nobody wrote from
    assert mh.platform.texts("c-held") == ["yes"]


@pytest.mark.asyncio
async def test_with_acked_live_the_released_events_wait_in_the_buffer_until_acked(
    mh: Harness,
) -> None:
    """A gateway that acks live deliveries: the released events are its buffer entries, so
    until it acks them they stay (nothing lost if it dies); once handled they are retired."""
    connector = await mh.start()
    await mh.platform.inject("c1", "held", user_id="u1")
    recorder = Recorder()
    await mh.gateway(connector, "gw-a", recorder)
    assert ACKED_LIVE in connector._instances["gw-a"].features  # announced by our transport
    await eventually(lambda: recorder.texts == ["held"], "the held event")
    await eventually(lambda: connector.buffered("gw-a") == 0, "acked, then retired")
    assert connector.held() == 0


@pytest.mark.asyncio
async def test_held_events_survive_a_restart_and_are_released_after_it(db: Path) -> None:
    """A connector holds an event and stops; a new one on the same SQLite file still holds it
    and releases it to the gateway that says hello there."""
    first = Harness(SQLiteStore(db))
    try:
        connector = await first.start()
        await first.platform.inject("c1", "before the restart", user_id="u1")
        assert connector.held() == 1
    finally:
        await first.close()
        first.store.close()
    second = Harness(SQLiteStore(db))
    try:
        connector = await second.start()
        assert connector.held("loopback") == 1
        recorder = Recorder()
        await second.gateway(connector, "gw-a", recorder)
        await eventually(lambda: recorder.texts == ["before the restart"], "released")
        assert connector.held() == 0
    finally:
        await second.close()
        second.store.close()


@pytest.mark.asyncio
async def test_a_full_hold_refuses_the_event_and_writes_nothing(
    db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """At max_held the next event is refused with IntakeFull (the driver keeps its cursor):
    neither its hold nor its key is written.  A copy of an event held before is still a copy
    (not refused).  Once a gateway took the held ones, the refused event is taken."""
    h = Harness(SQLiteStore(db))
    try:
        connector = await h.start(max_held=2)
        await connector.driver_intake("loopback", make_event(1))
        await connector.driver_intake("loopback", make_event(2))
        with caplog.at_level(logging.WARNING, logger=CONNECTOR_LOGGER):
            with pytest.raises(IntakeFull, match="full"):
                await connector.driver_intake("loopback", make_event(3))
            with pytest.raises(IntakeFull):
                await connector.intake("loopback", make_event(3))
        assert any("hold is full" in r.getMessage() for r in caplog.records)
        assert (_count(db, "relay_held_inbound"), _count(db, "relay_inbound_seen")) == (2, 2)
        assert [r["event_id"] for r in h.store.select(SEEN_KIND)] == ["x1", "x2"]
        await connector.driver_intake("loopback", make_event(2))  # the platform's copy
        assert connector.duplicates == 1
        recorder = Recorder()
        await h.gateway(connector, "gw-a", recorder)
        await eventually(lambda: recorder.texts == ["e1", "e2"], "the held ones")
        await connector.driver_intake("loopback", make_event(3))  # offered again: taken
        await eventually(lambda: recorder.texts == ["e1", "e2", "e3"], "the refused one")
    finally:
        await h.close()
        h.store.close()


@pytest.mark.asyncio
async def test_held_events_expire_after_the_retention_and_are_pruned_later(
    mh: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Held longer than the buffer's retention_s: expired by the housekeeping (logged at
    WARNING, no longer counted as held, never released); deleted once settled longer than
    buffer_retention_s (counted as ``held``)."""
    clock = FakeClock(time.time())
    metrics = IntakeRecordingMetrics()
    connector = await mh.start(
        clock=clock, metrics=metrics, retention_s=100.0, buffer_retention_s=50.0
    )
    await mh.platform.inject("c1", "old", user_id="u1")
    clock.advance(60.0)
    await mh.platform.inject("c1", "young", user_id="u1")
    clock.advance(41.0)
    with caplog.at_level(logging.WARNING):
        counts = await connector.housekeep()
    assert counts["held"] == 0
    assert connector.held() == 1
    expired = next(r for r in caplog.records if "expired" in r.getMessage())
    assert expired.levelno == logging.WARNING
    assert ("loopback", 1) in metrics.of("held")
    states = {r["event_json"].count("old"): r.state for r in mh.store.select(HOLD_KIND)}
    assert states == {1: HeldState.EXPIRED, 0: HeldState.HELD}
    clock.advance(60.0)
    counts = await connector.housekeep()  # the young one expires now, the old one goes
    assert counts["held"] == 1
    assert [r.state for r in mh.store.select(HOLD_KIND)] == [HeldState.EXPIRED]
    recorder = Recorder()
    await mh.gateway(connector, "gw-a", recorder)
    await mh.platform.inject("c1", "new", user_id="u1")
    await eventually(lambda: recorder.texts == ["new"], "only the new event")


@pytest.mark.asyncio
async def test_a_gateway_already_live_gets_what_its_later_hello_releases(mh: Harness) -> None:
    """A gateway live for one platform says hello for a second one whose events were held:
    they are handed to it at once (replayed from its buffer with their bufferIds), not left
    there until its next connection."""
    other = LoopbackPlatform("other")
    connector = await mh.start(drivers={"loopback": mh.platform, "other": other})
    await other.inject("c9", "waited", user_id="u9")
    assert connector.held("other") == 1
    ws = await mh.raw(connector)
    assert (await raw_hello(ws))["type"] == "descriptor"
    await eventually(lambda: is_live(connector, "gw-a"), "live")
    assert (await raw_hello(ws, "other"))["type"] == "descriptor"
    frame = await recv_frame(ws)
    assert (frame["type"], frame["event"]["text"]) == ("inbound", "waited")
    assert frame["bufferId"]
    assert connector.held("other") == 0
    await send_line(ws, {"type": "inbound_ack", "bufferId": frame["bufferId"]})
    await eventually(lambda: connector.buffered("gw-a") == 0, "acked")

"""Drivers' notes (relay.connector.driver_notes) through the DriverIntake a connector hands its
drivers: saved durably (committed when ``save`` returns), audited, surviving a reopened SQLite
store, bounded in size, and bad input refused with nothing changed."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from relay.connector.driver_notes import MAX_NOTE_BYTES, NOTE_KIND, DriverNotes, NoteState
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from statecore.clock import FakeClock
from statecore.ids import composite_id
from stores.sqlite import SQLiteStore
from tests.relay.connector.connector_harness import SECRETS, Harness


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "connector.db"


def _committed(path: Path) -> list[tuple[str, str]]:
    """(name, value) of every saved note, read through a connection of its own."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT name, value FROM relay_driver_notes WHERE state = 'saved'")
        return sorted(rows)
    finally:
        conn.close()


@pytest.mark.asyncio
async def test_notes_are_committed_when_save_returns_and_survive_reopening(db: Path) -> None:
    """save() returns once the note is on disk (another connection reads it); a new connector
    on the reopened file loads what the last save wrote; an unknown note loads as None."""
    h = Harness(SQLiteStore(db))
    try:
        connector = await h.start()
        intake = connector.driver_intake
        assert await intake.load("matrix", "next_batch") is None
        await intake.save("matrix", "next_batch", "s1_2_3")
        assert _committed(db) == [("next_batch", "s1_2_3")]
        await intake.save("matrix", "next_batch", "s4_5_6")
        await intake.save("matrix", "device_id", "DEV1")
        assert await intake.load("matrix", "next_batch") == "s4_5_6"
        assert await intake.load("telegram", "next_batch") is None  # per platform
    finally:
        await h.close()
        h.store.close()
    reopened = SQLiteStore(db)
    try:
        connector = Connector(reopened, secrets=SECRETS, drivers={"loopback": LoopbackPlatform()})
        async with connector:
            intake = connector.driver_intake
            assert await intake.load("matrix", "next_batch") == "s4_5_6"
            assert await intake.load("matrix", "device_id") == "DEV1"
        history = reopened.history(NOTE_KIND, composite_id("matrix", "next_batch"))
        assert [(r.event, r.to_state) for r in history] == [
            ("save", NoteState.SAVED),
            ("overwrite", NoteState.SAVED),
        ]
    finally:
        reopened.close()


@pytest.mark.asyncio
async def test_bad_notes_are_refused_and_change_nothing(db: Path) -> None:
    """A value over MAX_NOTE_BYTES (UTF-8 bytes, not characters), a name or value of the wrong
    type, an empty name: typed errors, and the note saved before is still there."""
    h = Harness(SQLiteStore(db))
    try:
        connector = await h.start()
        intake = connector.driver_intake
        await intake.save("matrix", "cursor", "kept")
        await intake.save("matrix", "big", "x" * MAX_NOTE_BYTES)  # exactly the bound fits
        with pytest.raises(ValueError, match="at most"):
            await intake.save("matrix", "cursor", "x" * (MAX_NOTE_BYTES + 1))
        with pytest.raises(ValueError, match="at most"):
            await intake.save("matrix", "cursor", "é" * (MAX_NOTE_BYTES // 2 + 1))
        with pytest.raises(TypeError):
            await intake.save("matrix", "cursor", 42)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await intake.load("matrix", None)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="name"):
            await intake.save("matrix", "", "v")
        with pytest.raises(ValueError, match="platform"):
            await intake.load("", "cursor")
        assert await intake.load("matrix", "cursor") == "kept"
        history = h.store.history(NOTE_KIND, composite_id("matrix", "cursor"))
        assert [r.event for r in history] == ["save"]
    finally:
        await h.close()
        h.store.close()


@pytest.mark.asyncio
async def test_a_dropped_note_loads_as_none_saves_again_and_is_pruned_later(mh: Harness) -> None:
    """Dropped: load answers None; saved again it starts over; a note dropped longer ago than
    buffer_retention_s is deleted by the housekeeping (``notes``), a saved one never."""
    clock = FakeClock(time.time())
    connector = await mh.start(clock=clock, buffer_retention_s=10.0)
    intake = connector.driver_intake
    notes: DriverNotes = connector.notes
    await intake.save("slack", "a", "1")
    await intake.save("slack", "b", "2")
    notes.drop("slack", "a")
    assert await intake.load("slack", "a") is None
    notes.drop("slack", "b")
    await intake.save("slack", "b", "3")
    assert await intake.load("slack", "b") == "3"
    clock.advance(11.0)
    counts = await connector.housekeep()
    assert counts["notes"] == 1
    assert [(r["name"], r.state) for r in mh.store.select(NOTE_KIND)] == [("b", NoteState.SAVED)]

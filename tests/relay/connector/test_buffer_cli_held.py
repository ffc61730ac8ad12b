"""``statecore buffer held`` (relay.connector.cli), run as the real console script against a
real SQLite file: per platform how many events are held and the oldest one's age, the events
in the order held; it only reads."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from relay.connector.held import HeldEvents
from relay.wire.frames import EventSource, InboundEvent
from statecore.clock import FakeClock
from stores.sqlite import SQLiteStore
from tests.cli_run import run, run_json, snapshot, url


def _event(platform: str, n: int) -> InboundEvent:
    return InboundEvent(
        text=f"message {n}",
        message_id=f"m{n}",
        source=EventSource(platform=platform, chat_id="c1", chat_type="dm", user_id="u1"),
    )


@pytest.fixture
def held(tmp_path: Path) -> tuple[Path, list[str]]:
    """matrix: two events held an hour ago; slack: one held now; one matrix event released."""
    path = tmp_path / "connector.db"
    store = SQLiteStore(path)
    clock = FakeClock(time.time() - 3600)
    hold = HeldEvents(store, clock=clock)
    ids = [hold.hold("matrix", _event("matrix", n)) for n in range(3)]
    hold.release([ids[0]], "gw-a")
    clock.advance(3600)
    ids.append(hold.hold("slack", _event("slack", 9)))
    store.close()
    return path, ids


def test_held_counts_per_platform_and_lists_in_order(held: tuple[Path, list[str]]) -> None:
    """JSON: the total, per platform its count and oldest age, the held entries in the order
    held (a released one is not held); --platform and --limit narrow; text has both tables;
    the store is unchanged."""
    path, ids = held
    before = snapshot(path)
    data = run_json("buffer", "held", store=url(path))
    assert data["total"] == 3
    assert set(data["platforms"]) == {"matrix", "slack"}
    assert data["platforms"]["matrix"]["held"] == 2
    assert 3590 < data["platforms"]["matrix"]["oldest_age_s"] < 3700
    assert data["platforms"]["slack"]["held"] == 1
    assert data["platforms"]["slack"]["oldest_age_s"] < 60
    assert [e["held_id"] for e in data["entries"]] == ids[1:]
    assert "message 1" in data["entries"][0]["event_json"]
    only = run_json("buffer", "held", "--platform", "slack", store=url(path))
    assert (only["total"], [e["held_id"] for e in only["entries"]]) == (1, [ids[3]])
    text = run("buffer", "held", "--limit", "1", store=url(path))
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["PLATFORM", "HELD", "OLDEST"]
    assert [line.split()[:2] for line in lines[1:3]] == [["matrix", "2"], ["slack", "1"]]
    assert text.stdout.endswith("1 of 3 shown (--limit 0 shows all)\n")
    assert snapshot(path) == before


def test_nothing_held_says_so(tmp_path: Path) -> None:
    """An empty hold: a plain sentence, and zero in JSON."""
    path = tmp_path / "connector.db"
    store = SQLiteStore(path)
    HeldEvents(store)
    store.close()
    assert run("buffer", "held", store=url(path)).stdout == "no events are held\n"
    assert run_json("buffer", "held", store=url(path)) == {
        "total": 0,
        "platforms": {},
        "entries": [],
    }

"""``statecore buffer ls|stats`` (relay.connector.cli, found through the ``statecore.cli``
entry point group), run as the real console script against a real SQLite file."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from relay.connector.buffer import InboundBuffer
from relay.wire.frames import EventSource, InboundEvent
from statecore.clock import FakeClock
from stores.sqlite import SQLiteStore
from tests.cli_run import run, run_json, snapshot, url


def _event(n: int) -> InboundEvent:
    return InboundEvent(
        text=f"message {n}",
        message_id=f"m{n}",
        source=EventSource(platform="loopback", chat_id="c1", chat_type="dm", user_id="u1"),
    )


@pytest.fixture
def buffered(tmp_path: Path) -> tuple[Path, list[str], list[str]]:
    """gw-a: three entries appended an hour ago, one of them acked; gw-b: one entry now."""
    path = tmp_path / "connector.db"
    store = SQLiteStore(path)
    clock = FakeClock(time.time() - 3600)
    buffer = InboundBuffer(store, clock=clock)
    a = [buffer.append("gw-a", "loopback", _event(n)) for n in range(3)]
    buffer.ack("gw-a", [a[0]])
    buffer.mark_sent_ids("gw-a", [a[1]])
    clock.advance(3600)
    b = [buffer.append("gw-b", "loopback", _event(9))]
    store.close()
    return path, a, b


def test_ls_lists_unacked_entries_in_replay_order(
    buffered: tuple[Path, list[str], list[str]],
) -> None:
    """Unacked entries by default, oldest seq first; --gateway, --state and --limit narrow."""
    path, a, b = buffered
    result = run("buffer", "ls", store=url(path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "STATE", "GATEWAY", "PLATFORM", "SEQ", "AGE", "REPLAYS"]
    assert [line.split()[:3] for line in lines[1:]] == [
        [a[1], "sent", "gw-a"],
        [a[2], "buffered", "gw-a"],
        [b[0], "buffered", "gw-b"],
    ]
    data = run_json("buffer", "ls", "--gateway", "gw-a", "--state", "all", store=url(path))
    assert data["total"] == 3
    assert [e["buffer_id"] for e in data["entries"]] == a
    assert [e["state"] for e in data["entries"]] == ["acked", "sent", "buffered"]
    assert "message 0" in data["entries"][0]["event_json"]
    limited = run("buffer", "ls", "--limit", "1", store=url(path))
    assert limited.stdout.endswith("1 of 3 shown (--limit 0 shows all)\n")
    nothing = run("buffer", "ls", "--state", "expired", store=url(path))
    assert nothing.stdout == "no buffer entries in state expired\n"


def test_stats_counts_per_state_and_unacked_per_gateway(
    buffered: tuple[Path, list[str], list[str]],
) -> None:
    """Counts per state; per gateway its unacked depth and oldest unacked age; reads only."""
    path, _, _ = buffered
    before = snapshot(path)
    data = run_json("buffer", "stats", store=url(path))
    assert data["states"] == {"buffered": 2, "sent": 1, "acked": 1, "expired": 0}
    assert data["total"] == 4
    assert data["gateways"]["gw-a"]["unacked"] == 2
    assert 3590 < data["gateways"]["gw-a"]["oldest_unacked_age_s"] < 3700
    assert data["gateways"]["gw-b"]["unacked"] == 1
    assert data["gateways"]["gw-b"]["oldest_unacked_age_s"] < 60
    text = run("buffer", "stats", store=url(path))
    assert text.returncode == 0
    header, gw_a, gw_b = (line.split() for line in text.stdout.splitlines()[-3:])
    assert header == ["GATEWAY", "UNACKED", "OLDEST"]
    assert gw_a == ["gw-a", "2", "1h", "00m"]
    assert gw_b[:2] == ["gw-b", "1"]
    assert snapshot(path) == before


def test_an_empty_store_has_an_empty_buffer() -> None:
    """memory:// works and says there is nothing."""
    result = run("buffer", "stats", store="memory://")
    assert result.returncode == 0
    assert result.stdout.endswith("no gateway instance has unacked entries\n")


def test_bad_state_and_missing_file_exit_2(tmp_path: Path) -> None:
    """An unknown state is a usage error; a missing file is refused and not created."""
    bad = run("buffer", "ls", "--state", "lost", store="memory://")
    assert bad.returncode == 2
    assert "invalid choice: 'lost'" in bad.stderr
    missing = run("buffer", "ls", store=url(tmp_path / "none.db"))
    assert missing.returncode == 2
    assert "none.db: no such database file" in missing.stderr
    assert not (tmp_path / "none.db").exists()

"""``statecore undeliverable ls`` (relay.client.cli), run as the real console script against
a real SQLite file."""

from __future__ import annotations

import asyncio
from pathlib import Path

from relay.client.dedupe import StoreBufferDedupe
from stores.sqlite import SQLiteStore
from tests.cli_run import run, run_json, url


def _record(path: Path) -> None:
    store = SQLiteStore(path)
    dedupe = StoreBufferDedupe(store)
    for n, reason in enumerate(("field 'event.source.chat_id' is required", "no handler")):
        asyncio.run(
            dedupe.record_undeliverable(
                f"buf-{n}", frame_type="inbound", reason=reason, raw_line=f'{{"n": {n}}}'
            )
        )
    dedupe.dismiss("buf-1")
    close = getattr(dedupe, "close", None)
    if close is not None:
        close()
    store.close()


def test_ls_lists_recorded_deliveries_and_all_includes_dismissed(tmp_path: Path) -> None:
    """Recorded ones by default, with the reason; --all adds the dismissed."""
    path = tmp_path / "gw.db"
    _record(path)
    result = run("undeliverable", "ls", store=url(path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["BUFFER", "ID", "STATE"]
    assert [line.split()[:3] for line in lines[1:]] == [["buf-0", "recorded", "inbound"]]
    assert "field 'event.source.chat_id' is required" in lines[1]
    data = run_json("undeliverable", "ls", "--all", store=url(path))
    assert [(d["buffer_id"], d["state"]) for d in data] == [
        ("buf-0", "recorded"),
        ("buf-1", "dismissed"),
    ]
    assert data[0]["raw_line"] == '{"n": 0}'
    empty = run("undeliverable", "ls", store="memory://")
    assert empty.stdout == "no undeliverable deliveries recorded\n"

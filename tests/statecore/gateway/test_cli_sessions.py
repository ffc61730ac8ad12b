"""``statecore sessions ls`` and ``statecore delegations ls`` (statecore.gateway.cli), run as
the real console script against a real SQLite file."""

from __future__ import annotations

import os
import time
from pathlib import Path

from statecore.clock import FakeClock
from statecore.gateway import Delegations, RoutingOrigin, SessionStore
from statecore.ownership import Incarnation, host_identity
from stores.sqlite import SQLiteStore
from tests.cli_run import run, run_json, snapshot, url

DEAD = Incarnation(host_identity(), os.getpid(), 1, "deadbeefdeadbeef")


def _origin(key: str) -> RoutingOrigin:
    return RoutingOrigin(
        platform="discord", chat_id="C1", chat_type="group", user_id="U1", session_key=key
    )


def _seed(path: Path) -> dict[str, str]:
    store = SQLiteStore(path)
    clock = FakeClock(time.time() - 600)
    sessions = SessionStore(store, clock=clock)
    first = sessions.start("dm:1", platform="loopback", chat_id="c1")
    successor = sessions.compress(first.session_id)
    other = sessions.start("dm:2", platform="loopback", chat_id=2)
    sessions.end(other.session_id, "idle")
    mine = Delegations(store, clock=clock, incarnation=Incarnation.current())
    running = mine.dispatch(_origin("dm:1"), {"job": 1})
    dead = Delegations(store, clock=clock, incarnation=DEAD).dispatch(_origin("dm:1"), {"job": 2})
    done = mine.dispatch(_origin("dm:2"), {"job": 3})
    mine.complete(done, {"ok": True})
    mine.mark_delivered(done)
    store.close()
    return {
        "first": first.session_id,
        "successor": successor.session_id,
        "other": other.session_id,
        "running": running,
        "dead": dead,
        "done": done,
    }


def test_sessions_ls_lists_active_sessions_and_filters(tmp_path: Path) -> None:
    """Active by default; --state ended shows the compressed one with its successor; --key
    narrows; JSON carries every field."""
    path = tmp_path / "gw.db"
    ids = _seed(path)
    result = run("sessions", "ls", store=url(path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["SESSION", "KEY", "STATE"]
    assert [line.split()[:3] for line in lines[1:]] == [[ids["successor"], "dm:1", "active"]]
    ended = run_json("sessions", "ls", "--state", "ended", store=url(path))
    assert ended["total"] == 2
    by_id = {s["session_id"]: s for s in ended["sessions"]}
    assert by_id[ids["first"]]["end_reason"] == "compression"
    assert by_id[ids["first"]]["successor_id"] == ids["successor"]
    assert by_id[ids["other"]]["chat_id"] == "2"
    keyed = run_json("sessions", "ls", "--state", "all", "--key", "dm:2", store=url(path))
    assert [s["session_id"] for s in keyed["sessions"]] == [ids["other"]]
    none = run("sessions", "ls", "--key", "dm:9", store=url(path))
    assert none.stdout == "no active sessions\n"


def test_delegations_ls_lists_owed_work_with_owner_liveness(tmp_path: Path) -> None:
    """Owed delegations by default, a running one's owner judged alive or dead; settled ones
    with --state settled; reads only."""
    path = tmp_path / "gw.db"
    ids = _seed(path)
    before = snapshot(path)
    data = run_json("delegations", "ls", store=url(path))
    assert data["total"] == 2
    owners = {d["delegation_id"]: d["owner_status"] for d in data["delegations"]}
    assert owners == {ids["running"]: "alive", ids["dead"]: "dead"}
    assert {d["origin"]["session_key"] for d in data["delegations"]} == {"dm:1"}
    settled = run_json("delegations", "ls", "--state", "settled", store=url(path))
    assert [(d["delegation_id"], d["state"]) for d in settled["delegations"]] == [
        (ids["done"], "delivered")
    ]
    assert settled["delegations"][0]["owner_status"] is None
    text = run("delegations", "ls", store=url(path))
    assert text.returncode == 0
    assert {line.split()[0] for line in text.stdout.splitlines()[1:]} == {
        ids["running"],
        ids["dead"],
    }
    assert snapshot(path) == before


def test_an_empty_store_has_no_sessions_or_delegations() -> None:
    """memory:// works and says there is nothing."""
    assert run("sessions", "ls", store="memory://").stdout == "no active sessions\n"
    assert run("delegations", "ls", store="memory://").stdout == "no owed delegations\n"

"""Tests for ``statecore kinds``: every kind a store's catalog holds, listed, counted, drawn
and browsed by a process that never imported the code declaring it."""

from __future__ import annotations

from pathlib import Path

import pytest

from statecore.catalog import kind_from_declaration
from statecore.cli.kinds import kind_summary, store_kinds
from statecore.store import Audit, Store
from stores import InMemoryStore, SQLiteStore
from stores.testing.timers import ALARM_KIND
from tests.cli_run import run, run_json, url

T0 = 1_000_000.0


@pytest.fixture
def alarms(tmp_path: Path) -> str:
    """A SQLite store holding three alarms: two set (entered at T0, T0+10; the 30 s ``ring``
    timer running), one snoozed for 60 s (``wake`` running), entered at T0+5."""
    path = tmp_path / "alarms.db"
    store = SQLiteStore(path)
    try:
        store.register(ALARM_KIND)
        for n, at in ((1, T0), (2, T0 + 10), (3, T0)):
            store.insert(
                ALARM_KIND, f"a{n}", {"label": f"alarm {n}"}, event="arm", audit=Audit(at=at)
            )
        store.transition(ALARM_KIND, "a3", "snooze", audit=Audit(at=T0 + 5), changes={"nap": 60.0})
    finally:
        store.close()
    return url(path)


def test_kinds_lists_every_cataloged_kind_with_counts_and_running_timers(alarms: str) -> None:
    """The alarm kind is listed from the catalog with its version, rows per state and each
    timer's running rows; the table names it too."""
    listed = {k["name"]: k for k in run_json("kinds", store=alarms)}
    alarm = listed["kit_alarm"]
    assert alarm["lifecycle"] == "kit_alarm"
    assert alarm["version"] == 1
    assert alarm["states"] == {"set": 2, "rung": 0, "snoozed": 1, "off": 0}
    assert alarm["total"] == 3
    timers = {t["event"]: t for t in alarm["timers"]}
    assert timers["ring"]["running"] == 2
    assert timers["wake"]["running"] == 1
    text = run("kinds", store=alarms).stdout
    assert "kit_alarm" in text
    assert "ring=2 wake=1" in text


def test_kinds_show_prints_the_table_diagram_counts_and_next_due(alarms: str) -> None:
    """``show`` gives the transition table and the Mermaid diagram of the rebuilt lifecycle,
    the counts, and each timer's next due time (entered time plus duration)."""
    shown = run_json("kinds", "show", "kit_alarm", store=alarms)
    rebuilt = kind_from_declaration(_declaration(alarms))  # the catalog's own record
    assert shown["mermaid"] == rebuilt.lifecycle.to_mermaid() == ALARM_KIND.lifecycle.to_mermaid()
    timers = {t["event"]: t for t in shown["timers"]}
    assert timers["ring"]["next_due_at"] == T0 + 30
    assert timers["wake"]["next_due_at"] == T0 + 5 + 60
    assert timers["ring"]["after"] == 30
    assert timers["wake"]["after"] == "nap"
    assert {"event": "ring", "from": ["set"], "to": "rung", "after": 30} in shown["transitions"]
    text = run("kinds", "show", "kit_alarm", store=alarms).stdout
    assert ALARM_KIND.lifecycle.describe() in text
    assert f"```mermaid\n{ALARM_KIND.lifecycle.to_mermaid()}```" in text
    assert "1970-01-12T13:47:10Z" in text  # T0 + 30


def _declaration(store_url: str) -> dict[str, object]:
    store = SQLiteStore(Path(store_url.removeprefix("sqlite://")))
    try:
        (record,) = [r for r in store.catalog() if r.name == "kit_alarm"]
        return dict(record.declaration)
    finally:
        store.close()


def test_kinds_rows_filters_by_state_and_limits(alarms: str) -> None:
    """``rows`` lists by id, with the state filter and the limit; the total is of the filter."""
    everything = run_json("kinds", "rows", "kit_alarm", store=alarms)
    assert [r["id"] for r in everything["rows"]] == ["a1", "a2", "a3"]
    assert everything["rows"][2] == {
        "id": "a3",
        "state": "snoozed",
        "fence": 1,
        "values": {"label": "alarm 3", "nap": 60.0},
    }
    set_only = run_json(
        "kinds", "rows", "kit_alarm", "--state", "set", "--limit", "1", store=alarms
    )
    assert set_only["total"] == 2
    assert [r["id"] for r in set_only["rows"]] == ["a1"]
    assert (
        "1 of 2 shown"
        in run("kinds", "rows", "kit_alarm", "--state", "set", "--limit", "1", store=alarms).stdout
    )


def test_kinds_history_shows_a_rows_audit_entries(alarms: str) -> None:
    """``history`` gives the row and its entries, oldest first."""
    shown = run_json("kinds", "history", "kit_alarm", "a3", store=alarms)
    assert shown["row"]["state"] == "snoozed"
    assert [(e["event"], e["from"], e["to"], e["at"]) for e in shown["history"]] == [
        ("arm", None, "set", T0),
        ("snooze", "set", "snoozed", T0 + 5),
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("show", "nope"), "unknown kind 'nope' in this store; known: "),
        (("rows", "nope"), "unknown kind 'nope'"),
        (
            ("rows", "kit_alarm", "--state", "asleep"),
            "unknown state 'asleep' of kit_alarm; known: set, snoozed, rung, off",
        ),
        (("history", "kit_alarm", "zz"), "unknown kit_alarm id 'zz'"),
    ],
)
def test_bad_names_are_refused_naming_what_is_known(
    alarms: str, argv: tuple[str, ...], message: str
) -> None:
    """An unknown kind, state or id: exit 2, the usual error line naming the known ones."""
    done = run("kinds", *argv, store=alarms)
    assert done.returncode == 2
    assert done.stdout == ""
    assert f"statecore: error: {message}" in done.stderr
    if argv[1] == "nope":
        assert done.stderr.rstrip().endswith("known: kit_alarm")


class _NoCatalog:
    """A store without ``catalog()`` (nor ``due_timers``): everything else delegated."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.register = inner.register
        self.count = inner.count


def test_a_store_without_a_catalog_lists_the_installed_kinds() -> None:
    """Without ``catalog()`` the installed kinds are registered and listed (version of the
    installed declaration, no registration time)."""
    inner = InMemoryStore()
    listed = store_kinds(_NoCatalog(inner))  # type: ignore[arg-type]
    names = [k.name for k in listed]
    assert "obligation" in names
    assert names == sorted(names)
    assert all(k.registered_at is None for k in listed)
    assert {r.name for r in inner.catalog()} >= set(names)


def test_an_in_memory_catalog_is_read_with_timers_due_now() -> None:
    """Of a store finding due timers itself: the due count at ``now`` and the next due time."""
    store = InMemoryStore()
    store.register(ALARM_KIND)
    store.insert(ALARM_KIND, "x", {}, event="arm", audit=Audit(at=T0))
    store.insert(ALARM_KIND, "y", {}, event="arm", audit=Audit(at=T0 + 100))
    (stored,) = [k for k in store_kinds(store, declared=[ALARM_KIND]) if k.name == "kit_alarm"]
    assert stored.kind is ALARM_KIND
    summary = kind_summary(store, stored, now=T0 + 31)
    ring = next(t for t in summary["timers"] if t["event"] == "ring")
    assert (ring["running"], ring["due"], ring["next_due_at"]) == (2, 1, T0 + 30)


def test_doctor_reports_each_cataloged_kinds_lifecycle_version(alarms: str) -> None:
    """``doctor`` lists the catalog's kinds with their lifecycle versions (JSON and text),
    reading only."""
    data = run_json("doctor", store=alarms)
    kinds = {k["name"]: k for k in data["kinds"]}
    alarm = kinds["kit_alarm"]
    assert isinstance(alarm.pop("registered_at"), float)
    assert alarm == {
        "name": "kit_alarm",
        "lifecycle": "kit_alarm",
        "version": 1,
        "installed_version": None,
    }
    assert kinds["obligation"]["installed_version"] == kinds["obligation"]["version"]
    text = run("doctor", store=alarms).stdout
    assert "  kinds (lifecycle version):\n" in text
    assert "kit_alarm v1\n" in text

"""The dashboard's view of every kind a store's catalog holds, over its WebSocket with a real
``WebServer`` on loopback and a real SQLite store: each kind drawn from its declaration and
counted, its timers, its rows and a row's history on request -- and what is withheld."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from websockets.asyncio.client import ClientConnection, connect

from relay.web._dashboard_kinds import VALUE_CHARS, CatalogView, builtin_kinds
from relay.web.dashboard import Dashboard
from relay.web.server import WebServer
from statecore import Ledger
from statecore.clock import FakeClock
from statecore.store import Audit
from stores import SQLiteStore
from stores.memory import InMemoryStore
from stores.testing.timers import ALARM_KIND
from tests.relay.web.browser import console_errors

BOUND_S = 10.0
T0 = 1_700_000_000.0
LONG = "x" * (VALUE_CHARS + 50)
SECRET_CONTENT = "the bot's private reply"


@asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[tuple[SQLiteStore, Ledger, str]]:
    """A SQLite store holding alarms (a1, a2 set at T0 and T0+10; a3 snoozed for 60 s at
    T0+5, with a long label) and one obligation, written through one store and served by a
    dashboard over another store of the same file (as ``statecore dashboard`` opens its own),
    whose clock reads T0+31 (a1's ring timer due, a2's not)."""
    store = SQLiteStore(tmp_path / "x.db")
    store.register(ALARM_KIND)
    store.insert(ALARM_KIND, "a1", {}, event="arm", audit=Audit(at=T0))
    store.insert(ALARM_KIND, "a2", {}, event="arm", audit=Audit(at=T0 + 10))
    store.insert(ALARM_KIND, "a3", {"label": LONG}, event="arm", audit=Audit(at=T0))
    store.transition(
        ALARM_KIND, "a3", "snooze", audit=Audit(at=T0 + 5, reason="r"), changes={"nap": 60.0}
    )
    ledger = Ledger(store)
    ledger.record(session_key="s", platform="web", chat_id="c", content=SECRET_CONTENT)
    read = SQLiteStore(tmp_path / "x.db")
    dashboard = Dashboard(read, poll_s=0.05, clock=FakeClock(T0 + 31))
    server = WebServer([dashboard])
    await server.start()
    try:
        yield store, ledger, server.url.replace("http", "ws") + "/dashboard/ws"
    finally:
        await server.stop()
        await dashboard.close()
        read.close()
        store.close()


async def receive(ws: ClientConnection, kind: str) -> dict[str, Any]:
    """The next message of type ``kind`` (bounded)."""
    deadline = time.monotonic() + BOUND_S
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no {kind!r} message within {BOUND_S} s"
        message: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), left))
        if message["type"] == kind:
            return message


async def ask(
    ws: ClientConnection, message: dict[str, Any], kind: str
) -> tuple[dict[str, Any], str]:
    """Send ``message``; the next answer of type ``kind``, parsed and as the text it came as."""
    await ws.send(json.dumps(message))
    deadline = time.monotonic() + BOUND_S
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no {kind!r} answer within {BOUND_S} s"
        raw = await asyncio.wait_for(ws.recv(), left)
        answer: dict[str, Any] = json.loads(raw)
        if answer["type"] == kind:
            return answer, str(raw)


def of(catalog: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(k for k in catalog if k["kind"] == name)
    return found


@pytest.mark.asyncio
async def test_every_cataloged_kind_is_drawn_counted_and_its_timers_shown(tmp_path: Path) -> None:
    """The snapshot's catalog: the alarm kind (declared by no installed package) drawn from
    its declaration, counted per state, each timer with its rows running, due now and next
    due; the obligation kind listed as built in; and counts after a change carry it again."""
    async with running(tmp_path) as (store, ledger, url), connect(url) as ws:
        hello = await receive(ws, "hello")
        alarm = of(hello["catalog"], "kit_alarm")
        assert alarm["counts"] == {"set": 2, "snoozed": 1, "rung": 0, "off": 0}
        assert alarm["svg"].startswith("<svg")
        assert ">snoozed<" in alarm["svg"]
        assert (alarm["version"], alarm["builtin"], alarm["readable"]) == (1, False, True)
        timers = {t["event"]: t for t in alarm["timers"]}
        assert (timers["ring"]["running"], timers["ring"]["due"]) == (2, 1)
        assert timers["ring"]["next_due_at"] == T0 + 30
        assert (timers["wake"]["running"], timers["wake"]["next_due_at"]) == (1, T0 + 65)
        assert of(hello["catalog"], "obligation")["builtin"] is True
        store.transition(ALARM_KIND, "a1", "cancel", audit=Audit(at=T0 + 20))
        ledger.record(session_key="s2", platform="web", chat_id="c", content="another")
        counts = await receive(ws, "counts")
        assert of(counts["catalog"], "kit_alarm")["counts"]["off"] == 1


@pytest.mark.asyncio
async def test_rows_and_history_on_request_with_values_cut(tmp_path: Path) -> None:
    """``kind_rows`` lists by id (the state filter too) with values cut to the bound;
    ``kind_history`` gives a row's audit entries, oldest first."""
    async with running(tmp_path) as (_store, _ledger, url), connect(url) as ws:
        await receive(ws, "hello")
        rows, _ = await ask(ws, {"type": "kind_rows", "kind": "kit_alarm"}, "kind_rows")
        assert (rows["found"], rows["total"]) == (True, 3)
        assert [r["id"] for r in rows["rows"]] == ["a1", "a2", "a3"]
        a3 = rows["rows"][2]
        assert a3["values"] == {"label": LONG[:VALUE_CHARS], "nap": 60.0}
        assert (a3["state"], a3["fence"], a3["cut"]) == ("snoozed", 1, ["label"])
        snoozed, _ = await ask(
            ws, {"type": "kind_rows", "kind": "kit_alarm", "state": "snoozed"}, "kind_rows"
        )
        assert [r["id"] for r in snoozed["rows"]] == ["a3"]
        history, _ = await ask(
            ws, {"type": "kind_history", "kind": "kit_alarm", "id": "a3"}, "kind_history"
        )
        assert history["found"] is True
        assert [
            (r["event"], r["from"], r["to"], r["at"], r["reason"]) for r in history["records"]
        ] == [
            ("arm", None, "set", T0, None),
            ("snooze", "set", "snoozed", T0 + 5, "r"),
        ]


@pytest.mark.asyncio
async def test_built_in_kinds_keep_their_fields_and_unknowns_are_answered(tmp_path: Path) -> None:
    """Of the obligation kind only ids, states and fences are sent (never its content, nor an
    audit reason); an unknown kind, state or id is answered as not found, naming the known
    ones; a malformed kind request is an error and the session goes on."""
    async with running(tmp_path) as (_store, _ledger, url), connect(url) as ws:
        await receive(ws, "hello")
        rows, raw = await ask(ws, {"type": "kind_rows", "kind": "obligation"}, "kind_rows")
        (row,) = rows["rows"]
        assert row["values"] is None
        assert SECRET_CONTENT not in raw
        history, raw = await ask(
            ws, {"type": "kind_history", "kind": "obligation", "id": row["id"]}, "kind_history"
        )
        assert history["row"]["values"] is None
        assert SECRET_CONTENT not in raw
        assert [r["reason"] for r in history["records"]] == [None]
        unknown, _ = await ask(ws, {"type": "kind_rows", "kind": "nope"}, "kind_rows")
        assert (unknown["found"], unknown["reason"]) == (False, "unknown kind")
        assert "kit_alarm" in unknown["known"]
        state, _ = await ask(
            ws, {"type": "kind_rows", "kind": "kit_alarm", "state": "asleep"}, "kind_rows"
        )
        assert (state["found"], state["known"]) == (False, ["set", "snoozed", "rung", "off"])
        gone, _ = await ask(
            ws, {"type": "kind_history", "kind": "kit_alarm", "id": "zz"}, "kind_history"
        )
        assert (gone["found"], gone["records"]) == (False, [])
        error, _ = await ask(ws, {"type": "kind_history", "kind": "kit_alarm"}, "error")
        assert error["error"] == "kind_history: id must be a non-empty string"
        again, _ = await ask(ws, {"type": "kind_rows", "kind": "kit_alarm"}, "kind_rows")
        assert again["total"] == 3


def test_the_built_in_kinds_are_statecores_the_gateways_and_the_relays() -> None:
    """The kernel's, the gateway's and the relay's kinds are built in; a test kit's is not."""
    assert {"obligation", "owner", "session", "buffer_entry", "rejected_inbound"} <= builtin_kinds()
    assert ALARM_KIND.name not in builtin_kinds()


def test_a_kind_a_store_holds_as_another_object_is_listed_unreadable() -> None:
    """A store that holds a kind as another object refuses the rebuilt one: a kind of its
    catalog no declared kind matches is listed (drawn, its timers unread) but not counted."""
    store = InMemoryStore()
    store.register(ALARM_KIND)
    alarm = of(CatalogView(store).counts(T0), "kit_alarm")
    assert (alarm["readable"], alarm["counts"], alarm["timers"]) == (False, None, [])
    assert alarm["svg"].startswith("<svg")


def test_the_page_draws_a_cataloged_kind_and_browses_its_rows(browser: Any, tmp_path: Path) -> None:
    """In the browser: the alarm kind drawn with its counts and timers; its rows on a click,
    then one row's history."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def call(work: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(work, loop)
        return future.result(BOUND_S)

    def wait(check: Callable[[Any], Any], what: str) -> Any:
        return WebDriverWait(browser, BOUND_S, poll_frequency=0.05).until(check, what)

    stack = running(tmp_path)
    try:
        _store, _ledger, url = call(stack.__aenter__())
        browser.get(url.replace("ws", "http", 1).removesuffix("ws"))
        figure = '#kinds figure[data-kind="kit_alarm"]'
        wait(
            lambda d: d.find_elements(By.CSS_SELECTOR, f'{figure} td[data-state="set"]'),
            "the alarm kind's counts",
        )
        counted = browser.find_element(By.CSS_SELECTOR, f'{figure} td[data-state="snoozed"]')
        assert counted.text == "1"
        timer = browser.find_element(By.CSS_SELECTOR, f'{figure} tr[data-timer="ring"]')
        assert timer.text.split()[:6] == ["ring", "set", "rung", "30", "s", "2"]
        browser.find_element(By.CSS_SELECTOR, f"{figure} button[data-kind]").click()
        wait(
            lambda d: d.find_elements(By.CSS_SELECTOR, '#kind-rows tr[data-id="a3"]'),
            "the rows",
        )
        assert browser.find_element(By.ID, "kind-total").text == "3 of 3 shown"
        browser.find_element(By.CSS_SELECTOR, '#kind-rows tr[data-id="a3"]').click()
        wait(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, "#kind-history tbody tr")) == 2,
            "the row's history",
        )
        assert browser.find_element(By.ID, "kind-row-state").text == "snoozed"
        assert console_errors(browser) == []
    finally:
        call(stack.__aexit__(None, None, None))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(BOUND_S)
        loop.close()

"""The dashboard page in a real headless Chromium: counts that change live, one obligation's
history on click, an operator's abandon with a token, a refusal shown in the page, a reply's
HTML shown as text, and no error in the browser console."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from relay.web.dashboard import Dashboard
from relay.web.server import WebServer
from relay.wire.auth import mint_token
from statecore import Ledger
from statecore.lifecycles import ObligationState
from statecore.obligation import OBLIGATION_KIND
from stores import SQLiteStore
from tests.relay.web.browser import console_errors, screenshot

BOUND_S = 15.0
SECRET = "page-test-secret"
XSS = '<img src=x onerror="document.body.dataset.pwned=1">'
T = TypeVar("T")


class Served:
    """A dashboard on its own event loop in a background thread (the browser is synchronous)."""

    def __init__(self, store: SQLiteStore) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.dashboard = Dashboard(
            store, secrets={"alice": [SECRET]}, poll_s=0.1, show_content=True
        )
        self.server = WebServer([self.dashboard])
        self.call(self.server.start())
        self.url = f"{self.server.url}/dashboard/"

    def call(self, work: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(work, self.loop)
        return future.result(BOUND_S)

    def stop(self) -> None:
        self.call(self.server.stop())
        self.call(self.dashboard.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(BOUND_S)
        self.loop.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, Ledger, SQLiteStore]]:
    store = SQLiteStore(tmp_path / "x.db")
    ledger = Ledger(store)
    running = Served(store)
    try:
        yield running, ledger, store
    finally:
        running.stop()
        store.close()


def wait_for(driver: Any, check: Callable[[Any], T], what: str) -> T:
    """``check(driver)`` once it is truthy (bounded; a re-rendered element is looked up again)."""
    waiting = WebDriverWait(
        driver, BOUND_S, poll_frequency=0.05, ignored_exceptions=(StaleElementReferenceException,)
    )
    return waiting.until(check, message=f"not seen within {BOUND_S} s: {what}")


def count(driver: Any, state: str) -> str:
    cell = driver.find_element(By.CSS_SELECTOR, f'td[data-kind="obligation"][data-state="{state}"]')
    return str(cell.text)


def row(driver: Any, oid: str) -> Any:
    return driver.find_element(By.CSS_SELECTOR, f'#obligations tr[data-id="{oid}"]')


def note(driver: Any) -> str:
    box = driver.find_element(By.ID, "note")
    return str(box.text) if box.is_displayed() else ""


def _watch_rows_arrive(browser: Any, running: Served, ledger: Ledger) -> tuple[str, str]:
    """Open the page, see the counts and diagrams, then see an owed row and a delivered one
    (whose content is HTML) arrive live; return their ids."""
    console_errors(browser)  # earlier pages' entries are not this test's
    browser.get(running.url)
    wait_for(browser, lambda d: count(d, "pending") == "0", "the counts")
    for kind in ("buffer_entry", "session", "delegation"):
        assert browser.find_elements(By.CSS_SELECTOR, f'td[data-kind="{kind}"][data-state]')
    images = browser.find_elements(By.CSS_SELECTOR, "#diagrams img")
    assert len(images) == 4
    wait_for(
        browser,
        lambda d: all(d.execute_script("return arguments[0].naturalWidth", i) > 0 for i in images),
        "the diagrams drawn",
    )

    owed = ledger.record(session_key="k1", platform="web", chat_id="c1", content="still owed")
    wait_for(browser, lambda d: count(d, "pending") == "1", "the pending count going up live")
    wait_for(
        browser,
        lambda d: row(d, owed.obligation_id).get_attribute("data-state") == "pending",
        "the owed row",
    )

    sent = ledger.record(session_key="k2", platform="web", chat_id="c2", content=XSS)
    ledger.mark_attempting(sent.obligation_id)
    ledger.mark_delivered(sent.obligation_id)
    wait_for(browser, lambda d: count(d, "delivered") == "1", "the delivered count")
    xss_row = wait_for(browser, lambda d: row(d, sent.obligation_id), "the delivered row")
    content = xss_row.find_element(By.CSS_SELECTOR, "td.content")
    assert content.text == XSS  # shown as text: the markup is visible, not an element
    assert not browser.find_elements(By.CSS_SELECTOR, "#obligations img, #stream img")
    assert browser.execute_script("return document.body.dataset.pwned") is None

    return owed.obligation_id, sent.obligation_id


def test_an_operator_watches_inspects_and_repairs_in_the_browser(
    browser: Any, served: tuple[Served, Ledger, SQLiteStore]
) -> None:
    running, ledger, store = served
    owed_id, sent_id = _watch_rows_arrive(browser, running, ledger)

    # One obligation's history on click.
    row(browser, owed_id).click()
    wait_for(browser, lambda d: d.find_element(By.ID, "detail").is_displayed(), "the detail")
    wait_for(browser, lambda d: d.find_element(By.ID, "detail-id").text == owed_id, "its id")
    events = wait_for(
        browser,
        lambda d: [
            r.get_attribute("data-event")
            for r in d.find_elements(By.CSS_SELECTOR, "#history tbody tr")
        ],
        "its history",
    )
    assert events == ["record"]

    # Without a token: refused, read-only.
    browser.find_element(By.ID, "reason").send_keys("the user left")
    browser.find_element(By.ID, "abandon").click()
    wait_for(browser, lambda d: "read-only: no token" in note(d), "the read-only refusal")

    # With a token: abandon the delivered row -> refused, shown; the owed row -> abandoned.
    browser.find_element(By.ID, "token").send_keys(mint_token("alice", SECRET))
    browser.find_element(By.ID, "token-use").click()
    wait_for(browser, lambda d: d.find_element(By.ID, "mode").text == "operator alice", "signed in")
    row(browser, sent_id).click()
    wait_for(
        browser,
        lambda d: d.find_element(By.ID, "detail-id").text == sent_id,
        "the delivered row's detail",
    )
    assert browser.find_element(By.ID, "detail-content").text == XSS
    browser.find_element(By.ID, "abandon").click()
    refusal = wait_for(
        browser,
        lambda d: "refused" in note(d) and sent_id in note(d) and note(d),
        "the wrong-state refusal",
    )
    assert "delivered" in refusal
    assert browser.find_element(By.ID, "note").get_attribute("data-kind") == "refused"

    row(browser, owed_id).click()
    wait_for(
        browser,
        lambda d: d.find_element(By.ID, "detail-id").text == owed_id,
        "the owed row's detail",
    )
    browser.find_element(By.ID, "abandon").click()
    wait_for(browser, lambda d: note(d).startswith("abandon by alice"), "the abandon done")
    wait_for(
        browser,
        lambda d: row(d, owed_id).get_attribute("data-state") == "abandoned",
        "the row moving",
    )
    wait_for(
        browser,
        lambda d: count(d, "abandoned") == "1" and count(d, "pending") == "0",
        "the counts moving",
    )
    wait_for(
        browser,
        lambda d: "dashboard:alice" in d.find_element(By.ID, "history").text,
        "the audit entry in the history",
    )
    stored = store.get(OBLIGATION_KIND, owed_id)
    assert stored is not None
    assert stored.state is ObligationState.ABANDONED
    assert SECRET not in browser.page_source

    screenshot(browser, "dashboard")
    assert console_errors(browser) == []

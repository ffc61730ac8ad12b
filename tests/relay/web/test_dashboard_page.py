"""The dashboard page in a real headless Chromium: counts that change live, one obligation's
history on click, settled rows listed and found by id, a table that fits at 1280 px, an
operator's abandon with a token, refusals shown in the page, only the repairs a row's state
allows offered, no token box on a read-only dashboard, every declared lifecycle drawn, replies
that keep failing counted and flagged until abandoned, a reply's HTML shown as text, and no
error in the browser console."""

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
from statecore.cli.lifecycles import all_lifecycles
from statecore.lifecycles import ObligationState
from statecore.obligation import OBLIGATION_KIND
from statecore.policy import ErrorKind
from statecore.repair import abandon
from stores import SQLiteStore
from tests.relay.web.browser import console_errors, screenshot

BOUND_S = 15.0
SECRET = "page-test-secret"
XSS = '<img src=x onerror="document.body.dataset.pwned=1">'
T = TypeVar("T")


class Served:
    """A dashboard on its own event loop in a background thread (the browser is synchronous)."""

    def __init__(self, store: SQLiteStore, **options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        options.setdefault("secrets", {"alice": [SECRET]})
        self.dashboard = Dashboard(store, poll_s=0.1, show_content=True, **options)
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


def offered(driver: Any) -> list[str]:
    """The repair buttons shown for the selected obligation."""
    buttons = driver.find_elements(By.CSS_SELECTOR, "#actions button[data-action]")
    return [str(b.get_attribute("data-action")) for b in buttons if b.is_displayed()]


def detail_of(driver: Any, oid: str) -> None:
    """Wait until the detail shows ``oid`` with its history."""
    wait_for(
        driver,
        lambda d: (
            d.find_element(By.ID, "detail-id").text == oid
            and d.find_elements(By.CSS_SELECTOR, "#history tbody tr")
        ),
        f"the detail of {oid}",
    )


def events_shown(driver: Any) -> list[str]:
    rows = driver.find_elements(By.CSS_SELECTOR, "#history tbody tr")
    return [str(r.get_attribute("data-event")) for r in rows]


def _watch_rows_arrive(browser: Any, running: Served, ledger: Ledger) -> tuple[str, str]:
    """Open the page, see the counts and diagrams, then see an owed row and a delivered one
    (whose content is HTML) arrive live; return their ids."""
    console_errors(browser)  # earlier pages' entries are not this test's
    browser.get(running.url)
    wait_for(browser, lambda d: count(d, "pending") == "0", "the counts")
    for kind in ("buffer_entry", "session", "delegation"):
        assert browser.find_elements(By.CSS_SELECTOR, f'td[data-kind="{kind}"][data-state]')
    images = browser.find_elements(By.CSS_SELECTOR, "#diagrams img")
    assert len(images) == len(all_lifecycles())
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

    assert browser.find_element(By.ID, "note").get_attribute("data-kind") == "refused"

    # With a token: the delivered row offers no repair; the owed row is abandoned.
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
    wait_for(browser, lambda d: offered(d) == [], "no repair offered for a delivered row")

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


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    opened = SQLiteStore(tmp_path / "x.db")
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def serve(store: SQLiteStore) -> Iterator[Callable[..., Served]]:
    """Start a dashboard over ``store`` with the options given (stopped at the end): for rows
    written before it starts."""
    started: list[Served] = []

    def start(**options: Any) -> Served:
        started.append(Served(store, **options))
        return started[-1]

    try:
        yield start
    finally:
        for running in started:
            running.stop()


@pytest.fixture
def small_window(browser: Any) -> Iterator[Any]:
    """The browser at 1280 x 800 for one test (the session's size afterwards)."""
    before = browser.get_window_size()
    browser.set_window_size(1280, 800)
    try:
        yield browser
    finally:
        browser.set_window_size(before["width"], before["height"])


_CLIPPED = """
const cell = arguments[0];
const box = cell.closest("section").getBoundingClientRect();
const r = cell.getBoundingClientRect();
const view = document.documentElement.clientWidth;
const problems = [];
if (cell.scrollWidth > cell.clientWidth) {
  problems.push(`text ${cell.scrollWidth} > ${cell.clientWidth}`);
}
if (r.left < box.left - 0.5 || r.right > box.right + 0.5) {
  problems.push(`outside its box ${r.left}-${r.right} of ${box.left}-${box.right}`);
}
if (r.left < 0 || r.right > view + 0.5) {
  problems.push(`outside the window ${r.left}-${r.right} of ${view}`);
}
return problems.join("; ");
"""
"""What keeps a table cell from being fully visible: its text clipped, or the cell reaching
out of its section or the window ("" when nothing does)."""


def test_settled_rows_are_listed_found_by_id_and_fit_at_1280_px(
    small_window: Any, store: SQLiteStore, serve: Callable[..., Served]
) -> None:
    """Rows delivered before the dashboard started are listed (with the owed ones), each one
    a click away from its history, and any id can be looked up; at 1280 x 800 every state and
    platform cell of the obligations table is fully visible inside its box."""
    browser = small_window
    ledger = Ledger(store)
    delivered = []
    for n in range(4):
        oid = ledger.record(
            session_key=f"k{n}", platform="telegram", chat_id=f"chat-{n}", content=f"reply {n}"
        ).obligation_id
        ledger.mark_attempting(oid)
        ledger.mark_delivered(oid)
        delivered.append(oid)
    busy = ledger.record(
        session_key="k9", platform="discord", chat_id="c9", content="x" * 300
    ).obligation_id
    ledger.mark_attempting(busy)
    running = serve()
    browser.get(running.url)
    wait_for(browser, lambda d: count(d, "delivered") == "4", "the counts")
    for oid in delivered:
        wait_for(
            browser,
            lambda d, oid=oid: row(d, oid).get_attribute("data-state") == "delivered",
            f"the delivered row {oid}",
        )
    row(browser, delivered[0]).click()
    detail_of(browser, delivered[0])
    assert events_shown(browser) == ["record", "attempt", "deliver"]

    cells = browser.find_elements(
        By.CSS_SELECTOR, "#obligations td.state, #obligations td.platform"
    )
    cells += browser.find_elements(
        By.CSS_SELECTOR, "#obligations th.state, #obligations th.platform"
    )
    assert len(cells) == 2 * 5 + 2
    assert "attempting" in [c.text for c in cells]
    problems = {c.text: browser.execute_script(_CLIPPED, c) for c in cells}
    assert {text: p for text, p in problems.items() if p} == {}

    # Found by id: a row that is not listed (pruned ids are answered as unknown).
    lookup = browser.find_element(By.ID, "lookup-id")
    lookup.send_keys(delivered[2])
    browser.find_element(By.ID, "lookup-go").click()
    detail_of(browser, delivered[2])
    lookup.clear()
    lookup.send_keys("no-such-obligation")
    browser.find_element(By.ID, "lookup-go").click()
    wait_for(
        browser,
        lambda d: "no such obligation" in d.find_element(By.ID, "detail-content").text,
        "the unknown id",
    )
    screenshot(browser, "dashboard-1280")
    assert console_errors(browser) == []


def test_a_token_living_too_long_is_refused_once_prefixed_in_the_page(
    browser: Any, store: SQLiteStore, serve: Callable[..., Served]
) -> None:
    """A 12 h token against the default dashboard: the page says the token's lifetime exceeds
    the 1 h cap, and an abandon with it is refused with "refused" said once; the same token on
    a dashboard whose cap is 12 h signs the operator in."""
    owed = Ledger(store).record(session_key="k", platform="web", chat_id="c", content="owed")
    token = mint_token("alice", SECRET, ttl_s=12 * 3600)
    reason = "the token's lifetime exceeds the 1 h this dashboard accepts (max_token_ttl_s)"
    strict = serve()
    browser.get(strict.url)
    wait_for(browser, lambda d: count(d, "pending") == "1", "the counts")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.ID, "token-use").click()
    wait_for(browser, lambda d: reason in d.find_element(By.ID, "mode").text, "the auth refusal")
    row(browser, owed.obligation_id).click()
    detail_of(browser, owed.obligation_id)
    browser.find_element(By.ID, "reason").send_keys("stuck")
    browser.find_element(By.ID, "abandon").click()
    shown = wait_for(browser, lambda d: "refused" in note(d) and note(d), "the refusal")
    assert shown == f"abandon of {owed.obligation_id} refused: {reason}"
    assert shown.count("refused") == 1

    relaxed = serve(max_token_ttl_s=12 * 3600)
    browser.get(relaxed.url)
    wait_for(browser, lambda d: count(d, "pending") == "1", "the counts")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.ID, "token-use").click()
    wait_for(browser, lambda d: d.find_element(By.ID, "mode").text == "operator alice", "signed in")
    assert console_errors(browser) == []


def test_a_read_only_dashboard_shows_no_token_box_and_no_repairs(
    browser: Any, store: SQLiteStore, serve: Callable[..., Served]
) -> None:
    """Without operator secrets the page shows no token box and no repair buttons (nothing
    could be done with them), says it is read-only, and still shows histories."""
    owed = Ledger(store).record(session_key="k", platform="web", chat_id="c", content="owed")
    running = serve(secrets=None)
    browser.get(running.url)
    wait_for(browser, lambda d: count(d, "pending") == "1", "the counts")
    mode = browser.find_element(By.ID, "mode")
    wait_for(browser, lambda d: "read-only" in mode.text, "the read-only badge")
    assert mode.is_displayed()
    for hidden in ("token", "token-use", "reason", "abandon", "retry"):
        assert not browser.find_element(By.ID, hidden).is_displayed(), hidden
    row(browser, owed.obligation_id).click()
    detail_of(browser, owed.obligation_id)
    assert offered(browser) == []
    assert not browser.find_element(By.ID, "token").is_displayed()
    assert console_errors(browser) == []


def test_only_the_repairs_a_rows_state_allows_are_offered(
    browser: Any, store: SQLiteStore, serve: Callable[..., Served]
) -> None:
    """Abandon is offered on an owed row only, retry on an abandoned one only, neither on a
    delivered one; the buttons follow the selected row as it moves."""
    ledger = Ledger(store)
    made = {}
    for state in ("pending", "attempting", "failed", "delivered", "abandoned"):
        oid = ledger.record(session_key=state, platform="web", chat_id="c", content=state)
        made[state] = oid.obligation_id
    ledger.mark_attempting(made["attempting"])
    ledger.mark_attempting(made["failed"])
    ledger.mark_failed(made["failed"], "down")
    ledger.mark_attempting(made["delivered"])
    ledger.mark_delivered(made["delivered"])
    abandon(store, made["abandoned"], by="test", reason="gone")
    running = serve()
    browser.get(running.url)
    wait_for(browser, lambda d: count(d, "abandoned") == "1", "the counts")
    expected = {
        "pending": ["abandon"],
        "attempting": ["abandon"],
        "failed": ["abandon"],
        "delivered": [],
        "abandoned": ["retry"],
    }
    for state, buttons in expected.items():
        row(browser, made[state]).click()
        detail_of(browser, made[state])
        wait_for(browser, lambda d, b=buttons: offered(d) == b, f"the repairs of {state}")
    row(browser, made["pending"]).click()
    detail_of(browser, made["pending"])
    ledger.mark_attempting(made["pending"])
    ledger.mark_delivered(made["pending"])
    wait_for(browser, lambda d: offered(d) == [], "no repair once the selected row is delivered")
    assert console_errors(browser) == []


def test_every_declared_lifecycle_is_drawn_with_counts_where_counted(
    browser: Any, served: tuple[Served, Ledger, SQLiteStore]
) -> None:
    """Every lifecycle of the ``statecore.lifecycles`` entry points is drawn, in their order;
    the four the dashboard counts carry their counts per state, which follow the store live."""
    running, ledger, _ = served
    browser.get(running.url)
    wait_for(browser, lambda d: count(d, "pending") == "0", "the counts")
    figures = browser.find_elements(By.CSS_SELECTOR, "#diagrams figure")
    assert [f.get_attribute("data-lifecycle") for f in figures] == [
        lc.name for lc in all_lifecycles()
    ]
    counted = {
        str(f.get_attribute("data-lifecycle")): str(f.get_attribute("data-kind"))
        for f in figures
        if f.get_attribute("data-kind")
    }
    assert counted == {
        "obligation": "obligation",
        "buffer": "buffer_entry",
        "session": "session",
        "delegation": "delegation",
        "held_inbound": "held_inbound",
        "rejected_inbound": "rejected_inbound",
    }
    for figure in figures:
        captions = figure.find_elements(By.CSS_SELECTOR, "figcaption td[data-state]")
        assert bool(captions) == (figure.get_attribute("data-kind") is not None)

    def drawn_count(d: Any, state: str) -> str:
        selector = f'#diagrams figure[data-lifecycle="obligation"] td[data-state="{state}"]'
        return str(d.find_element(By.CSS_SELECTOR, selector).text)

    assert drawn_count(browser, "pending") == "0"
    ledger.record(session_key="k", platform="web", chat_id="c", content="owed")
    wait_for(browser, lambda d: drawn_count(d, "pending") == "1", "the drawn count going up")
    assert console_errors(browser) == []


def failing_badge(driver: Any) -> str:
    """The text of the alarm near the counts ("" while it is hidden)."""
    badge = driver.find_element(By.ID, "failing")
    return str(badge.text) if badge.is_displayed() else ""


def test_a_reply_that_keeps_failing_is_flagged_until_an_operator_abandons_it(
    browser: Any, store: SQLiteStore, serve: Callable[..., Served]
) -> None:
    """A permanently refused reply raises a "1 reply keeps failing" alarm near the counts and
    is flagged in the table and its history with its error kind, error and what it waits for
    (a transient failure with a retry due is not flagged); abandoned through the page, its
    flag and the alarm go away."""
    ledger = Ledger(store)
    refused = ledger.record(session_key="k1", platform="web", chat_id="c1", content="long")
    retried = ledger.record(session_key="k2", platform="web", chat_id="c2", content="soon")
    for made, error, kind in [
        (refused, "message too long", ErrorKind.PERMANENT),
        (retried, "connection timed out", ErrorKind.TRANSIENT),
    ]:
        ledger.mark_attempting(made.obligation_id)
        ledger.mark_failed(made.obligation_id, error, kind=kind)
    refused_id, retried_id = refused.obligation_id, retried.obligation_id
    running = serve()
    console_errors(browser)  # earlier pages' entries are not this test's
    browser.get(running.url)
    wait_for(browser, lambda d: count(d, "failed") == "2", "the counts")
    wait_for(browser, lambda d: failing_badge(d) == "1 reply keeps failing", "the alarm")

    flagged = row(browser, refused_id)
    assert "keeps-failing" in str(flagged.get_attribute("class")).split()
    flag = flagged.find_element(By.CSS_SELECTOR, "td.state .flag")
    assert flag.text == "keeps failing"
    line = flagged.find_element(By.CSS_SELECTOR, "td.content .failure")
    assert line.is_displayed()
    assert line.text == "permanent · attempts 0 · message too long"
    assert str(line.get_attribute("title")).startswith("waits for an operator")
    calm = row(browser, retried_id)
    assert "keeps-failing" not in str(calm.get_attribute("class")).split()
    assert calm.find_elements(By.CSS_SELECTOR, ".flag") == []
    assert calm.find_element(By.CSS_SELECTOR, "td.content .failure").text.startswith("transient")

    flagged.click()
    detail_of(browser, refused_id)
    failure = browser.find_element(By.ID, "detail-failure")
    assert failure.is_displayed()
    assert failure.get_attribute("data-keeps-failing") == "true"
    assert failure.text.startswith("keeps failing permanent · attempts 0 · message too long")
    assert "waits for an operator" in failure.text

    browser.find_element(By.ID, "token").send_keys(mint_token("alice", SECRET))
    browser.find_element(By.ID, "token-use").click()
    wait_for(browser, lambda d: d.find_element(By.ID, "mode").text == "operator alice", "signed in")
    browser.find_element(By.ID, "reason").send_keys("too long for the platform")
    browser.find_element(By.ID, "abandon").click()
    wait_for(browser, lambda d: note(d).startswith("abandon by alice"), "the abandon done")
    wait_for(browser, lambda d: failing_badge(d) == "", "the alarm gone")
    assert browser.find_element(By.ID, "failing").get_attribute("data-count") == "0"
    wait_for(
        browser,
        lambda d: (
            row(d, refused_id).get_attribute("data-state") == "abandoned"
            and "keeps-failing" not in str(row(d, refused_id).get_attribute("class")).split()
        ),
        "the row unflagged",
    )
    assert row(browser, refused_id).find_elements(By.CSS_SELECTOR, ".flag, .failure") == []
    wait_for(
        browser,
        lambda d: not d.find_element(By.ID, "detail-failure").is_displayed(),
        "the history's flag gone",
    )
    stored = store.get(OBLIGATION_KIND, refused_id)
    assert stored is not None
    assert stored.state is ObligationState.ABANDONED
    screenshot(browser, "dashboard-failing")
    assert console_errors(browser) == []

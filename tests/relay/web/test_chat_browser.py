"""The web chat in a real headless Chromium: a person picks a name, writes, sees the bot's
reply; markup stays text; an oversized message shows a refusal; the bot's process is SIGKILLed
in the middle of a reply and the labelled redelivery appears after its restart.  The connector
and the web server run in the test's event loop; the bot is ``statecore gateway`` in a real
subprocess on a SQLite ledger; every browser call runs on a worker thread."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest
import pytest_asyncio
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from relay.connector.server import Connector
from relay.web.chat import WebChatPlatform
from relay.web.dashboard import Dashboard
from relay.web.server import WebServer
from relay.wire.frames import OutboundOutcome
from statecore import RECOVERED_MARKER
from statecore.lifecycles import ObligationState
from statecore.obligation import OBLIGATION_KIND
from stores import SQLiteStore
from tests.cli_run import console_script
from tests.relay.web.browser import console_errors, screenshot
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[3]
SECRET = "web-chat-browser-secret"
WAIT_S = 20.0
T = TypeVar("T")


class HoldingChat(WebChatPlatform):
    """The web chat whose first reply containing "hold" hangs until the test releases it, and
    then fails (a platform call that timed out).  The test kills the bot's process while it
    hangs and releases it before the restart: a send still hanging would hold the connector's
    idempotency key, and the restarted bot's resend would get its outcome (the connector never
    performs one request twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        self.failed = asyncio.Event()

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        content = action.get("content")
        hold = action.get("op") == "send" and isinstance(content, str) and "hold" in content
        if hold and not self.holding.is_set():
            self.holding.set()
            try:
                await asyncio.wait_for(self.release.wait(), WAIT_S)
            finally:
                self.failed.set()
            return OutboundOutcome(False, None, "the platform timed out", "timeout")
        return await super().perform(action)


class Stack:
    def __init__(self, tmp: Path, chat: HoldingChat, connector: Connector, web: WebServer) -> None:
        self.db = tmp / "bot.db"
        self.chat = chat
        self.connector = connector
        self.web = web
        self.bot: subprocess.Popen[bytes] | None = None
        self.log = tmp / "bot.log"

    def start_bot(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STATECORE_")}
        env.update(
            PYTHONPATH=str(ROOT),
            STATECORE_CONNECTOR_URL=self.connector.url,
            STATECORE_STORE_URL=f"sqlite:///{self.db}",
            STATECORE_PLATFORM="webchat",
            STATECORE_GATEWAY_ID="bot",
            STATECORE_SECRET=SECRET,
        )
        with self.log.open("ab") as log:
            self.bot = subprocess.Popen(
                [console_script(), "gateway", "tests.relay.web.chat_bot:answer"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=log,
            )

    def kill_bot(self) -> None:
        assert self.bot is not None
        self.bot.send_signal(signal.SIGKILL)
        assert self.bot.wait(timeout=WAIT_S) == -signal.SIGKILL


@pytest_asyncio.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    chat = HoldingChat()
    store = SQLiteStore(tmp_path / "connector.db")
    connector = Connector(store, secrets={"bot": [SECRET]}, drivers={"webchat": chat})
    ledger = SQLiteStore(tmp_path / "bot.db")  # the bot's ledger, as the dashboard reads it
    dashboard = Dashboard(ledger, poll_s=0.2)
    web = WebServer([chat, dashboard])
    await connector.start()
    await web.start()
    s = Stack(tmp_path, chat, connector, web)
    try:
        yield s
    finally:
        if s.bot is not None and s.bot.poll() is None:
            s.bot.kill()
            s.bot.wait(timeout=WAIT_S)
        await web.stop()
        await dashboard.close()
        ledger.close()
        await connector.stop()
        store.close()


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """A blocking browser call, on a worker thread: the servers keep running meanwhile."""
    return await asyncio.to_thread(fn, *args)


async def wait_in_browser(browser: Any, predicate: Callable[[Any], bool], what: str) -> None:
    """Poll the page (bounded) until ``predicate(browser)`` holds."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not await off_loop(predicate, browser):
        if asyncio.get_running_loop().time() > deadline:
            await off_loop(screenshot, browser, f"timeout-{what}")
            raise AssertionError(f"timed out after {WAIT_S:g} s waiting for {what}")
        await asyncio.sleep(0.05)


def bot_texts(browser: Any) -> list[str]:
    return [
        li.find_element(By.CSS_SELECTOR, ".text").text
        for li in browser.find_elements(By.CSS_SELECTOR, '#messages li[data-bot="true"]')
    ]


def write(browser: Any, text: str) -> None:
    box = browser.find_element(By.ID, "text")
    box.clear()
    browser.execute_script("arguments[0].value = arguments[1];", box, text)
    box.send_keys(Keys.ENTER)


def delivered_count(browser: Any) -> int:
    """The dashboard's count of delivered replies (-1 before the table is drawn).  Read in one
    script: the page redraws the cell whenever the counts change."""
    text = browser.execute_script(
        "const cell = document.querySelector("
        '\'td[data-kind="obligation"][data-state="delivered"]\');'
        "return cell === null ? null : cell.textContent;"
    )
    return -1 if text is None else int(text or 0)


def attempting(db: Path) -> int:
    with SQLiteStore(db) as store:
        store.register(OBLIGATION_KIND)
        return store.count(OBLIGATION_KIND, states=(ObligationState.ATTEMPTING,))


@pytest.mark.asyncio
async def test_a_person_chats_and_a_killed_bot_redelivers_labelled(
    stack: Stack, browser: Any
) -> None:
    stack.start_bot()
    await eventually(lambda: stack.connector.connected("bot"), "bot connected", timeout=WAIT_S)
    await off_loop(browser.get, stack.web.url + "/chat/")
    await off_loop(browser.execute_script, "localStorage.clear();")
    await off_loop(browser.refresh)
    await wait_in_browser(browser, lambda b: b.find_element(By.ID, "join").is_displayed(), "join")
    await off_loop(lambda: browser.find_element(By.ID, "name").send_keys("Ada", Keys.ENTER))
    await wait_in_browser(browser, lambda b: b.find_element(By.ID, "app").is_displayed(), "app")
    assert await off_loop(lambda: browser.find_element(By.ID, "who").text) == "Ada"

    # A message and its reply.
    await off_loop(write, browser, "hello bot")
    await wait_in_browser(browser, lambda b: "echo: hello bot" in bot_texts(b), "the reply")

    # Markup is shown as text: no element is made of it, no script runs.
    payload = "<img src=x onerror=\"document.title='pwned'\">"
    await off_loop(write, browser, payload)
    await wait_in_browser(browser, lambda b: f"echo: {payload}" in bot_texts(b), "markup echoed")
    assert await off_loop(lambda: browser.find_elements(By.CSS_SELECTOR, "#messages img")) == []
    assert await off_loop(lambda: browser.title) == "statecore web chat"

    # Too long: refused, with a visible note; nothing sent.
    await off_loop(write, browser, "x" * 4001)
    await wait_in_browser(
        browser, lambda b: "too long" in b.find_element(By.ID, "note").text, "the refusal note"
    )
    assert await off_loop(lambda: browser.find_element(By.ID, "note").is_displayed())
    await off_loop(screenshot, browser, "chat")

    # The dashboard, in a second tab, counts the two replies delivered so far.
    chat_tab = await off_loop(lambda: browser.current_window_handle)
    await off_loop(browser.switch_to.new_window, "tab")
    await off_loop(browser.get, stack.web.url + "/dashboard/")
    await wait_in_browser(browser, lambda b: delivered_count(b) == 2, "2 delivered counted")
    dashboard_tab = await off_loop(lambda: browser.current_window_handle)
    await off_loop(browser.switch_to.window, chat_tab)

    # The bot is killed while its reply is in flight, then started again.
    await off_loop(write, browser, "please hold on")
    await eventually(stack.chat.holding.is_set, "the reply in flight", timeout=WAIT_S)
    await eventually(lambda: attempting(stack.db) == 1, "the reply attempting", timeout=WAIT_S)
    stack.kill_bot()
    stack.chat.release.set()
    await eventually(stack.chat.failed.is_set, "the hung send over", timeout=WAIT_S)
    stack.start_bot()
    labelled = f"{RECOVERED_MARKER}\n\necho: please hold on"
    await wait_in_browser(browser, lambda b: labelled in bot_texts(b), "the labelled redelivery")
    badge = await off_loop(
        lambda: (
            browser.find_element(
                By.CSS_SELECTOR, '#messages li[data-redelivery="true"] .badge'
            ).text
        )
    )
    assert badge == "redelivered: may repeat"
    await off_loop(screenshot, browser, "chat-redelivery")

    # The dashboard's count moved live: the recovered reply was delivered too.
    await off_loop(browser.switch_to.window, dashboard_tab)
    await wait_in_browser(browser, lambda b: delivered_count(b) == 3, "3 delivered counted")
    await off_loop(screenshot, browser, "chat-dashboard")
    assert await off_loop(console_errors, browser) == []
    await off_loop(browser.close)
    await off_loop(browser.switch_to.window, chat_tab)

    # Reopening the page keeps the conversation.
    await off_loop(browser.refresh)
    await wait_in_browser(browser, lambda b: labelled in bot_texts(b), "history after reload")
    assert await off_loop(console_errors, browser) == []

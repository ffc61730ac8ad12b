"""The web chat in a real headless Chromium: a person picks a name, writes, sees the bot's
reply; markup stays text; an oversized message shows a refusal; the bot's process is SIGKILLed
in the middle of a reply and the labelled redelivery appears after its restart.  The page's
layout and forms: the join screen shows only the name form, long messages wrap inside the
message list, a bad chat name is refused by the browser itself, a refused message stays in the
input.  The connector and the web server run in the test's event loop; the bot is
``statecore gateway`` in a real subprocess on a SQLite ledger; every browser call runs on a
worker thread."""

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
from selenium.webdriver.support.expected_conditions import (
    text_to_be_present_in_element,
    visibility_of_element_located,
)
from selenium.webdriver.support.wait import WebDriverWait

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


# -- the page's layout and forms ------------------------------------------------------------------

LONG_WORD = "w" * 3000
LONG_TEXT = " ".join(["a long message with spaces that wraps"] * 90)
NARROW = (420, 800)
WIDE = (1280, 900)
SEND_SPY = (
    "window.sentFrames = [];"
    "const send = WebSocket.prototype.send;"
    "WebSocket.prototype.send = function (data) {"
    "  window.sentFrames.push(JSON.parse(data)); return send.call(this, data); };"
)
LAYOUT = """
const doc = document.documentElement;
const list = document.getElementById("messages");
const button = document.getElementById("send");
const b = button.getBoundingClientRect();
const box = list.getBoundingClientRect();
const shown = Array.from(list.querySelectorAll("li.message")).filter((li) => !li.hidden);
return {
  page: [doc.scrollWidth, doc.clientWidth, doc.scrollHeight, doc.clientHeight],
  button: [b.left, b.top, b.right, b.bottom],
  viewport: [doc.clientWidth, doc.clientHeight],
  hit: document.elementFromPoint((b.left + b.right) / 2, (b.top + b.bottom) / 2) === button,
  wrap: shown.map((li) => getComputedStyle(li).overflowWrap),
  inside: shown.every((li) => {
    const r = li.getBoundingClientRect();
    return r.left >= box.left - 0.5 && r.right <= box.right + 0.5;
  }),
  list: [list.scrollWidth, list.clientWidth, list.scrollHeight, list.clientHeight],
  overflowY: getComputedStyle(list).overflowY,
};
"""


async def join(stack: Stack, browser: Any, name: str) -> None:
    """Open the chat page with a fresh identity, pick ``name`` and wait for the app."""
    wait = WebDriverWait(browser, WAIT_S)
    await off_loop(browser.get, stack.web.url + "/chat/")
    await off_loop(browser.execute_script, "localStorage.clear();")
    await off_loop(browser.refresh)
    await off_loop(wait.until, visibility_of_element_located((By.ID, "name")))
    await off_loop(lambda: browser.find_element(By.ID, "name").send_keys(name, Keys.ENTER))
    await off_loop(wait.until, text_to_be_present_in_element((By.ID, "who"), name))
    await off_loop(wait.until, text_to_be_present_in_element((By.ID, "chat-title"), "# general"))


def displayed(browser: Any, css: str) -> bool:
    return bool(browser.find_element(By.CSS_SELECTOR, css).is_displayed())


APP_PARTS = ("#app", "nav h2", "#new-chat-form", "#new-chat", ".who", "#composer", "#send")


@pytest.mark.asyncio
async def test_the_join_screen_shows_only_the_name_form(stack: Stack, browser: Any) -> None:
    """Before a person joined, the app (chats, the new-chat form, "You are") is not displayed,
    only the name form; after joining the app is, and the name form is gone."""
    wait = WebDriverWait(browser, WAIT_S)
    await off_loop(browser.get, stack.web.url + "/chat/")
    await off_loop(browser.execute_script, "localStorage.clear();")
    await off_loop(browser.refresh)
    await off_loop(wait.until, visibility_of_element_located((By.ID, "name")))
    await off_loop(screenshot, browser, "chat-join")
    shown = {css: await off_loop(displayed, browser, css) for css in APP_PARTS}
    assert shown == dict.fromkeys(APP_PARTS, False)

    await off_loop(lambda: browser.find_element(By.ID, "name").send_keys("Grace", Keys.ENTER))
    await off_loop(wait.until, text_to_be_present_in_element((By.ID, "who"), "Grace"))
    shown = {css: await off_loop(displayed, browser, css) for css in APP_PARTS}
    assert shown == dict.fromkeys(APP_PARTS, True)
    assert not await off_loop(displayed, browser, "#join")
    assert not await off_loop(displayed, browser, "#note")
    assert not await off_loop(displayed, browser, "#typing")
    assert await off_loop(console_errors, browser) == []


@pytest.mark.asyncio
async def test_long_messages_wrap_and_the_send_button_stays_in_view(
    stack: Stack, browser: Any
) -> None:
    """A 3,000-character word and a long message with spaces, sent and echoed by the bot, wrap
    inside the message list, which scrolls in its own box: the page never scrolls and the Send
    button stays whole in the viewport and clickable, on a wide and on a narrow window."""
    stack.start_bot()
    await eventually(lambda: stack.connector.connected("bot"), "bot connected", timeout=WAIT_S)
    wait = WebDriverWait(browser, WAIT_S)
    try:
        for width, height in (WIDE, NARROW):
            await off_loop(browser.set_window_size, width, height)
            await join(stack, browser, "Lin")
            for text in (LONG_WORD, LONG_TEXT):
                await off_loop(write, browser, text)
                await off_loop(wait.until, lambda b, t=text: f"echo: {t}" in bot_texts(b))
            await off_loop(screenshot, browser, f"chat-long-{width}")
            layout = await off_loop(browser.execute_script, LAYOUT)
            scroll_width, client_width, scroll_height, client_height = layout["page"]
            assert scroll_width <= client_width, (width, layout)
            assert scroll_height <= client_height, (width, layout)
            left, top, right, bottom = layout["button"]
            view_width, view_height = layout["viewport"]
            assert 0 <= left < right <= view_width, (width, layout)
            assert 0 <= top < bottom <= view_height, (width, layout)
            assert layout["hit"], (width, layout)
            assert layout["wrap"] == ["anywhere"] * 4, (width, layout)
            assert layout["inside"], (width, layout)
            list_scroll_width, list_client_width, list_scroll_height, list_client_height = layout[
                "list"
            ]
            assert list_scroll_width <= list_client_width, (width, layout)
            assert list_scroll_height > list_client_height, (width, layout)
            assert layout["overflowY"] == "auto", (width, layout)

            # The button is clicked where it is shown, and what it sends arrives.
            box = await off_loop(browser.find_element, By.ID, "text")
            await off_loop(box.send_keys, f"short at {width}")
            await off_loop(lambda: browser.find_element(By.ID, "send").click())
            await off_loop(wait.until, lambda b, w=width: f"echo: short at {w}" in bot_texts(b))
    finally:
        await off_loop(browser.set_window_size, *WIDE)
    assert await off_loop(console_errors, browser) == []


def new_chat_state(browser: Any) -> dict[str, Any]:
    return dict(
        browser.execute_script(
            "const el = document.getElementById('new-chat');"
            "return {invalid: el.matches(':invalid'), mismatch: el.validity.patternMismatch,"
            " message: el.validationMessage,"
            " opened: window.sentFrames.filter((f) => f.type === 'open').map((f) => f.chat),"
            " note: document.getElementById('note').hidden ? null : "
            "document.getElementById('note').textContent};"
        )
    )


@pytest.mark.asyncio
async def test_the_browser_checks_a_new_chat_name_before_sending_it(
    stack: Stack, browser: Any
) -> None:
    """The new-chat name's pattern compiles (no console error): a name the server would refuse
    makes the input invalid with the rule shown, and nothing is sent; a valid name opens the
    chat."""
    wait = WebDriverWait(browser, WAIT_S)
    await join(stack, browser, "Kay")
    await off_loop(browser.execute_script, SEND_SPY)
    field = await off_loop(browser.find_element, By.ID, "new-chat")
    for bad in ("Bad Name!", "-dash-first"):
        await off_loop(field.clear)
        await off_loop(field.send_keys, bad, Keys.ENTER)
        state = await off_loop(new_chat_state, browser)
        assert state["invalid"], state
        assert state["mismatch"], state
        assert "a-z, 0-9 and -" in state["message"], state
        assert await off_loop(displayed, browser, "#new-chat-rule")
        assert await off_loop(lambda: field.get_attribute("value")) == bad
    await off_loop(screenshot, browser, "chat-bad-name")
    assert await off_loop(console_errors, browser) == []

    await off_loop(field.clear)
    await off_loop(field.send_keys, "team-2", Keys.ENTER)
    await off_loop(wait.until, text_to_be_present_in_element((By.ID, "chat-title"), "# team-2"))
    state = await off_loop(new_chat_state, browser)
    assert state["opened"] == ["team-2"], state  # the bad names never went out
    assert state["note"] is None, state
    assert not await off_loop(displayed, browser, "#new-chat-rule")  # the field is empty again
    chats = await off_loop(
        lambda: [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#chats li")]
    )
    assert chats == ["# general", "# team-2"]
    assert await off_loop(console_errors, browser) == []


@pytest.mark.asyncio
async def test_a_refused_message_stays_in_the_input(stack: Stack, browser: Any) -> None:
    """A message the server accepts empties the input once it is echoed; one it refuses (over
    max_text) stays in the input, with the refusal shown."""
    wait = WebDriverWait(browser, WAIT_S)
    await join(stack, browser, "Noor")
    await off_loop(write, browser, "accepted")
    await off_loop(
        wait.until,
        lambda b: (
            "accepted"
            in [
                li.text
                for li in b.find_elements(By.CSS_SELECTOR, '#messages li[data-bot="false"] .text')
            ]
        ),
    )
    await off_loop(wait.until, lambda b: b.find_element(By.ID, "text").get_attribute("value") == "")

    refused = "z" * (stack.chat.descriptor().max_message_length + 1)
    await off_loop(write, browser, refused)
    await off_loop(wait.until, text_to_be_present_in_element((By.ID, "note"), "too long"))
    assert await off_loop(displayed, browser, "#note")
    assert (
        await off_loop(lambda: browser.find_element(By.ID, "text").get_attribute("value"))
        == refused
    )
    assert await off_loop(console_errors, browser) == []

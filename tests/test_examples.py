"""The runnable examples, exercised: each one runs as a real subprocess (as a user would run it)
and must exit 0 and print the lines that show its point; the custom store passes the whole
store contract kit."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from statecore import RECONNECTED_MARKER, FakeClock

if "stores.testing" not in sys.modules:  # detailed assertion messages from the kit's asserts
    pytest.register_assert_rewrite("stores.testing")

from relay.client.adapter import RelayAdapter
from relay.client.transport import WebSocketRelayTransport
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from statecore import RECOVERED_MARKER, Audit, LedgerPolicy, Store
from statecore.gateway import Gateway
from stores import InMemoryStore, SQLiteStore
from stores.testing import TICKET_KIND, StoreContract, StoreFactory

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TIMEOUT_S = 60.0

CLUSTER_BOUND_S = 300.0
"""The bound on the cluster example's run: its fixed kills and messages take about 20 s, much
longer on a busy machine (every kill waits for the restarted process to be ready)."""

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="the example sends SIGKILL")


def run_example(
    name: str, *args: str, env: dict[str, str] | None = None, timeout: float = TIMEOUT_S
) -> str:
    """Run ``examples/<name>.py`` from the repository root; return its stdout (exit 0 asserted)."""
    done = subprocess.run(
        [sys.executable, f"examples/{name}.py", *args],
        cwd=ROOT,
        env=None if env is None else {**os.environ, **env},
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, (
        f"{name}.py exited with {done.returncode}\n"
        f"--- stdout ---\n{done.stdout}\n--- stderr ---\n{done.stderr}"
    )
    return done.stdout


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` as a module (the examples are scripts, not a package)."""
    module_name = f"statecore_example_{name}"
    found = sys.modules.get(module_name)
    if found is not None:
        return found
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def section(output: str, title: str) -> str:
    """The part of ``output`` from the line starting with ``title`` to the end."""
    start = output.find(title)
    assert start >= 0, f"no {title!r} in:\n{output}"
    return output[start:]


# -- echo ------------------------------------------------------------------------------------------


def test_echo_bot_answers_every_message_in_order() -> None:
    out = run_example("echo_bot")
    chat = section(out, "the chat, as alice sees it:")
    lines = [line.strip() for line in chat.splitlines()[1:7]]
    assert lines == [
        "[alice] hello",
        "[bot] echo: hello",
        "[alice] how are you?",
        "[bot] echo: how are you?",
        "[alice] bye",
        "[bot] echo: bye",
    ]
    assert "replies delivered by the gateway: 3" in out


# -- crash recovery --------------------------------------------------------------------------------


@posix_only
def test_crash_recovery_delivers_the_reply_labelled_after_sigkill() -> None:
    out = run_example("crash_recovery")
    # The first life hung in the send with its ledger row attempting, and was SIGKILLed.
    assert "HANGING in the send of obligation" in out
    assert "the bot exited with -9: killed by SIGKILL = True" in out
    assert "bot replies so far: 0" in out
    # The second life claimed the dead process's row and redelivered it, labelled.
    assert "claimed 1 owed reply(s) left by a dead process" in out
    assert "redelivered 1 reply(s), 1 of them labelled" in out
    outcome = section(out, "5. the outcome")
    assert f"[bot]   {RECOVERED_MARKER}" in outcome
    assert "The answer to everything is 42." in outcome
    assert outcome.count("[bot]") == 1  # exactly one reply: nothing lost, nothing doubled
    assert "recovered reply delivered: True; labelled: True" in out
    assert "replies sent 1, lost 0" in out


# -- a cluster on PostgreSQL ----------------------------------------------------------------------


@posix_only
def test_cluster_of_gateways_and_connector_nodes_loses_nothing_under_kills(
    postgres_url: str,
) -> None:
    """Three gateway processes and two connector nodes on one PostgreSQL (the session's real
    server), users writing while two gateways and two nodes are SIGKILLed in turn: every
    accepted message answered, every repeat labelled, nothing owed or unacked at the end -- and
    nodes delivered what their peers accepted."""
    out = run_example(
        "cluster",
        "--kills",
        "4",
        "--messages",
        "60",
        "--seed",
        "11",
        env={"STATECORE_CLUSTER_PG_URL": postgres_url},
        timeout=CLUSTER_BOUND_S,
    )
    summary = json.loads(out.split("SUMMARY ", 1)[1].splitlines()[0])
    assert (summary["gateway_kills"], summary["node_kills"]) == (2, 2), summary
    assert summary["written"] >= 60, summary
    # A write is unconfirmed only when its node died before accepting it (the users write the
    # next one once the last was accepted or its node died): at most one per node kill.
    assert summary["written"] - summary["accepted"] <= summary["node_kills"], summary
    for key in ("lost", "unlabelled_duplicates", "wrong_chat", "stray"):
        assert summary[key] == 0, (key, summary)
    assert (summary["owed_at_end"], summary["unacked_at_end"]) == (0, 0), summary
    assert summary["peer_notices_acted_on"] >= 1, summary
    assert "every accepted message answered; every repeated reply labelled" in out
    assert postgres_url not in out  # the URL (with its password) is never printed


# -- make chat -------------------------------------------------------------------------------------


@posix_only
@pytest.mark.asyncio
async def test_chat_example_serves_a_bot_to_talk_to_until_ctrl_c(tmp_path: Path) -> None:
    """``make chat``: it prints the chat and dashboard URLs and an operator token, a person
    (here a raw client speaking the page's protocol) gets the bot's answer, the dashboard page
    is served, and SIGINT stops it with exit 0."""
    from websockets.asyncio.client import connect  # noqa: PLC0415

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "examples/chat.py",
        "--data",
        str(tmp_path / "chat-data"),
        "--port",
        "0",
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        printed: list[str] = []
        async with asyncio.timeout(TIMEOUT_S):
            while not printed or not printed[-1].startswith("Ctrl-C"):
                printed.append((await proc.stdout.readline()).decode().strip())
        chat_url = next(line.split()[-1] for line in printed if line.startswith("chat:"))
        dashboard_url = next(line.split()[-1] for line in printed if line.startswith("dash"))
        assert dashboard_url.endswith("/dashboard/")
        page = await asyncio.to_thread(_get, dashboard_url)
        assert b"dashboard.js" in page
        token = printed[printed.index(next(p for p in printed if p.startswith("operator"))) + 1]
        async with connect(dashboard_url.replace("http", "ws") + "ws", open_timeout=10) as ws:
            await _next(ws, "hello")
            await ws.send(json.dumps({"type": "auth", "token": token}))
            auth = await _next(ws, "auth")
        assert (auth["operator"], auth["reason"]) == ("operator", None)  # its own token works
        async with connect(chat_url.replace("http", "ws") + "ws", open_timeout=10) as ws:
            await ws.send(json.dumps({"type": "hello", "key": "x" * 32, "name": "Ada"}))
            await ws.send(json.dumps({"type": "open", "chat": "general"}))
            await ws.send(json.dumps({"type": "send", "chat": "general", "text": "hi there"}))
            async with asyncio.timeout(TIMEOUT_S):
                while True:
                    message = json.loads(await ws.recv())
                    if message["type"] == "message" and message["bot"]:
                        break
        assert message["text"] == "You said: hi there\n(2 words)"
        await _edits_typing_and_long_answers(chat_url)
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), TIMEOUT_S) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.asyncio
async def test_matrix_example_serves_a_person_on_any_matrix_client_until_ctrl_c(
    tmp_path: Path,
) -> None:
    """``make matrix``: it starts a throwaway homeserver, prints its address, the person's login
    and the dashboard; a person logging in there with a real Matrix client (matrix-nio) and
    writing to the bot gets its answer; SIGINT stops it with exit 0 and the homeserver with it."""
    import urllib.error  # noqa: PLC0415

    from nio import AsyncClient, LoginResponse, RoomCreateResponse  # noqa: PLC0415

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "examples/matrix_bot.py",
        "--data",
        str(tmp_path / "matrix-data"),
        "--port",
        "0",
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        printed: list[str] = []
        async with asyncio.timeout(TIMEOUT_S * 2):
            while not printed or not printed[-1].startswith("the bot is listening"):
                printed.append((await proc.stdout.readline()).decode().strip())
        homeserver = next(line.split()[1] for line in printed if line.startswith("homeserver:"))
        person_line = next(line.split() for line in printed if line.startswith("person:"))
        person, password = person_line[1], person_line[3]
        bot = next(line.split()[1] for line in printed if line.startswith("bot:"))
        dashboard_url = next(line.split()[-1] for line in printed if line.startswith("dash"))
        assert b"dashboard.js" in await asyncio.to_thread(_get, dashboard_url)
        client = AsyncClient(homeserver, person)
        try:
            assert isinstance(await client.login(password), LoginResponse)
            created = await client.room_create(invite=[bot], is_direct=True)
            assert isinstance(created, RoomCreateResponse)
            answers: list[str] = []
            sent = False
            async with asyncio.timeout(TIMEOUT_S):
                while not answers:
                    events = await asyncio.to_thread(
                        _timeline, homeserver, str(client.access_token), created.room_id
                    )
                    joined = any(
                        e.get("state_key") == bot and e["content"].get("membership") == "join"
                        for e in events
                    )
                    if joined and not sent:
                        body = {"msgtype": "m.text", "body": "hello bot"}
                        await client.room_send(created.room_id, "m.room.message", body)
                        sent = True
                    answers = [
                        e["content"]["body"]
                        for e in events
                        if e["sender"] == bot and e["type"] == "m.room.message"
                    ]
                    await asyncio.sleep(0.1)
        finally:
            await client.close()
        assert answers == ["You said: *hello bot*\n\n(2 words)"]
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), TIMEOUT_S) == 0
        with pytest.raises(urllib.error.URLError, match="refused"):  # the homeserver is gone
            await asyncio.to_thread(_get, homeserver + "/_matrix/client/versions")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _edits_typing_and_long_answers(chat_url: str) -> None:
    """What the chat bot's docstring promises, as the page sees it: ``/edit`` edits a draft
    into the answer, ``/slow`` types first, and an answer longer than the page takes arrives
    whole, in parts."""
    from websockets.asyncio.client import connect  # noqa: PLC0415

    async with connect(chat_url.replace("http", "ws") + "ws", open_timeout=10) as ws:
        await ws.send(json.dumps({"type": "hello", "key": "y" * 32, "name": "Bo"}))
        await ws.send(json.dumps({"type": "open", "chat": "general"}))
        # /edit: a draft, then the same message edited into the answer.
        await ws.send(json.dumps({"type": "send", "chat": "general", "text": "/edit"}))
        draft = await _next(ws, "message", bot=True)
        edited = await _next(ws, "edit")
        assert (edited["id"], edited["edited"]) == (draft["id"], True)
        assert edited["text"] == "You said: /edit\n(1 word)"
        # /slow: the bot types before it answers, and the answer ends the typing.
        await ws.send(json.dumps({"type": "send", "chat": "general", "text": "/slow"}))
        typing = await _next(ws, "typing")
        assert typing["status"] == "typing"
        answer = await _next(ws, "message", bot=True)
        assert answer["text"] == "You said: /slow\n(1 word)"
        # As long a message as the page takes: the longer answer arrives whole, in parts.
        long_text = " ".join(["word"] * 800)[:4000]
        await ws.send(json.dumps({"type": "send", "chat": "general", "text": long_text}))
        parts = [(await _next(ws, "message", bot=True))["text"]]
        while not parts[-1].endswith("words)"):
            parts.append((await _next(ws, "message", bot=True))["text"])
        assert len(parts) >= 2
        assert all(len(part) <= 4000 for part in parts)
        assert "".join(parts).replace(" ", "").replace("\n", "") == (
            f"You said: {long_text}\n(800 words)".replace(" ", "").replace("\n", "")
        )


async def _next(ws: Any, kind: str, **fields: object) -> dict[str, Any]:
    """The next message of ``kind`` (with ``fields``) the chat page would get, within the
    example test's bound."""
    async with asyncio.timeout(TIMEOUT_S):
        while True:
            message: dict[str, Any] = json.loads(await ws.recv())
            if message["type"] == kind and all(message.get(k) == v for k, v in fields.items()):
                return message


def _timeline(homeserver: str, token: str, room: str) -> list[dict[str, Any]]:
    """A room's latest events, read back from the homeserver as its member ``token``."""
    import urllib.parse  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    url = f"{homeserver}/_matrix/client/v3/rooms/{urllib.parse.quote(room)}/messages?dir=b"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        chunk: list[dict[str, Any]] = json.loads(response.read())["chunk"]
        return chunk


def _get(url: str) -> bytes:
    import urllib.request  # noqa: PLC0415

    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body


# -- scale to zero ---------------------------------------------------------------------------------


def test_scale_to_zero_buffers_while_dormant_and_answers_in_order_once() -> None:
    out = run_example("scale_to_zero")
    assert "going_idle -> dormant (sleep)" in out
    assert "dormant -> connecting (dial)" in out  # woken by the dormant cadence
    counts = [int(n) for n in re.findall(r"connector\.buffered\('sleepy-gateway'\) = (\d+)", out)]
    # Buffered while asleep, all acked after the wake; the dead instance's two stay unacked.
    assert counts == [3, 0, 2, 2, 0]
    assert "= 2 after bot#1 is gone (unacked)" in out
    assert "handled in the order written: True" in out
    assert "was handled before -> acked, not handled" in out
    assert "messages handled: 6, handled twice: none" in out
    assert "replies sent: 6; replays skipped by dedupe: 1" in out
    chats = section(out, "the chats:")
    answers_a = re.findall(r"chat-a \[bot\] got it: (.+)", chats)
    assert answers_a == ["hi", "are you there?", "one more thing"]
    answers_b = re.findall(r"chat-b \[bot\] got it: (.+)", chats)
    assert answers_b == ["good morning", "ping", "pong"]


# -- delegating bot --------------------------------------------------------------------------------


@posix_only
def test_delegating_bot_routes_late_results_to_the_right_chats_after_restart() -> None:
    out = run_example("delegating_bot")
    assert "killed by SIGKILL = True" in out
    assert out.count("of a dead process: status unknown") == 2
    verdicts = dict(re.findall(r"route \w+ -> loopback/([\w-]+) \(scope [\w-]+\): (.+)", out))
    assert verdicts == {
        "team-a-room": "deliver, pinned_live",
        "bo-dm": "deliver, pinned_live",
        "cy-dm": "terminal, user_boundary:session_reset",
    }
    assert "startup routing sent 2 late result(s)" in out
    chats = section(out, "4. the chats")
    assert re.search(r"team-a-room +\[bot\] Your summary of 'the Q3 report' .* is ready", chats)
    assert re.search(r"bo-dm +\[bot\] Your research of 'cold fusion' .* outcome is unknown", chats)
    assert not re.search(r"cy-dm +\[bot\] Your", chats)  # dropped: the user reset that session
    assert "late result to team-a-room carried scope_id=team-a" in out
    assert "late result to bo-dm carried scope_id=team-b" in out
    assert "late results delivered to the right chats: True" in out


# -- custom store ----------------------------------------------------------------------------------


def test_custom_store_example_runs() -> None:
    out = run_example("custom_store")
    feed = section(out, "the change feed")
    assert "3 committed changes" in feed
    assert "rolled back" not in feed
    assert "feed matches the delivered reply's lifecycle: True" in out


class TestCustomStoreContract(StoreContract):
    """The example's ChangeFeedStore passes the whole store contract kit."""

    @pytest.fixture
    def store(self, tmp_path: Path) -> StoreFactory:
        """A fresh ChangeFeedStore (new feed file) per call."""
        change_feed_store = load_example("custom_store").ChangeFeedStore
        paths = (tmp_path / f"feed-{n}.jsonl" for n in itertools.count())
        return lambda: change_feed_store(next(paths))


def insert_then_raise(store: Store, ticket_id: str) -> None:
    """Insert a ticket inside a block that then raises: the insert must be undone."""
    with store.atomic():
        store.insert(TICKET_KIND, ticket_id, {"title": "undone"}, event="file", audit=Audit(1.0))
        raise RuntimeError("the block fails")


def test_change_feed_holds_exactly_the_committed_changes(tmp_path: Path) -> None:
    """Beyond the contract: a nested block that raises drops only its own feed lines, an outer
    block that raises drops everything, and commit order is feed order."""
    example = load_example("custom_store")
    path = tmp_path / "feed.jsonl"
    store = example.ChangeFeedStore(path)
    store.register(TICKET_KIND)
    audit = Audit(at=1.0)
    try:
        with store.atomic():
            store.insert(TICKET_KIND, "t1", {"title": "kept"}, event="file", audit=audit)
            with pytest.raises(RuntimeError):
                insert_then_raise(store, "t2")
            store.transition(TICKET_KIND, "t1", "hold", audit=audit)
        with pytest.raises(RuntimeError):
            insert_then_raise(store, "t3")
        store.insert(TICKET_KIND, "t1", {"title": "kept"}, event="file", audit=audit)  # no-op
    finally:
        store.close()
    feed = example.ChangeFeedStore.read_feed(path)
    assert [(c["id"], c["event"], c["state"], c["fence"]) for c in feed] == [
        ("t1", "file", "open", 0),
        ("t1", "hold", "held", 1),
    ]


# -- library bugs found while writing the examples ------------------------------------------------
#
# Each test below is the scenario of an example with one twist the examples avoid (the connector
# is unreachable for a moment): regressions of bugs found while writing the examples.

BUG_WAIT_S = 3.0
SECRET = "bug-secret"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def eventually(predicate: Callable[[], bool], timeout: float = BUG_WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def quick_transport(url: str) -> WebSocketRelayTransport:
    return WebSocketRelayTransport(
        url,
        "loopback",
        "bot",
        gateway_id="gw",
        secret=SECRET,
        reconnect_backoff_s=0.05,
        reconnect_max_s=0.1,
    )


@pytest.mark.asyncio
async def test_crash_recovery_when_the_connector_comes_up_after_the_bot(tmp_path: Path) -> None:
    db = tmp_path / "bot.db"
    # A reply owed by a process that is dead now: recorded, marked attempting, then it exited.
    record = (
        "from statecore import Ledger; from stores import SQLiteStore; "
        f"ledger = Ledger(SQLiteStore({str(db)!r})); "
        "ob = ledger.record(session_key='k', platform='loopback', chat_id='c1', "
        "content='owed', message_ref='m1'); ledger.mark_attempting(ob.obligation_id)"
    )
    subprocess.run([sys.executable, "-c", record], check=True, timeout=TIMEOUT_S)
    port = free_port()
    store = SQLiteStore(db)
    transport = quick_transport(f"ws://127.0.0.1:{port}")
    adapter = RelayAdapter(transport)
    gateway = Gateway(store, retry_interval_s=0.1)
    gateway.add_adapter("loopback", adapter)
    platform = LoopbackPlatform()
    connector = Connector(
        # The owed reply was recorded by hand, not in answer to an inbound message: egress is
        # opened explicitly (provenance would rightly decline a chat that never wrote).
        InMemoryStore(),
        secrets={"gw": [SECRET]},
        drivers={"loopback": platform},
        open_egress=True,
    )
    try:
        assert await gateway.start() == 0  # the connector is down: nothing can be claimed yet
        await connector.start("127.0.0.1", port)
        assert await eventually(lambda: transport.state.value == "connected")
        assert await eventually(lambda: bool(platform.texts("c1"))), (
            f"owed reply not redelivered; adapter.connected={adapter.connected}"
        )
    finally:
        await gateway.stop(budget_s=2.0)
        await connector.stop()
        store.close()


@pytest.mark.asyncio
async def test_reply_sent_during_a_connector_blip_is_delivered_after_reconnect() -> None:
    platform = LoopbackPlatform()
    first = Connector(
        # The owed reply was recorded by hand, not in answer to an inbound message: egress is
        # opened explicitly (provenance would rightly decline a chat that never wrote).
        InMemoryStore(),
        secrets={"gw": [SECRET]},
        drivers={"loopback": platform},
        open_egress=True,
    )
    await first.start("127.0.0.1", 0)
    port = int(first.url.rsplit(":", 1)[1])
    second = Connector(
        # The owed reply was recorded by hand, not in answer to an inbound message: egress is
        # opened explicitly (provenance would rightly decline a chat that never wrote).
        InMemoryStore(),
        secrets={"gw": [SECRET]},
        drivers={"loopback": platform},
        open_egress=True,
    )
    transport = quick_transport(first.url)
    clock = FakeClock()  # the gateway's: its retry timer runs when the test moves time
    gateway = Gateway(
        InMemoryStore(),
        policy=LedgerPolicy(retry_backoff=(0.05, 0.05)),
        retry_interval_s=0.1,
        clock=clock,
    )
    gateway.add_adapter("loopback", RelayAdapter(transport))
    try:
        await gateway.start()
        await first.stop()  # the blip begins
        assert await eventually(lambda: transport.state.value != "connected")
        result = await gateway.send_final(
            session_key="k", platform="loopback", chat_id="c1", content="hi", message_ref="m1"
        )
        assert not result.success  # not sent: the reply is owed
        # Through the outage the adapter is down: five retry rounds spend no attempt on it.
        for _ in range(5):
            assert await eventually(lambda: clock.sleepers == 1)  # the retry timer waiting
            clock.advance(0.1)
            assert await eventually(lambda: clock.sleepers == 1)  # its round done
        owed = await gateway.ledger.owed()
        assert [(o.state.value, o.attempts, o.last_error) for o in owed] == [
            ("failed", 0, "send_path_degraded")
        ]
        await second.start("127.0.0.1", port)  # the blip ends
        assert await eventually(lambda: transport.state.value == "connected")
        # Runtime retries are labelled (the ledger cannot know what the platform saw).
        assert await eventually(lambda: platform.texts("c1") == [f"{RECONNECTED_MARKER}\n\nhi"]), (
            f"owed reply not delivered after reconnect: {platform.texts('c1')}"
        )
    finally:
        await gateway.stop(budget_s=2.0)
        await second.stop()

"""The throwaway homeserver (``relay.matrix.testing``): Synapse from its wheel, on loopback,
with users made by shared secret, a plain client's calls, idempotent sends across a restart,
bounded failures and a server that never outlives the process that started it."""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import nio  # type: ignore[import-untyped]
import psutil
import pytest

from relay.matrix.testing import (
    Homeserver,
    HomeserverUnavailable,
    MatrixAccount,
    MatrixRequestError,
    start_homeserver,
)

ROOT = Path(__file__).resolve().parents[3]
GONE_WITHIN_S = 15.0
NewAccount = Callable[..., MatrixAccount]
"""The ``new_account`` fixture: ``new_account(prefix="user", *, admin=False)``."""


def test_the_server_answers_versions_on_loopback_only(homeserver: Homeserver) -> None:
    """The client API answers at the server's URL, and every socket it listens on is bound to
    127.0.0.1."""
    assert homeserver.url == f"http://127.0.0.1:{homeserver.port}"
    assert homeserver.request("GET", "/_matrix/client/versions")["versions"]
    assert homeserver.pid is not None
    listening = [
        c.laddr
        for c in psutil.Process(homeserver.pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert listening
    assert {address.ip for address in listening} == {"127.0.0.1"}
    assert homeserver.port in {address.port for address in listening}


def test_registered_users_log_in(homeserver: Homeserver, new_account: NewAccount) -> None:
    """A registered user logs in again on a new device, a wrong password and a taken name are
    refused with their Matrix error, and only an admin reaches the admin API."""
    ann = new_account("ann")
    assert ann.user_id == f"@{ann.localpart}:localhost"
    again = homeserver.login(ann.localpart, ann.password)
    assert again.user_id == ann.user_id
    assert again.device_id != ann.device_id
    assert homeserver.login(ann.user_id, ann.password, device_id="KEPT").device_id == "KEPT"
    whoami = homeserver.request("GET", "/_matrix/client/v3/account/whoami", account=again)
    assert whoami["user_id"] == ann.user_id
    with pytest.raises(MatrixRequestError) as wrong:
        homeserver.login(ann.localpart, "not-the-password")
    assert (wrong.value.status, wrong.value.errcode) == (403, "M_FORBIDDEN")
    with pytest.raises(MatrixRequestError) as taken:
        homeserver.register(ann.localpart)
    assert taken.value.errcode == "M_USER_IN_USE"
    admin = new_account("admin", admin=True)
    path = f"/_synapse/admin/v2/users/{ann.user_id}"
    assert homeserver.request("GET", path, account=admin)["name"] == ann.user_id
    with pytest.raises(MatrixRequestError) as refused:
        homeserver.request("GET", path, account=ann)
    assert refused.value.status == 403


@pytest.mark.asyncio
async def test_a_person_writes_with_a_client_and_the_message_reads_back(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    """A person on a real client (matrix-nio) creates a room, invites the bot and writes; the
    bot joins and reads the message back from the server."""
    person, bot = new_account("person"), new_account("bot")
    client = nio.AsyncClient(homeserver.url, person.user_id)
    try:
        login = await client.login(person.password)
        assert isinstance(login, nio.LoginResponse), login
        created = await client.room_create(name="chat", invite=[bot.user_id])
        assert isinstance(created, nio.RoomCreateResponse), created
        content = {"msgtype": "m.text", "body": "hello, bot"}
        sent = await client.room_send(created.room_id, "m.room.message", content)
        assert isinstance(sent, nio.RoomSendResponse), sent
    finally:
        await client.close()
    homeserver.join(bot, created.room_id)
    messages = homeserver.messages(bot, created.room_id, event_type="m.room.message")
    assert [(m["event_id"], m["sender"], m["content"]) for m in messages] == [
        (sent.event_id, person.user_id, content)
    ]


def test_messages_follow_every_page_oldest_first(
    homeserver: Homeserver, new_account: NewAccount
) -> None:
    """Reading a room back in pages of two gives the whole timeline, oldest first; a user
    outside the room is refused."""
    ann, bob = new_account("ann"), new_account("bob")
    room = homeserver.create_room(ann, name="paged")
    homeserver.invite(ann, room, bob.user_id)
    homeserver.join(bob, room)
    sent = [homeserver.send_text(ann, room, f"line {n}") for n in range(5)]
    everything = homeserver.messages(bob, room)
    assert everything[0]["type"] == "m.room.create"
    paged = homeserver.messages(bob, room, page_size=2)
    assert [e["event_id"] for e in paged] == [e["event_id"] for e in everything]
    texts = homeserver.messages(bob, room, event_type="m.room.message", page_size=2)
    assert [m["event_id"] for m in texts] == sent
    assert [m["content"]["body"] for m in texts] == [f"line {n}" for n in range(5)]
    with pytest.raises(MatrixRequestError) as outside:
        homeserver.messages(new_account("eve"), room)
    assert outside.value.status == 403


def test_the_same_txn_id_is_one_event_also_across_a_restart() -> None:
    """The same transaction id sent twice by the same device is one event, also after the
    server restarts (database, users and port kept); stop removes the directory, is
    idempotent, and a stopped server cannot be restarted."""
    server = start_homeserver()
    try:
        ann = server.register("ann")
        room = server.create_room(ann, name="idempotent", is_direct=True)
        first = server.send_text(ann, room, "once", txn_id="txn-1")
        assert server.send_text(ann, room, "once", txn_id="txn-1") == first
        url, pid = server.url, server.pid
        server.restart()
        assert server.pid != pid
        # The same port, unless another process took it while the server was down.
        assert server.url == url or "Address already in use" in server.log_tail(200)
        assert server.send_text(ann, room, "once", txn_id="txn-1") == first
        other = server.send_text(ann, room, "once", txn_id="txn-2")
        bodies = [
            (m["event_id"], m["content"]["body"])
            for m in server.messages(ann, room, event_type="m.room.message")
        ]
        assert bodies == [(first, "once"), (other, "once")]
    finally:
        data_dir, pid = server.data_dir, server.pid
        server.stop()
    assert not data_dir.exists()
    assert pid is not None
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    server.stop()
    with pytest.raises(HomeserverUnavailable, match="stopped"):
        server.restart()


def test_a_rate_limited_server_says_how_long_to_wait() -> None:
    """With Synapse's default message limit kept, a burst of messages is refused with
    M_LIMIT_EXCEEDED and the wait to respect."""
    with start_homeserver(rate_limited=True) as server:
        ann = server.register("ann")
        room = server.create_room(ann)
        with pytest.raises(MatrixRequestError) as limited:  # noqa: PT012
            for n in range(30):
                server.send_text(ann, room, f"burst {n}")
        assert (limited.value.status, limited.value.errcode) == (429, "M_LIMIT_EXCEEDED")
        assert limited.value.retry_after_ms is not None
        assert limited.value.retry_after_ms > 0


def test_a_server_that_cannot_start_says_why_within_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A configuration Synapse refuses raises HomeserverUnavailable with the log's tail, well
    within the timeout; a server slower than its timeout is stopped; neither leaves a
    directory behind."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # their directories go here
    started = time.monotonic()
    with pytest.raises(HomeserverUnavailable) as refused:
        start_homeserver(timeout_s=30.0, config_overrides={"database": {"name": "nosuch"}})
    assert time.monotonic() - started < 30.0
    assert "exited at start" in str(refused.value)
    assert "Unsupported database type 'nosuch'" in str(refused.value)
    started = time.monotonic()
    with pytest.raises(HomeserverUnavailable, match=r"did not answer within 0\.2 s"):
        start_homeserver(timeout_s=0.2)
    assert time.monotonic() - started < 0.2 + 15.0  # the wait, then a bounded stop
    assert list(tmp_path.iterdir()) == []


CHILD = textwrap.dedent(
    """
    import time
    from relay.matrix.testing import start_homeserver

    server = start_homeserver()
    print(server.pid, server.url, server.data_dir, flush=True)
    time.sleep(120)
    """
)


def _first_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            raise AssertionError(f"the child printed nothing within {timeout_s:g} s")
    return process.stdout.readline()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_the_server_dies_with_the_process_that_started_it(sig: signal.Signals) -> None:
    """A process that started a homeserver is killed without stopping it: the server ends
    within a bound, and the next start removes the directory it left."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    data_dir: Path | None = None
    try:
        line = _first_line(child, 90.0)
        assert line, child.communicate(timeout=10)[1][-2000:]
        pid_text, url, directory = line.split()
        pid, data_dir = int(pid_text), Path(directory)
        assert url.startswith("http://127.0.0.1:")
        assert not _gone(pid)
        child.send_signal(sig)
        child.wait(10)
        deadline = time.monotonic() + GONE_WITHIN_S
        while not _gone(pid):
            assert time.monotonic() < deadline, (
                f"the server outlived its parent by {GONE_WITHIN_S} s"
            )
            time.sleep(0.05)
        assert data_dir.exists()  # nobody stopped it: the directory stays until the next start
        with start_homeserver():
            assert not data_dir.exists()
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=10)
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)

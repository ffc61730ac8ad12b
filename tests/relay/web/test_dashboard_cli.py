"""``statecore dashboard`` as an operator runs it: the real console script in a real process on
loopback, printing its URL, serving the page and its WebSocket, stopping with exit 0 on SIGINT
or SIGTERM; refusing a store URL it cannot open with exit 2, naming it without its password."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
from websockets.sync.client import connect

from relay.wire.auth import verify_token
from statecore import Ledger
from stores import SQLiteStore
from tests.cli_run import clean_env, console_script, line_with

BOUND_S = 30.0
ROOT = Path(__file__).resolve().parents[3]
SECRET = "cli-test-secret"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_dashboard_serves_a_store_and_stops_on_a_signal(
    tmp_path: Path, processes: list[subprocess.Popen[str]], signum: signal.Signals
) -> None:
    db = tmp_path / "bot.db"
    store = SQLiteStore(db)
    owed = Ledger(store).record(session_key="k", platform="web", chat_id="c", content="hi")
    store.close()
    proc = subprocess.Popen(
        [console_script(), "dashboard", "--store", f"sqlite:///{db}", "--port", "0"],
        cwd=ROOT,
        env=clean_env(STATECORE_DASHBOARD_SECRETS=f"alice={SECRET}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    processes.append(proc)
    line = line_with(proc, "statecore dashboard on ")
    url = line.removeprefix("statecore dashboard on ")
    assert url.startswith("http://127.0.0.1:")
    assert url.endswith("/dashboard/")
    with urllib.request.urlopen(url, timeout=10) as response:
        page = response.read().decode()
        assert response.headers["Content-Type"].startswith("text/html")
        assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    assert '<script src="dashboard.js"' in page
    for name in ("dashboard.js", "dashboard.css"):
        with urllib.request.urlopen(url + name, timeout=10) as response:
            assert response.status == 200
    with connect(url.replace("http", "ws") + "ws", open_timeout=BOUND_S) as ws:
        hello = json.loads(ws.recv(timeout=BOUND_S))
    assert hello["type"] == "hello"
    assert hello["store"] == f"sqlite:///{db}"  # the URL as given: it holds no password
    assert hello["writable"] is True
    assert hello["obligations"][0]["id"] == owed.obligation_id
    assert SECRET not in json.dumps(hello)
    proc.send_signal(signum)
    assert proc.wait(timeout=BOUND_S) == 0
    assert proc.stdout is not None
    assert proc.stderr is not None
    output = proc.stdout.read() + proc.stderr.read()
    assert SECRET not in output


@pytest.mark.parametrize(
    ("url", "named", "hidden"),
    [
        ("nosuch://somewhere/x", "nosuch://somewhere/x", None),
        ("sqlite:///{tmp}/missing.db", "missing.db", None),
        ("memory://ops:hunter2@host/x", "memory://host/x", "hunter2"),
        ("not a url", "not a store URL", None),
    ],
    ids=["unknown-scheme", "missing-file", "password", "not-a-url"],
)
def test_a_store_it_cannot_open_is_refused_naming_it(
    tmp_path: Path, url: str, named: str, hidden: str | None
) -> None:
    done = subprocess.run(
        [console_script(), "dashboard", "--store", url.format(tmp=tmp_path), "--port", "0"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "statecore dashboard: " in done.stderr
    assert named in done.stderr
    assert done.stdout == ""
    if hidden is not None:
        assert hidden not in done.stderr
    assert not (tmp_path / "missing.db").exists()


def test_malformed_secrets_and_ports_are_refused(tmp_path: Path) -> None:
    cases = [
        (
            ["--store", "memory://"],
            {"STATECORE_DASHBOARD_SECRETS": "alice"},
            "STATECORE_DASHBOARD_SECRETS",
        ),
        (["--store", "memory://", "--port", "http"], {}, "--port"),
        ([], {}, "no store given"),
    ]
    for args, extra, named in cases:
        done = subprocess.run(
            [console_script(), "dashboard", *args],
            cwd=ROOT,
            env=clean_env(**extra),
            capture_output=True,
            text=True,
            timeout=BOUND_S,
            check=False,
        )
        assert done.returncode == 2, (args, done.stderr)
        assert named in done.stderr


def test_mint_token_prints_a_token_for_an_operator_with_a_secret() -> None:
    done = subprocess.run(
        [console_script(), "dashboard", "--mint-token", "alice"],
        cwd=ROOT,
        env=clean_env(STATECORE_DASHBOARD_SECRETS=f"bob=x;alice={SECRET},old"),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        check=True,
    )
    assert verify_token(done.stdout.strip(), {"alice": [SECRET]}) == "alice"
    refused = subprocess.run(
        [console_script(), "dashboard", "--mint-token", "carol"],
        cwd=ROOT,
        env=clean_env(STATECORE_DASHBOARD_SECRETS=f"alice={SECRET}"),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        check=False,
    )
    assert refused.returncode == 2
    assert SECRET not in refused.stderr


def test_the_url_is_printed_once_and_websockets_chatter_stays_out(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """Serving a page and a WebSocket, then stopping, the command's whole output (standard
    output and error) names its URL on one line only, and holds no line of the ``websockets``
    library's own INFO logging (listening, connection open or closed)."""
    db = tmp_path / "bot.db"
    SQLiteStore(db).close()
    proc = subprocess.Popen(
        [console_script(), "dashboard", "--store", f"sqlite:///{db}", "--port", "0"],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    processes.append(proc)
    first = line_with(proc, "statecore dashboard on ")
    url = first.removeprefix("statecore dashboard on ")
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
    with connect(url.replace("http", "ws") + "ws", open_timeout=BOUND_S) as ws:
        assert json.loads(ws.recv(timeout=BOUND_S))["type"] == "hello"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=BOUND_S) == 0
    assert proc.stdout is not None
    assert proc.stderr is not None
    lines = [first, *proc.stdout.read().splitlines(), *proc.stderr.read().splitlines()]
    host_port = url.removeprefix("http://").split("/")[0]
    assert [line for line in lines if host_port in line] == [first]
    chatter = [line for line in lines if " websockets" in line or "connection open" in line]
    assert chatter == []
    assert any("dashboard stopping" in line for line in lines)  # its own INFO lines remain

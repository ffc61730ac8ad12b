"""``statecore connector`` and ``statecore gateway`` as an operator runs them: the real console
script in real processes on loopback, configured from a file and the environment, probed over
HTTP, stopped with SIGTERM; and refused, with exit code 2 and the setting named, when their
configuration cannot work."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.cli_run import clean_env, console_script, line_with

BOUND_S = 30.0
ROOT = Path(__file__).resolve().parents[2]


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def _health(url: str) -> dict[str, Any]:
    status, kind, body = _get(url)
    assert (status, kind) == (200, "application/json"), body
    answer: dict[str, Any] = json.loads(body)
    return answer


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=BOUND_S)


def _spawn(
    started: list[subprocess.Popen[str]], args: list[str], env: dict[str, str]
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [console_script(), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started.append(proc)
    return proc


def test_a_connector_and_a_gateway_run_are_probed_and_stop_on_sigterm(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """The connector serves from a TOML file (port 0, SQLite store), answers /healthz and
    /metrics; the gateway connects from the environment and shows up there; each stops
    gracefully (exit 0) on SIGTERM, the gateway leaving nothing attempting in its ledger."""
    config = tmp_path / "connector.toml"
    config.write_text(
        'host = "127.0.0.1"\nport = 0\n'
        f'store = "sqlite:///{tmp_path / "connector.db"}"\n'
        '[secrets]\nrunner-bot = ["s3cret"]\n[drivers]\nloopback = "loopback"\n'
    )
    connector = _spawn(processes, ["connector", "--config", str(config)], clean_env())
    url = line_with(connector, "listening on").rsplit(" ", 1)[-1]
    http = "http://" + url.split("://", 1)[1].split("/", 1)[0]
    assert _health(f"{http}/healthz")["gateways"] == 0
    status, kind, body = _get(f"{http}/metrics")
    assert status == 200, body
    assert kind.startswith("text/plain")

    bot_db = tmp_path / "bot.db"
    gateway = _spawn(
        processes,
        ["gateway", "tests.relay.runner_bot:echo", "--http-port", "0"],
        clean_env(
            STATECORE_CONNECTOR_URL=url,
            STATECORE_STORE_URL=f"sqlite:///{bot_db}",
            STATECORE_GATEWAY_ID="runner-bot",
            STATECORE_SECRET="s3cret",
            STATECORE_STOP_BUDGET_S="5",
        ),
    )
    gateway_health = line_with(gateway, "health on").rsplit(" ", 1)[-1]
    line_with(gateway, "gateway running")
    deadline = time.monotonic() + BOUND_S
    while _health(f"{http}/healthz")["gateways"] != 1:
        assert time.monotonic() < deadline, "the gateway never showed up at the connector"
        time.sleep(0.05)
    assert _health(gateway_health) == {"status": "ok", "connected": ["loopback/default"]}
    assert _get(gateway_health.replace("/healthz", "/metrics"))[0] == 200

    began = time.monotonic()
    assert _stop(gateway) == 0
    assert time.monotonic() - began < 5 + 3
    stats = subprocess.run(
        [console_script(), "ledger", "stats", "--json", "--store", f"sqlite:///{bot_db}"],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        env=clean_env(),
        check=True,
    )
    assert json.loads(stats.stdout)["states"]["attempting"] == 0
    assert _stop(connector) == 0


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["connector", "--port", "0"], {}, "secrets"),
        (
            ["connector", "--port", "0"],
            {
                "STATECORE_CONNECTOR_SECRETS": "bot=s",
                "STATECORE_CONNECTOR_DRIVERS": "loopback=telegram",
            },
            "drivers.loopback",
        ),
        (["connector", "--config", "/nonexistent/connector.toml"], {}, "connector.toml"),
        (
            ["connector", "--port", "0"],
            {"STATECORE_CONNECTOR_SECRETS": "bot=s", "STATECORE_CONNECTOR_DRIVERS": "tg=telegram"},
            "STATECORE_TELEGRAM_TOKEN",
        ),
        (
            ["connector", "--port", "0"],
            {"STATECORE_CONNECTOR_SECRETS": "bot=s", "STATECORE_CONNECTOR_DRIVERS": "sl=slack"},
            "STATECORE_SLACK_BOT_TOKEN",
        ),
        (
            ["connector", "--port", "0"],
            {"STATECORE_CONNECTOR_SECRETS": "bot=s", "STATECORE_CONNECTOR_DRIVERS": "dc=discord"},
            "STATECORE_DISCORD_TOKEN",
        ),
        (
            ["connector", "--port", "0", "--store", "mysql://nowhere/db"],
            {
                "STATECORE_CONNECTOR_SECRETS": "bot=s",
                "STATECORE_CONNECTOR_DRIVERS": "loopback=loopback",
            },
            "scheme 'mysql'",
        ),
        (
            ["connector", "--port", "0"],
            {
                "STATECORE_CONNECTOR_SECRETS": "bot=s",
                "STATECORE_CONNECTOR_DRIVERS": "loopback=loopback",
                "STATECORE_CONNECTOR_CLUSTER": "1",
            },
            "cluster: the nodes of a cluster share a PostgreSQL store",
        ),
        (["gateway", "tests.relay.runner_bot:echo"], {}, "STATECORE_CONNECTOR_URL"),
        (
            ["gateway", "tests.relay.no_such_module:echo"],
            {"STATECORE_CONNECTOR_URL": "ws://127.0.0.1:9/relay"},
            "tests.relay.no_such_module:echo",
        ),
        (
            ["gateway", "tests.relay.runner_bot:not_async"],
            {"STATECORE_CONNECTOR_URL": "ws://127.0.0.1:9/relay"},
            "must be an async function",
        ),
    ],
    ids=[
        "no-secrets",
        "unknown-driver",
        "missing-config",
        "telegram-no-token",
        "slack-no-token",
        "discord-no-token",
        "unknown-store",
        "cluster-on-sqlite",
        "no-connector",
        "no-handler",
        "sync-handler",
    ],
)
def test_a_configuration_that_cannot_work_is_refused(
    tmp_path: Path, args: list[str], env: dict[str, str], named: str
) -> None:
    """Exit code 2, the setting named on standard error, nothing served or written."""
    done = subprocess.run(
        [console_script(), *args],
        cwd=tmp_path,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        check=False,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert named in done.stderr
    assert "listening" not in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_the_console_script_is_the_one_this_interpreter_runs() -> None:
    """The processes above run this checkout's code (not another installed copy)."""
    assert Path(console_script()).parent == Path(sys.executable).parent

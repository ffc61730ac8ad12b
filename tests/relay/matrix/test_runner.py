"""``statecore connector`` with the Matrix driver: configured from the environment, it serves a
person on a real homeserver with ``statecore gateway``; a configuration that cannot work, and
credentials the homeserver refuses, are exit code 2 with the setting named."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from relay.matrix.testing import Homeserver, MatrixAccount
from tests.cli_run import clean_env, console_script, line_with

BOUND_S = 30.0
ROOT = Path(__file__).resolve().parents[3]
NewAccount = Callable[..., MatrixAccount]


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=BOUND_S)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


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


def _matrix_env(tmp_path: Path, account: MatrixAccount, password: str) -> dict[str, str]:
    return clean_env(
        STATECORE_CONNECTOR_PORT="0",
        STATECORE_STORE_URL=f"sqlite:///{tmp_path / 'connector.db'}",
        STATECORE_CONNECTOR_SECRETS="matrix-bot=s3cret",
        STATECORE_CONNECTOR_DRIVERS="matrix=matrix",
        STATECORE_MATRIX_HOMESERVER=account.homeserver,
        STATECORE_MATRIX_USER_ID=account.user_id,
        STATECORE_MATRIX_PASSWORD=password,
    )


def test_a_person_on_the_homeserver_is_answered_through_the_runners(
    tmp_path: Path,
    homeserver: Homeserver,
    new_account: NewAccount,
    processes: list[subprocess.Popen[str]],
) -> None:
    bot, ann = new_account("bot"), new_account("ann")
    connector = _spawn(processes, ["connector"], _matrix_env(tmp_path, bot, bot.password))
    url = line_with(connector, "listening on").rsplit(" ", 1)[-1]
    gateway = _spawn(
        processes,
        ["gateway", "tests.relay.runner_bot:echo", "--http-port", "0"],
        clean_env(
            STATECORE_CONNECTOR_URL=url,
            STATECORE_STORE_URL=f"sqlite:///{tmp_path / 'bot.db'}",
            STATECORE_GATEWAY_ID="matrix-bot",
            STATECORE_SECRET="s3cret",
            STATECORE_PLATFORM="matrix",
        ),
    )
    line_with(gateway, "gateway running")
    room = homeserver.create_room(ann, invite=[bot.user_id], is_direct=True)
    deadline = time.monotonic() + BOUND_S
    answers: list[str] = []
    sent = False
    while time.monotonic() < deadline and not answers:
        members = homeserver.messages(ann, room, event_type="m.room.member")
        if not sent and any(
            e.get("state_key") == bot.user_id and e["content"].get("membership") == "join"
            for e in members
        ):
            homeserver.send_text(ann, room, "through the runners")
            sent = True
        answers = [
            e["content"]["body"]
            for e in homeserver.messages(ann, room, event_type="m.room.message")
            if e["sender"] == bot.user_id
        ]
        time.sleep(0.1)
    assert answers == ["echo: through the runners"]
    for proc in (gateway, connector):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=BOUND_S) == 0


def test_credentials_the_homeserver_refuses_are_exit_code_2_naming_the_driver(
    tmp_path: Path, new_account: NewAccount, processes: list[subprocess.Popen[str]]
) -> None:
    bot = new_account("bot")
    connector = _spawn(processes, ["connector"], _matrix_env(tmp_path, bot, "not the password"))
    assert connector.wait(timeout=BOUND_S + 30) == 2
    assert connector.stdout is not None
    assert connector.stderr is not None
    err = connector.stderr.read()
    assert "drivers.matrix: could not start" in err
    assert "refused to log in" in err
    assert "not the password" not in err
    assert "listening" not in connector.stdout.read()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({}, "matrix.homeserver"),
        ({"STATECORE_MATRIX_HOMESERVER": "http://127.0.0.1:1"}, "matrix.user_id"),
        (
            {
                "STATECORE_MATRIX_HOMESERVER": "http://127.0.0.1:1",
                "STATECORE_MATRIX_USER_ID": "@b:l",
            },
            "password or an access_token",
        ),
        (
            {
                "STATECORE_MATRIX_HOMESERVER": "matrix.example.org",
                "STATECORE_MATRIX_USER_ID": "@b:l",
                "STATECORE_MATRIX_PASSWORD": "pw",
            },
            "http(s)://",
        ),
    ],
    ids=["no-homeserver", "no-user", "no-credentials", "not-a-url"],
)
def test_a_matrix_configuration_that_cannot_work_is_refused(
    tmp_path: Path, env: dict[str, str], named: str
) -> None:
    done = subprocess.run(
        [console_script(), "connector", "--port", "0"],
        cwd=tmp_path,
        env=clean_env(
            STATECORE_CONNECTOR_SECRETS="bot=s",
            STATECORE_CONNECTOR_DRIVERS="matrix=matrix",
            **env,
        ),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        check=False,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert named in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_matrix_setting_in_the_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "connector.toml"
    config.write_text(
        '[secrets]\nbot = ["s"]\n[drivers]\nmatrix = "matrix"\n[matrix]\ncolour = "blue"\n'
    )
    done = subprocess.run(
        [console_script(), "connector", "--config", str(config), "--port", "0"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        check=False,
    )
    assert done.returncode == 2
    assert "matrix.colour: unknown setting" in done.stderr

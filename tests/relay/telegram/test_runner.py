"""The Telegram driver from the environment, as ``statecore connector`` builds it
(``[drivers] telegram = "relay.telegram:driver_from_env"``), and the example bot run once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from relay.connector.runner import make_driver
from relay.telegram import TelegramDriver, driver_from_env

ROOT = Path(__file__).resolve().parents[3]


def test_the_runner_builds_the_driver_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STATECORE_TELEGRAM_TOKEN", "123:secret-part")
    monkeypatch.setenv("STATECORE_TELEGRAM_API_URL", "http://127.0.0.1:9/bot")
    driver = make_driver("tg", "relay.telegram:driver_from_env")
    assert isinstance(driver, TelegramDriver)
    assert (driver.platform, driver.mode, driver.bot_id) == ("tg", "polling", 123)
    assert driver.descriptor().platform == "tg"


def test_settings_that_cannot_work_name_the_variable_never_the_token() -> None:
    with pytest.raises(ValueError, match="STATECORE_TELEGRAM_TOKEN"):
        driver_from_env("telegram", {})
    env = {"STATECORE_TELEGRAM_TOKEN": "123:secret-part", "STATECORE_TELEGRAM_MODE": "webhook"}
    with pytest.raises(ValueError, match="webhook_url") as refused:
        driver_from_env("telegram", env)
    assert "secret-part" not in str(refused.value)
    env["STATECORE_TELEGRAM_WEBHOOK_URL"] = "https://bot.example.org/telegram"
    env["STATECORE_TELEGRAM_WEBHOOK_PORT"] = "80a"
    with pytest.raises(ValueError, match="WEBHOOK_PORT"):
        driver_from_env("telegram", env)
    env["STATECORE_TELEGRAM_WEBHOOK_PORT"] = "8443"
    assert driver_from_env("telegram", env).mode == "webhook"


def test_the_example_answers_on_the_fake_server(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "examples/telegram_bot.py", "--data", str(tmp_path), "--say", "hi", "#t"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[private] #2 bot (reply to #1): You said: hi" in done.stdout
    assert "[forum, topic 7] #2 bot (reply to #1): You said: t" in done.stdout

"""The page tests' browser: a real headless Chromium driven by Selenium (Debian's ``chromium``
and ``chromium-driver``; ``.ci/run`` installs them when missing).

Never skipped: when no browser can be started, every test that uses one FAILS, saying why.
Screenshots go to ``$STATECORE_TEST_ARTIFACTS`` (default ``test-artifacts/`` at the repository
root, ignored by git), one file per call of :func:`screenshot`.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS_ENV = "STATECORE_TEST_ARTIFACTS"
CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMEDRIVER = ("/usr/bin/chromedriver",)
PAGE_LOAD_S = 15.0


def _first(paths: tuple[str, ...], name: str) -> str | None:
    found = next((p for p in paths if os.path.exists(p)), None)
    return found or shutil.which(name)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless Chromium for the session (a fresh profile in a temporary directory)."""
    from selenium import webdriver  # noqa: PLC0415
    from selenium.common.exceptions import WebDriverException  # noqa: PLC0415
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    binary = _first(CHROMIUM, "chromium")
    driver_path = _first(CHROMEDRIVER, "chromedriver")
    if binary is None or driver_path is None:
        pytest.fail(
            "no Chromium for the page tests: install Debian's chromium and chromium-driver "
            "(bash .ci/run does)",
            pytrace=False,
        )
    profile = tempfile.mkdtemp(prefix="statecore-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--window-size=1280,900",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    except WebDriverException as exc:
        shutil.rmtree(profile, ignore_errors=True)
        pytest.fail(f"Chromium could not be started for the page tests: {exc.msg}", pytrace=False)
    driver.set_page_load_timeout(PAGE_LOAD_S)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def console_errors(driver: Any) -> list[str]:
    """The browser console's SEVERE entries since the last call (each read once)."""
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def screenshot(driver: Any, name: str) -> Path:
    """Save what the browser shows as ``<artifacts>/<name>.png``; return the path."""
    folder = Path(os.environ.get(ARTIFACTS_ENV) or ROOT / "test-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot saved at {path}"
    return path


def reset(driver: Any) -> None:
    """Close every tab but one, show a blank page there and drop what the console logged."""
    handles = driver.window_handles
    for handle in handles[1:]:
        driver.switch_to.window(handle)
        driver.close()
    driver.switch_to.window(handles[0])
    driver.get("about:blank")
    driver.get_log("browser")

"""The page tests' fixtures: a real headless Chromium (:mod:`tests.relay.web.browser`), reset
before each test that uses it: one blank tab, and nothing left in the console log."""

from collections.abc import Iterator
from typing import Any

import pytest

from tests.relay.web.browser import browser, reset

__all__ = ["browser"]


@pytest.fixture(autouse=True)
def _fresh_page(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test with the browser starts on one blank tab with an empty console log (a page a
    failed test left behind keeps reconnecting to its stopped server: its errors are not this
    test's), and leaves it blank again."""
    if "browser" not in request.fixturenames:
        yield
        return
    driver: Any = request.getfixturevalue("browser")
    reset(driver)
    yield
    reset(driver)

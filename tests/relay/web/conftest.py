"""The page tests' fixtures: a real headless Chromium (:mod:`tests.relay.web.browser`)."""

from tests.relay.web.browser import browser

__all__ = ["browser"]

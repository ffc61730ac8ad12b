"""The Telegram platform driver: a bot's connector speaks the Telegram Bot API
(:class:`TelegramDriver`; ``relay.telegram.testing`` is a fake Bot API server for tests and
examples)."""

from __future__ import annotations

from relay.telegram._api import TelegramAuthError, TelegramError, TelegramUnreachable
from relay.telegram._env import driver_from_env
from relay.telegram.driver import TelegramDriver

__all__ = [
    "TelegramAuthError",
    "TelegramDriver",
    "TelegramError",
    "TelegramUnreachable",
    "driver_from_env",
]

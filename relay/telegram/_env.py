"""The Telegram driver configured from the environment (for ``statecore connector``).

``[drivers] telegram = "relay.telegram:driver_from_env"`` makes the connector runner build the
driver with :func:`driver_from_env`, which reads:

* ``STATECORE_TELEGRAM_TOKEN`` (required): the bot's token from @BotFather;
* ``STATECORE_TELEGRAM_API_URL``: the Bot API's base (default ``https://api.telegram.org/bot``);
* ``STATECORE_TELEGRAM_MODE``: ``polling`` (default) or ``webhook``, then
  ``STATECORE_TELEGRAM_WEBHOOK_URL`` (required), ``..._WEBHOOK_SECRET``, ``..._WEBHOOK_HOST``,
  ``..._WEBHOOK_PORT`` and ``..._WEBHOOK_PATH``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

from relay.telegram._api import DEFAULT_API_URL
from relay.telegram.driver import TelegramDriver

__all__ = ["ENV_PREFIX", "driver_from_env"]

ENV_PREFIX: Final = "STATECORE_TELEGRAM_"


def driver_from_env(platform: str, environ: Mapping[str, str] | None = None) -> TelegramDriver:
    """A :class:`TelegramDriver` for ``platform`` from ``environ`` (default ``os.environ``).

    Raises ``ValueError`` naming the variable that is missing or cannot work (the token is
    never quoted).
    """
    env = os.environ if environ is None else environ

    def get(name: str) -> str | None:
        value = env.get(ENV_PREFIX + name, "").strip()
        return value or None

    token = get("TOKEN")
    if token is None:
        raise ValueError(f"the telegram driver needs the bot's token in {ENV_PREFIX}TOKEN")
    options: dict[str, Any] = {"platform": platform, "api_url": get("API_URL") or DEFAULT_API_URL}
    mode = get("MODE") or "polling"
    options["mode"] = mode
    if mode == "webhook":
        options["webhook_url"] = get("WEBHOOK_URL")
        for name in ("WEBHOOK_SECRET", "WEBHOOK_HOST", "WEBHOOK_PATH"):
            value = get(name)
            if value is not None:
                options[name.lower()] = value
        port = get("WEBHOOK_PORT")
        if port is not None:
            if not port.isdigit():
                raise ValueError(f"{ENV_PREFIX}WEBHOOK_PORT must be a port number")
            options["webhook_port"] = int(port)
    try:
        return TelegramDriver(token, **options)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"telegram ({ENV_PREFIX}*): {exc}") from None

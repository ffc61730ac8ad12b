"""The Discord platform driver: a bot's connector speaks Discord's gateway and REST API
(:class:`DiscordDriver`; ``relay.discord.testing`` is a fake Discord for tests and examples)."""

from __future__ import annotations

from relay.discord._api import DiscordAuthError, DiscordError, DiscordUnreachable
from relay.discord.driver import DiscordDriver

__all__ = ["DiscordAuthError", "DiscordDriver", "DiscordError", "DiscordUnreachable"]

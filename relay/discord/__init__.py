"""The Discord platform driver: a bot's connector speaks Discord's gateway and REST API
(``relay.discord.testing`` is a fake Discord for tests and examples)."""

from __future__ import annotations

__all__: list[str] = []

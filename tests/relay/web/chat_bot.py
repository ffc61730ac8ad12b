"""The bot ``statecore gateway`` runs in the web chat's browser tests (imported by path; no
tests)."""

from __future__ import annotations

from statecore.gateway import Turn


async def answer(turn: Turn) -> None:
    """Answer every message with its own text."""
    await turn.reply(f"echo: {turn.message.text}")

"""The handlers ``statecore gateway`` runs in the runner tests (imported by path; no tests)."""

from __future__ import annotations

from statecore.gateway import Turn


async def echo(turn: Turn) -> None:
    """Answer every message with its own text."""
    await turn.reply(f"echo: {turn.message.text}")


def not_async(turn: Turn) -> None:
    """A handler that is not a coroutine function: the runner must refuse it."""
    del turn

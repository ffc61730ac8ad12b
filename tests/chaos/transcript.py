"""What the platform saw during a chaos run: every user message and every bot message, in order.

The harness's platform appends to one :class:`Transcript`; the history checker
(``tests/chaos/checker.py``) reads it beside the store's audit.  Nothing in it comes from the
gateways' or connectors' own counters: the platform writes it when a message crosses its API.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs

__all__ = ["BotMessage", "Transcript", "UserMessage"]


@attrs.frozen
class UserMessage:
    """A message a simulated person wrote, as the platform accepted it."""

    chat_id: str
    tenant: str
    """The tenant the platform places the chat in (a workspace, a guild, a server)."""
    message_id: str
    """The platform's own id of the message (unique per chat)."""
    text: str
    at: float
    """Wall-clock time (the harness's own, unshifted clock) the platform accepted it."""


@attrs.frozen
class BotMessage:
    """A message the bot posted, as the platform performed it."""

    chat_id: str
    tenant: str
    """The tenant of the chat it was posted in, as the platform knows it."""
    text: str
    """The body exactly as posted (a redelivery banner included)."""
    at: float
    node: str = ""
    """Which connector node performed the send, when the platform can tell."""


_KINDS: dict[str, type[UserMessage] | type[BotMessage]] = {"user": UserMessage, "bot": BotMessage}


@attrs.define
class Transcript:
    """The platform's record, in the order the platform saw things."""

    entries: list[UserMessage | BotMessage] = attrs.field(factory=list)

    def add(self, entry: UserMessage | BotMessage) -> None:
        """Append one entry (the platform calls this as a message crosses its API)."""
        self.entries.append(entry)

    def users(self) -> Iterator[UserMessage]:
        """The user messages, in order."""
        return (e for e in self.entries if isinstance(e, UserMessage))

    def bots(self) -> Iterator[BotMessage]:
        """The bot messages, in order."""
        return (e for e in self.entries if isinstance(e, BotMessage))

    def dump(self, path: Path) -> None:
        """Write the transcript as JSON lines (one object per entry, with its ``kind``)."""
        with path.open("w", encoding="utf-8") as out:
            for entry in self.entries:
                kind = "user" if isinstance(entry, UserMessage) else "bot"
                out.write(json.dumps({"kind": kind, **attrs.asdict(entry)}) + "\n")

    @classmethod
    def load(cls, path: Path) -> Transcript:
        """Read a transcript :meth:`dump` wrote; a malformed line raises ``ValueError``."""
        return cls(list(_parse(path.read_text(encoding="utf-8").splitlines())))


def _parse(lines: Iterable[str]) -> Iterator[UserMessage | BotMessage]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            kind = _KINDS[data.pop("kind")]
            yield kind(**data)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"transcript line {number} is malformed: {exc}") from exc

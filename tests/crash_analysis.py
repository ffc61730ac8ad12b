"""What a crash test's users saw, checked: the loopback platform noting when each reply first
appeared, the messages injected, and the analysis of every chat against them (answered, lost,
duplicated with or without the redelivery banner, in the wrong chat).  Shared by the crash tests
of one gateway (tests/relay) and of a gateway fleet (tests/statecore/gateway)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import attrs

from relay import LoopbackPlatform
from relay.connector.platform import target_chat
from relay.wire.frames import OutboundOutcome
from statecore import RECONNECTED_MARKER, RECOVERED_MARKER

BANNERS = (f"{RECOVERED_MARKER}\n\n", f"{RECONNECTED_MARKER}\n\n")
"""The banners a redelivery that may repeat a message starts with."""


class TimedPlatform(LoopbackPlatform):
    """The loopback chat, noting when each reply body first appeared in each chat."""

    def __init__(self) -> None:
        super().__init__()
        self.first_seen: dict[tuple[str, str], float] = {}
        """(chat id, reply body without banner) -> monotonic time of its first performance."""
        self.performed = 0
        """Successful sends performed so far."""

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        """Perform like the loopback platform; note the time of every successful send."""
        outcome = await super().perform(action)
        content = action.get("content")
        chat_id = target_chat(action)
        if outcome.success and action.get("op") == "send" and isinstance(content, str) and chat_id:
            self.performed += 1
            self.first_seen.setdefault((chat_id, split_banner(content)[1]), time.monotonic())
        return outcome


@attrs.frozen
class Injected:
    """One user message the load generator injected."""

    text: str
    chat_id: str
    message_id: str
    at: float
    """Monotonic time just before the injection."""


def split_banner(text: str) -> tuple[bool, str]:
    """(labelled, body): whether ``text`` starts with a redelivery banner and a blank line, and
    the reply body after it."""
    for banner in BANNERS:
        if text.startswith(banner):
            return True, text[len(banner) :]
    return False, text


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``values`` (NaN when empty)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@attrs.frozen
class Analysis:
    """The chats checked against what was injected."""

    messages: int
    replies: int
    without_reply: tuple[str, ...]
    """Texts of the messages with no ``echo: <text>`` in their chat."""
    unlabelled_duplicates: int
    """Copies of an answer, after the first, that carry no banner."""
    labelled: int
    """Answers (first copies included) that carry a banner."""
    wrong_chat: int
    stray: int
    """Replies whose body answers no injected message."""
    latencies: tuple[float, ...]
    """Seconds from injection to the first answer, for every answered message."""


def analyse(
    injected: list[Injected],
    platform: LoopbackPlatform,
    first_seen: Mapping[tuple[str, str], float],
) -> Analysis:
    """Check every bot message of every chat of ``platform`` against ``injected``."""
    by_body = {f"echo: {m.text}": m for m in injected}
    copies: dict[str, list[bool]] = {}  # message text -> labelled flag of each copy, in order
    replies = wrong_chat = stray = 0
    for chat_id in list(platform.transcript):
        for text in platform.texts(chat_id):
            replies += 1
            labelled, body = split_banner(text)
            message = by_body.get(body)
            if message is None:
                stray += 1
            elif message.chat_id != chat_id:
                wrong_chat += 1
            else:
                copies.setdefault(message.text, []).append(labelled)
    latencies = []
    for m in injected:
        seen = first_seen.get((m.chat_id, f"echo: {m.text}"))
        if seen is not None and m.text in copies:
            latencies.append(seen - m.at)
    return Analysis(
        messages=len(injected),
        replies=replies,
        without_reply=tuple(m.text for m in injected if m.text not in copies),
        unlabelled_duplicates=sum(not f for flags in copies.values() for f in flags[1:]),
        labelled=sum(f for flags in copies.values() for f in flags),
        wrong_chat=wrong_chat,
        stray=stray,
        latencies=tuple(latencies),
    )

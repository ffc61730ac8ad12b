"""Replies longer than the platform takes: split into parts in order, or truncated with a mark.

A platform refuses a message over its limit, and no retry changes that.  When an adapter
announces its limit (:class:`~statecore.gateway.adapter.MessageLimit`, through
``AdapterAbilities.limits_length``), the gateway fits every reply to it before recording it:

* :attr:`LongReplies.SPLIT` (the default): the reply becomes parts, each within the limit, cut
  at a paragraph break, else a line break, else a space, else mid-word; each part is recorded as
  an obligation of its own and sent in order;
* :attr:`LongReplies.TRUNCATE`: the reply is cut to fit and ends with :data:`TRUNCATION_MARK`,
  so the person sees that something is missing.

Every part keeps room for the longer of the redelivery labels, so that a part resent with its
label (``RECOVERED_MARKER`` / ``RECONNECTED_MARKER``) still fits -- unless the limit is so small
that the label alone would take half of it, where the parts use the whole limit instead.

Pure functions of text and limit; nothing here performs I/O.
"""

from __future__ import annotations

from enum import StrEnum

from statecore.gateway.adapter import MessageLimit
from statecore.obligation import RECONNECTED_MARKER, RECOVERED_MARKER

__all__ = ["TRUNCATION_MARK", "LongReplies", "fit_reply", "part_ref"]

TRUNCATION_MARK = "\n[\u2026 truncated]"
"""What a truncated reply ends with."""

_LABEL = max(RECOVERED_MARKER, RECONNECTED_MARKER, key=len) + "\n\n"
"""The longest text a redelivery puts before a reply (see ``Claim.render``)."""

_BREAKS = ("\n\n", "\n", " ")
"""Where a part may end, best first."""


class LongReplies(StrEnum):
    """What the gateway does with a reply longer than the platform's limit."""

    SPLIT = "split"
    """Send it as several messages, in order, each its own obligation."""
    TRUNCATE = "truncate"
    """Send one message, cut to fit, ending with :data:`TRUNCATION_MARK`."""


def fit_reply(text: str, limit: MessageLimit | None, mode: LongReplies) -> list[str]:
    """The message(s) to record for ``text`` under ``limit``: ``[text]`` when it fits or no
    limit is known, else its parts (:attr:`LongReplies.SPLIT`) or its truncation.  Each result
    is non-empty and at most ``limit.max_length`` long as the platform counts, with room left
    for a redelivery label (see the module docs).  Raises ``TypeError`` for a ``mode`` that is
    not a :class:`LongReplies`."""
    if not isinstance(mode, LongReplies):
        raise TypeError(f"mode must be a LongReplies, not {type(mode).__name__}")
    if limit is None or limit.length(text) <= limit.max_length:
        return [text]
    room = _room(limit)
    if mode is LongReplies.TRUNCATE:
        mark = limit.length(TRUNCATION_MARK)
        if mark >= room:  # a limit too small for the mark: plain cut
            return [_prefix(text, room, limit)]
        return [_prefix(text, room - mark, limit) + TRUNCATION_MARK]
    return _split(text, room, limit)


def _room(limit: MessageLimit) -> int:
    """How long one part may be: the limit less the longest label, unless that leaves less
    than half of it."""
    room = limit.max_length - limit.length(_LABEL)
    return room if room * 2 >= limit.max_length else limit.max_length


def _prefix(text: str, size: int, limit: MessageLimit) -> str:
    """The longest prefix of ``text`` whose length (as the platform counts) is at most
    ``size`` (code points are never cut in half)."""
    if limit.unit == "chars":
        return text[:size]
    used = 0
    for index, ch in enumerate(text):
        used += 2 if ord(ch) > 0xFFFF else 1
        if used > size:
            return text[:index]
    return text


def _split(text: str, size: int, limit: MessageLimit) -> list[str]:
    """``text`` in parts of at most ``size``, each cut at the best break in its second half."""
    parts: list[str] = []
    rest = text
    while limit.length(rest) > size:
        window = _prefix(rest, size, limit) or rest[0]  # a part holds one code point at least
        cut = len(window)
        skip = 0
        for mark in _BREAKS:
            at = window.rfind(mark)
            if at * 2 >= len(window) and window[:at].strip():
                cut, skip = at, len(mark)
                break
        parts.append(rest[:cut])
        rest = rest[cut + skip :]
    if rest.strip() or not parts:
        parts.append(rest)
    return parts


def part_ref(message_ref: str | int | None, number: int, count: int) -> str:
    """The message reference part ``number`` of ``count`` of a reply to ``message_ref`` is
    recorded under: distinct per part, the same on every replay of the turn, so that each part
    has an obligation id of its own (even when two parts have the same text)."""
    base = "" if message_ref is None else str(message_ref)
    return f"{base}#part-{number}-of-{count}"

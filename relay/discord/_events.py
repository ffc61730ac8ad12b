"""What a gateway dispatch means to the driver (sans-I/O).

:func:`classify` turns one dispatch into exactly one of:

* a :class:`Message` for the connector's intake: MESSAGE_CREATE of a person's message (default
  and reply types), and MESSAGE_UPDATE that edits one (it carries ``edited_timestamp`` and
  ``content``); an edit's id is ``<message id>:edit:<edited_timestamp>``, the same in every
  replay of that dispatch and different for the next edit;
* a :class:`Rejected` record (kept durably by the connector with the raw payload and why): a
  message dispatch that is not what the documentation says (no id, author or channel, a
  content that is not text);
* :data:`PASSED_OVER`: every other dispatch, the bot's own messages (``author.id`` is the bot's
  user id), system messages (joins, pins, thread starters...) and updates that are not edits
  (an embed unfurled).

:class:`Channels` remembers what the guild, channel and thread dispatches said of each
channel (its type and parent), so that a message in a thread (channel types 10, 11, 12) is
mapped to its thread and parent channel.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Final

import attrs

__all__ = [
    "PASSED_OVER",
    "THREAD_TYPES",
    "Channels",
    "Message",
    "Rejected",
    "classify",
    "raw_text",
]

MAX_RAW_CHARS: Final = 16_384
THREAD_TYPES: Final = frozenset((10, 11, 12))
DM_TYPES: Final = frozenset((1, 3))
_TAKEN_TYPES: Final = frozenset((0, 19))
"""Message types that are a person's message: DEFAULT and REPLY."""
_MAX_CHANNELS: Final = 50_000


@attrs.frozen
class Message:
    """One person's message (or edit) for the intake."""

    event_id: str
    message_id: str
    channel_id: str
    guild_id: str | None
    author_id: str
    author_name: str | None
    text: str
    message_type: str
    reply_to: str | None
    media_urls: tuple[str, ...] = ()


@attrs.frozen
class Rejected:
    """A message dispatch this driver cannot map."""

    event_id: str | None
    reason: str
    raw: str


PASSED_OVER: Final = None


def raw_text(payload: object) -> str:
    """``payload`` as JSON text, bounded (for a rejection record)."""
    try:
        text = json.dumps(payload, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(payload)
    return text if len(text) <= MAX_RAW_CHARS else text[:MAX_RAW_CHARS] + "…"


def _snowflake(value: object) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    if isinstance(value, str) and value.isdigit() and 0 < len(value) <= 20:
        return value
    return None


def classify(
    event: str, data: object, payload: object, *, me: str | None
) -> Message | Rejected | None:
    """What the dispatch ``event`` with ``data`` is: a :class:`Message`, a :class:`Rejected`
    (its raw form from ``payload``) or :data:`PASSED_OVER` (see the module docs); raises
    nothing."""
    if event not in ("MESSAGE_CREATE", "MESSAGE_UPDATE"):
        return PASSED_OVER
    if not isinstance(data, dict):
        return Rejected(None, f"a {event} whose data is not an object", raw_text(payload))
    message_id = _snowflake(data.get("id"))
    channel_id = _snowflake(data.get("channel_id"))
    if message_id is None or channel_id is None:
        return Rejected(None, f"a {event} without a message or channel id", raw_text(payload))
    author = data.get("author")
    if event == "MESSAGE_UPDATE" and (author is None or "content" not in data):
        return PASSED_OVER  # a partial update (an embed unfurled): nobody edited anything
    author_id = _snowflake(author.get("id")) if isinstance(author, dict) else None
    if not isinstance(author, dict) or author_id is None:
        return Rejected(message_id, f"a {event} without an author", raw_text(payload))
    if me is not None and author_id == me:
        return PASSED_OVER
    kind = data.get("type", 0)
    if kind not in _TAKEN_TYPES:
        return PASSED_OVER
    content = data.get("content", "")
    if not isinstance(content, str):
        return Rejected(message_id, f"a {event} whose content is not text", raw_text(payload))
    guild = data.get("guild_id")
    guild_id = _snowflake(guild) if guild is not None else None
    if guild is not None and guild_id is None:
        return Rejected(message_id, f"a {event} with a bad guild_id", raw_text(payload))
    name = author.get("global_name") or author.get("username")
    media = _attachments(data.get("attachments"))
    if event == "MESSAGE_UPDATE":
        edited = data.get("edited_timestamp")
        if not isinstance(edited, str) or not edited:
            return PASSED_OVER
        return Message(
            f"{message_id}:edit:{edited[:40]}",
            message_id,
            channel_id,
            guild_id,
            author_id,
            name[:200] if isinstance(name, str) else None,
            content,
            "edit",
            message_id,
            media,
        )
    reply_to = None
    reference = data.get("message_reference")
    if isinstance(reference, dict) and reference.get("type", 0) == 0:
        reply_to = _snowflake(reference.get("message_id"))
    message_type = "text" if content or not media else "file"
    return Message(
        message_id,
        message_id,
        channel_id,
        guild_id,
        author_id,
        name[:200] if isinstance(name, str) else None,
        content,
        message_type,
        reply_to,
        media,
    )


def _attachments(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    urls = []
    for item in value[:10]:
        url = item.get("url") if isinstance(item, dict) else None
        if isinstance(url, str) and url.startswith(("https://", "http://")) and len(url) < 2048:
            urls.append(url)
    return tuple(urls)


@attrs.frozen
class ChannelInfo:
    """What the driver knows of one channel."""

    type: int
    parent_id: str | None
    guild_id: str | None


class Channels:
    """Channel types and parents, read from the dispatches that describe them (bounded)."""

    def __init__(self) -> None:
        self._known: OrderedDict[str, ChannelInfo] = OrderedDict()

    def get(self, channel_id: str) -> ChannelInfo | None:
        """What is known of ``channel_id`` (None: nothing yet)."""
        return self._known.get(channel_id)

    def note(self, channel: object, guild_id: str | None = None) -> None:
        """Remember a channel object (from a dispatch or ``GET /channels/{id}``)."""
        if not isinstance(channel, dict):
            return
        channel_id = _snowflake(channel.get("id"))
        kind = channel.get("type")
        if channel_id is None or not isinstance(kind, int) or isinstance(kind, bool):
            return
        parent = _snowflake(channel.get("parent_id"))
        guild = _snowflake(channel.get("guild_id")) or guild_id
        self._known[channel_id] = ChannelInfo(kind, parent, guild)
        self._known.move_to_end(channel_id)
        while len(self._known) > _MAX_CHANNELS:
            self._known.popitem(last=False)

    def note_dispatch(self, event: str, data: object) -> None:
        """Read the channels a GUILD_CREATE, CHANNEL_* or THREAD_* dispatch describes."""
        if not isinstance(data, dict):
            return
        if event == "GUILD_CREATE":
            guild_id = _snowflake(data.get("id"))
            for key in ("channels", "threads"):
                items = data.get(key)
                for channel in items if isinstance(items, list) else ():
                    self.note(channel, guild_id)
        elif event in ("CHANNEL_CREATE", "CHANNEL_UPDATE", "THREAD_CREATE", "THREAD_UPDATE"):
            self.note(data)
        elif event == "THREAD_LIST_SYNC":
            threads = data.get("threads")
            guild_id = _snowflake(data.get("guild_id"))
            for thread in threads if isinstance(threads, list) else ():
                self.note(thread, guild_id)
        elif event in ("CHANNEL_DELETE", "THREAD_DELETE"):
            channel_id = _snowflake(data.get("id"))
            if channel_id is not None:
                self._known.pop(channel_id, None)

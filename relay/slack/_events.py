"""Reading what Slack delivers: Socket Mode frames and event callbacks (sans-I/O).

:func:`read_frame` reads one Socket Mode frame into a :class:`Frame` (``hello``,
``disconnect``, ``events_api`` and the rest) or a :class:`Rejected` record when it is not a
JSON object with a type.  :func:`classify` turns one event callback into exactly one of:

* a :class:`Message` for the connector's intake: a person's message (no subtype,
  ``thread_broadcast``, ``file_share`` with the files' ``url_private`` as media, ``me_message``
  as an emote), an ``app_mention``, a person's edit (``message_changed`` with ``edited``);
* a :class:`Rejected` record (kept durably with the raw payload and the reason): a payload or
  event that is malformed, a message of a subtype this driver does not know;
* :data:`PASSED_OVER`: what is nobody's message to the bot -- the bot's own messages (its
  ``bot_id`` or user id), other bots' (``bot_id``, subtype ``bot_message``), deletions, system
  subtypes (joins, leaves, topics, pins ...), ``message_changed`` without ``edited`` (link
  previews added), events of other types (reactions, membership ...).

The message id is ``<channel>:<ts>``: a retry repeats it exactly, and the ``message`` and the
``app_mention`` event of one message (different ``event_id``) share it, so the connector's
dedupe makes them one.  An edit's id is ``<channel>:<ts>:edit:<edited.ts>``.
"""

from __future__ import annotations

import json
from typing import Any, Final

import attrs

__all__ = [
    "MAX_RAW_CHARS",
    "PASSED_OVER",
    "Frame",
    "Me",
    "Message",
    "Rejected",
    "classify",
    "raw_text",
    "read_frame",
]

MAX_RAW_CHARS: Final = 16_384
"""The longest raw form kept with a rejection."""

_SYSTEM_SUBTYPES: Final = frozenset(
    (
        "bot_message",
        "message_deleted",
        "message_replied",
        "channel_join",
        "channel_leave",
        "channel_topic",
        "channel_purpose",
        "channel_name",
        "channel_archive",
        "channel_unarchive",
        "channel_convert_to_private",
        "channel_posting_permissions",
        "group_join",
        "group_leave",
        "group_topic",
        "group_purpose",
        "group_name",
        "group_archive",
        "group_unarchive",
        "pinned_item",
        "unpinned_item",
        "reminder_add",
        "ekm_access_denied",
        "tombstone",
        "huddle_thread",
        "assistant_app_thread",
        "joiner_notification",
        "slackbot_response",
    )
)
_CHAT_TYPES: Final = {"im": "dm", "mpim": "group", "group": "group", "channel": "channel"}


@attrs.frozen
class Me:
    """Who the bot is (from ``auth.test``)."""

    user_id: str
    bot_id: str | None


@attrs.frozen
class Frame:
    """One Socket Mode frame."""

    type: str
    envelope_id: str | None
    payload: Any
    retry_attempt: int
    reason: str | None
    """``disconnect``'s reason, ``events_api``'s retry_reason."""


@attrs.frozen
class Message:
    """One event for the intake."""

    message_id: str
    channel: str
    chat_type: str | None
    """``dm``, ``group`` or ``channel``; None when the event does not say (ask Slack)."""
    user: str
    text: str
    message_type: str
    thread_ts: str | None
    reply_to: str | None
    team_id: str | None
    event_id: str | None
    media_urls: tuple[str, ...] = ()


@attrs.frozen
class Rejected:
    """What this driver cannot map, with why."""

    event_id: str | None
    reason: str
    raw: str


PASSED_OVER: Final = None
"""What :func:`classify` returns for an event that is nobody's message to the bot."""


def raw_text(value: object) -> str:
    """``value`` as JSON text (a str as it is), bounded (for a rejection record)."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, sort_keys=True)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= MAX_RAW_CHARS else text[:MAX_RAW_CHARS] + "…"


def read_frame(text: str) -> Frame | Rejected:
    """One Socket Mode frame's parts; a :class:`Rejected` when it is not an object with a
    ``type`` (raises nothing)."""
    try:
        value = json.loads(text)
    except ValueError:
        return Rejected(None, "a Socket Mode frame that is not JSON", raw_text(text))
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        return Rejected(None, "a Socket Mode frame without a type", raw_text(text))
    envelope_id = value.get("envelope_id")
    attempt = value.get("retry_attempt")
    reason = value.get("reason", value.get("retry_reason"))
    return Frame(
        type=value["type"],
        envelope_id=envelope_id if isinstance(envelope_id, str) and envelope_id else None,
        payload=value.get("payload"),
        retry_attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 0,
        reason=reason if isinstance(reason, str) else None,
    )


def _ts(value: object) -> str | None:
    """A Slack timestamp (``"1700000000.000100"``), else None."""
    if not isinstance(value, str) or not 0 < len(value) <= 32:
        return None
    seconds, dot, micro = value.partition(".")
    return value if seconds.isdigit() and (not dot or micro.isdigit()) else None


def _id(value: object) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= 64 else None


def classify(payload: object, me: Me) -> Message | Rejected | None:
    """What one event callback is (see the module docs); raises nothing."""
    if not isinstance(payload, dict):
        return Rejected(None, "an event payload that is not an object", raw_text(payload))
    event_id = _id(payload.get("event_id"))
    if payload.get("type") != "event_callback":
        kind = str(payload.get("type"))[:60]
        return Rejected(
            event_id, f"a payload of type {kind!r}, not an event_callback", raw_text(payload)
        )
    event = payload.get("event")
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return Rejected(event_id, "an event callback without an event object", raw_text(payload))
    kind = event["type"]
    if kind not in ("message", "app_mention"):
        return PASSED_OVER
    team = _id(payload.get("team_id"))
    subtype = event.get("subtype")
    channel = _id(event.get("channel"))
    if channel is None:
        return Rejected(event_id, "a message event without a channel", raw_text(payload))
    if subtype == "message_changed":
        return _edit(payload, event, channel, team=team, event_id=event_id, me=me)
    if subtype in _SYSTEM_SUBTYPES:
        return PASSED_OVER
    if event.get("bot_id") is not None or event.get("user") == me.user_id:
        return PASSED_OVER  # the bot's own messages, and other bots'
    if subtype not in (None, "thread_broadcast", "file_share", "me_message"):
        shown = str(subtype)[:60]
        return Rejected(event_id, f"a message of unknown subtype {shown!r}", raw_text(payload))
    ts, user, text = _ts(event.get("ts")), _id(event.get("user")), event.get("text", "")
    if ts is None or user is None or not isinstance(text, str):
        return Rejected(event_id, "a message without a ts, a user or a text", raw_text(payload))
    thread = event.get("thread_ts")
    thread_ts = _ts(thread)
    if thread is not None and thread_ts is None:
        return Rejected(event_id, "a message with a malformed thread_ts", raw_text(payload))
    media: tuple[str, ...] = ()
    files = event.get("files")
    if isinstance(files, list):
        media = tuple(
            f["url_private"]
            for f in files
            if isinstance(f, dict) and isinstance(f.get("url_private"), str)
        )
    message_type = "emote" if subtype == "me_message" else "file" if media and not text else "text"
    return Message(
        message_id=f"{channel}:{ts}",
        channel=channel,
        chat_type=_CHAT_TYPES.get(str(event.get("channel_type"))),
        user=user,
        text=text,
        message_type=message_type,
        thread_ts=thread_ts if thread_ts != ts else None,
        reply_to=None,
        team_id=team,
        event_id=event_id,
        media_urls=media,
    )


def _edit(
    payload: dict[str, Any],
    event: dict[str, Any],
    channel: str,
    *,
    team: str | None,
    event_id: str | None,
    me: Me,
) -> Message | Rejected | None:
    message = event.get("message")
    if not isinstance(message, dict):
        return Rejected(event_id, "a message_changed without a message", raw_text(payload))
    edited = message.get("edited")
    if not isinstance(edited, dict):
        return PASSED_OVER  # not a person's edit: link previews and the like
    if message.get("bot_id") is not None or message.get("user") == me.user_id:
        return PASSED_OVER
    ts, edited_ts = _ts(message.get("ts")), _ts(edited.get("ts"))
    user, text = _id(message.get("user")), message.get("text")
    if ts is None or edited_ts is None or user is None or not isinstance(text, str):
        return Rejected(event_id, "an edit without a ts, a user or a text", raw_text(payload))
    thread_ts = _ts(message.get("thread_ts"))
    return Message(
        message_id=f"{channel}:{ts}:edit:{edited_ts}",
        channel=channel,
        chat_type=_CHAT_TYPES.get(str(event.get("channel_type"))),
        user=user,
        text=text,
        message_type="edit",
        thread_ts=thread_ts if thread_ts != ts else None,
        reply_to=f"{channel}:{ts}",
        team_id=team,
        event_id=event_id,
    )

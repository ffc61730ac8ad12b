"""What one Telegram update means to us, and the ids the driver hands out (sans-I/O).

:func:`classify` turns one update of ``getUpdates`` (or of a webhook POST) into exactly one of:

* a :class:`Message` for the connector's intake: a person's ``message`` or ``channel_post``
  (text; a photo, document, audio, voice or video with its caption; a sticker by its emoji)
  and their edits (``edited_message``, ``edited_channel_post``: ``message_type`` ``"edit"``);
* a :class:`Rejected` record (kept durably by the connector with the raw update and the
  reason): an update that is not an object, has no usable ``update_id``, a message without a
  chat or a message id, a message with nothing this driver can show as text (a location, a
  poll, a contact, ...), an update of a kind this driver does not know;
* :data:`PASSED_OVER`: updates that are nobody's message -- membership changes
  (``my_chat_member``, ``chat_member``, ``chat_join_request``), polls and answers, reactions,
  boosts, inline and callback queries, payments, business connections -- and service
  messages (members joined or left, a pinned message, a topic created or closed, ...).

Ids: a message is ``"<chat id>:<message id>"`` (what a redelivery of its update repeats
exactly, unique for one bot, and what a reply and an edit of the bot need back); an edit of it
is ``"<chat id>:<message id>:edit:<update id>"`` (each edit its own event, its
``reply_to_message_id`` the edited message).  Nothing in a message is read as markup: its
``text`` (or ``caption``) arrives as typed; entities are not applied.
"""

from __future__ import annotations

import json
from typing import Any, Final

import attrs

from relay.wire.frames import ChatType

__all__ = [
    "MESSAGE_KINDS",
    "PASSED_OVER",
    "Message",
    "Rejected",
    "classify",
    "message_ref",
    "parse_ref",
    "raw_text",
    "update_id_of",
]

MAX_RAW_CHARS: Final = 16_384
"""The longest raw update kept with a rejection."""
MESSAGE_KINDS: Final = ("message", "edited_message", "channel_post", "edited_channel_post")
"""The update kinds the driver asks for (``allowed_updates``) and maps."""
_EDITS: Final = frozenset(("edited_message", "edited_channel_post"))
_NOT_MESSAGES: Final = frozenset(
    (
        "my_chat_member",
        "chat_member",
        "chat_join_request",
        "poll",
        "poll_answer",
        "message_reaction",
        "message_reaction_count",
        "chat_boost",
        "removed_chat_boost",
        "inline_query",
        "chosen_inline_result",
        "callback_query",
        "shipping_query",
        "pre_checkout_query",
        "purchased_paid_media",
        "business_connection",
        "business_message",
        "edited_business_message",
        "deleted_business_messages",
    )
)
_SERVICE: Final = frozenset(
    (
        "new_chat_members",
        "left_chat_member",
        "new_chat_title",
        "new_chat_photo",
        "delete_chat_photo",
        "group_chat_created",
        "supergroup_chat_created",
        "channel_chat_created",
        "message_auto_delete_timer_changed",
        "migrate_to_chat_id",
        "migrate_from_chat_id",
        "pinned_message",
        "forum_topic_created",
        "forum_topic_edited",
        "forum_topic_closed",
        "forum_topic_reopened",
        "general_forum_topic_hidden",
        "general_forum_topic_unhidden",
        "video_chat_scheduled",
        "video_chat_started",
        "video_chat_ended",
        "video_chat_participants_invited",
        "write_access_allowed",
        "users_shared",
        "chat_shared",
        "boost_added",
        "chat_background_set",
        "proximity_alert_triggered",
        "giveaway_created",
        "giveaway_completed",
    )
)
_MEDIA: Final = (
    ("photo", "image"),
    ("document", "file"),
    ("audio", "audio"),
    ("voice", "audio"),
    ("video", "video"),
    ("video_note", "video"),
    ("animation", "video"),
)
_CHAT_TYPES: Final[dict[str, ChatType]] = {
    "private": "dm",
    "group": "group",
    "supergroup": "group",
    "channel": "channel",
}


@attrs.frozen
class Message:
    """One update for the intake."""

    update_id: int
    event_id: str
    chat_id: int
    chat_type: ChatType
    text: str
    message_type: str
    reply_to: str | None
    thread_id: str | None
    user_id: str | None
    user_name: str | None
    chat_name: str | None


@attrs.frozen
class Rejected:
    """An update this driver cannot map (``update_id`` None when it had no usable one)."""

    update_id: int | None
    reason: str
    raw: str


PASSED_OVER: Final = None
"""What :func:`classify` returns for an update that is nobody's message."""


def message_ref(chat_id: int, message_id: int) -> str:
    """The id of a message of ``chat_id`` (inbound events and send outcomes alike)."""
    return f"{chat_id}:{message_id}"


def parse_ref(value: object) -> tuple[int | None, int] | None:
    """``(chat id, message id)`` of an id this driver handed out (``"<chat>:<message>"``, an
    edit's longer form too), ``(None, message id)`` for a bare message id; None otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return None, value
    if not isinstance(value, str):
        return None
    parts = value.split(":")
    try:
        if len(parts) == 1:
            return None, int(parts[0])
        return int(parts[0]), int(parts[1])
    except ValueError:
        return None


def raw_text(update: object) -> str:
    """The update as JSON text, bounded (for a rejection record)."""
    try:
        text = json.dumps(update, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(update)
    return text if len(text) <= MAX_RAW_CHARS else text[:MAX_RAW_CHARS] + "…"


def update_id_of(update: object) -> int | None:
    """The update's ``update_id`` when it is a non-negative int, else None."""
    uid = update.get("update_id") if isinstance(update, dict) else None
    if isinstance(uid, int) and not isinstance(uid, bool) and uid >= 0:
        return uid
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def classify(update: object, *, bot_id: int | None) -> Message | Rejected | None:
    """What one update is (see the module docs); raises nothing."""
    if not isinstance(update, dict):
        return Rejected(None, "an update that is not a JSON object", raw_text(update))
    uid = update_id_of(update)
    if uid is None:
        return Rejected(None, "an update without a usable update_id", raw_text(update))
    kinds = [key for key in update if key != "update_id"]
    if len(kinds) != 1:
        return Rejected(uid, f"an update of {len(kinds)} kinds, not one", raw_text(update))
    kind = kinds[0]
    if kind in _NOT_MESSAGES:
        return PASSED_OVER
    if kind not in MESSAGE_KINDS:
        return Rejected(
            uid, f"an update of a kind this driver does not know: {kind[:60]!r}", raw_text(update)
        )
    message = update[kind]
    if not isinstance(message, dict):
        return Rejected(uid, f"a {kind} that is not an object", raw_text(update))
    return _message(uid, kind, message, update, bot_id)


def _message(
    uid: int, kind: str, message: dict[str, Any], update: dict[str, Any], bot_id: int | None
) -> Message | Rejected | None:
    chat = message.get("chat")
    message_id = message.get("message_id")
    if not (isinstance(chat, dict) and _is_int(chat.get("id")) and _is_int(message_id)):
        return Rejected(uid, f"a {kind} without a chat id or a message id", raw_text(update))
    chat_type = _CHAT_TYPES.get(str(chat.get("type")))
    if chat_type is None:
        return Rejected(uid, f"a {kind} in a chat of unknown type", raw_text(update))
    sender = message.get("from")
    sender = sender if isinstance(sender, dict) else None
    if sender is not None and bot_id is not None and sender.get("id") == bot_id:
        return PASSED_OVER  # the bot's own message
    text, message_type = _text(message)
    if text is None:
        if any(key in message for key in _SERVICE):
            return PASSED_OVER
        return Rejected(
            uid, f"a {kind} without text or a caption this driver can show", raw_text(update)
        )
    chat_id: int = chat["id"]
    if chat.get("is_forum") is True:
        chat_type = "forum"
    thread = message.get("message_thread_id")
    topic = message.get("is_topic_message") is True and _is_int(thread)
    reply_to = None
    replied = message.get("reply_to_message")
    # In a topic, a message that replies to nothing still points at the topic's first
    # (service) message: that is no reply.
    if (
        isinstance(replied, dict)
        and _is_int(replied.get("message_id"))
        and not (topic and replied["message_id"] == thread)
    ):
        reply_to = message_ref(chat_id, replied["message_id"])
    event_id = message_ref(chat_id, int(message_id or 0))
    if kind in _EDITS:
        reply_to, event_id, message_type = event_id, f"{event_id}:edit:{uid}", "edit"
    return Message(
        update_id=uid,
        event_id=event_id,
        chat_id=chat_id,
        chat_type=chat_type,
        text=text,
        message_type=message_type,
        reply_to=reply_to,
        thread_id=str(thread) if topic else None,
        user_id=str(sender["id"]) if sender is not None and _is_int(sender.get("id")) else None,
        user_name=_name(sender),
        chat_name=_name(chat) if chat_type != "dm" else None,
    )


def _text(message: dict[str, Any]) -> tuple[str | None, str]:
    text = message.get("text")
    if isinstance(text, str):
        return text, "text"
    caption = message.get("caption")
    caption = caption if isinstance(caption, str) else ""
    for key, message_type in _MEDIA:
        if key in message:
            return caption, message_type
    sticker = message.get("sticker")
    if isinstance(sticker, dict):
        emoji = sticker.get("emoji")
        return (emoji if isinstance(emoji, str) else ""), "sticker"
    return None, "text"


def _name(who: dict[str, Any] | None) -> str | None:
    if who is None:
        return None
    for key in ("title", "username"):
        value = who.get(key)
        if isinstance(value, str) and value:
            return value[:200]
    first, last = who.get("first_name"), who.get("last_name")
    name = " ".join(n for n in (first, last) if isinstance(n, str) and n)
    return name[:200] or None

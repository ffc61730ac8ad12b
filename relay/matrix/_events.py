"""Reading a ``/sync`` answer: which rooms changed and what each timeline event means to us.

Sans-I/O.  :func:`read_sync` checks the answer's shape (a malformed body raises
:class:`MalformedSync`, and the driver keeps its cursor); :func:`classify` turns one timeline
event into exactly one of:

* a :class:`Message` for the connector's intake (text, notice and emote messages, media, a
  user's edit, with its reply and thread);
* a :class:`Rejected` record (kept durably by the connector, with the raw event and the reason):
  an event meant for people that this driver cannot map (encrypted, malformed content, an
  unknown event type);
* :data:`PASSED_OVER`: events that are not messages to anybody -- room state (membership,
  names, power levels; membership is tracked by the driver), reactions, redactions, events
  redacted since, receipts, and the bot's own events.

Nothing in a room's body is interpreted as markup: the plain ``body`` is the text (an HTML
``formatted_body`` is never read), so what a person typed arrives as typed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import attrs

from statecore.errors import StatecoreError

__all__ = [
    "PASSED_OVER",
    "MalformedSync",
    "Message",
    "Rejected",
    "RoomBatch",
    "SyncBatch",
    "classify",
    "raw_text",
    "read_sync",
]

MAX_RAW_CHARS: Final = 16_384
"""The longest raw event kept with a rejection."""

_TEXT_TYPES: Final = {"m.text": "text", "m.notice": "notice", "m.emote": "emote"}
_MEDIA_TYPES: Final = {"m.image": "image", "m.file": "file", "m.audio": "audio", "m.video": "video"}
# Not messages to anybody: passed over on purpose (state events are read for membership).
_NOT_MESSAGES: Final = frozenset(
    (
        "m.reaction",
        "m.room.redaction",
        "m.receipt",
        "m.typing",
        "m.call.invite",
        "m.call.answer",
        "m.call.hangup",
        "m.call.candidates",
        "m.call.negotiate",
        "m.call.select_answer",
        "m.call.reject",
        "m.sticker",
    )
)


class MalformedSync(StatecoreError):
    """A ``/sync`` answer that is not what the specification says (no ``next_batch``, a room
    that is not an object, ...); the driver must not move its cursor past it."""


@attrs.frozen
class Message:
    """One event for the intake (before the room's DM-or-group answer is known)."""

    event_id: str
    room_id: str
    sender: str
    text: str
    message_type: str
    reply_to: str | None
    thread_id: str | None
    media_urls: tuple[str, ...] = ()


@attrs.frozen
class Rejected:
    """An event meant for people that this driver cannot map."""

    event_id: str | None
    room_id: str
    reason: str
    raw: str


PASSED_OVER: Final = None
"""What :func:`classify` returns for an event that is nobody's message."""


@attrs.frozen
class RoomBatch:
    """One joined room's part of a sync: its timeline events in order, and what the answer said
    of its members."""

    room_id: str
    events: tuple[Any, ...]
    limited: bool
    prev_batch: str | None
    joined_members: int | None
    state_events: tuple[Any, ...]


@attrs.frozen
class SyncBatch:
    """A whole sync answer, checked."""

    next_batch: str
    rooms: tuple[RoomBatch, ...]
    invites: tuple[tuple[str, bool], ...]
    """Rooms the bot is invited to, each with whether the invite says it is a direct chat."""
    left: tuple[str, ...]
    direct_rooms: frozenset[str] | None
    """Rooms the bot's ``m.direct`` account data names (None: not in this answer)."""


def _object(value: object, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedSync(f"{what} is not an object")
    return value


def _list(value: object, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedSync(f"{what} is not a list")
    return value


def read_sync(body: Mapping[str, Any], *, me: str) -> SyncBatch:
    """Check a ``/sync`` answer and return its parts; raises :class:`MalformedSync`."""
    next_batch = body.get("next_batch")
    if not isinstance(next_batch, str) or not next_batch:
        raise MalformedSync("the answer has no next_batch")
    rooms = _object(body.get("rooms"), "rooms")
    joined: list[RoomBatch] = []
    for room_id, raw_room in _object(rooms.get("join"), "rooms.join").items():
        room = _object(raw_room, "a joined room")
        timeline = _object(room.get("timeline"), "a timeline")
        summary = _object(room.get("summary"), "a summary")
        count = summary.get("m.joined_member_count")
        prev = timeline.get("prev_batch")
        joined.append(
            RoomBatch(
                room_id=room_id,
                events=tuple(_list(timeline.get("events"), "timeline.events")),
                limited=timeline.get("limited") is True,
                prev_batch=prev if isinstance(prev, str) else None,
                joined_members=count if _is_int(count) else None,
                state_events=tuple(
                    _list(_object(room.get("state"), "a state").get("events"), "state.events")
                ),
            )
        )
    invites: list[tuple[str, bool]] = []
    for room_id, room in _object(rooms.get("invite"), "rooms.invite").items():
        state = _object(_object(room, "an invite").get("invite_state"), "invite_state")
        direct = False
        for event in _list(state.get("events"), "invite_state.events"):
            if (
                isinstance(event, dict)
                and event.get("type") == "m.room.member"
                and event.get("state_key") == me
            ):
                content = event.get("content")
                direct = isinstance(content, dict) and content.get("is_direct") is True
        invites.append((room_id, direct))
    left = tuple(_object(rooms.get("leave"), "rooms.leave"))
    direct_rooms: frozenset[str] | None = None
    for event in _list(_object(body.get("account_data"), "account_data").get("events"), "ad"):
        if isinstance(event, dict) and event.get("type") == "m.direct":
            content = event.get("content")
            if isinstance(content, dict):
                direct_rooms = frozenset(
                    room
                    for rooms_of_user in content.values()
                    if isinstance(rooms_of_user, list)
                    for room in rooms_of_user
                    if isinstance(room, str)
                )
    return SyncBatch(next_batch, tuple(joined), tuple(invites), left, direct_rooms)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def raw_text(event: object) -> str:
    """The event as JSON text, bounded (for a rejection record)."""
    try:
        text = json.dumps(event, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(event)
    return text if len(text) <= MAX_RAW_CHARS else text[:MAX_RAW_CHARS] + "…"


def classify(event: object, room_id: str, *, me: str) -> Message | Rejected | None:
    """What one timeline event of ``room_id`` is (see the module docs); raises nothing."""
    if not isinstance(event, dict):
        return Rejected(None, room_id, "an event that is not a JSON object", raw_text(event))
    event_id = event.get("event_id")
    kind = event.get("type")
    sender = event.get("sender")
    if not (isinstance(event_id, str) and event_id and isinstance(kind, str)):
        return Rejected(None, room_id, "an event without an event_id or type", raw_text(event))
    if not isinstance(sender, str) or not sender:
        return Rejected(event_id, room_id, "an event without a sender", raw_text(event))
    if sender == me or "state_key" in event or kind in _NOT_MESSAGES:
        return PASSED_OVER
    content = event.get("content")
    unsigned = event.get("unsigned")
    if isinstance(unsigned, dict) and "redacted_because" in unsigned:
        return PASSED_OVER  # redacted since: nothing left to read
    if kind == "m.room.encrypted":
        return Rejected(
            event_id,
            room_id,
            "an encrypted event (this driver speaks to unencrypted rooms only)",
            raw_text(event),
        )
    if kind != "m.room.message":
        return Rejected(
            event_id, room_id, f"an event of unknown type {kind[:80]!r}", raw_text(event)
        )
    if not isinstance(content, dict):
        return Rejected(
            event_id, room_id, "a message whose content is not an object", raw_text(event)
        )
    return _message(event, event_id, room_id, sender, content)


def _message(
    event: dict[str, Any], event_id: str, room_id: str, sender: str, content: dict[str, Any]
) -> Message | Rejected:
    relates = content.get("m.relates_to")
    relates = relates if isinstance(relates, dict) else {}
    if relates.get("rel_type") == "m.replace":
        edited = relates.get("event_id")
        new = content.get("m.new_content")
        new_body = new.get("body") if isinstance(new, dict) else None
        if not isinstance(edited, str) or not isinstance(new_body, str):
            return Rejected(event_id, room_id, "an edit without m.new_content", raw_text(event))
        return Message(event_id, room_id, sender, new_body, "edit", edited, None)
    body = content.get("body")
    msgtype = content.get("msgtype")
    if not isinstance(body, str) or not isinstance(msgtype, str):
        return Rejected(
            event_id, room_id, "a message without a text body and msgtype", raw_text(event)
        )
    thread_id = None
    if relates.get("rel_type") == "m.thread" and isinstance(relates.get("event_id"), str):
        thread_id = relates["event_id"]
    reply_to = None
    in_reply = relates.get("m.in_reply_to")
    # In a thread, a reply to the thread's last event marked ``is_falling_back`` is only there
    # for clients without threads: it is not a reply.
    if isinstance(in_reply, dict) and not (thread_id and relates.get("is_falling_back") is True):
        target = in_reply.get("event_id")
        if isinstance(target, str) and target:
            reply_to = target
            body = _without_reply_fallback(body)
    media: tuple[str, ...] = ()
    if msgtype in _MEDIA_TYPES:
        url = content.get("url")
        media = (url,) if isinstance(url, str) and url.startswith("mxc://") else ()
        message_type = _MEDIA_TYPES[msgtype]
    else:
        # The specification: a client shows the body of a msgtype it does not know.
        message_type = _TEXT_TYPES.get(msgtype, "text")
    return Message(event_id, room_id, sender, body, message_type, reply_to, thread_id, media)


def _without_reply_fallback(body: str) -> str:
    """The body without the quoted lines older clients put before a reply (``> <@a:b> ...``)."""
    if not body.startswith("> "):
        return body
    lines = body.split("\n")
    index = 0
    while index < len(lines) and lines[index].startswith(">"):
        index += 1
    if index < len(lines) and lines[index] == "":
        index += 1
    rest = "\n".join(lines[index:])
    return rest if rest else body

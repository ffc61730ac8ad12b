"""Reading sync answers: what each timeline event means to the driver, and malformed answers."""

from __future__ import annotations

from typing import Any

import pytest

from relay.matrix._events import (
    MAX_RAW_CHARS,
    PASSED_OVER,
    MalformedSync,
    Message,
    Rejected,
    classify,
    read_sync,
)

ME = "@bot:localhost"
ROOM = "!room"


def message(content: dict[str, Any], **extra: Any) -> dict[str, Any]:
    event = {
        "type": "m.room.message",
        "event_id": "$e1",
        "sender": "@ann:localhost",
        "content": content,
    }
    event.update(extra)
    return event


def test_a_text_message_is_taken_with_its_body_as_typed() -> None:
    seen = classify(message({"msgtype": "m.text", "body": "<b>hi</b> & bye"}), ROOM, me=ME)
    assert seen == Message("$e1", ROOM, "@ann:localhost", "<b>hi</b> & bye", "text", None, None)


@pytest.mark.parametrize(
    ("msgtype", "kind"), [("m.notice", "notice"), ("m.emote", "emote"), ("org.x.custom", "text")]
)
def test_notices_emotes_and_unknown_msgtypes_are_read_by_their_body(
    msgtype: str, kind: str
) -> None:
    seen = classify(message({"msgtype": msgtype, "body": "waves"}), ROOM, me=ME)
    assert isinstance(seen, Message)
    assert (seen.text, seen.message_type) == ("waves", kind)


def test_a_reply_names_its_target_and_loses_the_quoted_fallback() -> None:
    body = "> <@bob:localhost> the question\n> second line\n\nthe answer"
    content = {
        "msgtype": "m.text",
        "body": body,
        "m.relates_to": {"m.in_reply_to": {"event_id": "$q"}},
    }
    seen = classify(message(content), ROOM, me=ME)
    assert isinstance(seen, Message)
    assert (seen.reply_to, seen.text, seen.thread_id) == ("$q", "the answer", None)


def test_a_thread_message_names_its_root_and_its_fallback_reply_is_no_reply() -> None:
    relates = {
        "rel_type": "m.thread",
        "event_id": "$root",
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": "$last"},
    }
    seen = classify(
        message({"msgtype": "m.text", "body": "in thread", "m.relates_to": relates}), ROOM, me=ME
    )
    assert isinstance(seen, Message)
    assert (seen.thread_id, seen.reply_to) == ("$root", None)
    relates["is_falling_back"] = False
    seen = classify(
        message({"msgtype": "m.text", "body": "x", "m.relates_to": relates}), ROOM, me=ME
    )
    assert isinstance(seen, Message)
    assert (seen.thread_id, seen.reply_to) == ("$root", "$last")


def test_a_users_edit_is_an_edit_of_the_original_with_the_new_text() -> None:
    content = {
        "msgtype": "m.text",
        "body": "* fixed",
        "m.new_content": {"msgtype": "m.text", "body": "fixed"},
        "m.relates_to": {"rel_type": "m.replace", "event_id": "$orig"},
    }
    seen = classify(message(content), ROOM, me=ME)
    assert isinstance(seen, Message)
    assert (seen.message_type, seen.text, seen.reply_to) == ("edit", "fixed", "$orig")


def test_media_keeps_its_mxc_url() -> None:
    seen = classify(
        message({"msgtype": "m.image", "body": "cat.png", "url": "mxc://localhost/abc"}),
        ROOM,
        me=ME,
    )
    assert isinstance(seen, Message)
    assert (seen.message_type, seen.media_urls) == ("image", ("mxc://localhost/abc",))


@pytest.mark.parametrize(
    "event",
    [
        message({"msgtype": "m.text", "body": "mine"}, sender=ME),
        {
            "type": "m.room.member",
            "event_id": "$m",
            "sender": "@a:l",
            "state_key": "@a:l",
            "content": {},
        },
        {"type": "m.reaction", "event_id": "$r", "sender": "@a:l", "content": {}},
        message({}, unsigned={"redacted_because": {}}),
    ],
    ids=["own", "state", "reaction", "redacted"],
)
def test_events_that_are_nobodys_message_are_passed_over(event: dict[str, Any]) -> None:
    assert classify(event, ROOM, me=ME) is PASSED_OVER


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (
            {"type": "m.room.encrypted", "event_id": "$x", "sender": "@a:l", "content": {}},
            "encrypted",
        ),
        (
            {"type": "com.example.poll", "event_id": "$x", "sender": "@a:l", "content": {}},
            "unknown type",
        ),
        (message({"msgtype": "m.text", "body": 42}), "without a text body"),
        (message("not an object"), "content is not an object"),  # type: ignore[arg-type]
        (
            message({"body": "x", "msgtype": "m.text", "m.relates_to": {"rel_type": "m.replace"}}),
            "edit",
        ),
        ({"type": "m.room.message", "sender": "@a:l", "content": {}}, "without an event_id"),
        (["not", "an", "object"], "not a JSON object"),
    ],
)
def test_events_meant_for_people_that_cannot_be_mapped_are_rejected_with_a_reason(
    event: Any, reason: str
) -> None:
    seen = classify(event, ROOM, me=ME)
    assert isinstance(seen, Rejected)
    assert reason in seen.reason
    assert seen.room_id == ROOM
    assert seen.raw  # the raw event is kept


def test_a_huge_rejected_event_is_kept_truncated() -> None:
    event = {
        "type": "com.example.big",
        "event_id": "$big",
        "sender": "@a:l",
        "content": {"x": "y" * 100_000},
    }
    seen = classify(event, ROOM, me=ME)
    assert isinstance(seen, Rejected)
    assert len(seen.raw) <= MAX_RAW_CHARS + 1


def test_a_sync_answer_is_read_into_rooms_invites_and_leaves() -> None:
    body = {
        "next_batch": "s2",
        "rooms": {
            "join": {
                "!a": {
                    "timeline": {
                        "events": [message({"msgtype": "m.text", "body": "x"})],
                        "limited": True,
                        "prev_batch": "p1",
                    },
                    "summary": {"m.joined_member_count": 3},
                }
            },
            "invite": {
                "!b": {
                    "invite_state": {
                        "events": [
                            {
                                "type": "m.room.member",
                                "state_key": ME,
                                "content": {"is_direct": True},
                            }
                        ]
                    }
                }
            },
            "leave": {"!c": {}},
        },
        "account_data": {"events": [{"type": "m.direct", "content": {"@ann:l": ["!d"]}}]},
    }
    batch = read_sync(body, me=ME)
    assert batch.next_batch == "s2"
    (room,) = batch.rooms
    assert (room.room_id, room.limited, room.prev_batch, room.joined_members) == (
        "!a",
        True,
        "p1",
        3,
    )
    assert batch.invites == (("!b", True),)
    assert batch.left == ("!c",)
    assert batch.direct_rooms == frozenset({"!d"})


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"next_batch": 5},
        {"next_batch": ""},
        {"next_batch": "s", "rooms": []},
        {"next_batch": "s", "rooms": {"join": {"!a": "x"}}},
        {"next_batch": "s", "rooms": {"join": {"!a": {"timeline": {"events": {}}}}}},
    ],
)
def test_a_malformed_sync_answer_is_refused_whole(body: dict[str, Any]) -> None:
    with pytest.raises(MalformedSync):
        read_sync(body, me=ME)

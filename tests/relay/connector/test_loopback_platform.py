"""Tests for relay.connector.platform.LoopbackPlatform: the simulated chat platform driver."""

from __future__ import annotations

import asyncio

import pytest

from relay.connector.platform import ChatMessage, LoopbackPlatform, PlatformDriver, SentAction
from relay.wire.frames import InboundEvent, OutboundOutcome


class Intake:
    """Records what the platform hands to its connector."""

    def __init__(self) -> None:
        self.events: list[tuple[str, InboundEvent]] = []

    async def __call__(self, platform: str, event: InboundEvent) -> None:
        self.events.append((platform, event))


def attached(platform: LoopbackPlatform) -> Intake:
    intake = Intake()
    platform.attach(intake)
    return intake


async def send(
    platform: LoopbackPlatform, chat_id: str, text: str, **extra: object
) -> OutboundOutcome:
    return await platform.perform({"op": "send", "chat_id": chat_id, "content": text, **extra})


def test_loopback_is_a_platform_driver() -> None:
    """LoopbackPlatform satisfies the PlatformDriver protocol the connector relies on."""
    assert isinstance(LoopbackPlatform(), PlatformDriver)


def test_descriptor_advertises_the_supported_ops() -> None:
    """The descriptor names the platform, its limits and exactly the ops it supports."""
    default = LoopbackPlatform().descriptor()
    assert default.platform == "loopback"
    assert tuple(default.supported_ops) == ("send", "edit", "typing", "follow_up")
    assert default.supports_edit
    assert default.supports_threads
    assert default.max_message_length == 4096
    narrow = LoopbackPlatform(
        "chat2", label="Two", max_message_length=50, supported_ops=("send",)
    ).descriptor()
    assert (narrow.platform, narrow.label, narrow.max_message_length) == ("chat2", "Two", 50)
    assert tuple(narrow.supported_ops) == ("send",)
    assert not narrow.supports_edit


@pytest.mark.asyncio
async def test_inject_requires_attach() -> None:
    """Injecting into a platform no connector is attached to raises and records nothing."""
    platform = LoopbackPlatform()
    with pytest.raises(RuntimeError, match="not attached"):
        await platform.inject("c1", "hello")


@pytest.mark.asyncio
async def test_inject_delivers_the_event_as_given() -> None:
    """inject() hands the intake an InboundEvent with the given chat, user, scope, thread and
    chat type, and returns its message id."""
    platform = LoopbackPlatform("chat")
    intake = attached(platform)
    first = await platform.inject(
        "g1",
        "hi all",
        user_id="u7",
        scope_id="guild-1",
        chat_type="thread",
        thread_id="t9",
        user_name="Ann",
    )
    second = await platform.inject("d1", "psst")
    assert first != second
    (p1, e1), (p2, e2) = intake.events
    assert (p1, p2) == ("chat", "chat")
    assert (e1.text, e1.message_id, e1.message_type) == ("hi all", first, "text")
    src = e1.source
    assert (src.platform, src.chat_id, src.chat_type) == ("chat", "g1", "thread")
    assert (src.user_id, src.user_name, src.scope_id, src.thread_id) == (
        "u7",
        "Ann",
        "guild-1",
        "t9",
    )
    assert (e2.message_id, e2.source.chat_type, e2.source.scope_id) == (second, "dm", None)
    assert platform.transcript["g1"] == [ChatMessage(first, "g1", "u7", "hi all", "t9")]
    assert platform.texts("g1") == []  # texts() shows only what the bot sent


@pytest.mark.asyncio
async def test_send_records_and_returns_a_message_id() -> None:
    """A send succeeds with a fresh message id, is listed in ``sent`` with its thread, reply
    and metadata, appears in the transcript and sets ``sent_event``."""
    platform = LoopbackPlatform()
    attached(platform)
    user_msg = await platform.inject("c1", "question")
    assert not platform.sent_event.is_set()
    outcome = await send(
        platform, "c1", "answer", thread_id="t1", reply_to=user_msg, metadata={"scope_id": "s"}
    )
    assert outcome.success
    assert outcome.message_id not in (None, user_msg)
    assert platform.sent_event.is_set()
    assert platform.sent == [
        SentAction("send", "c1", "answer", outcome.message_id, "t1", user_msg, {"scope_id": "s"})
    ]
    assert platform.transcript["c1"][-1] == ChatMessage(
        str(outcome.message_id), "c1", "bot", "answer", "t1"
    )
    other = await send(platform, "c1", "more")
    assert other.message_id != outcome.message_id
    assert platform.texts("c1") == ["answer", "more"]
    assert platform.texts("elsewhere") == []


@pytest.mark.asyncio
async def test_edit_changes_the_bots_message_in_place() -> None:
    """An edit rewrites the bot's message (texts reflect it, marked edited); editing a user's
    message, an unknown id or a message of another chat fails with not_found."""
    platform = LoopbackPlatform()
    attached(platform)
    user_msg = await platform.inject("c1", "hello")
    first = await send(platform, "c1", "draft")
    await send(platform, "c1", "second")
    edited = await platform.perform(
        {"op": "edit", "chat_id": "c1", "message_id": first.message_id, "content": "final"}
    )
    assert edited == OutboundOutcome(True, first.message_id)
    assert platform.texts("c1") == ["final", "second"]
    message = next(m for m in platform.transcript["c1"] if m.message_id == first.message_id)
    assert message.edited
    assert platform.sent[-1] == SentAction("edit", "c1", "final", first.message_id)
    for chat_id, message_id in (("c1", user_msg), ("c1", "m999"), ("c2", first.message_id)):
        refused = await platform.perform(
            {"op": "edit", "chat_id": chat_id, "message_id": message_id, "content": "x"}
        )
        assert (refused.success, refused.code) == (False, "not_found")
    assert platform.texts("c1") == ["final", "second"]


@pytest.mark.asyncio
async def test_typing_is_recorded_without_a_message() -> None:
    """typing succeeds, is listed in ``sent`` and adds nothing to the transcript."""
    platform = LoopbackPlatform()
    outcome = await platform.perform({"op": "typing", "chat_id": "c1"})
    assert outcome == OutboundOutcome(True)
    assert platform.sent == [SentAction("typing", "c1", None, None)]
    assert platform.transcript == {}


@pytest.mark.asyncio
async def test_every_advertised_op_can_be_performed() -> None:
    """Each op the descriptor advertises succeeds against the loopback platform."""
    platform = LoopbackPlatform()
    sent = await send(platform, "c1", "base")
    actions: dict[str, dict[str, object]] = {
        "send": {"chat_id": "c1", "content": "t"},
        "edit": {"chat_id": "c1", "content": "t2", "message_id": sent.message_id},
        "typing": {"chat_id": "c1"},
        "follow_up": {
            "session_key": "agent:default:loopback:dm:c1",
            "kind": "result",
            "content": "done",
            "metadata": {"chat_id": "c1"},
        },
    }
    for op in platform.descriptor().supported_ops:
        outcome = await platform.perform({"op": op, **actions[op]})
        assert outcome.success, (op, outcome)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("action", "code"),
    [
        ({"op": "delete", "chat_id": "c1"}, "unsupported_op"),
        ({"chat_id": "c1", "content": "no op"}, "unsupported_op"),
        ({"op": "send", "content": "no chat"}, "bad_action"),
        ({"op": "send", "chat_id": "", "content": "empty chat"}, "bad_action"),
        ({"op": "send", "chat_id": ["c1"], "content": "list chat"}, "bad_action"),
        ({"op": "send", "chat_id": "c1", "text": "the body is content"}, "bad_action"),
        ({"op": "typing"}, "bad_action"),
        ({"op": "send", "chat_id": "c1"}, "bad_action"),
        ({"op": "send", "chat_id": "c1", "content": 42}, "bad_action"),
        ({"op": "edit", "chat_id": "c1", "message_id": "m1"}, "bad_action"),
    ],
)
async def test_bad_actions_fail_definitely_and_record_nothing(
    action: dict[str, object], code: str
) -> None:
    """Unsupported ops and actions without a chat or text fail with a code; nothing is sent."""
    platform = LoopbackPlatform()
    outcome = await platform.perform(action)
    assert (outcome.success, outcome.code) == (False, code)
    assert outcome.error
    assert platform.sent == []
    assert platform.transcript == {}


@pytest.mark.asyncio
async def test_unadvertised_op_is_unsupported() -> None:
    """A platform configured without edit refuses edit as unsupported."""
    platform = LoopbackPlatform(supported_ops=("send", "typing"))
    sent = await send(platform, "c1", "x")
    outcome = await platform.perform(
        {"op": "edit", "chat_id": "c1", "message_id": sent.message_id, "content": "y"}
    )
    assert (outcome.success, outcome.code) == (False, "unsupported_op")
    assert platform.texts("c1") == ["x"]


@pytest.mark.asyncio
async def test_too_long_message_is_refused() -> None:
    """A text longer than max_message_length fails with too_long; one at the limit is sent."""
    platform = LoopbackPlatform(max_message_length=10)
    refused = await send(platform, "c1", "x" * 11)
    assert (refused.success, refused.code) == (False, "too_long")
    assert (await send(platform, "c1", "y" * 10)).success
    assert platform.texts("c1") == ["y" * 10]


@pytest.mark.asyncio
async def test_fail_next_fails_exactly_the_next_send() -> None:
    """fail_next() makes the next send fail with the given error and code; typing is unaffected
    and the send after it succeeds."""
    platform = LoopbackPlatform()
    platform.fail_next("rate limited", "rate_limit")
    platform.fail_next("boom")
    assert (await platform.perform({"op": "typing", "chat_id": "c1"})).success
    first = await send(platform, "c1", "a")
    second = await send(platform, "c1", "b")
    third = await send(platform, "c1", "c")
    assert first == OutboundOutcome(False, None, "rate limited", "rate_limit")
    assert (second.success, second.error, second.code) == (False, "boom", None)
    assert third.success
    assert platform.texts("c1") == ["c"]


@pytest.mark.asyncio
async def test_down_platform_fails_every_action_until_back() -> None:
    """While ``down`` every op fails with platform_down and nothing is recorded."""
    platform = LoopbackPlatform()
    sent = await send(platform, "c1", "before")
    platform.down = True
    for action in (
        {"op": "send", "chat_id": "c1", "content": "x"},
        {"op": "edit", "chat_id": "c1", "message_id": sent.message_id, "content": "x"},
        {"op": "typing", "chat_id": "c1"},
    ):
        outcome = await platform.perform(action)
        assert (outcome.success, outcome.code) == (False, "platform_down")
    assert len(platform.sent) == 1
    platform.down = False
    assert (await send(platform, "c1", "after")).success
    assert platform.texts("c1") == ["before", "after"]


@pytest.mark.asyncio
async def test_sent_event_can_be_awaited_for_the_next_send() -> None:
    """A test can clear ``sent_event`` and wait (bounded) for the next send."""
    platform = LoopbackPlatform()
    platform.sent_event.clear()
    task = asyncio.create_task(send(platform, "c1", "later"))
    await asyncio.wait_for(platform.sent_event.wait(), timeout=5)
    assert (await task).success

"""Sample frames and Hypothesis strategies of valid frames, shared by the frame and codec tests."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from hypothesis import strategies as st

from relay.wire.descriptor import CONTRACT_VERSION, CapabilityDescriptor
from relay.wire.errors import ProtocolError
from relay.wire.frames import (
    CHAT_TYPES,
    EGRESS_DECLINED,
    DescriptorFrame,
    ErrorFrame,
    EventSource,
    Frame,
    GoingIdle,
    GoingIdleAck,
    Hello,
    Inbound,
    InboundAck,
    InboundEvent,
    Interrupt,
    InterruptInbound,
    Outbound,
    OutboundOutcome,
    OutboundResult,
    PassthroughForward,
    frame_from_wire,
)

DESCRIPTOR = CapabilityDescriptor(
    contract_version=CONTRACT_VERSION,
    platform="discord",
    label="Discord",
    max_message_length=2000,
    supports_draft_streaming=False,
    supports_edit=True,
    supports_threads=True,
    markdown_dialect="discord",
    len_unit="chars",
)

SOURCE = EventSource("discord", "c1", "dm")

FULL_SOURCE = EventSource(
    "discord",
    "c1",
    "thread",
    chat_name="général",
    user_id="u1",
    user_name="Ada",
    thread_id="t1",
    scope_id="guild-1",
    profile="work",
)


# One minimal and one fully populated instance of every frame type.
SAMPLE_FRAMES: list[Frame] = [
    Hello("discord", "bot1"),
    Hello("slack", "bot2", protocol=1, features=("error_frame", "close_4419")),
    Outbound("r1", {"op": "send"}),
    Outbound(
        "r2",
        {"op": "send", "chat_id": "c1", "content": "héllo ✓", "metadata": {"scope_id": "g1"}},
        idempotency_key="k1",
        platform="discord",
        bot_id="bot1",
    ),
    InboundAck("buf-1"),
    GoingIdle(),
    GoingIdle("r3"),
    Interrupt("sess-1"),
    Interrupt("sess-1", reason="user pressed stop"),
    DescriptorFrame(DESCRIPTOR),
    DescriptorFrame(
        attrs.evolve(DESCRIPTOR, supported_ops=("send", "react"), max_frame_bytes=65536)
    ),
    Inbound(InboundEvent("hi", source=SOURCE)),
    Inbound(
        InboundEvent(
            "a reply 🎉",
            message_type="photo",
            message_id="m2",
            reply_to_message_id="m1",
            source=FULL_SOURCE,
        ),
        buffer_id="buf-42",
    ),
    OutboundResult("r1", OutboundOutcome(True)),
    OutboundResult(
        "r2", OutboundOutcome(False, message_id="m9", error="nope", code=EGRESS_DECLINED)
    ),
    GoingIdleAck(),
    GoingIdleAck("r3"),
    ErrorFrame("bad_field", "field 'requestId' must be a string"),
    ErrorFrame("frame_too_large", "too big", ref="r7"),
    InterruptInbound("agent:main:p:dm:c1", "c1"),
    InterruptInbound("s", buffer_id="b-9"),
    PassthroughForward(
        {"platform": "p", "botId": "b", "method": "POST", "path": "/hook", "headers": {}},
        buffer_id="b-10",
    ),
]


def wire(frame: Frame) -> dict[str, Any]:
    """The frame's wire object after a real JSON round trip."""
    result: dict[str, Any] = json.loads(json.dumps(frame.to_wire()))
    return result


def refused(obj: Any) -> ProtocolError:
    """The ProtocolError frame_from_wire raises for ``obj``."""
    with pytest.raises(ProtocolError) as info:
        frame_from_wire(obj)
    return info.value


def validate_deep(value: object) -> None:
    """Run the attrs validators of ``value`` and of every attrs record nested in it."""
    cls: Any = type(value)
    if attrs.has(cls):
        attrs.validate(value)  # type: ignore[arg-type]
        for field in attrs.fields(cls):
            validate_deep(getattr(value, field.name))


texts = st.text(max_size=12)

ids = st.one_of(texts, st.integers(min_value=-(2**70), max_value=2**70))

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)

json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)

sources = st.builds(
    EventSource,
    platform=texts,
    chat_id=ids.filter(lambda v: v != ""),  # an empty chat id routes nowhere: poison
    chat_type=st.sampled_from(sorted(CHAT_TYPES)),
    chat_name=st.none() | texts,
    user_id=st.none() | ids,
    user_name=st.none() | texts,
    thread_id=st.none() | ids,
    scope_id=st.none() | ids,
    profile=st.none() | texts,
)

events = st.builds(
    InboundEvent,
    text=texts,
    message_type=texts.filter(bool),
    message_id=st.none() | ids,
    reply_to_message_id=st.none() | ids,
    source=sources,
    media_urls=st.lists(texts.filter(bool), max_size=2).map(tuple),
)

descriptors = st.builds(
    CapabilityDescriptor,
    contract_version=st.just(CONTRACT_VERSION),
    platform=texts,
    label=texts,
    max_message_length=st.integers(1, 10**9),
    supports_draft_streaming=st.booleans(),
    supports_edit=st.booleans(),
    supports_threads=st.booleans(),
    markdown_dialect=texts,
    len_unit=st.sampled_from(["chars", "utf16"]),
    supported_ops=st.lists(st.text(min_size=1, max_size=8), max_size=4).map(tuple),
    max_frame_bytes=st.none() | st.integers(1, 10**9),
    features=st.lists(st.text(min_size=1, max_size=8), max_size=3, unique=True).map(tuple),
)

actions = st.tuples(st.text(min_size=1, max_size=8), st.dictionaries(texts, json_values)).map(
    lambda pair: {**pair[1], "op": pair[0]}
)

opt = st.none() | texts

frames: st.SearchStrategy[Frame] = st.one_of(
    st.builds(
        Hello,
        texts,
        texts,
        st.integers(0, 9),
        st.lists(texts, max_size=3).map(tuple),
        st.none() | st.integers(1, 10_000),
    ),
    st.builds(Outbound, texts, actions, opt, opt, opt),
    st.builds(InboundAck, texts),
    st.builds(GoingIdle, opt),
    st.builds(Interrupt, texts, opt),
    st.builds(DescriptorFrame, descriptors),
    st.builds(Inbound, events, opt),
    st.builds(InterruptInbound, texts, st.none() | ids, opt),
    st.builds(
        PassthroughForward,
        st.fixed_dictionaries(
            {
                "platform": texts,
                "botId": texts,
                "method": texts,
                "path": texts,
                "headers": st.dictionaries(texts, texts, max_size=2),
                "bodyB64": texts,
            }
        ),
        opt,
    ),
    st.builds(
        OutboundResult,
        texts,
        st.builds(OutboundOutcome, st.booleans(), st.none() | ids, opt, opt),
    ),
    st.builds(GoingIdleAck, opt),
    st.builds(ErrorFrame, texts, texts, opt),
)

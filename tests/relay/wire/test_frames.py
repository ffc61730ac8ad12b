"""Tests for relay.wire.frames: every frame type, its wire shape, and local vs remote validation."""

from __future__ import annotations

import pickle
from types import MappingProxyType
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.wire.descriptor import CONTRACT_VERSION, LEGACY_OPS
from relay.wire.errors import ContractVersionError, ProtocolError, UndeliverableEvent
from relay.wire.frames import (
    CONNECTOR_TO_GATEWAY,
    EGRESS_DECLINED,
    FRAME_TYPES,
    GATEWAY_TO_CONNECTOR,
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
    Outbound,
    OutboundOutcome,
    OutboundResult,
    frame_from_wire,
)
from tests.relay.wire.frame_samples import (
    DESCRIPTOR,
    FULL_SOURCE,
    SAMPLE_FRAMES,
    SOURCE,
    frames,
    json_values,
    refused,
    validate_deep,
    wire,
)

# -- Hypothesis strategies (shared with test_codec) ----------------------------------------------


# -- the frame catalogue -------------------------------------------------------------------------


def test_directions_partition_the_frame_types() -> None:
    """The two direction sets are disjoint and together cover every frame type of the doc."""
    assert not GATEWAY_TO_CONNECTOR & CONNECTOR_TO_GATEWAY
    assert set(FRAME_TYPES.values()) == GATEWAY_TO_CONNECTOR | CONNECTOR_TO_GATEWAY
    assert {cls.TYPE for cls in GATEWAY_TO_CONNECTOR} == {
        "hello",
        "outbound",
        "inbound_ack",
        "going_idle",
        "interrupt",
    }
    assert {cls.TYPE for cls in CONNECTOR_TO_GATEWAY} == {
        "interrupt_inbound",
        "passthrough_forward",
        "descriptor",
        "inbound",
        "outbound_result",
        "going_idle_ack",
        "error",
    }


@pytest.mark.parametrize("frame", SAMPLE_FRAMES, ids=lambda f: type(f).__name__)
def test_every_frame_round_trips_through_its_wire_object(frame: Frame) -> None:
    """to_wire then frame_from_wire (through real JSON) gives back an equal frame."""
    obj = wire(frame)
    assert obj["type"] == frame.TYPE
    assert frame_from_wire(obj) == frame


@pytest.mark.parametrize("frame", SAMPLE_FRAMES, ids=lambda f: type(f).__name__)
def test_frames_are_frozen(frame: Frame) -> None:
    """Every frame is immutable: assigning an attribute raises FrozenInstanceError."""
    name = attrs.fields(type(frame))[0].name
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(frame, name, "x")


@settings(max_examples=300)
@given(frames)
def test_any_valid_frame_round_trips(frame: Frame) -> None:
    """Any frame built from valid values survives to_wire -> JSON -> frame_from_wire unchanged."""
    assert frame_from_wire(wire(frame)) == frame


def test_wire_keys_are_camel_case_at_frame_level_and_snake_case_inside() -> None:
    """Frame-level keys are camelCase; the event/source/result objects keep snake_case."""
    assert wire(SAMPLE_FRAMES[1]) == {
        "type": "hello",
        "platform": "slack",
        "botId": "bot2",
        "protocol": 1,
        "features": ["error_frame", "close_4419"],
    }
    assert set(wire(SAMPLE_FRAMES[3])) == {
        "type",
        "requestId",
        "action",
        "idempotencyKey",
        "platform",
        "botId",
    }
    inbound = wire(SAMPLE_FRAMES[12])
    assert inbound["bufferId"] == "buf-42"
    assert set(inbound["event"]) == {
        "text",
        "message_type",
        "message_id",
        "reply_to_message_id",
        "source",
    }
    assert set(inbound["event"]["source"]) == {
        "platform",
        "chat_id",
        "chat_type",
        "chat_name",
        "user_id",
        "user_name",
        "thread_id",
        "scope_id",
        "profile",
    }
    assert wire(SAMPLE_FRAMES[14])["result"] == {
        "success": False,
        "message_id": "m9",
        "error": "nope",
        "code": "egress_declined",
    }
    assert wire(InboundAck("b")) == {"type": "inbound_ack", "bufferId": "b"}
    assert wire(Interrupt("s", "why")) == {"type": "interrupt", "session_key": "s", "reason": "why"}


def test_optional_none_fields_are_omitted_on_the_wire() -> None:
    """to_wire leaves out optional keys whose value is None (bufferId present iff buffered)."""
    assert wire(Inbound(InboundEvent("hi", source=SOURCE))) == {
        "type": "inbound",
        "event": {
            "text": "hi",
            "message_type": "text",
            "source": {"platform": "discord", "chat_id": "c1", "chat_type": "dm"},
        },
    }
    assert wire(GoingIdle()) == {"type": "going_idle"}
    assert wire(GoingIdleAck()) == {"type": "going_idle_ack"}
    assert wire(Outbound("r", {"op": "typing"})) == {
        "type": "outbound",
        "requestId": "r",
        "action": {"op": "typing"},
    }
    assert wire(ErrorFrame("c", "m")) == {"type": "error", "code": "c", "message": "m"}


# -- decoding rules ------------------------------------------------------------------------------


def test_seed_inbound_frame_decodes() -> None:
    """The inbound frame shape the original connector sends decodes into typed records."""
    frame = frame_from_wire(
        {
            "type": "inbound",
            "event": {
                "text": "buffered",
                "message_type": "text",
                "source": {"platform": "discord", "chat_id": "c1", "chat_type": "dm"},
            },
            "bufferId": "buf-42",
        }
    )
    assert frame == Inbound(InboundEvent("buffered", source=SOURCE), buffer_id="buf-42")


def test_integer_platform_ids_are_normalised_to_str() -> None:
    """message/chat/user/thread/scope ids sent as JSON integers arrive as strings."""
    frame = frame_from_wire(
        {
            "type": "inbound",
            "event": {
                "text": "x",
                "message_id": 17,
                "reply_to_message_id": 16,
                "source": {
                    "platform": "telegram",
                    "chat_id": -100123,
                    "chat_type": "group",
                    "user_id": 42,
                    "thread_id": 7,
                    "scope_id": 123456789012345678901234,
                },
            },
        }
    )
    assert isinstance(frame, Inbound)
    event = frame.event
    assert (event.message_id, event.reply_to_message_id) == ("17", "16")
    assert (event.source.chat_id, event.source.user_id, event.source.thread_id) == (
        "-100123",
        "42",
        "7",
    )
    assert event.source.scope_id == "123456789012345678901234"
    result = frame_from_wire(
        {"type": "outbound_result", "requestId": "r", "result": {"success": True, "message_id": 5}}
    )
    assert isinstance(result, OutboundResult)
    assert result.result.message_id == "5"


def test_constructors_normalise_integer_ids_too() -> None:
    """Building records in Python with integer ids stores them as strings, like the wire does."""
    source = EventSource("telegram", 5, "dm", user_id=6, thread_id=7, scope_id=8)
    assert (source.chat_id, source.user_id, source.thread_id, source.scope_id) == (
        "5",
        "6",
        "7",
        "8",
    )
    assert InboundEvent("x", message_id=1, reply_to_message_id=2, source=source).message_id == "1"
    assert OutboundOutcome(True, message_id=9).message_id == "9"


@pytest.mark.parametrize("key", ["user_id", "thread_id", "scope_id"])
def test_booleans_are_not_ids(key: str) -> None:
    """A JSON boolean where an optional id belongs reads as absent, never as the id "True"."""
    source: dict[str, Any] = {"platform": "p", "chat_id": "c", "chat_type": "dm", key: True}
    frame = frame_from_wire({"type": "inbound", "event": {"text": "x", "source": source}})
    assert isinstance(frame, Inbound)
    assert getattr(frame.event.source, key) is None


def test_a_boolean_chat_id_makes_the_event_undeliverable() -> None:
    """A JSON boolean chat_id is no chat at all: the event is poison, naming the field."""
    source = {"platform": "p", "chat_id": True, "chat_type": "dm"}
    with pytest.raises(UndeliverableEvent) as caught:
        frame_from_wire({"type": "inbound", "event": {"text": "x", "source": source}})
    assert "event.source.chat_id" in caught.value.message


def test_null_is_the_same_as_absent() -> None:
    """JSON null for an optional key reads as None, and for a required key as missing_field."""
    frame = frame_from_wire(
        {
            "type": "inbound",
            "bufferId": None,
            "event": {"text": "x", "message_type": None, "source": SOURCE.to_wire()},
        }
    )
    assert frame == Inbound(InboundEvent("x", source=SOURCE))
    assert refused({"type": "inbound_ack", "bufferId": None}).code == "missing_field"


def test_unknown_keys_inside_known_frames_are_ignored() -> None:
    """Extra keys at any level of a known frame are dropped (forward compatibility)."""
    obj = wire(SAMPLE_FRAMES[12])
    obj["newTopLevel"] = {"x": 1}
    obj["event"]["attachments"] = [1, 2]
    obj["event"]["source"]["locale"] = "fr"
    assert frame_from_wire(obj) == SAMPLE_FRAMES[12]
    result = frame_from_wire(
        {"type": "outbound_result", "requestId": "r", "result": {"success": True, "raw": {}}}
    )
    assert result == OutboundResult("r", OutboundOutcome(True))


def test_unknown_type_returns_none() -> None:
    """A frame of an unknown type is not an error: frame_from_wire returns None."""
    assert frame_from_wire({"type": "presence", "status": "away"}) is None
    assert frame_from_wire({"type": ""}) is None


def test_missing_or_non_string_type_is_refused() -> None:
    """An object without a string type is a protocol error (missing_field / bad_field)."""
    assert refused({"requestId": "r"}).code == "missing_field"
    err = refused({"type": 3})
    assert (err.code, err.ref) == ("bad_field", None)
    assert refused({"type": ["hello"]}).code == "bad_field"


@pytest.mark.parametrize("obj", [[], "hello", 3, None, 1.5, True])
def test_a_non_object_is_not_an_object(obj: Any) -> None:
    """frame_from_wire refuses anything that is not a mapping with not_an_object."""
    assert refused(obj).code == "not_an_object"


def test_hello_without_protocol_is_an_original_gateway() -> None:
    """A hello without protocol/features (original contract) reads as protocol None, unannounced,
    and is written back exactly as the original writes it; ours announces protocol 1."""
    original = frame_from_wire({"type": "hello", "platform": "p", "botId": "b"})
    assert original == Hello("p", "b", protocol=None)
    assert isinstance(original, Hello)
    assert not original.announced
    assert original.to_wire() == {"type": "hello", "platform": "p", "botId": "b"}
    assert Hello("p", "b").protocol == CONTRACT_VERSION
    assert Hello("p", "b").announced


@pytest.mark.parametrize("raw", [0, -3, True, "8", 2.5, None])
def test_an_unusable_hello_window_reads_as_the_default(raw: object) -> None:
    """``window`` is our addition: a value we cannot use means "the connector's default", never a
    refused hello (the original reader never refused a hello over a field it did not know)."""
    hello = frame_from_wire(
        {"type": "hello", "platform": "p", "botId": "b", "protocol": 1, "window": raw}
    )
    assert isinstance(hello, Hello)
    assert hello.window is None
    assert "window" not in hello.to_wire()


def test_a_usable_hello_window_round_trips() -> None:
    hello = Hello("p", "b", window=64)
    assert hello.to_wire()["window"] == 64
    assert frame_from_wire(hello.to_wire()) == hello
    with pytest.raises((TypeError, ValueError)):
        Hello("p", "b", window=0)


# -- lenient inbound reading (the original reader's rules) ---------------------------------------


def test_inbound_is_read_as_leniently_as_the_original_reader() -> None:
    """A missing text is "", a forum chat is kept, a missing or unknown chat_type is dm, a
    message_type that is not text is "text", a missing platform is left for the receiver, and
    mistyped optional fields read as absent: none of these refuses the event."""
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"source": {"platform": "p", "chat_id": "c", "chat_type": "forum"}}, {"text": ""}),
        ({"text": "x", "source": {"platform": "p", "chat_id": "c"}}, {"chat_type": "dm"}),
        (
            {"text": "x", "source": {"platform": "p", "chat_id": "c", "chat_type": "space"}},
            {"chat_type": "dm"},
        ),
        ({"text": 1, "source": {"platform": "p", "chat_id": "c"}}, {"text": ""}),
        (
            {"text": "x", "message_type": 2, "source": {"chat_id": 7, "chat_type": "group"}},
            {"message_type": "text", "platform": "", "chat_id": "7", "chat_type": "group"},
        ),
        (
            {
                "text": "x",
                "message_id": 1.5,
                "source": {"platform": "p", "chat_id": "c", "user_name": 3, "thread_id": []},
            },
            {"message_id": None, "user_name": None, "thread_id": None},
        ),
    ]
    for event, expected in cases:
        frame = frame_from_wire({"type": "inbound", "event": event, "bufferId": "b-1"})
        assert isinstance(frame, Inbound), event
        assert frame.buffer_id == "b-1"
        got = {**attrs.asdict(frame.event.source), **attrs.asdict(frame.event, recurse=False)}
        for key, value in expected.items():
            assert got[key] == value, (event, key)


def test_media_urls_are_carried_and_read_leniently() -> None:
    """media_urls round-trips; a value that is not a list of URLs reads as no media."""
    event = InboundEvent("pic", source=SOURCE, media_urls=("https://x/1.png", "https://x/2.png"))
    assert event.to_wire()["media_urls"] == ["https://x/1.png", "https://x/2.png"]
    assert InboundEvent.from_wire(event.to_wire()) == event
    for garbage in ("https://x/1.png", 3, [1, None, ""], {"a": "b"}):
        wire = {**event.to_wire(), "media_urls": garbage}
        assert InboundEvent.from_wire(wire).media_urls == ()


@pytest.mark.parametrize(
    ("event", "field"),
    [
        (None, "event"),
        ("hi", "event"),
        ({"text": "x"}, "event.source"),
        ({"text": "x", "source": []}, "event.source"),
        ({"text": "x", "source": {"platform": "p", "chat_type": "dm"}}, "event.source.chat_id"),
        ({"text": "x", "source": {"platform": "p", "chat_id": ""}}, "event.source.chat_id"),
        ({"text": "x", "source": {"platform": "p", "chat_id": {"id": 1}}}, "event.source.chat_id"),
    ],
)
def test_an_unroutable_inbound_is_undeliverable_with_its_buffer_id(event: Any, field: str) -> None:
    """An inbound without a usable source.chat_id is poison: an UndeliverableEvent naming the
    field and carrying the bufferId (so it can be recorded and acked), never a plain violation."""
    obj: dict[str, Any] = {"type": "inbound", "bufferId": "b-7"}
    if event is not None:
        obj["event"] = event
    with pytest.raises(UndeliverableEvent) as caught:
        frame_from_wire(obj)
    err = caught.value
    assert (err.code, err.buffer_id, err.frame_type, err.ref) == (
        "undeliverable",
        "b-7",
        "inbound",
        "b-7",
    )
    assert repr(field) in err.message
    live = dict(obj)
    del live["bufferId"]
    with pytest.raises(UndeliverableEvent) as caught:
        frame_from_wire(live)
    assert caught.value.buffer_id is None


def test_a_malformed_original_delivery_is_undeliverable_too() -> None:
    """An interrupt_inbound or passthrough_forward that cannot be read is poison with its
    bufferId, like an inbound event; a bufferId of the wrong type is no bufferId at all."""
    for obj in (
        {"type": "interrupt_inbound", "chat_id": "c", "bufferId": "b-1"},
        {"type": "passthrough_forward", "forward": "x", "bufferId": "b-1"},
        {"type": "passthrough_forward", "forward": {"method": "POST"}, "bufferId": "b-1"},
    ):
        with pytest.raises(UndeliverableEvent) as caught:
            frame_from_wire(obj)
        assert caught.value.buffer_id == "b-1"
        assert caught.value.frame_type == obj["type"]
    with pytest.raises(UndeliverableEvent) as caught:
        frame_from_wire({"type": "inbound", "bufferId": 3, "event": {}})
    assert caught.value.buffer_id is None


def test_undeliverable_events_pickle_with_their_fields() -> None:
    """An UndeliverableEvent survives a process boundary with its bufferId, type and raw line."""
    err = UndeliverableEvent("no chat", "b-1", "passthrough_forward", raw_line='{"x":1}')
    back = pickle.loads(pickle.dumps(err))
    assert (back.message, back.buffer_id, back.frame_type, back.raw_line) == (
        "no chat",
        "b-1",
        "passthrough_forward",
        '{"x":1}',
    )


def test_interrupt_accepts_the_camel_case_spelling() -> None:
    """interrupt's documented key is session_key; sessionKey is tolerated on input."""
    assert frame_from_wire({"type": "interrupt", "sessionKey": "s"}) == Interrupt("s")
    both = {"type": "interrupt", "session_key": "a", "sessionKey": "b"}
    assert frame_from_wire(both) == Interrupt("a")
    err = refused({"type": "interrupt"})
    assert (err.code, err.ref) == ("missing_field", "interrupt")
    assert "session_key" in err.message


MISSING_CASES: list[tuple[dict[str, Any], str, str | None]] = [
    ({"type": "hello", "botId": "b"}, "platform", "hello"),
    ({"type": "hello", "platform": "p"}, "botId", "hello"),
    ({"type": "outbound", "action": {"op": "send"}}, "requestId", "outbound"),
    ({"type": "outbound", "requestId": "r9"}, "action", "r9"),
    ({"type": "outbound", "requestId": "r9", "action": {}}, "action.op", "r9"),
    ({"type": "inbound_ack"}, "bufferId", "inbound_ack"),
    ({"type": "descriptor"}, "descriptor", "descriptor"),
    ({"type": "outbound_result", "result": {"success": True}}, "requestId", "outbound_result"),
    ({"type": "outbound_result", "requestId": "r5"}, "result", "r5"),
    ({"type": "outbound_result", "requestId": "r5", "result": {}}, "result.success", "r5"),
    ({"type": "error", "message": "m"}, "code", "error"),
    ({"type": "error", "code": "c"}, "message", "error"),
]


@pytest.mark.parametrize(("obj", "field", "ref"), MISSING_CASES)
def test_missing_required_field_is_missing_field(
    obj: dict[str, Any], field: str, ref: str | None
) -> None:
    """A known frame without a required field is missing_field naming it (ref: requestId/type)."""
    err = refused(obj)
    assert err.code == "missing_field"
    assert repr(field) in err.message
    assert err.ref == ref


BAD_CASES: list[tuple[dict[str, Any], str, str | None]] = [
    ({"type": "hello", "platform": 1, "botId": "b"}, "platform", "hello"),
    ({"type": "hello", "platform": "p", "botId": ["b"]}, "botId", "hello"),
    ({"type": "hello", "platform": "p", "botId": "b", "protocol": "1"}, "protocol", "hello"),
    ({"type": "hello", "platform": "p", "botId": "b", "protocol": True}, "protocol", "hello"),
    ({"type": "hello", "platform": "p", "botId": "b", "features": "x"}, "features", "hello"),
    ({"type": "hello", "platform": "p", "botId": "b", "features": [1]}, "features", "hello"),
    ({"type": "outbound", "requestId": 7, "action": {"op": "send"}}, "requestId", "outbound"),
    ({"type": "outbound", "requestId": "r1", "action": ["op"]}, "action", "r1"),
    ({"type": "outbound", "requestId": "r1", "action": {"op": 3}}, "action.op", "r1"),
    ({"type": "outbound", "requestId": "r1", "action": {"op": ""}}, "action.op", "r1"),
    (
        {"type": "outbound", "requestId": "r1", "action": {"op": "s"}, "idempotencyKey": 1},
        "idempotencyKey",
        "r1",
    ),
    (
        {"type": "outbound", "requestId": "r1", "action": {"op": "s"}, "platform": False},
        "platform",
        "r1",
    ),
    ({"type": "outbound", "requestId": "r1", "action": {"op": "s"}, "botId": {}}, "botId", "r1"),
    ({"type": "inbound_ack", "bufferId": 42}, "bufferId", "inbound_ack"),
    ({"type": "going_idle", "requestId": 1}, "requestId", "going_idle"),
    ({"type": "going_idle_ack", "requestId": []}, "requestId", "going_idle_ack"),
    ({"type": "interrupt", "session_key": 5}, "session_key", "interrupt"),
    ({"type": "interrupt", "session_key": "s", "reason": 5}, "reason", "interrupt"),
    ({"type": "descriptor", "descriptor": "x"}, "descriptor", "descriptor"),
    ({"type": "outbound_result", "requestId": 1, "result": {}}, "requestId", "outbound_result"),
    ({"type": "outbound_result", "requestId": "r2", "result": True}, "result", "r2"),
    (
        {"type": "outbound_result", "requestId": "r2", "result": {"success": "yes"}},
        "result.success",
        "r2",
    ),
    (
        {"type": "outbound_result", "requestId": "r2", "result": {"success": 1}},
        "result.success",
        "r2",
    ),
    (
        {"type": "outbound_result", "requestId": "r2", "result": {"success": True, "error": 5}},
        "result.error",
        "r2",
    ),
    (
        {"type": "outbound_result", "requestId": "r2", "result": {"success": True, "code": {}}},
        "result.code",
        "r2",
    ),
    ({"type": "error", "code": 1, "message": "m"}, "code", "error"),
    ({"type": "error", "code": "c", "message": "m", "ref": 3}, "ref", "error"),
]


@pytest.mark.parametrize(("obj", "field", "ref"), BAD_CASES)
def test_wrong_field_type_is_bad_field(obj: dict[str, Any], field: str, ref: str | None) -> None:
    """A known frame with a mistyped field raises bad_field naming it, ref = requestId or type."""
    err = refused(obj)
    assert err.code == "bad_field"
    assert repr(field) in err.message
    assert err.ref == ref


def test_error_messages_name_types_but_never_echo_values() -> None:
    """A bad_field message says the wrong type, not the (possibly huge or secret) value."""
    err = refused({"type": "inbound_ack", "bufferId": ["s3cr3t-value"]})
    assert "list" in err.message
    assert "s3cr3t" not in str(err)


def test_descriptor_errors_surface_through_frame_from_wire() -> None:
    """A descriptor of another contract version raises ContractVersionError, a ProtocolError."""
    obj = wire(DescriptorFrame(DESCRIPTOR))
    obj["descriptor"]["contract_version"] = 2
    err = refused(obj)
    assert isinstance(err, ContractVersionError)
    assert (err.code, err.ref, err.expected, err.received) == (
        "contract_version",
        "descriptor",
        1,
        2,
    )


def test_frame_from_wire_accepts_any_mapping() -> None:
    """A non-dict Mapping (e.g. a MappingProxy) decodes like a dict, nested objects included."""
    obj = wire(SAMPLE_FRAMES[14])
    obj["result"] = MappingProxyType(obj["result"])
    assert frame_from_wire(MappingProxyType(obj)) == SAMPLE_FRAMES[14]


def test_records_decode_on_their_own() -> None:
    """OutboundOutcome/EventSource/InboundEvent.from_wire parse a bare object with the given ref."""
    assert OutboundOutcome.from_wire({"success": True}) == OutboundOutcome(True)
    assert EventSource.from_wire(FULL_SOURCE.to_wire()) == FULL_SOURCE
    event = InboundEvent("x", source=SOURCE)
    assert InboundEvent.from_wire(event.to_wire()) == event
    with pytest.raises(ProtocolError) as info:
        InboundEvent.from_wire({"text": "x"}, ref="persisted")
    assert (info.value.code, info.value.ref) == ("missing_field", "persisted")
    with pytest.raises(ProtocolError) as info:
        EventSource.from_wire([], ref="r")  # type: ignore[arg-type]
    assert info.value.code == "not_an_object"


def mutations(obj: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """Every (container, key) pair of ``obj`` and its nested objects."""
    found: list[tuple[dict[str, Any], str]] = []
    for key, value in obj.items():
        found.append((obj, key))
        if isinstance(value, dict):
            found.extend(mutations(value))
    return found


@settings(max_examples=400)
@given(frames, st.data())
def test_corrupted_frames_are_refused_or_decoded_valid(frame: Frame, data: st.DataObject) -> None:
    """Corrupting any key of a valid frame gives a ProtocolError or a fully valid frame, never a
    crash or a frame holding a wrongly typed value (the trusted constructors stay honest)."""
    obj = wire(frame)
    container, key = data.draw(st.sampled_from(mutations(obj)))
    if data.draw(st.booleans()):
        del container[key]
    else:
        container[key] = data.draw(json_values)
    code: str | None = None
    try:
        result = frame_from_wire(obj)
    except ProtocolError as err:
        code = err.code
    else:
        if result is not None:
            validate_deep(result)
    assert code in {None, "missing_field", "bad_field", "contract_version", "undeliverable"}


# -- local validation (constructors) ------------------------------------------------------------


LOCAL_ERRORS: list[tuple[Any, type[Exception]]] = [
    (lambda: Hello(1, "b"), TypeError),  # type: ignore[arg-type]
    (lambda: Hello("p", "b", protocol="1"), TypeError),  # type: ignore[arg-type]
    (lambda: Hello("p", "b", protocol=True), TypeError),
    (lambda: Hello("p", "b", features="abc"), TypeError),
    (lambda: Hello("p", "b", features=[1]), TypeError),  # type: ignore[list-item]
    (lambda: Outbound("r", {"text": "no op"}), ValueError),
    (lambda: Outbound("r", {"op": ""}), ValueError),
    (lambda: Outbound("r", ["op"]), TypeError),  # type: ignore[arg-type]
    (lambda: Outbound(1, {"op": "send"}), TypeError),  # type: ignore[arg-type]
    (lambda: Outbound("r", {"op": "send"}, idempotency_key=1), TypeError),  # type: ignore[arg-type]
    (lambda: InboundAck(None), TypeError),  # type: ignore[arg-type]
    (lambda: GoingIdle(1), TypeError),  # type: ignore[arg-type]
    (lambda: Interrupt(None), TypeError),  # type: ignore[arg-type]
    (lambda: DescriptorFrame({"contract_version": 1}), TypeError),  # type: ignore[arg-type]
    (lambda: Inbound({"text": "x"}), TypeError),  # type: ignore[arg-type]
    (lambda: Inbound(InboundEvent("x", source=SOURCE), buffer_id=1), TypeError),  # type: ignore[arg-type]
    (lambda: OutboundResult("r", {"success": True}), TypeError),  # type: ignore[arg-type]
    (lambda: OutboundOutcome("yes"), TypeError),  # type: ignore[arg-type]
    (lambda: OutboundOutcome(True, message_id=True), TypeError),
    (lambda: EventSource("p", "c", "dms"), ValueError),  # type: ignore[arg-type]
    (lambda: EventSource("p", None, "dm"), TypeError),  # type: ignore[arg-type]
    (lambda: EventSource("p", "c", "dm", user_id=1.5), TypeError),  # type: ignore[arg-type]
    (lambda: InboundEvent(None, source=SOURCE), TypeError),  # type: ignore[arg-type]
    (lambda: InboundEvent("x", source=None), TypeError),  # type: ignore[arg-type]
    (lambda: ErrorFrame("c", None), TypeError),  # type: ignore[arg-type]
    (lambda: GoingIdleAck(3), TypeError),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("build", "error"), LOCAL_ERRORS)
def test_building_a_frame_with_bad_values_is_a_local_error(
    build: Any, error: type[Exception]
) -> None:
    """Constructors refuse bad values with TypeError/ValueError, never with ProtocolError."""
    with pytest.raises(error):
        build()


def test_outbound_keeps_a_private_copy_of_its_action() -> None:
    """Mutating the caller's action dict after building (or decoding) does not change the frame."""
    action = {"op": "send", "content": "a"}
    frame = Outbound("r", action)
    action["content"] = "b"
    assert frame.action["content"] == "a"
    obj: dict[str, Any] = {
        "type": "outbound",
        "requestId": "r",
        "action": {"op": "send", "content": "a"},
    }
    decoded = frame_from_wire(obj)
    obj["action"]["content"] = "b"
    assert isinstance(decoded, Outbound)
    assert decoded.action["content"] == "a"


def test_outbound_is_hashable_despite_its_dict_action() -> None:
    """Outbound hashes by its other fields (the action dict is excluded from the hash only)."""
    a = Outbound("r", {"op": "send"})
    b = Outbound("r", {"op": "edit"})
    assert hash(a) == hash(b)
    assert a != b


def test_descriptor_frame_keeps_legacy_ops_default() -> None:
    """A descriptor frame without supported_ops reads with the legacy op set."""
    obj = wire(DescriptorFrame(DESCRIPTOR))
    del obj["descriptor"]["supported_ops"]
    frame = frame_from_wire(obj)
    assert isinstance(frame, DescriptorFrame)
    assert frame.descriptor.supported_ops == LEGACY_OPS


def test_outcome_declined_flags_the_tenant_guard_refusal() -> None:
    """OutboundOutcome.declined is True exactly for code egress_declined."""
    assert OutboundOutcome(False, code=EGRESS_DECLINED).declined
    assert not OutboundOutcome(False, code="rate_limited").declined
    assert not OutboundOutcome(True).declined


@pytest.mark.parametrize("frame", SAMPLE_FRAMES, ids=lambda f: type(f).__name__)
def test_frames_pickle(frame: Frame) -> None:
    """Frames (decoded ones included) survive pickling, e.g. to cross a process boundary."""
    decoded = frame_from_wire(wire(frame))
    assert pickle.loads(pickle.dumps(decoded)) == frame

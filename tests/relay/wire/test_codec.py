"""Tests for relay.wire.codec (encode, FrameDecoder, error_frame_for) and relay errors."""

from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.wire.codec import (
    DEFAULT_MAX_FRAME_BYTES,
    FrameDecoder,
    ack_lines,
    buffered_inbound_line,
    decode_event,
    encode,
    encode_event,
    error_frame_for,
    plain_acks,
)
from relay.wire.errors import (
    AuthError,
    ContractVersionError,
    ProtocolError,
    RelayBroken,
    RelayClosed,
)
from relay.wire.frames import (
    ErrorFrame,
    EventSource,
    Frame,
    GoingIdle,
    GoingIdleAck,
    Inbound,
    InboundAck,
    InboundEvent,
    Outbound,
    OutboundOutcome,
    OutboundResult,
)
from statecore.errors import StatecoreError
from tests.relay.wire.frame_samples import SAMPLE_FRAMES, frames

A = InboundAck("buf-1")
B = OutboundResult("r1", OutboundOutcome(True, message_id="m1"))
C = GoingIdleAck("r2")
LINE_A = encode(A)
LINE_B = encode(B)


def codes(items: list[Frame | ProtocolError]) -> list[str]:
    """Each item's frame type, or ``!code`` for a ProtocolError."""
    return [f"!{i.code}" if isinstance(i, ProtocolError) else i.TYPE for i in items]


# -- encode --------------------------------------------------------------------------------------


def test_encode_is_compact_json_plus_newline() -> None:
    """encode writes one compact JSON object (no spaces) terminated by exactly one newline."""
    assert encode(A) == '{"type":"inbound_ack","bufferId":"buf-1"}\n'
    assert encode(GoingIdle()) == '{"type":"going_idle"}\n'


def test_encode_keeps_non_ascii_text() -> None:
    """encode does not escape non-ASCII characters (ensure_ascii=False)."""
    line = encode(Outbound("r", {"op": "send", "content": "héllo 🎉"}))
    assert "héllo 🎉" in line
    assert "\\u" not in line


def test_encode_escapes_newlines_inside_strings() -> None:
    """A newline inside a value is escaped, so one frame is always exactly one line."""
    line = encode(Outbound("r", {"op": "send", "content": "a\nb\r\n"}))
    assert line.count("\n") == 1
    assert line.endswith("\n")


@pytest.mark.parametrize("frame", SAMPLE_FRAMES, ids=lambda f: type(f).__name__)
def test_every_frame_round_trips_through_the_codec(frame: Frame) -> None:
    """encode then FrameDecoder.feed gives back exactly the frame, for every frame type."""
    assert FrameDecoder().feed(encode(frame)) == [frame]
    assert FrameDecoder().feed(encode(frame).encode("utf-8")) == [frame]


def test_encode_refuses_what_json_cannot_carry() -> None:
    """Non-frames, unserialisable action values and NaN are local errors, raised by encode."""
    with pytest.raises(TypeError):
        encode({"type": "going_idle"})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode(Outbound("r", {"op": "send", "when": object()}))
    with pytest.raises(ValueError, match="JSON"):
        encode(Outbound("r", {"op": "send", "x": float("nan")}))


def test_encode_enforces_the_peers_frame_limit() -> None:
    """encode(max_frame_bytes=n) refuses a line whose UTF-8 size exceeds n bytes."""
    frame = Outbound("r", {"op": "send", "content": "é" * 10})
    size = len(encode(frame).encode()) - 1
    assert encode(frame, max_frame_bytes=size) == encode(frame)
    with pytest.raises(ValueError, match=str(size)):
        encode(frame, max_frame_bytes=size - 1)


# -- decoder: framing ----------------------------------------------------------------------------


def test_several_lines_in_one_message() -> None:
    """One message carrying several lines yields every frame, in order."""
    assert FrameDecoder().feed(LINE_A + LINE_B + encode(C)) == [A, B, C]


def test_blank_lines_are_ignored() -> None:
    """Empty and whitespace-only lines (CRLF included) produce nothing."""
    decoder = FrameDecoder()
    assert decoder.feed("\n\n  \n\r\n" + LINE_A + "\t\n") == [A]
    assert decoder.ignored == 0


def test_crlf_terminated_lines_decode() -> None:
    """A line ending in \\r\\n decodes like one ending in \\n."""
    assert FrameDecoder().feed(LINE_A.replace("\n", "\r\n")) == [A]


def test_a_line_split_across_messages_is_reassembled() -> None:
    """A partial tail is buffered until its newline arrives in a later message."""
    decoder = FrameDecoder()
    assert decoder.feed(LINE_A[:10]) == []
    assert decoder.buffered_bytes == 10
    assert decoder.feed(LINE_A[10:20]) == []
    assert decoder.feed(LINE_A[20:] + LINE_B[:5]) == [A]
    assert decoder.feed(LINE_B[5:]) == [B]
    assert decoder.buffered_bytes == 0


def test_two_frames_split_at_every_position_as_text() -> None:
    """Splitting a two-frame text message at every character position yields both frames."""
    stream = LINE_A + encode(Outbound("r", {"op": "send", "content": "ünïcødé ✓ 🎉"}))
    expected = FrameDecoder().feed(stream)
    assert len(expected) == 2
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder()
        assert decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) == expected, cut


def test_two_frames_split_at_every_byte_position() -> None:
    """Splitting a two-frame binary message at every byte (inside UTF-8 sequences too) works."""
    stream = (LINE_A + encode(Outbound("r", {"op": "send", "content": "ünïcødé ✓ 🎉"}))).encode()
    expected = FrameDecoder().feed(stream)
    assert len(expected) == 2
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder()
        assert decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) == expected, cut


def test_mixed_text_and_binary_messages_share_one_buffer() -> None:
    """A line started in a text message may end in a binary one and vice versa."""
    decoder = FrameDecoder()
    raw = LINE_B.encode()
    assert decoder.feed(LINE_A[:7]) == []
    assert decoder.feed(LINE_A[7:].encode() + raw[:9]) == [A]
    assert decoder.feed(LINE_B[9:]) == [B]
    assert decoder.feed(bytearray(raw[:4])) == []
    assert decoder.feed(memoryview(raw[4:])) == [B]


@settings(max_examples=200)
@given(st.lists(frames, min_size=1, max_size=6), st.data())
def test_any_chunking_decodes_to_the_same_frames(
    frames_in: list[Frame], data: st.DataObject
) -> None:
    """However a stream of valid frames is cut into messages (text or bytes), the decoded
    frames are the same, in the same order."""
    text = "".join(encode(f) for f in frames_in)
    binary = data.draw(st.booleans())
    stream: str | bytes = text.encode() if binary else text
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    decoder = FrameDecoder()
    decoded: list[Frame | ProtocolError] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        decoded += decoder.feed(stream[start:end])
    assert decoded == frames_in
    assert decoder.buffered_bytes == 0


def test_flush_decodes_an_unterminated_last_line() -> None:
    """flush() decodes a buffered line that never got its newline, and empties the decoder."""
    decoder = FrameDecoder()
    assert decoder.feed(LINE_A + LINE_B[:-1]) == [A]
    assert decoder.flush() == [B]
    assert decoder.flush() == []
    assert decoder.feed(LINE_A) == [A]


# -- decoder: bad lines never lose good ones -----------------------------------------------------


def test_malformed_json_yields_an_error_between_good_frames() -> None:
    """A line that is not JSON yields one malformed_json error; the frames around it survive."""
    items = FrameDecoder().feed(LINE_A + '{"type": "inbound_ack", bufferId}\n' + LINE_B)
    assert codes(items) == ["inbound_ack", "!malformed_json", "outbound_result"]
    err = items[1]
    assert isinstance(err, ProtocolError)
    assert err.ref is None


@pytest.mark.parametrize(
    "line",
    [
        "[1, 2]",
        '"inbound_ack"',
        "42",
        "null",
        "true",
    ],
)
def test_a_line_that_is_not_an_object_is_refused(line: str) -> None:
    """A valid JSON line that is not an object yields not_an_object; decoding continues."""
    assert codes(FrameDecoder().feed(line + "\n" + LINE_A)) == ["!not_an_object", "inbound_ack"]


@pytest.mark.parametrize(
    "line",
    [
        "{",
        "{'type': 'going_idle'}",
        '{"type":"going_idle"} trailing',
        '{"type":"going_idle","x":NaN}',
        '{"type":"going_idle","x":-Infinity}',
        '{"type":"going_idle","x":' + "9" * 5000 + "}",
        "[" * 100_000 + "]" * 100_000,
        "\ufeff" + '{"type":"going_idle"}',
    ],
    ids=["open", "single-quotes", "trailing", "nan", "infinity", "huge-int", "deep", "bom"],
)
def test_invalid_json_variants_are_malformed(line: str) -> None:
    """Truncated, non-standard (NaN, BOM), over-long-integer and pathologically deep JSON is
    malformed_json, never an exception."""
    assert codes(FrameDecoder().feed(line + "\n" + LINE_A)) == ["!malformed_json", "inbound_ack"]


def test_wrong_field_types_yield_bad_field_with_ref() -> None:
    """A known frame with a mistyped field yields bad_field naming its requestId; others survive."""
    bad = '{"type":"outbound_result","requestId":"r9","result":{"success":"yes"}}\n'
    items = FrameDecoder().feed(LINE_A + bad + LINE_B)
    assert codes(items) == ["inbound_ack", "!bad_field", "outbound_result"]
    err = items[1]
    assert isinstance(err, ProtocolError)
    assert err.ref == "r9"


def test_missing_field_yields_missing_field() -> None:
    """A known frame without a required field yields missing_field."""
    assert codes(FrameDecoder().feed('{"type":"inbound_ack"}\n')) == ["!missing_field"]


def test_unknown_types_are_skipped_and_counted() -> None:
    """Frames of an unknown type yield nothing and increase decoder.ignored."""
    decoder = FrameDecoder()
    items = decoder.feed('{"type":"presence"}\n' + LINE_A + '{"type":"typing_v2","x":1}\n')
    assert items == [A]
    assert decoder.ignored == 2


def test_contract_version_error_is_returned_not_raised() -> None:
    """A descriptor of another contract version comes back as a ContractVersionError item."""
    line = json.dumps({"type": "descriptor", "descriptor": {"contract_version": 3}}) + "\n"
    items = FrameDecoder().feed(line + LINE_A)
    assert isinstance(items[0], ContractVersionError)
    assert items[1:] == [A]


def test_invalid_utf8_is_malformed_for_that_line_only() -> None:
    """Invalid UTF-8 in a binary message is malformed_json for its line; other lines decode."""
    items = FrameDecoder().feed(LINE_A.encode() + b'{"type":"\xff\xfe"}\n' + LINE_B.encode())
    assert codes(items) == ["inbound_ack", "!malformed_json", "outbound_result"]


def test_feed_refuses_non_text_input() -> None:
    """feed() raises TypeError for anything but str or bytes-like (a local error)."""
    with pytest.raises(TypeError):
        FrameDecoder().feed(123)  # type: ignore[arg-type]


# -- decoder: size limits ------------------------------------------------------------------------


def padded(size: int) -> str:
    """A valid going_idle line of exactly ``size`` bytes, without its newline."""
    head = '{"type":"going_idle","pad":"'
    line = head + "x" * (size - len(head) - 2) + '"}'
    assert len(line) == size
    return line


def test_default_limit_is_one_mebibyte() -> None:
    """The default max_frame_bytes is 1 MiB, and the buffer limit defaults to it."""
    decoder = FrameDecoder()
    assert decoder.max_frame_bytes == DEFAULT_MAX_FRAME_BYTES == 1_048_576
    assert decoder.max_buffer_bytes == DEFAULT_MAX_FRAME_BYTES


def test_a_line_at_the_limit_passes_and_one_byte_more_is_too_large() -> None:
    """A complete line of exactly max_frame_bytes decodes; one byte longer is frame_too_large."""
    decoder = FrameDecoder(max_frame_bytes=100)
    assert decoder.feed(padded(100) + "\n") == [GoingIdle()]
    assert codes(decoder.feed(padded(101) + "\n" + LINE_A)) == ["!frame_too_large", "inbound_ack"]


def test_the_limit_counts_utf8_bytes_not_characters() -> None:
    """A non-ASCII line under the limit in characters but over it in UTF-8 bytes is too large."""
    head = '{"type":"going_idle","pad":"'
    line = head + "é" * 40 + '"}'  # 70 characters, 110 bytes
    assert codes(FrameDecoder(max_frame_bytes=100).feed(line + "\n")) == ["!frame_too_large"]
    assert FrameDecoder(max_frame_bytes=110).feed(line + "\n") == [GoingIdle()]
    assert codes(FrameDecoder(max_frame_bytes=100).feed((line + "\n").encode())) == [
        "!frame_too_large"
    ]


def test_oversized_partial_line_yields_one_error_and_is_discarded_to_its_newline() -> None:
    """A tail growing past the limit across feeds gives exactly one frame_too_large, the rest of
    that line is dropped, and decoding resumes after its newline."""
    decoder = FrameDecoder(max_frame_bytes=100)
    big = padded(300)
    assert decoder.feed(LINE_A + big[:60]) == [A]
    assert codes(decoder.feed(big[60:120])) == ["!frame_too_large"]
    assert decoder.buffered_bytes == 0
    assert decoder.feed(big[120:200]) == []
    assert decoder.feed(big[200:] + "\n" + LINE_B[:10]) == []
    assert decoder.feed(LINE_B[10:]) == [B]


def test_oversized_tail_in_a_single_message_is_reported_at_once() -> None:
    """An unterminated tail already over the limit in one message is reported immediately."""
    decoder = FrameDecoder(max_frame_bytes=100)
    assert codes(decoder.feed(LINE_A + padded(150))) == ["inbound_ack", "!frame_too_large"]
    assert decoder.feed("still the same line\n" + LINE_A) == [A]


def test_oversized_line_split_across_binary_messages() -> None:
    """The tail bound also holds for bytes input, and recovery works after the newline."""
    decoder = FrameDecoder(max_frame_bytes=64)
    data = (padded(200) + "\n" + LINE_A).encode()
    items: list[Frame | ProtocolError] = []
    for i in range(0, len(data), 16):
        items += decoder.feed(data[i : i + 16])
    assert codes(items) == ["!frame_too_large", "inbound_ack"]


def test_tail_exactly_at_the_limit_is_kept() -> None:
    """An unterminated tail of exactly the limit is buffered, not reported."""
    decoder = FrameDecoder(max_frame_bytes=100)
    assert decoder.feed(padded(100)) == []
    assert decoder.buffered_bytes == 100
    assert decoder.feed("\n") == [GoingIdle()]


def test_tail_one_byte_over_the_limit_is_reported() -> None:
    """An unterminated tail of limit + 1 bytes (in one or several messages) is frame_too_large."""
    assert codes(FrameDecoder(max_frame_bytes=100).feed(padded(101))) == ["!frame_too_large"]
    decoder = FrameDecoder(max_frame_bytes=100)
    assert decoder.feed(padded(101)[:100]) == []
    assert codes(decoder.feed("x")) == ["!frame_too_large"]


def test_a_smaller_buffer_limit_reports_buffer_overflow() -> None:
    """With max_buffer_bytes below max_frame_bytes, a long split line is buffer_overflow while
    the same line in one message still decodes."""
    decoder = FrameDecoder(max_frame_bytes=200, max_buffer_bytes=50)
    line = padded(150)
    assert codes(decoder.feed(line[:40])) == []
    assert codes(decoder.feed(line[40:80])) == ["!buffer_overflow"]
    assert decoder.feed(line[80:] + "\n") == []
    assert decoder.feed(line + "\n") == [GoingIdle()]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_frame_bytes": 0}, ValueError),
        ({"max_frame_bytes": -1}, ValueError),
        ({"max_frame_bytes": 1.5}, TypeError),
        ({"max_frame_bytes": True}, TypeError),
        ({"max_buffer_bytes": 0}, ValueError),
        ({"max_buffer_bytes": "10"}, TypeError),
    ],
)
def test_decoder_limits_are_validated(kwargs: dict[str, object], error: type[Exception]) -> None:
    """FrameDecoder refuses non-positive or non-integer limits."""
    with pytest.raises(error):
        FrameDecoder(**kwargs)  # type: ignore[arg-type]


# -- error_frame_for -----------------------------------------------------------------------------


def test_error_frame_for_copies_code_message_and_ref() -> None:
    """error_frame_for builds the error frame that answers a ProtocolError."""
    err = ProtocolError("bad_field", "field 'x' must be a string", "r1")
    assert error_frame_for(err) == ErrorFrame("bad_field", "field 'x' must be a string", "r1")
    assert error_frame_for(ProtocolError("malformed_json", "nope")).ref is None
    with pytest.raises(TypeError):
        error_frame_for(ValueError("x"))  # type: ignore[arg-type]


def test_decoder_errors_answer_as_decodable_error_frames() -> None:
    """Every ProtocolError the decoder yields encodes to an error frame the peer can decode."""
    items = FrameDecoder(max_frame_bytes=64).feed("{\n[]\n" + padded(80) + "\n")
    for item in items:
        assert isinstance(item, ProtocolError)
        frame = error_frame_for(item)
        assert FrameDecoder().feed(encode(frame)) == [frame]


def test_decoding_many_frames_is_sane() -> None:
    """A large batch (10k frames in one message) decodes fully; a sanity check, no timing."""
    batch = "".join(encode(OutboundResult(f"r{i}", OutboundOutcome(True))) for i in range(10_000))
    items = FrameDecoder().feed(batch)
    assert len(items) == 10_000
    assert items[-1] == OutboundResult("r9999", OutboundOutcome(True))


# -- the error classes ---------------------------------------------------------------------------


def test_error_hierarchy_says_who_is_to_blame() -> None:
    """All relay errors are StatecoreErrors; ContractVersionError is a ProtocolError; closed
    (we did it) and broken (the world did it) are distinct."""
    for cls in (ProtocolError, ContractVersionError, RelayClosed, RelayBroken, AuthError):
        assert issubclass(cls, StatecoreError)
    assert issubclass(ContractVersionError, ProtocolError)
    assert not issubclass(RelayClosed, RelayBroken)
    assert not issubclass(RelayBroken, RelayClosed)
    assert not issubclass(ProtocolError, ValueError)


@pytest.mark.parametrize(
    "err",
    [
        ProtocolError("bad_field", "field 'x' must be a string", "r1"),
        ProtocolError("malformed_json", "line is not valid JSON"),
        ContractVersionError(1, 2),
        RelayClosed(),
        RelayClosed("closed by disconnect()"),
        RelayBroken(),
        RelayBroken("lost", code=1006, reason="abnormal"),
        AuthError("expired", "token expired at 5"),
    ],
    ids=repr,
)
def test_errors_pickle_with_their_attributes(err: Exception) -> None:
    """Every relay error survives pickling with its class, attributes and message."""
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is type(err)
    assert str(copy) == str(err)
    assert vars(copy) == vars(err)


def test_protocol_error_attributes_and_message() -> None:
    """ProtocolError exposes code/message/ref and shows them in str()."""
    err = ProtocolError("frame_too_large", "line of 9 bytes exceeds 8 bytes", "r1")
    assert (err.code, err.message, err.ref) == (
        "frame_too_large",
        "line of 9 bytes exceeds 8 bytes",
        "r1",
    )
    assert str(err) == "frame_too_large: line of 9 bytes exceeds 8 bytes (ref 'r1')"


def test_relay_broken_carries_the_close_code() -> None:
    """RelayBroken keeps the close code and reason and mentions them."""
    err = RelayBroken("lost", code=4400, reason="protocol")
    assert (err.code, err.reason) == (4400, "protocol")
    assert "4400" in str(err)


@given(st.text(max_size=40))
def test_ack_line_is_exactly_the_encoded_inbound_ack(buffer_id: str) -> None:
    # The transport writes acks without building frames; they must be byte-identical to the
    # codec's encoding, escapes included (quotes, backslashes, control and non-ASCII chars).
    assert ack_lines([buffer_id]) == encode(InboundAck(buffer_id))


@pytest.mark.parametrize("buffer_id", ["b1", 'quo"te', "back\\slash", "tab\there", "é", "\x7f"])
def test_ack_line_round_trips_through_the_decoder(buffer_id: str) -> None:
    (frame,) = FrameDecoder().feed(ack_lines([buffer_id]))
    assert frame == InboundAck(buffer_id)


@given(st.lists(st.from_regex(r"[A-Za-z0-9_.:-]{1,128}", fullmatch=True), min_size=1, max_size=5))
def test_plain_acks_reads_exactly_what_the_decoder_reads(buffer_ids: list[str]) -> None:
    """plain_acks takes a message of canonical acks to the same bufferIds the decoder reads."""
    message = ack_lines(buffer_ids)
    assert plain_acks(message) == buffer_ids
    decoded = FrameDecoder().feed(message)
    assert [f.buffer_id for f in decoded if isinstance(f, InboundAck)] == buffer_ids


@pytest.mark.parametrize(
    "message",
    [
        '{"type":"inbound_ack","bufferId":"a"}',  # no newline: not a complete line
        '{"type":"inbound_ack", "bufferId":"a"}\n',  # not the canonical form
        '{"type":"inbound_ack","bufferId":"a\\"b"}\n',  # an id that needs escaping
        '{"type":"going_idle"}\n',
        b'{"type":"inbound_ack","bufferId":"a"}\n',
    ],
)
def test_plain_acks_refuses_anything_else(message: object) -> None:
    """Anything but canonical ack lines of plain ids is left to the decoder (None)."""
    assert plain_acks(message) is None


@given(st.text(max_size=40), st.text(min_size=1, max_size=20))
def test_a_buffered_inbound_line_is_the_encoded_inbound(text: str, buffer_id: str) -> None:
    """buffered_inbound_line from the stored event JSON is byte-equal to encode(Inbound)."""
    event = InboundEvent(text, source=EventSource("p", "c1", "dm"))
    line = buffered_inbound_line(buffer_id, encode_event(event.to_wire()))
    assert line == encode(Inbound(event, buffer_id))


def test_a_kept_event_reads_back_as_it_was_written() -> None:
    """decode_event is encode_event's inverse for an event's wire form."""
    source = EventSource("loopback", "c1", "dm")
    event = InboundEvent("héllo \u2028", source=source, message_id="m1")
    assert decode_event(encode_event(event.to_wire())) == event


@pytest.mark.parametrize("text", ["not json", "NaN", '{"source": 1}', "[]"])
def test_a_kept_event_that_is_not_one_is_refused(text: str) -> None:
    """Text that is not an event's JSON raises (ValueError or ProtocolError), never returns."""
    with pytest.raises((ValueError, ProtocolError)):
        decode_event(text)

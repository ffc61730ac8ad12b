"""The sans-I/O codec of the relay: frames -> text, and WebSocket messages -> frames.

No sockets here. The transport hands every received message to :meth:`FrameDecoder.feed` and gets
back, in order, the frames it carried and a :class:`~relay.wire.errors.ProtocolError` *object*
for every bad line (never raised: one bad line never loses the good ones around it). It sends
``encode(frame)`` as one text message.

Framing rules (docs/wire-contract.md): one JSON object + ``"\\n"`` per line;
a message may carry several lines, and a line may be split across messages; blank lines are
ignored; a line longer than the maximum, a line that is not a JSON object, and a known frame with
wrong field types are protocol errors; an unknown ``type`` is skipped (``FrameDecoder.ignored``).
A delivery the gateway can never handle comes back as an
:class:`~relay.wire.errors.UndeliverableEvent` (a ProtocolError) carrying its bufferId and the
raw line, so the receiver can settle it.

The codec is on the hot path of every frame; ``benchmarks/bench_relay.py`` measures the
transport through it against raw ``websockets``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from relay.wire.errors import ProtocolError, UndeliverableEvent
from relay.wire.frames import (
    CONNECTOR_TO_GATEWAY,
    GATEWAY_TO_CONNECTOR,
    ErrorFrame,
    Frame,
    InboundEvent,
    frame_from_wire,
)

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "PLAIN_ACK_LINE_MAX",
    "FrameDecoder",
    "ack_lines",
    "buffered_inbound_line",
    "decode_event",
    "encode",
    "encode_event",
    "error_frame_for",
    "plain_acks",
    "with_traceparent",
]

DEFAULT_MAX_FRAME_BYTES: Final = 1_048_576
"""The default largest line (in UTF-8 bytes, without its newline) a decoder accepts: 1 MiB."""

_FRAME_CLASSES: Final = GATEWAY_TO_CONNECTOR | CONNECTOR_TO_GATEWAY


def _refuse_constant(name: str) -> Any:
    # NaN / Infinity are not JSON; a peer sending them is malformed, not "close enough".
    raise ValueError(f"{name} is not valid JSON")


# One encoder/decoder each, built once: json.dumps/json.loads with arguments would rebuild them
# per call (measurably slower on the hot path). Both use the C accelerators.
_ENCODE: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
_DECODE: Final = _DECODER.decode
_RAW_DECODE: Final = _DECODER.raw_decode


def encode(frame: Frame, *, max_frame_bytes: int | None = None) -> str:
    """Return ``frame`` as one wire line: compact JSON (non-ASCII kept as is) plus ``"\\n"``.

    Send the result as one WebSocket text message. Pass the peer's ``max_frame_bytes`` (from its
    descriptor) to refuse, before sending, a line the peer would drop.

    Raises ``TypeError`` when ``frame`` is not a frame or an ``Outbound.action`` holds a value
    JSON cannot represent, ``ValueError`` for NaN/infinite floats in an action or a line longer
    than ``max_frame_bytes`` UTF-8 bytes. Nothing is sent or changed on failure.
    """
    if type(frame) not in _FRAME_CLASSES:
        raise TypeError(f"encode() takes a relay frame, got {type(frame).__name__}")
    line = _ENCODE(frame.to_wire())
    if max_frame_bytes is not None and _utf8_len(line) > max_frame_bytes:
        raise ValueError(
            f"{frame.TYPE} frame is {_utf8_len(line)} bytes, the peer accepts {max_frame_bytes}"
        )
    return line + "\n"


# -- fast paths of the hot frames ----------------------------------------------------------------
#
# The three frames of the inbound hot path are written (and the ack read) without building frame
# objects.  They live here, beside encode() and the decoder, so the wire is written and read in
# one module; the tests pin each one byte-equal to encode() and to the decoder's reading.


def ack_lines(buffer_ids: list[str]) -> str:
    """``encode(InboundAck(b))`` for every bufferId, concatenated: one message of acks (the
    framing lets a sender batch lines).  Raises nothing."""
    return "".join(_ack_line(b) for b in buffer_ids)


def _ack_line(buffer_id: str) -> str:
    # Printable ASCII without a quote or backslash needs no escaping: the common case, cheaply.
    plain = buffer_id.isascii() and buffer_id.isprintable()
    if plain and '"' not in buffer_id and "\\" not in buffer_id:
        return f'{{"type":"inbound_ack","bufferId":"{buffer_id}"}}\n'
    return f'{{"type":"inbound_ack","bufferId":{json.dumps(buffer_id, ensure_ascii=False)}}}\n'


_PLAIN_ACKS: Final = re.compile(
    r'(?:\{"type":"inbound_ack","bufferId":"[A-Za-z0-9_.:-]{1,128}"\}\n)+'
)
_ACK_ID: Final = re.compile(r'"bufferId":"([^"]*)"')

PLAIN_ACK_LINE_MAX: Final = 200
"""At least the bytes of a line :func:`plain_acks` accepts (36 of envelope, at most 128 of id):
a receiver whose maximum frame is below it must not use it (the decoder enforces the maximum)."""


def plain_acks(message: object) -> list[str] | None:
    """The bufferIds of a message made only of acks in their canonical compact form (what
    :func:`ack_lines` writes for plain ids), or None for any other message -- which must then go
    through :class:`FrameDecoder`, and only when no unterminated line is buffered before it.
    Raises nothing."""
    if type(message) is not str or not _PLAIN_ACKS.fullmatch(message):
        return None
    return _ACK_ID.findall(message)


encode_event: Final = _ENCODE
"""Compact JSON of a wire object (an event's ``to_wire()``), as :func:`encode` writes it."""


def decode_event(event_json: str) -> InboundEvent:
    """The event back from its :func:`encode_event` JSON (as kept by a buffer).  Raises
    ``ValueError`` for text that is not such JSON, :class:`ProtocolError` for an object that is
    not an event."""
    return InboundEvent.from_wire(_DECODE(event_json))


def buffered_inbound_line(buffer_id: str, event_json: str) -> str:
    """``encode(Inbound(event, buffer_id))`` from the event's JSON (:func:`encode_event`) kept
    since it was buffered: a replay sends it without parsing and encoding it again.  Raises
    nothing."""
    return f'{{"type":"inbound","event":{event_json},"bufferId":{_ENCODE(buffer_id)}}}\n'


def with_traceparent(line: str, traceparent: str) -> str:
    """``line`` (an ``inbound`` line as :func:`encode` or :func:`buffered_inbound_line` wrote
    it) with its ``traceparent`` field added, for a gateway that announced
    :data:`~relay.wire.compat.TRACE_CONTEXT`.  ``traceparent`` must be well formed
    (``statecore.tracing.is_traceparent``): ``ValueError`` otherwise, and for a line that is not
    one compact object."""
    if len(traceparent) != 55 or not traceparent.isascii() or '"' in traceparent:
        raise ValueError("not a W3C traceparent")
    if not line.endswith("}\n"):
        raise ValueError("not a compact frame line")
    return f'{line[:-2]},"traceparent":"{traceparent}"}}\n'


def error_frame_for(err: ProtocolError) -> ErrorFrame:
    """Return the ``error`` frame that answers ``err`` (same code, message and ref).

    Send it to the peer, then drop the offending frame and keep the connection. Raises
    ``TypeError`` when ``err`` is not a :class:`ProtocolError`.
    """
    if not isinstance(err, ProtocolError):
        raise TypeError(f"error_frame_for() takes a ProtocolError, got {type(err).__name__}")
    return ErrorFrame(err.code, err.message, err.ref)


def _utf8_len(text: str) -> int:
    if text.isascii():
        return len(text)
    # surrogatepass: a str from a lenient source may hold lone surrogates; count, don't crash.
    return len(text.encode("utf-8", "surrogatepass"))


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


class FrameDecoder:
    """Turn received WebSocket messages into frames, with bounded buffering.

    Create one per connection and call :meth:`feed` with every message, in order. The caller must
    handle each returned item: a frame is routed; a :class:`ProtocolError` is answered with
    ``error_frame_for(err)`` (and counted: repeated violations may close with 4400).

    ``max_frame_bytes`` bounds a complete line (UTF-8 bytes, newline excluded): a longer line is
    dropped with ``frame_too_large``. ``max_buffer_bytes`` (default: ``max_frame_bytes``) bounds
    the unterminated tail kept between messages: a tail that outgrows it yields one error --
    ``frame_too_large`` if it is already longer than ``max_frame_bytes``, else
    ``buffer_overflow`` -- and the rest of that line is discarded up to its newline, after which
    decoding resumes. Memory held between calls is therefore at most
    ``min(max_buffer_bytes, max_frame_bytes)`` bytes.

    Invariants: ``feed`` never raises for anything the peer sent (only ``TypeError`` for a
    ``data`` that is neither ``str`` nor bytes-like), and the decoder is never left half-updated.
    """

    __slots__ = (
        "_binary",
        "_chunks",
        "_discarding",
        "_tail_bytes",
        "_tail_limit",
        "ignored",
        "max_buffer_bytes",
        "max_frame_bytes",
    )

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_buffer_bytes: int | None = None,
    ) -> None:
        self.max_frame_bytes: Final = _positive_int("max_frame_bytes", max_frame_bytes)
        self.max_buffer_bytes: Final = (
            max_frame_bytes
            if max_buffer_bytes is None
            else _positive_int("max_buffer_bytes", max_buffer_bytes)
        )
        self.ignored = 0
        """How many frames of an unknown ``type`` were skipped (forward compatibility)."""
        # A tail longer than max_frame_bytes can never become an acceptable line, so buffering
        # stops at the smaller of the two limits.
        self._tail_limit = min(self.max_buffer_bytes, self.max_frame_bytes)
        # The unterminated tail: chunks of one kind (all str, or all bytes when _binary).
        self._chunks: list[Any] = []
        self._tail_bytes = 0
        self._binary = False
        # True after a tail overflowed: everything up to the next newline is thrown away.
        self._discarding = False

    @property
    def buffered_bytes(self) -> int:
        """UTF-8 bytes of the unterminated line currently held (0 when none)."""
        return self._tail_bytes

    def feed(self, data: str | bytes | bytearray | memoryview) -> list[Frame | ProtocolError]:
        """Decode one received message; return its frames and protocol errors in wire order.

        ``data`` is a text message (``str``) or a binary one (bytes, decoded as UTF-8 per line:
        invalid UTF-8 is ``malformed_json`` for that line). A trailing unterminated line is kept
        for the next call. Unknown frame types are skipped and counted in :attr:`ignored`.
        Raises only ``TypeError`` for a ``data`` of another type.
        """
        # Typed Any: the same line logic runs over str or bytes (a tail keeps one kind).
        buf: Any
        if isinstance(data, str):
            buf = data.encode("utf-8", "surrogatepass") if self._binary and self._chunks else data
        elif isinstance(data, bytes | bytearray | memoryview):
            buf = bytes(data)
            if self._chunks and not self._binary:
                self._chunks = [c.encode("utf-8", "surrogatepass") for c in self._chunks]
        else:
            raise TypeError(f"feed() takes str or bytes, got {type(data).__name__}")
        binary = type(buf) is bytes
        newline: Any = b"\n" if binary else "\n"
        out: list[Frame | ProtocolError] = []
        start = 0
        if self._discarding or self._chunks:
            end = buf.find(newline)
            if end < 0:
                if not self._discarding:
                    self._keep(buf, binary, out)
                return out
            if self._discarding:
                self._discarding = False
            else:
                head = buf[:end]
                line = (b"" if binary else "").join((*self._chunks, head))
                self._chunks = []
                self._tail_bytes = 0
                self._line(line, out)
            start = end + 1
        lines = (buf[start:] if start else buf).split(newline)
        tail = lines.pop()
        line_fn = self._line
        for line in lines:
            line_fn(line, out)
        if tail:
            self._keep(tail, binary, out)
        return out

    def flush(self) -> list[Frame | ProtocolError]:
        """Decode the buffered unterminated line, if any, as if its newline had arrived.

        Call it once when the stream ends (the peer closed) to be lenient with a last line sent
        without its newline; the decoder is empty afterwards. Raises nothing.
        """
        out: list[Frame | ProtocolError] = []
        if self._chunks:
            line = (b"" if self._binary else "").join(self._chunks)
            self._chunks = []
            self._tail_bytes = 0
            self._line(line, out)
        self._discarding = False
        return out

    def _keep(self, tail: Any, binary: bool, out: list[Frame | ProtocolError]) -> None:
        """Buffer an unterminated tail, or report it and start discarding when it outgrows the
        limit (exactly one error per oversized line)."""
        size = len(tail) if binary else _utf8_len(tail)
        total = self._tail_bytes + size
        if total > self._tail_limit:
            self._chunks = []
            self._tail_bytes = 0
            self._discarding = True
            if total > self.max_frame_bytes:
                out.append(
                    ProtocolError(
                        "frame_too_large",
                        f"unterminated line exceeds {self.max_frame_bytes} bytes",
                    )
                )
            else:
                out.append(
                    ProtocolError(
                        "buffer_overflow",
                        f"unterminated line exceeds the {self.max_buffer_bytes}-byte buffer",
                    )
                )
            return
        self._chunks.append(tail)
        self._tail_bytes = total
        self._binary = binary

    def _line(self, line: Any, out: list[Frame | ProtocolError]) -> None:
        """Decode one complete line (without its newline) into ``out``."""
        limit = self.max_frame_bytes
        if type(line) is bytes:
            if len(line) > limit:
                out.append(self._too_large(len(line)))
                return
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError:
                out.append(ProtocolError("malformed_json", "line is not valid UTF-8"))
                return
        else:
            size = len(line)
            # A code point is 1-4 UTF-8 bytes: only a line in between needs an exact count.
            if size > limit or (size * 4 > limit and _utf8_len(line) > limit):
                out.append(self._too_large(_utf8_len(line)))
                return
        if not line or line.isspace():
            return
        try:
            # The common line is one compact object: raw_decode skips the two whitespace scans
            # of a full decode; anything else (surrounding whitespace, garbage after the object)
            # takes the full, strict path.
            obj, end = _RAW_DECODE(line)
            if end != len(line):
                obj = _DECODE(line)
        except ValueError:
            try:
                obj = _DECODE(line)
            except (ValueError, RecursionError):
                out.append(ProtocolError("malformed_json", "line is not valid JSON"))
                return
        except RecursionError:
            # ValueError covers JSONDecodeError, NaN/Infinity and over-long integers;
            # RecursionError a pathologically nested document.
            out.append(ProtocolError("malformed_json", "line is not valid JSON"))
            return
        if type(obj) is not dict:
            out.append(
                ProtocolError("not_an_object", f"line is a JSON {_json_kind(obj)}, not an object")
            )
            return
        try:
            frame = frame_from_wire(obj)
        except UndeliverableEvent as err:
            err.raw_line = line  # the receiver records it as received
            out.append(err)
            return
        except ProtocolError as err:
            out.append(err)
            return
        if frame is None:
            self.ignored += 1
        else:
            out.append(frame)

    def _too_large(self, size: int) -> ProtocolError:
        return ProtocolError(
            "frame_too_large", f"line of {size} bytes exceeds {self.max_frame_bytes} bytes"
        )


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"

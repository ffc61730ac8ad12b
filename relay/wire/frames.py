"""The frames of the relay wire protocol, one frozen class per ``type`` (docs/wire-contract.md).

Gateway -> connector: :class:`Hello`, :class:`Outbound`, :class:`InboundAck`, :class:`GoingIdle`,
:class:`Interrupt`. Connector -> gateway: :class:`DescriptorFrame`, :class:`Inbound`,
:class:`OutboundResult`, :class:`GoingIdleAck`, :class:`ErrorFrame`, and the original contract's
:class:`InterruptInbound` and :class:`PassthroughForward`. Records carried inside them:
:class:`OutboundOutcome`, :class:`InboundEvent`, :class:`EventSource`.

This module is their one public home and the dispatch by ``type`` (:func:`frame_from_wire`,
:data:`FRAME_TYPES`, the directions and :data:`DELIVERIES`). The classes are defined by concept
in private siblings -- ``_inbound_frames`` (deliveries to the gateway and their ack),
``_outbound_frames`` (actions and their results), ``_control_frames`` (handshake, idling,
interrupt, error), ``_fields`` (the field checks they share) -- and imported from here.

Two ways in, two kinds of error (the h11 / websockets split between local and remote errors):

* building a frame in Python validates the values and raises ``TypeError`` / ``ValueError`` --
  the caller's bug;
* :func:`frame_from_wire` (and each class's ``from_wire``) validates the peer's JSON object and
  raises :class:`~relay.wire.errors.ProtocolError` -- the peer's bug: ``missing_field`` for an
  absent required key, ``bad_field`` for a wrong type, ``ref`` the frame's requestId or its
  type.

Wire conventions, pinned by the tests:

* frame-level keys are camelCase (``botId``, ``requestId``, ``idempotencyKey``, ``bufferId``);
  the Python attributes are snake_case. The ``event``/``source``/``result``/``descriptor``
  objects, and ``interrupt.session_key``, use snake_case keys, exactly as the doc lists them;
* JSON ``null`` is the same as an absent key (optional -> ``None``, required -> missing_field),
  and ``to_wire`` omits optional keys whose value is ``None`` (so ``bufferId`` present <=> the
  delivery came from the durable buffer);
* platform ids sent as JSON integers (message ids, chat/user/thread/scope ids) are normalised to
  ``str``; booleans are never ids. Relay ids (``requestId``, ``bufferId``) must be strings: they
  are echoed back verbatim and must compare equal on the peer;
* unknown keys inside a known frame are ignored, and an unknown ``type`` makes
  :func:`frame_from_wire` return ``None`` (forward compatibility);
* an inbound event is read as leniently as the original reader reads it (defaults for a missing
  ``text``, ``message_type``, ``chat_type`` ...); a delivery that still cannot be used (no
  usable ``source.chat_id``) raises :class:`~relay.wire.errors.UndeliverableEvent`, carrying its
  bufferId, so the receiver can record it and ack it instead of stalling the buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias

from relay.wire._control_frames import (
    DescriptorFrame,
    ErrorFrame,
    GoingIdle,
    GoingIdleAck,
    Hello,
    Interrupt,
)
from relay.wire._fields import bad_field, missing_field
from relay.wire._inbound_frames import (
    CHAT_TYPES,
    DEFAULT_CHAT_TYPE,
    ChatType,
    EventSource,
    Inbound,
    InboundAck,
    InboundEvent,
    InterruptInbound,
    PassthroughForward,
)
from relay.wire._outbound_frames import EGRESS_DECLINED, Outbound, OutboundOutcome, OutboundResult
from relay.wire.errors import ProtocolError, UndeliverableEvent

__all__ = [
    "CHAT_TYPES",
    "CONNECTOR_TO_GATEWAY",
    "DEFAULT_CHAT_TYPE",
    "DELIVERIES",
    "EGRESS_DECLINED",
    "FRAME_TYPES",
    "GATEWAY_TO_CONNECTOR",
    "ChatType",
    "DescriptorFrame",
    "ErrorFrame",
    "EventSource",
    "Frame",
    "GoingIdle",
    "GoingIdleAck",
    "Hello",
    "Inbound",
    "InboundAck",
    "InboundEvent",
    "Interrupt",
    "InterruptInbound",
    "Outbound",
    "OutboundOutcome",
    "OutboundResult",
    "PassthroughForward",
    "frame_from_wire",
]


def _request_ref(obj: Mapping[str, Any], frame_type: str) -> str:
    # The error frame's ref lets the peer correlate: its requestId when it sent a usable one.
    rid = obj.get("requestId")
    return rid if isinstance(rid, str) else frame_type


Frame: TypeAlias = (
    Hello
    | Outbound
    | InboundAck
    | GoingIdle
    | Interrupt
    | DescriptorFrame
    | Inbound
    | OutboundResult
    | GoingIdleAck
    | ErrorFrame
    | InterruptInbound
    | PassthroughForward
)
"""Any frame of the protocol, in either direction."""

GATEWAY_TO_CONNECTOR: Final[frozenset[type[Frame]]] = frozenset(
    (Hello, Outbound, InboundAck, GoingIdle, Interrupt)
)
CONNECTOR_TO_GATEWAY: Final[frozenset[type[Frame]]] = frozenset(
    (
        DescriptorFrame,
        Inbound,
        OutboundResult,
        GoingIdleAck,
        ErrorFrame,
        InterruptInbound,
        PassthroughForward,
    )
)

DELIVERIES: Final[frozenset[str]] = frozenset(
    (Inbound.TYPE, InterruptInbound.TYPE, PassthroughForward.TYPE)
)
"""The connector -> gateway frames that may come from the durable buffer (with a bufferId).

One the gateway cannot read is poison (:class:`~relay.wire.errors.UndeliverableEvent`), never a
stall.
"""

FRAME_TYPES: Final[Mapping[str, type[Frame]]] = {
    cls.TYPE: cls for cls in (*GATEWAY_TO_CONNECTOR, *CONNECTOR_TO_GATEWAY)
}
"""Wire ``type`` -> frame class, for every frame this contract version knows."""

_PARSERS: Final[dict[str, Callable[[Mapping[str, Any]], Frame]]] = {
    name: cls.from_wire for name, cls in FRAME_TYPES.items()
}


def frame_from_wire(obj: Mapping[str, Any]) -> Frame | None:
    """Validate one decoded JSON object and return its frame, or ``None`` for an unknown ``type``.

    ``None`` means "a newer peer's frame": the caller must ignore it (and may count it), never
    answer it with an error. Raises :class:`ProtocolError`: ``not_an_object`` when ``obj`` is not
    a mapping, ``missing_field``/``bad_field`` for an absent or non-string ``type`` and for the
    fields of a known frame (``ref`` its requestId or type), ``contract_version`` for a
    descriptor of another contract version. The caller should answer a ProtocolError with
    ``error_frame_for(err)`` and drop the frame; it never leaves partial state behind.
    """
    if type(obj) is not dict and not isinstance(obj, Mapping):
        raise ProtocolError("not_an_object", "a frame must be a JSON object")
    frame_type = obj.get("type")
    if isinstance(frame_type, str):
        parse = _PARSERS.get(frame_type)
        if parse is None:
            return None
        try:
            return parse(obj)
        except UndeliverableEvent:
            raise
        except ProtocolError as err:
            if frame_type in DELIVERIES:
                raise _undeliverable(obj, frame_type, err.message) from err
            raise
        except (TypeError, ValueError) as exc:
            if frame_type in DELIVERIES:
                raise _undeliverable(obj, frame_type, str(exc)) from exc
            # Safety net: the readers check every field explicitly and raise ProtocolError; should
            # one still trip over a value (a TypeError/ValueError from a nested parse), that is
            # the peer's bad field, never a crash of the reader loop.
            raise ProtocolError("bad_field", str(exc), _request_ref(obj, frame_type)) from exc
    if frame_type is None:
        raise missing_field("type", None)
    raise bad_field("type", "a string", frame_type, None)


def _undeliverable(obj: Mapping[str, Any], frame_type: str, reason: str) -> UndeliverableEvent:
    buffer_id = obj.get("bufferId")
    return UndeliverableEvent(
        reason, buffer_id if type(buffer_id) is str and buffer_id else None, frame_type
    )

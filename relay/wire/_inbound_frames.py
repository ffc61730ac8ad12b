"""Inbound: what the connector delivers to the gateway, and the ack that retires a delivery.

The records :class:`InboundEvent` and :class:`EventSource` (a normalised platform message and
where it came from), the delivery frames :class:`Inbound` and the original contract's
:class:`InterruptInbound` and :class:`PassthroughForward` (each with a ``bufferId`` iff it came
from the durable buffer), and :class:`InboundAck`, the gateway's ack of one such delivery.

Deliveries are read as leniently as the original contract's reader reads them (defaults for a
missing ``text``, ``message_type``, ``chat_type`` ...; ids of a wrong type read as absent): only
a delivery that cannot be routed at all (no usable ``source.chat_id``) is refused.  Private to
:mod:`relay.wire`: import these from :mod:`relay.wire.frames`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final, Literal

import attrs

from relay.wire._fields import (
    as_id,
    as_object,
    as_str,
    is_opt_str,
    is_str,
    normal_id,
    str_items,
    str_tuple,
)
from relay.wire.errors import ProtocolError
from statecore.trusted import trusted_constructor

__all__ = [
    "CHAT_TYPES",
    "DEFAULT_CHAT_TYPE",
    "ChatType",
    "EventSource",
    "Inbound",
    "InboundAck",
    "InboundEvent",
    "InterruptInbound",
    "PassthroughForward",
]

ChatType = Literal["dm", "group", "channel", "thread", "forum"]
"""The kind of conversation an inbound event came from."""

CHAT_TYPES: Final[frozenset[str]] = frozenset(("dm", "group", "channel", "thread", "forum"))

DEFAULT_CHAT_TYPE: Final = "dm"
"""How an inbound event without a known ``chat_type`` is read (the original reader's default)."""


def _chat_type(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    if value not in CHAT_TYPES:
        raise ValueError(
            f"chat_type must be one of dm, group, channel, thread, forum; got {value!r}"
        )


# -- the lenient readers of the original contract ------------------------------------------------


def _lenient_str(value: object) -> str | None:
    """An optional text field of an inbound event: a str (subclass) is kept, anything else is
    read as absent (the original reader never refused an event for it)."""
    return str(value) if isinstance(value, str) else None


def _lenient_id(value: object) -> str | None:
    """An optional platform id of an inbound event: str or int (not bool) -> str, else absent."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _buffer_id(obj: Mapping[str, Any], ref: str) -> str | None:
    buffer_id = obj.get("bufferId")
    if buffer_id is not None and type(buffer_id) is not str:
        buffer_id = as_str(buffer_id, "bufferId", ref)
    return buffer_id


# -- records -------------------------------------------------------------------------------------


@attrs.frozen
class EventSource:
    """Where an inbound event came from (the ``source`` object); every id is a ``str``.

    ``scope_id`` is the platform-neutral tenant scope (Discord guild, Slack workspace): carry it
    wherever a route is rebuilt, or two servers' conversations merge.
    """

    platform: str = attrs.field(validator=is_str)
    chat_id: str = attrs.field(converter=normal_id, validator=is_str)
    chat_type: ChatType = attrs.field(validator=_chat_type)
    chat_name: str | None = attrs.field(default=None, validator=is_opt_str)
    user_id: str | None = attrs.field(default=None, converter=normal_id, validator=is_opt_str)
    user_name: str | None = attrs.field(default=None, validator=is_opt_str)
    thread_id: str | None = attrs.field(default=None, converter=normal_id, validator=is_opt_str)
    scope_id: str | None = attrs.field(default=None, converter=normal_id, validator=is_opt_str)
    profile: str | None = attrs.field(default=None, validator=is_opt_str)

    def to_wire(self) -> dict[str, Any]:
        """Return the ``source`` object (``None`` fields omitted); a fresh dict."""
        wire: dict[str, Any] = {
            "platform": self.platform,
            "chat_id": self.chat_id,
            "chat_type": self.chat_type,
        }
        if self.chat_name is not None:
            wire["chat_name"] = self.chat_name
        if self.user_id is not None:
            wire["user_id"] = self.user_id
        if self.user_name is not None:
            wire["user_name"] = self.user_name
        if self.thread_id is not None:
            wire["thread_id"] = self.thread_id
        if self.scope_id is not None:
            wire["scope_id"] = self.scope_id
        if self.profile is not None:
            wire["profile"] = self.profile
        return wire

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any], *, ref: str | None = None) -> EventSource:
        """Validate a peer's ``source`` object; raises :class:`ProtocolError` naming ``ref``."""
        return _source_from_wire(as_object(obj, "object", ref, top=True), "", ref)


def _source_from_wire(obj: dict[str, Any], where: str, ref: str | None) -> EventSource:
    # Lenient exactly where the original reader is: only a usable chat_id is essential (an event
    # without one cannot be routed anywhere: the caller treats it as poison). Every other field
    # falls back to its default when it is missing or of the wrong type; see _lenient_*.
    get = obj.get
    chat_id = get("chat_id")
    if type(chat_id) is not str or not chat_id:
        chat_id = as_id(chat_id, where + "chat_id", ref)
        if not chat_id:
            raise ProtocolError("bad_field", f"field {where + 'chat_id'!r} is empty", ref)
    platform = get("platform")
    if type(platform) is not str:
        platform = _lenient_str(platform) or ""  # "": the receiver fills in its own platform
    chat_type = get("chat_type")
    if chat_type not in CHAT_TYPES:
        chat_type = DEFAULT_CHAT_TYPE
    chat_name = get("chat_name")
    if chat_name is not None and type(chat_name) is not str:
        chat_name = _lenient_str(chat_name)
    user_id = get("user_id")
    if user_id is not None and type(user_id) is not str:
        user_id = _lenient_id(user_id)
    user_name = get("user_name")
    if user_name is not None and type(user_name) is not str:
        user_name = _lenient_str(user_name)
    thread_id = get("thread_id")
    if thread_id is not None and type(thread_id) is not str:
        thread_id = _lenient_id(thread_id)
    scope_id = get("scope_id")
    if scope_id is not None and type(scope_id) is not str:
        scope_id = _lenient_id(scope_id)
    profile = get("profile")
    if profile is not None and type(profile) is not str:
        profile = _lenient_str(profile)
    return _new_source(
        platform, chat_id, chat_type, chat_name, user_id, user_name, thread_id, scope_id, profile
    )


@attrs.frozen
class InboundEvent:
    """A normalised platform message (the ``event`` object); ``source`` is keyword-only."""

    text: str = attrs.field(validator=is_str)
    message_type: str = attrs.field(default="text", validator=is_str)
    message_id: str | None = attrs.field(default=None, converter=normal_id, validator=is_opt_str)
    reply_to_message_id: str | None = attrs.field(
        default=None, converter=normal_id, validator=is_opt_str
    )
    source: EventSource = attrs.field(
        kw_only=True, validator=attrs.validators.instance_of(EventSource)
    )
    media_urls: tuple[str, ...] = attrs.field(
        default=(), kw_only=True, converter=str_tuple, validator=str_items
    )
    """Attachments' URLs, in order (empty for a plain text message)."""

    def to_wire(self) -> dict[str, Any]:
        """Return the ``event`` object (``None`` fields and no media omitted); a fresh dict."""
        wire: dict[str, Any] = {"text": self.text, "message_type": self.message_type}
        if self.message_id is not None:
            wire["message_id"] = self.message_id
        if self.reply_to_message_id is not None:
            wire["reply_to_message_id"] = self.reply_to_message_id
        if self.media_urls:
            wire["media_urls"] = list(self.media_urls)
        wire["source"] = self.source.to_wire()
        return wire

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any], *, ref: str | None = None) -> InboundEvent:
        """Validate a peer's (or a persisted) ``event`` object; raises :class:`ProtocolError`."""
        return _event_from_wire(as_object(obj, "object", ref, top=True), "", ref)


def _event_from_wire(obj: dict[str, Any], where: str, ref: str | None) -> InboundEvent:
    """Read an ``event`` object as leniently as the original reader: ``text`` missing -> "",
    ``message_type`` missing or not text -> "text", ids of a wrong type -> absent, ``media_urls``
    keeps its non-empty strings (anything else -> none).  Raises
    :class:`ProtocolError` only when the event cannot be routed at all (no usable ``source`` or
    ``source.chat_id``)."""
    get = obj.get
    text = get("text")
    if type(text) is not str:
        text = _lenient_str(text) or ""
    message_type = get("message_type")
    if type(message_type) is not str or not message_type:
        message_type = _lenient_str(message_type) or "text"
    message_id = get("message_id")
    if message_id is not None and type(message_id) is not str:
        message_id = _lenient_id(message_id)
    reply_to = get("reply_to_message_id")
    if reply_to is not None and type(reply_to) is not str:
        reply_to = _lenient_id(reply_to)
    source = get("source")
    if type(source) is not dict:
        source = as_object(source, where + "source", ref)
    media = get("media_urls")
    media_urls = (
        tuple(u for u in media if isinstance(u, str) and u) if isinstance(media, list) else ()
    )
    return _new_event(
        text,
        message_type,
        message_id,
        reply_to,
        _source_from_wire(source, where + "source.", ref),
        media_urls,
    )


# -- deliveries (connector -> gateway) -----------------------------------------------------------


@attrs.frozen
class Inbound:
    """A platform message for the gateway.

    ``buffer_id`` is set iff it came from the durable buffer: the caller must send
    ``InboundAck(buffer_id)`` after its handler returned normally (and not if it raised).
    ``traceparent`` is the W3C trace context of the connector's span for the event: set only
    toward a gateway that announced :data:`~relay.wire.compat.TRACE_CONTEXT`, read as sent
    (anything but a string reads as absent; its form is checked where it is used).
    """

    TYPE: ClassVar[str] = "inbound"

    event: InboundEvent = attrs.field(validator=attrs.validators.instance_of(InboundEvent))
    buffer_id: str | None = attrs.field(default=None, validator=is_opt_str)
    traceparent: str | None = attrs.field(default=None, validator=is_opt_str)

    def to_wire(self) -> dict[str, Any]:
        """Return the frame's JSON object (``bufferId`` only for a buffered delivery,
        ``traceparent`` only when set)."""
        wire: dict[str, Any] = {"type": "inbound", "event": self.event.to_wire()}
        if self.buffer_id is not None:
            wire["bufferId"] = self.buffer_id
        if self.traceparent is not None:
            wire["traceparent"] = self.traceparent
        return wire

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> Inbound:
        """Validate the peer's frame object; raises :class:`ProtocolError` (ref ``inbound``)."""
        ref = "inbound"
        buffer_id = obj.get("bufferId")
        if buffer_id is not None and type(buffer_id) is not str:
            buffer_id = as_str(buffer_id, "bufferId", ref)
        event = obj.get("event")
        if type(event) is not dict:
            event = as_object(event, "event", ref)
        event = _event_from_wire(event, "event.", ref)
        traceparent = obj.get("traceparent")
        # Never refused for it: a trace context of another type is no trace context.
        return _new_inbound(event, buffer_id, traceparent if type(traceparent) is str else None)


@attrs.frozen
class InterruptInbound:
    """The connector asks the gateway to cancel the turn of ``session_key`` in ``chat_id``.

    ``buffer_id`` is set when it came from the durable buffer: ack it once it was handled -- or,
    with no handler for it, once it was recorded as unhandled (it must never block the buffer).
    """

    TYPE: ClassVar[str] = "interrupt_inbound"

    session_key: str = attrs.field(validator=is_str)
    chat_id: str | None = attrs.field(default=None, converter=normal_id, validator=is_opt_str)
    buffer_id: str | None = attrs.field(default=None, validator=is_opt_str)

    def to_wire(self) -> dict[str, Any]:
        """Return the frame's JSON object (``None`` fields omitted)."""
        wire: dict[str, Any] = {"type": "interrupt_inbound", "session_key": self.session_key}
        if self.chat_id is not None:
            wire["chat_id"] = self.chat_id
        if self.buffer_id is not None:
            wire["bufferId"] = self.buffer_id
        return wire

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> InterruptInbound:
        """Validate the peer's frame object; raises :class:`ProtocolError`."""
        ref = "interrupt_inbound"
        buffer_id = _buffer_id(obj, ref)
        session_key = obj.get("session_key")
        if type(session_key) is not str:
            session_key = as_str(session_key, "session_key", ref)
        return _new_interrupt_inbound(session_key, _lenient_id(obj.get("chat_id")), buffer_id)


@attrs.frozen
class PassthroughForward:
    """A platform webhook the connector already acknowledged, forwarded verbatim.

    ``forward`` holds ``platform``, ``botId``, ``method``, ``path``, ``headers``, ``bodyB64``
    and optionally ``profile`` (kept as the peer sent them; a private copy).  ``buffer_id``: as
    for :class:`InterruptInbound`.
    """

    TYPE: ClassVar[str] = "passthrough_forward"

    # Mutable inner data: excluded from the hash (equality still compares it).
    forward: Mapping[str, Any] = attrs.field(converter=dict, hash=False)
    buffer_id: str | None = attrs.field(default=None, validator=is_opt_str)

    def to_wire(self) -> dict[str, Any]:
        """Return the frame's JSON object (``bufferId`` only for a buffered delivery)."""
        wire: dict[str, Any] = {"type": "passthrough_forward", "forward": self.forward}
        if self.buffer_id is not None:
            wire["bufferId"] = self.buffer_id
        return wire

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> PassthroughForward:
        """Validate the peer's frame object; raises :class:`ProtocolError`."""
        ref = "passthrough_forward"
        buffer_id = _buffer_id(obj, ref)
        forward = as_object(obj.get("forward"), "forward", ref)
        for key in ("platform", "method", "path"):
            if type(forward.get(key)) is not str:
                as_str(forward.get(key), "forward." + key, ref)
        return _new_passthrough(dict(forward), buffer_id)


# -- the ack (gateway -> connector) --------------------------------------------------------------


@attrs.frozen
class InboundAck:
    """The inbound delivery carrying ``buffer_id`` was handled; the connector may retire it.

    Send it only after the handler returned normally, never for a live (unbuffered) delivery.
    """

    TYPE: ClassVar[str] = "inbound_ack"

    buffer_id: str = attrs.field(validator=is_str)

    def to_wire(self) -> dict[str, Any]:
        """Return the frame's JSON object."""
        return {"type": "inbound_ack", "bufferId": self.buffer_id}

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> InboundAck:
        """Validate the peer's frame object; raises :class:`ProtocolError` (ref ``inbound_ack``)."""
        buffer_id = obj.get("bufferId")
        if type(buffer_id) is not str:
            buffer_id = as_str(buffer_id, "bufferId", "inbound_ack")
        return _new_inbound_ack(buffer_id)


# Trusted constructors for the wire readers above (see trusted_constructor): resolved at call time.
_new_source = trusted_constructor(EventSource)
_new_event = trusted_constructor(InboundEvent)
_new_inbound = trusted_constructor(Inbound)
_new_interrupt_inbound = trusted_constructor(InterruptInbound)
_new_passthrough = trusted_constructor(PassthroughForward)
_new_inbound_ack = trusted_constructor(InboundAck)

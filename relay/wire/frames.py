"""The frames of the relay wire protocol, one frozen class per ``type`` (docs/wire-contract.md).

Gateway -> connector: :class:`Hello`, :class:`Outbound`, :class:`InboundAck`, :class:`GoingIdle`,
:class:`Interrupt`. Connector -> gateway: :class:`DescriptorFrame`, :class:`Inbound`,
:class:`OutboundResult`, :class:`GoingIdleAck`, :class:`ErrorFrame`, and the original contract's
:class:`InterruptInbound` and :class:`PassthroughForward`. Records carried inside them:
:class:`OutboundOutcome`, :class:`InboundEvent`, :class:`EventSource`.

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

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Final, Literal, TypeAlias

import attrs

from relay.wire.descriptor import CONTRACT_VERSION, CapabilityDescriptor, check_strict_int
from relay.wire.errors import ProtocolError, UndeliverableEvent
from statecore.trusted import trusted_constructor

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

ChatType = Literal["dm", "group", "channel", "thread", "forum"]
"""The kind of conversation an inbound event came from."""

CHAT_TYPES: Final[frozenset[str]] = frozenset(("dm", "group", "channel", "thread", "forum"))

DEFAULT_CHAT_TYPE: Final = "dm"
"""How an inbound event without a known ``chat_type`` is read (the original reader's default)."""

EGRESS_DECLINED: Final = "egress_declined"
"""``OutboundOutcome.code`` of a definite refusal by the connector's tenant guard."""


# -- local validation (constructors) -------------------------------------------------------------

_str = attrs.validators.instance_of(str)
_opt_str = attrs.validators.optional(_str)


def _id(value: Any) -> Any:
    # Platforms send numeric ids; we keep one representation (str) so routes compare equal.
    # A bool is not an id, and None stays None: both pass through unchanged for the validator.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str | bytes):
        raise TypeError("expected an iterable of strings, got a single string")
    return tuple(value)


def _str_items(_inst: object, attr: attrs.Attribute[Any], value: tuple[object, ...]) -> None:
    for item in value:
        if not isinstance(item, str):
            raise TypeError(f"{attr.name} must hold strings, got {type(item).__name__}")


def _chat_type(_inst: object, _attr: attrs.Attribute[Any], value: object) -> None:
    if value not in CHAT_TYPES:
        raise ValueError(
            f"chat_type must be one of dm, group, channel, thread, forum; got {value!r}"
        )


def _opt_positive_int(inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        check_strict_int(inst, attr, value)
        if isinstance(value, int) and value < 1:
            raise ValueError(f"{attr.name} must be at least 1, got {value}")


def _opt_strict_int(inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        check_strict_int(inst, attr, value)


def _action(value: Mapping[str, Any]) -> dict[str, Any]:
    # A private shallow copy: a caller mutating its dict afterwards cannot change a built frame.
    if not isinstance(value, Mapping):
        raise TypeError(f"action must be a mapping, got {type(value).__name__}")
    return dict(value)


def _action_op(_inst: object, _attr: attrs.Attribute[Any], value: Mapping[str, Any]) -> None:
    op = value.get("op")
    if not isinstance(op, str) or not op:
        raise ValueError("action must contain a non-empty string 'op'")


# -- remote validation (from_wire) ---------------------------------------------------------------


def _missing(name: str, ref: str | None) -> ProtocolError:
    return ProtocolError("missing_field", f"field {name!r} is required", ref)


def _bad(name: str, what: str, value: object, ref: str | None) -> ProtocolError:
    # Name the type, never echo the value: it may be huge or sensitive.
    return ProtocolError(
        "bad_field", f"field {name!r} must be {what}, got {type(value).__name__}", ref
    )


# The fast path of every wire check is an inline ``type(value) is str`` test; these helpers run only
# when it fails, and either accept the value (a str subclass, an int id, a null optional) or raise.


def _as_str(value: object, name: str, ref: str | None) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        raise _missing(name, ref)
    raise _bad(name, "a string", value, ref)


def _as_opt_str(value: object, name: str, ref: str | None) -> str | None:
    return None if value is None else _as_str(value, name, ref)


def _as_id(value: object, name: str, ref: str | None) -> str:
    if type(value) is int:
        return str(value)
    if isinstance(value, str):
        return value
    if value is None:
        raise _missing(name, ref)
    raise _bad(name, "a string or an integer", value, ref)


def _as_opt_id(value: object, name: str, ref: str | None) -> str | None:
    return None if value is None else _as_id(value, name, ref)


def _as_object(value: object, name: str, ref: str | None, *, top: bool = False) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, Mapping):
        return dict(value)
    if top:
        raise ProtocolError("not_an_object", "a frame or record must be a JSON object", ref)
    if value is None:
        raise _missing(name, ref)
    raise _bad(name, "an object", value, ref)


def _request_ref(obj: Mapping[str, Any], frame_type: str) -> str:
    # The error frame's ref lets the peer correlate: its requestId when it sent a usable one.
    rid = obj.get("requestId")
    return rid if isinstance(rid, str) else frame_type


# -- records -------------------------------------------------------------------------------------


@attrs.frozen
class OutboundOutcome:
    """The connector's answer to one ``outbound`` action (the ``result`` object).

    ``success`` says whether the platform performed the action; ``message_id`` is the platform's
    id of the message sent or edited; ``error`` a human-readable failure; ``code`` a machine token
    (``"egress_declined"`` is a definite refusal by the tenant guard: never retry it).
    """

    success: bool = attrs.field(validator=attrs.validators.instance_of(bool))
    message_id: str | None = attrs.field(default=None, converter=_id, validator=_opt_str)
    error: str | None = attrs.field(default=None, validator=_opt_str)
    code: str | None = attrs.field(default=None, validator=_opt_str)

    @property
    def declined(self) -> bool:
        """True for a definite refusal by the connector's tenant guard (nothing was sent)."""
        return self.code == EGRESS_DECLINED

    def to_wire(self) -> dict[str, Any]:
        """Return the ``result`` object (``None`` fields omitted); a fresh dict, raises nothing."""
        wire: dict[str, Any] = {"success": self.success}
        if self.message_id is not None:
            wire["message_id"] = self.message_id
        if self.error is not None:
            wire["error"] = self.error
        if self.code is not None:
            wire["code"] = self.code
        return wire

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any], *, ref: str | None = None) -> OutboundOutcome:
        """Validate a peer's ``result`` object; raises :class:`ProtocolError` naming ``ref``."""
        return _outcome_from_wire(_as_object(obj, "object", ref, top=True), "", ref)


def _outcome_from_wire(obj: dict[str, Any], where: str, ref: str | None) -> OutboundOutcome:
    get = obj.get
    success = get("success")
    if type(success) is not bool:
        if success is None:
            raise _missing(where + "success", ref)
        raise _bad(where + "success", "a boolean", success, ref)
    message_id = get("message_id")
    if type(message_id) is not str:
        message_id = _as_opt_id(message_id, where + "message_id", ref)
    error = get("error")
    if error is not None and type(error) is not str:
        error = _as_str(error, where + "error", ref)
    code = get("code")
    if code is not None and type(code) is not str:
        code = _as_str(code, where + "code", ref)
    return _new_outcome(success, message_id, error, code)


@attrs.frozen
class EventSource:
    """Where an inbound event came from (the ``source`` object); every id is a ``str``.

    ``scope_id`` is the platform-neutral tenant scope (Discord guild, Slack workspace): carry it
    wherever a route is rebuilt, or two servers' conversations merge.
    """

    platform: str = attrs.field(validator=_str)
    chat_id: str = attrs.field(converter=_id, validator=_str)
    chat_type: ChatType = attrs.field(validator=_chat_type)
    chat_name: str | None = attrs.field(default=None, validator=_opt_str)
    user_id: str | None = attrs.field(default=None, converter=_id, validator=_opt_str)
    user_name: str | None = attrs.field(default=None, validator=_opt_str)
    thread_id: str | None = attrs.field(default=None, converter=_id, validator=_opt_str)
    scope_id: str | None = attrs.field(default=None, converter=_id, validator=_opt_str)
    profile: str | None = attrs.field(default=None, validator=_opt_str)

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
        return _source_from_wire(_as_object(obj, "object", ref, top=True), "", ref)


def _source_from_wire(obj: dict[str, Any], where: str, ref: str | None) -> EventSource:
    # Lenient exactly where the original reader is: only a usable chat_id is essential (an event
    # without one cannot be routed anywhere: the caller treats it as poison). Every other field
    # falls back to its default when it is missing or of the wrong type; see _lenient_*.
    get = obj.get
    chat_id = get("chat_id")
    if type(chat_id) is not str or not chat_id:
        chat_id = _as_id(chat_id, where + "chat_id", ref)
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


@attrs.frozen
class InboundEvent:
    """A normalised platform message (the ``event`` object); ``source`` is keyword-only."""

    text: str = attrs.field(validator=_str)
    message_type: str = attrs.field(default="text", validator=_str)
    message_id: str | None = attrs.field(default=None, converter=_id, validator=_opt_str)
    reply_to_message_id: str | None = attrs.field(default=None, converter=_id, validator=_opt_str)
    source: EventSource = attrs.field(
        kw_only=True, validator=attrs.validators.instance_of(EventSource)
    )
    media_urls: tuple[str, ...] = attrs.field(
        default=(), kw_only=True, converter=_str_tuple, validator=_str_items
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
        return _event_from_wire(_as_object(obj, "object", ref, top=True), "", ref)


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
        source = _as_object(source, where + "source", ref)
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


# -- gateway -> connector ------------------------------------------------------------------------


@attrs.frozen
class Hello:
    """Announce one fronted identity; the connector answers with a :class:`DescriptorFrame`.

    Send one per identity right after the upgrade; the first is the default identity.
    ``protocol``/``features`` are our additions (the announcement, see :mod:`relay.wire.compat`): a
    hello read from the wire without ``protocol`` has ``protocol=None`` -- an original-contract
    gateway, to which nothing the contract did not have (``error`` frames, 4419, 4409) is sent.
    """

    TYPE: ClassVar[str] = "hello"

    platform: str = attrs.field(validator=_str)
    bot_id: str = attrs.field(validator=_str)
    protocol: int | None = attrs.field(default=CONTRACT_VERSION, validator=_opt_strict_int)
    features: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple, validator=_str_items)
    window: int | None = attrs.field(default=None, validator=_opt_positive_int)
    """With ``acked_live``: how many deliveries the gateway takes unacked at once (the connector
    sends no more until acks come back).  None: the connector's default."""

    @property
    def announced(self) -> bool:
        """True when the sender announced itself (``protocol`` present): not an original peer."""
        return self.protocol is not None

    def to_wire(self) -> dict[str, Any]:
        """Return the frame's JSON object (a fresh dict; ``protocol``/``features`` only for an
        announced hello, so an original one is written exactly as the original wrote it)."""
        wire: dict[str, Any] = {"type": "hello", "platform": self.platform, "botId": self.bot_id}
        if self.protocol is not None:
            wire["protocol"] = self.protocol
            wire["features"] = list(self.features)
            if self.window is not None:
                wire["window"] = self.window
        return wire

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> Hello:
        """Validate the peer's frame object; raises :class:`ProtocolError` (ref ``"hello"``)."""
        ref = "hello"
        get = obj.get
        platform = get("platform")
        if type(platform) is not str:
            platform = _as_str(platform, "platform", ref)
        bot_id = get("botId")
        if type(bot_id) is not str:
            bot_id = _as_str(bot_id, "botId", ref)
        protocol = get("protocol")
        if protocol is not None and type(protocol) is not int:
            raise _bad("protocol", "an integer", protocol, ref)
        features = get("features")
        if features is None:
            features = ()
        elif not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            raise _bad("features", "a list of strings", features, ref)
        window = get("window")
        if window is not None and (type(window) is not int or window < 1):
            window = None  # our addition, read leniently: unusable means "the default"
        return _new_hello(platform, bot_id, protocol, tuple(features), window)


@attrs.frozen
class Outbound:
    """Ask the connector to perform ``action`` on a platform; answered by :class:`OutboundResult`.

    ``action`` must contain a non-empty string ``"op"`` (e.g. ``"send"``); the frame keeps a
    shallow copy and ``to_wire`` hands out that copy (do not mutate it). Reuse the same
    ``idempotency_key`` when retrying an ambiguous send so the connector can de-duplicate.
    ``platform``/``bot_id`` pick a non-default identity announced by a :class:`Hello`.
    """

    TYPE: ClassVar[str] = "outbound"

    request_id: str = attrs.field(validator=_str)
    # Mutable inner data: excluded from the hash (equality still compares it).
    action: Mapping[str, Any] = attrs.field(converter=_action, validator=_action_op, hash=False)
    idempotency_key: str | None = attrs.field(default=None, validator=_opt_str)
    platform: str | None = attrs.field(default=None, validator=_opt_str)
    bot_id: str | None = attrs.field(default=None, validator=_opt_str)

    def to_wire(self) -> dict[str, Any]:
        """Return the frame's JSON object (``None`` fields omitted)."""
        wire: dict[str, Any] = {
            "type": "outbound",
            "requestId": self.request_id,
            "action": self.action,
        }
        if self.idempotency_key is not None:
            wire["idempotencyKey"] = self.idempotency_key
        if self.platform is not None:
            wire["platform"] = self.platform
        if self.bot_id is not None:
            wire["botId"] = self.bot_id
        return wire

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> Outbound:
        """Validate the peer's frame object; raises :class:`ProtocolError` (ref = requestId)."""
        get = obj.get
        request_id = get("requestId")
        if type(request_id) is not str:
            request_id = _as_str(request_id, "requestId", "outbound")
        ref = request_id
        action = _as_object(get("action"), "action", ref)
        op = action.get("op")
        if type(op) is not str or not op:
            if op is None:
                raise _missing("action.op", ref)
            raise _bad("action.op", "a non-empty string", op, ref)
        idempotency_key = get("idempotencyKey")
        if idempotency_key is not None and type(idempotency_key) is not str:
            idempotency_key = _as_str(idempotency_key, "idempotencyKey", ref)
        platform = get("platform")
        if platform is not None and type(platform) is not str:
            platform = _as_str(platform, "platform", ref)
        bot_id = get("botId")
        if bot_id is not None and type(bot_id) is not str:
            bot_id = _as_str(bot_id, "botId", ref)
        # A private copy: the frame must not change if the caller's dict does.
        return _new_outbound(request_id, dict(action), idempotency_key, platform, bot_id)


@attrs.frozen
class InboundAck:
    """The inbound delivery carrying ``buffer_id`` was handled; the connector may retire it.

    Send it only after the handler returned normally, never for a live (unbuffered) delivery.
    """

    TYPE: ClassVar[str] = "inbound_ack"

    buffer_id: str = attrs.field(validator=_str)

    def to_wire(self) -> dict[str, Any]:
        """Return the frame's JSON object."""
        return {"type": "inbound_ack", "bufferId": self.buffer_id}

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> InboundAck:
        """Validate the peer's frame object; raises :class:`ProtocolError` (ref ``inbound_ack``)."""
        buffer_id = obj.get("bufferId")
        if type(buffer_id) is not str:
            buffer_id = _as_str(buffer_id, "bufferId", "inbound_ack")
        return _new_inbound_ack(buffer_id)


@attrs.frozen
class GoingIdle:
    """Ask the connector to buffer new inbound durably; answered by :class:`GoingIdleAck`."""

    TYPE: ClassVar[str] = "going_idle"

    request_id: str | None = attrs.field(default=None, validator=_opt_str)

    def to_wire(self) -> dict[str, Any]:
        """Return the frame's JSON object (``requestId`` only when set)."""
        if self.request_id is None:
            return {"type": "going_idle"}
        return {"type": "going_idle", "requestId": self.request_id}

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> GoingIdle:
        """Validate the peer's frame object; raises :class:`ProtocolError` (ref ``going_idle``)."""
        request_id = obj.get("requestId")
        if request_id is not None and type(request_id) is not str:
            request_id = _as_str(request_id, "requestId", "going_idle")
        return _new_going_idle(request_id)


@attrs.frozen
class Interrupt:
    """Cancel the turn of session ``session_key`` (fire-and-forget: no answer comes back).

    The wire key is ``session_key`` as the doc spells it; ``sessionKey`` is accepted on input.
    """

    TYPE: ClassVar[str] = "interrupt"

    session_key: str = attrs.field(validator=_str)
    reason: str | None = attrs.field(default=None, validator=_opt_str)

    def to_wire(self) -> dict[str, Any]:
        """Return the frame's JSON object (``reason`` only when set)."""
        wire: dict[str, Any] = {"type": "interrupt", "session_key": self.session_key}
        if self.reason is not None:
            wire["reason"] = self.reason
        return wire

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> Interrupt:
        """Validate the peer's frame object; raises :class:`ProtocolError` (ref ``interrupt``)."""
        ref = "interrupt"
        session_key = obj.get("session_key")
        if session_key is None:
            session_key = obj.get("sessionKey")  # tolerated spelling; errors name the doc's key
        if type(session_key) is not str:
            session_key = _as_str(session_key, "session_key", ref)
        reason = obj.get("reason")
        if reason is not None and type(reason) is not str:
            reason = _as_str(reason, "reason", ref)
        return _new_interrupt(session_key, reason)


# -- connector -> gateway ------------------------------------------------------------------------


@attrs.frozen
class DescriptorFrame:
    """The connector's capabilities for one hello; the first of a connection ends the handshake."""

    TYPE: ClassVar[str] = "descriptor"

    descriptor: CapabilityDescriptor = attrs.field(
        validator=attrs.validators.instance_of(CapabilityDescriptor)
    )

    def to_wire(self) -> dict[str, Any]:
        """Return the frame's JSON object."""
        return {"type": "descriptor", "descriptor": self.descriptor.to_wire()}

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> DescriptorFrame:
        """Validate the peer's frame object.

        Raises :class:`ProtocolError` (ref ``descriptor``), including its subclass
        :class:`~relay.wire.errors.ContractVersionError` for another contract version: the caller
        must then give up on this connector rather than answer and continue.
        """
        descriptor = _as_object(obj.get("descriptor"), "descriptor", "descriptor")
        return _new_descriptor_frame(CapabilityDescriptor.from_wire(descriptor))


@attrs.frozen
class Inbound:
    """A platform message for the gateway.

    ``buffer_id`` is set iff it came from the durable buffer: the caller must send
    ``InboundAck(buffer_id)`` after its handler returned normally (and not if it raised).
    """

    TYPE: ClassVar[str] = "inbound"

    event: InboundEvent = attrs.field(validator=attrs.validators.instance_of(InboundEvent))
    buffer_id: str | None = attrs.field(default=None, validator=_opt_str)

    def to_wire(self) -> dict[str, Any]:
        """Return the frame's JSON object (``bufferId`` only for a buffered delivery)."""
        wire: dict[str, Any] = {"type": "inbound", "event": self.event.to_wire()}
        if self.buffer_id is not None:
            wire["bufferId"] = self.buffer_id
        return wire

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> Inbound:
        """Validate the peer's frame object; raises :class:`ProtocolError` (ref ``inbound``)."""
        ref = "inbound"
        buffer_id = obj.get("bufferId")
        if buffer_id is not None and type(buffer_id) is not str:
            buffer_id = _as_str(buffer_id, "bufferId", ref)
        event = obj.get("event")
        if type(event) is not dict:
            event = _as_object(event, "event", ref)
        event = _event_from_wire(event, "event.", ref)
        return _new_inbound(event, buffer_id)


@attrs.frozen
class OutboundResult:
    """The answer to the :class:`Outbound` with the same ``request_id``.

    The caller resolves its pending request by ``request_id``; an unknown or late id is ignored.
    """

    TYPE: ClassVar[str] = "outbound_result"

    request_id: str = attrs.field(validator=_str)
    result: OutboundOutcome = attrs.field(validator=attrs.validators.instance_of(OutboundOutcome))

    def to_wire(self) -> dict[str, Any]:
        """Return the frame's JSON object."""
        return {
            "type": "outbound_result",
            "requestId": self.request_id,
            "result": self.result.to_wire(),
        }

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> OutboundResult:
        """Validate the peer's frame object; raises :class:`ProtocolError` (ref = requestId)."""
        request_id = obj.get("requestId")
        if type(request_id) is not str:
            request_id = _as_str(request_id, "requestId", "outbound_result")
        result = obj.get("result")
        if type(result) is not dict:
            result = _as_object(result, "result", request_id)
        return _new_outbound_result(request_id, _outcome_from_wire(result, "result.", request_id))


@attrs.frozen
class GoingIdleAck:
    """The connector flipped this instance to buffered-only; new inbound is buffered durably."""

    TYPE: ClassVar[str] = "going_idle_ack"

    request_id: str | None = attrs.field(default=None, validator=_opt_str)

    def to_wire(self) -> dict[str, Any]:
        """Return the frame's JSON object (``requestId`` only when set)."""
        if self.request_id is None:
            return {"type": "going_idle_ack"}
        return {"type": "going_idle_ack", "requestId": self.request_id}

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> GoingIdleAck:
        """Validate the peer's frame object; raises :class:`ProtocolError`."""
        request_id = obj.get("requestId")
        if request_id is not None and type(request_id) is not str:
            request_id = _as_str(request_id, "requestId", "going_idle_ack")
        return _new_going_idle_ack(request_id)


@attrs.frozen
class InterruptInbound:
    """The connector asks the gateway to cancel the turn of ``session_key`` in ``chat_id``.

    ``buffer_id`` is set when it came from the durable buffer: ack it once it was handled -- or,
    with no handler for it, once it was recorded as unhandled (it must never block the buffer).
    """

    TYPE: ClassVar[str] = "interrupt_inbound"

    session_key: str = attrs.field(validator=_str)
    chat_id: str | None = attrs.field(default=None, converter=_id, validator=_opt_str)
    buffer_id: str | None = attrs.field(default=None, validator=_opt_str)

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
            session_key = _as_str(session_key, "session_key", ref)
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
    buffer_id: str | None = attrs.field(default=None, validator=_opt_str)

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
        forward = _as_object(obj.get("forward"), "forward", ref)
        for key in ("platform", "method", "path"):
            if type(forward.get(key)) is not str:
                _as_str(forward.get(key), "forward." + key, ref)
        return _new_passthrough(dict(forward), buffer_id)


def _buffer_id(obj: Mapping[str, Any], ref: str) -> str | None:
    buffer_id = obj.get("bufferId")
    if buffer_id is not None and type(buffer_id) is not str:
        buffer_id = _as_str(buffer_id, "bufferId", ref)
    return buffer_id


@attrs.frozen
class ErrorFrame:
    """A typed protocol error about a frame we sent (``ref``: its requestId or type).

    Receiving one means the peer dropped that frame: fail the matching request (if ``ref`` names
    one) and log it; the connection stays up. Build one with
    :func:`relay.wire.codec.error_frame_for`.
    """

    TYPE: ClassVar[str] = "error"

    code: str = attrs.field(validator=_str)
    message: str = attrs.field(validator=_str)
    ref: str | None = attrs.field(default=None, validator=_opt_str)

    def to_wire(self) -> dict[str, Any]:
        """Return the frame's JSON object (``ref`` only when set)."""
        wire: dict[str, Any] = {"type": "error", "code": self.code, "message": self.message}
        if self.ref is not None:
            wire["ref"] = self.ref
        return wire

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> ErrorFrame:
        """Validate the peer's frame object; raises :class:`ProtocolError` (ref ``error``)."""
        ref = "error"
        get = obj.get
        code = get("code")
        if type(code) is not str:
            code = _as_str(code, "code", ref)
        message = get("message")
        if type(message) is not str:
            message = _as_str(message, "message", ref)
        error_ref = get("ref")
        if error_ref is not None and type(error_ref) is not str:
            error_ref = _as_str(error_ref, "ref", ref)
        return _new_error_frame(code, message, error_ref)


# Trusted constructors for the wire readers above (see trusted_constructor): resolved at call time.
_new_outcome = trusted_constructor(OutboundOutcome)
_new_source = trusted_constructor(EventSource)
_new_event = trusted_constructor(InboundEvent)
_new_hello = trusted_constructor(Hello)
_new_outbound = trusted_constructor(Outbound)
_new_inbound_ack = trusted_constructor(InboundAck)
_new_going_idle = trusted_constructor(GoingIdle)
_new_interrupt = trusted_constructor(Interrupt)
_new_descriptor_frame = trusted_constructor(DescriptorFrame)
_new_inbound = trusted_constructor(Inbound)
_new_outbound_result = trusted_constructor(OutboundResult)
_new_going_idle_ack = trusted_constructor(GoingIdleAck)
_new_error_frame = trusted_constructor(ErrorFrame)
_new_interrupt_inbound = trusted_constructor(InterruptInbound)
_new_passthrough = trusted_constructor(PassthroughForward)

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
        raise _missing("type", None)
    raise _bad("type", "a string", frame_type, None)


def _undeliverable(obj: Mapping[str, Any], frame_type: str, reason: str) -> UndeliverableEvent:
    buffer_id = obj.get("bufferId")
    return UndeliverableEvent(
        reason, buffer_id if type(buffer_id) is str and buffer_id else None, frame_type
    )

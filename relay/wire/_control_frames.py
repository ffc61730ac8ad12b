"""Control: the frames that run a connection rather than carry a platform message or action.

The handshake (:class:`Hello` per fronted identity, answered by a :class:`DescriptorFrame`),
going idle (:class:`GoingIdle` / :class:`GoingIdleAck`: new inbound is buffered durably), the
gateway's :class:`Interrupt` of a turn, and the typed protocol :class:`ErrorFrame`.  Private to
:mod:`relay.wire`: import these from :mod:`relay.wire.frames`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from relay.wire._fields import (
    as_object,
    as_str,
    bad_field,
    is_opt_str,
    is_str,
    str_items,
    str_tuple,
)
from relay.wire.descriptor import CONTRACT_VERSION, CapabilityDescriptor, check_strict_int
from statecore.trusted import trusted_constructor

__all__ = ["DescriptorFrame", "ErrorFrame", "GoingIdle", "GoingIdleAck", "Hello", "Interrupt"]


def _opt_positive_int(inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        check_strict_int(inst, attr, value)
        if isinstance(value, int) and value < 1:
            raise ValueError(f"{attr.name} must be at least 1, got {value}")


def _opt_strict_int(inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        check_strict_int(inst, attr, value)


# -- the handshake -------------------------------------------------------------------------------


@attrs.frozen
class Hello:
    """Announce one fronted identity; the connector answers with a :class:`DescriptorFrame`.

    Send one per identity right after the upgrade; the first is the default identity.
    ``protocol``/``features`` are our additions (the announcement, see :mod:`relay.wire.compat`): a
    hello read from the wire without ``protocol`` has ``protocol=None`` -- an original-contract
    gateway, to which nothing the contract did not have (``error`` frames, 4419, 4409) is sent.
    """

    TYPE: ClassVar[str] = "hello"

    platform: str = attrs.field(validator=is_str)
    bot_id: str = attrs.field(validator=is_str)
    protocol: int | None = attrs.field(default=CONTRACT_VERSION, validator=_opt_strict_int)
    features: tuple[str, ...] = attrs.field(default=(), converter=str_tuple, validator=str_items)
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
            platform = as_str(platform, "platform", ref)
        bot_id = get("botId")
        if type(bot_id) is not str:
            bot_id = as_str(bot_id, "botId", ref)
        protocol = get("protocol")
        if protocol is not None and type(protocol) is not int:
            raise bad_field("protocol", "an integer", protocol, ref)
        features = get("features")
        if features is None:
            features = ()
        elif not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            raise bad_field("features", "a list of strings", features, ref)
        window = get("window")
        if window is not None and (type(window) is not int or window < 1):
            window = None  # our addition, read leniently: unusable means "the default"
        return _new_hello(platform, bot_id, protocol, tuple(features), window)


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
        descriptor = as_object(obj.get("descriptor"), "descriptor", "descriptor")
        return _new_descriptor_frame(CapabilityDescriptor.from_wire(descriptor))


# -- going idle ----------------------------------------------------------------------------------


@attrs.frozen
class GoingIdle:
    """Ask the connector to buffer new inbound durably; answered by :class:`GoingIdleAck`."""

    TYPE: ClassVar[str] = "going_idle"

    request_id: str | None = attrs.field(default=None, validator=is_opt_str)

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
            request_id = as_str(request_id, "requestId", "going_idle")
        return _new_going_idle(request_id)


@attrs.frozen
class GoingIdleAck:
    """The connector flipped this instance to buffered-only; new inbound is buffered durably."""

    TYPE: ClassVar[str] = "going_idle_ack"

    request_id: str | None = attrs.field(default=None, validator=is_opt_str)

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
            request_id = as_str(request_id, "requestId", "going_idle_ack")
        return _new_going_idle_ack(request_id)


# -- interrupts and errors -----------------------------------------------------------------------


@attrs.frozen
class Interrupt:
    """Cancel the turn of session ``session_key`` (fire-and-forget: no answer comes back).

    The wire key is ``session_key`` as the doc spells it; ``sessionKey`` is accepted on input.
    """

    TYPE: ClassVar[str] = "interrupt"

    session_key: str = attrs.field(validator=is_str)
    reason: str | None = attrs.field(default=None, validator=is_opt_str)

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
            session_key = as_str(session_key, "session_key", ref)
        reason = obj.get("reason")
        if reason is not None and type(reason) is not str:
            reason = as_str(reason, "reason", ref)
        return _new_interrupt(session_key, reason)


@attrs.frozen
class ErrorFrame:
    """A typed protocol error about a frame we sent (``ref``: its requestId or type).

    Receiving one means the peer dropped that frame: fail the matching request (if ``ref`` names
    one) and log it; the connection stays up. Build one with
    :func:`relay.wire.codec.error_frame_for`.
    """

    TYPE: ClassVar[str] = "error"

    code: str = attrs.field(validator=is_str)
    message: str = attrs.field(validator=is_str)
    ref: str | None = attrs.field(default=None, validator=is_opt_str)

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
            code = as_str(code, "code", ref)
        message = get("message")
        if type(message) is not str:
            message = as_str(message, "message", ref)
        error_ref = get("ref")
        if error_ref is not None and type(error_ref) is not str:
            error_ref = as_str(error_ref, "ref", ref)
        return _new_error_frame(code, message, error_ref)


# Trusted constructors for the wire readers above (see trusted_constructor): resolved at call time.
_new_hello = trusted_constructor(Hello)
_new_descriptor_frame = trusted_constructor(DescriptorFrame)
_new_going_idle = trusted_constructor(GoingIdle)
_new_going_idle_ack = trusted_constructor(GoingIdleAck)
_new_interrupt = trusted_constructor(Interrupt)
_new_error_frame = trusted_constructor(ErrorFrame)

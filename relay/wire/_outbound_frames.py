"""Outbound: the gateway asks the connector to act on a platform, and gets one answer back.

:class:`Outbound` (gateway -> connector) carries an ``action``; :class:`OutboundResult`
(connector -> gateway) answers it by ``requestId`` with an :class:`OutboundOutcome` -- the
``result`` record, whose ``code`` :data:`EGRESS_DECLINED` is the tenant guard's definite refusal.
Private to :mod:`relay.wire`: import these from :mod:`relay.wire.frames`, which documents the
wire conventions and the local/remote error split they follow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final

import attrs

from relay.wire._fields import (
    as_object,
    as_opt_id,
    as_str,
    bad_field,
    is_opt_str,
    is_str,
    missing_field,
    normal_id,
)
from statecore.trusted import trusted_constructor

__all__ = ["EGRESS_DECLINED", "Outbound", "OutboundOutcome", "OutboundResult"]

EGRESS_DECLINED: Final = "egress_declined"
"""``OutboundOutcome.code`` of a definite refusal by the connector's tenant guard."""


def _action(value: Mapping[str, Any]) -> dict[str, Any]:
    # A private shallow copy: a caller mutating its dict afterwards cannot change a built frame.
    if not isinstance(value, Mapping):
        raise TypeError(f"action must be a mapping, got {type(value).__name__}")
    return dict(value)


def _action_op(_inst: object, _attr: attrs.Attribute[Any], value: Mapping[str, Any]) -> None:
    op = value.get("op")
    if not isinstance(op, str) or not op:
        raise ValueError("action must contain a non-empty string 'op'")


@attrs.frozen
class OutboundOutcome:
    """The connector's answer to one ``outbound`` action (the ``result`` object).

    ``success`` says whether the platform performed the action; ``message_id`` is the platform's
    id of the message sent or edited; ``error`` a human-readable failure; ``code`` a machine token
    (``"egress_declined"`` is a definite refusal by the tenant guard: never retry it).
    """

    success: bool = attrs.field(validator=attrs.validators.instance_of(bool))
    message_id: str | None = attrs.field(default=None, converter=normal_id, validator=is_opt_str)
    error: str | None = attrs.field(default=None, validator=is_opt_str)
    code: str | None = attrs.field(default=None, validator=is_opt_str)

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
        return _outcome_from_wire(as_object(obj, "object", ref, top=True), "", ref)


def _outcome_from_wire(obj: dict[str, Any], where: str, ref: str | None) -> OutboundOutcome:
    get = obj.get
    success = get("success")
    if type(success) is not bool:
        if success is None:
            raise missing_field(where + "success", ref)
        raise bad_field(where + "success", "a boolean", success, ref)
    message_id = get("message_id")
    if type(message_id) is not str:
        message_id = as_opt_id(message_id, where + "message_id", ref)
    error = get("error")
    if error is not None and type(error) is not str:
        error = as_str(error, where + "error", ref)
    code = get("code")
    if code is not None and type(code) is not str:
        code = as_str(code, where + "code", ref)
    return _new_outcome(success, message_id, error, code)


@attrs.frozen
class Outbound:
    """Ask the connector to perform ``action`` on a platform; answered by :class:`OutboundResult`.

    ``action`` must contain a non-empty string ``"op"`` (e.g. ``"send"``); the frame keeps a
    shallow copy and ``to_wire`` hands out that copy (do not mutate it). Reuse the same
    ``idempotency_key`` when retrying an ambiguous send so the connector can de-duplicate.
    ``platform``/``bot_id`` pick a non-default identity announced by a :class:`Hello`.
    ``traceparent`` (W3C trace context of the gateway's span for the send) is set only toward a
    connector that announced :data:`~relay.wire.compat.TRACE_CONTEXT`; read as sent (anything
    but a string reads as absent).
    """

    TYPE: ClassVar[str] = "outbound"

    request_id: str = attrs.field(validator=is_str)
    # Mutable inner data: excluded from the hash (equality still compares it).
    action: Mapping[str, Any] = attrs.field(converter=_action, validator=_action_op, hash=False)
    idempotency_key: str | None = attrs.field(default=None, validator=is_opt_str)
    platform: str | None = attrs.field(default=None, validator=is_opt_str)
    bot_id: str | None = attrs.field(default=None, validator=is_opt_str)
    traceparent: str | None = attrs.field(default=None, validator=is_opt_str)

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
        if self.traceparent is not None:
            wire["traceparent"] = self.traceparent
        return wire

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> Outbound:
        """Validate the peer's frame object; raises :class:`ProtocolError` (ref = requestId)."""
        get = obj.get
        request_id = get("requestId")
        if type(request_id) is not str:
            request_id = as_str(request_id, "requestId", "outbound")
        ref = request_id
        action = as_object(get("action"), "action", ref)
        op = action.get("op")
        if type(op) is not str or not op:
            if op is None:
                raise missing_field("action.op", ref)
            raise bad_field("action.op", "a non-empty string", op, ref)
        idempotency_key = get("idempotencyKey")
        if idempotency_key is not None and type(idempotency_key) is not str:
            idempotency_key = as_str(idempotency_key, "idempotencyKey", ref)
        platform = get("platform")
        if platform is not None and type(platform) is not str:
            platform = as_str(platform, "platform", ref)
        bot_id = get("botId")
        if bot_id is not None and type(bot_id) is not str:
            bot_id = as_str(bot_id, "botId", ref)
        traceparent = get("traceparent")
        if type(traceparent) is not str:
            traceparent = None  # never refused for it: no trace context, that is all
        # A private copy: the frame must not change if the caller's dict does.
        return _new_outbound(
            request_id, dict(action), idempotency_key, platform, bot_id, traceparent
        )


@attrs.frozen
class OutboundResult:
    """The answer to the :class:`Outbound` with the same ``request_id``.

    The caller resolves its pending request by ``request_id``; an unknown or late id is ignored.
    """

    TYPE: ClassVar[str] = "outbound_result"

    request_id: str = attrs.field(validator=is_str)
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
            request_id = as_str(request_id, "requestId", "outbound_result")
        result = obj.get("result")
        if type(result) is not dict:
            result = as_object(result, "result", request_id)
        return _new_outbound_result(request_id, _outcome_from_wire(result, "result.", request_id))


# Trusted constructors for the wire readers above (see trusted_constructor): resolved at call time.
_new_outcome = trusted_constructor(OutboundOutcome)
_new_outbound = trusted_constructor(Outbound)
_new_outbound_result = trusted_constructor(OutboundResult)

"""Relay errors, each saying who is to blame.

* :class:`ProtocolError` -- the **peer** sent something invalid (a remote error). The codec never
  raises it from :meth:`~relay.wire.codec.FrameDecoder.feed`; it hands the error back in place of
  the frame, so one bad line never loses the good ones around it. The receiver answers with an
  ``error`` frame (:func:`relay.wire.codec.error_frame_for`) and keeps the connection.
* :class:`ContractVersionError` -- the peer's descriptor speaks another contract version.
* :class:`RelayClosed` -- **we** closed the relay (``disconnect()``); retrying on this object
  cannot succeed.
* :class:`RelayBroken` -- the **peer or the network** broke the relay; a new connection may work.
* :class:`AuthError` -- a relay token was refused; ``reason`` says why.

Local misuse (a wrong argument type, a frame built with a bad value) raises the plain builtin
(``TypeError`` / ``ValueError``) instead: that is the caller's bug, not the peer's.

Every class pickles with its attributes (``__reduce__``), so errors survive a process boundary.
"""

from __future__ import annotations

from typing import Any, Final, Literal, get_args

from statecore.errors import StatecoreError

__all__ = [
    "AUTH_REASONS",
    "AuthError",
    "AuthReason",
    "ContractVersionError",
    "ProtocolError",
    "RelayBroken",
    "RelayClosed",
    "UndeliverableEvent",
]


class ProtocolError(StatecoreError):
    """The peer sent something invalid; the offending frame is dropped, the connection survives.

    ``code`` is a short machine-readable token (``"malformed_json"``, ``"not_an_object"``,
    ``"bad_field"``, ``"missing_field"``, ``"frame_too_large"``, ``"buffer_overflow"``,
    ``"contract_version"``), ``message`` a human-readable sentence (it never echoes the peer's
    data, only field names and type names), ``ref`` the requestId or the type of the offending
    frame when it is known (``None`` when the line could not be parsed at all).

    What to do next: answer the peer with ``relay.wire.codec.error_frame_for(err)``, drop the frame,
    and count it; repeated violations may close the connection with ``CLOSE_PROTOCOL`` (4400).
    """

    def __init__(self, code: str, message: str, ref: str | None = None) -> None:
        self.code = code
        self.message = message
        self.ref = ref
        text = f"{code}: {message}"
        if ref is not None:
            text = f"{text} (ref {ref!r})"
        super().__init__(text)

    def __reduce__(self) -> tuple[type[ProtocolError], tuple[str, str, str | None]]:
        return (type(self), (self.code, self.message, self.ref))


class ContractVersionError(ProtocolError):
    """The peer's capability descriptor declares a contract version we do not speak.

    ``expected`` is ours, ``received`` the peer's value. The connection cannot be used with this
    peer: the caller should close it and report both versions; re-dialing will not help until one
    side is upgraded.
    """

    def __init__(self, expected: int, received: int, ref: str | None = "descriptor") -> None:
        self.expected = expected
        self.received = received
        super().__init__(
            "contract_version",
            f"peer speaks relay contract version {received}, this side speaks {expected}",
            ref,
        )

    # The base class's __reduce__ would call this __init__ with (code, message, ref).
    def __reduce__(self) -> tuple[type[ContractVersionError], tuple[int, int, str | None]]:  # type: ignore[override]
        return (type(self), (self.expected, self.received, self.ref))


class UndeliverableEvent(ProtocolError):
    """A delivery from the connector that can never be handled: a *poison* event.

    Raised (and handed back by the decoder) for an ``inbound``, ``interrupt_inbound`` or
    ``passthrough_forward`` frame whose essentials are unusable -- an inbound event without a
    usable ``source.chat_id``, say.  ``buffer_id`` is the delivery's bufferId when it carried a
    usable one, ``frame_type`` its type, ``raw_line`` the line as received (set by the decoder).

    What to do next: never let it block what follows.  With a ``buffer_id``, record it durably
    as undeliverable (raw line and reason) and then ack it, so a connector that replays one
    entry at a time moves on; without one, log and count it.  It is not a protocol violation
    (an original connector may send such events), so it never counts toward closing with 4400.
    """

    def __init__(
        self,
        message: str,
        buffer_id: str | None = None,
        frame_type: str = "inbound",
        raw_line: str = "",
    ) -> None:
        self.buffer_id = buffer_id
        self.frame_type = frame_type
        self.raw_line = raw_line
        super().__init__("undeliverable", message, buffer_id or frame_type)

    def __reduce__(  # type: ignore[override]
        self,
    ) -> tuple[type[UndeliverableEvent], tuple[str, str | None, str, str]]:
        return (type(self), (self.message, self.buffer_id, self.frame_type, self.raw_line))


class RelayClosed(StatecoreError):
    """The relay was closed **by this side** (a deliberate disconnect); nothing more will be sent.

    Retrying on the same transport cannot succeed; build a new one if you need the relay again.
    """

    def __init__(self, message: str = "relay transport closed") -> None:
        self.message = message
        super().__init__(message)

    def __reduce__(self) -> tuple[type[RelayClosed], tuple[str]]:
        return (type(self), (self.message,))


class RelayBroken(StatecoreError):
    """The relay was broken **by the peer or the network** (unexpected close, reset, timeout).

    ``code``/``reason`` carry the WebSocket close code and reason when one was received. An
    outbound request in flight when this happened has an unknown outcome: retry it with the same
    idempotency key once a new connection is up.
    """

    def __init__(
        self,
        message: str = "relay connection lost",
        code: int | None = None,
        reason: str | None = None,
    ) -> None:
        self.message = message
        self.code = code
        self.reason = reason
        text = message
        if code is not None:
            text = f"{text} (close code {code}" + (f", reason {reason!r})" if reason else ")")
        super().__init__(text)

    def __reduce__(self) -> tuple[type[RelayBroken], tuple[str, int | None, str | None]]:
        return (type(self), (self.message, self.code, self.reason))


AuthReason = Literal["expired", "unknown", "forged", "malformed"]
"""Why a relay token was refused."""

AUTH_REASONS: Final[frozenset[str]] = frozenset(get_args(AuthReason))


class AuthError(StatecoreError):
    """A relay token was refused; ``reason`` is one of :data:`AuthReason`.

    * ``malformed`` -- not a token at all (bad base64, wrong shape, non-integer expiry, empty id,
      missing or non-Bearer header): the client is broken or not ours.
    * ``unknown`` -- no secret is configured for that gateway id.
    * ``forged`` -- no configured secret of that gateway produced the signature (wrong or retired
      secret).
    * ``expired`` -- a genuine token whose expiry lies further in the past than the skew allows:
      the client should dial again with a fresh token (close code 4419).

    ``detail`` is a short human-readable addition; it never contains a secret or a signature.
    """

    def __init__(self, reason: AuthReason, detail: str = "", *, timing: bool = False) -> None:
        if reason not in AUTH_REASONS:
            raise ValueError(f"unknown AuthError reason {reason!r}")
        self.reason: AuthReason = reason
        self.detail = detail
        self.timing = timing
        """True when the token was genuine and refused only for its times (expired, or a
        lifetime beyond the cap): the two clocks may disagree, and the refusal should say so."""
        text = f"relay token refused: {reason}"
        if detail:
            text = f"{text} ({detail})"
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_auth_error, (self.reason, self.detail, self.timing))


def _auth_error(reason: AuthReason, detail: str, timing: bool) -> AuthError:
    return AuthError(reason, detail, timing=timing)

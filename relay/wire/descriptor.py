"""The capability descriptor: what a platform behind the connector can do.

The connector answers every ``hello`` with one descriptor; the first descriptor of a connection
completes the handshake. This module is pure data: :meth:`CapabilityDescriptor.from_wire` turns the
peer's JSON object into a validated record (a remote error is a :class:`ProtocolError`), the
constructor validates values built locally (a local error is a ``TypeError``/``ValueError``).

Wire rules (docs/wire-contract.md):

* required: ``contract_version`` (must equal :data:`CONTRACT_VERSION`), ``platform``, ``label``,
  ``max_message_length`` (``<= 0`` or garbage -> 4096), ``supports_draft_streaming``,
  ``supports_edit``, ``supports_threads``, ``markdown_dialect``, ``len_unit`` (``"chars"`` |
  ``"utf16"``);
* optional: ``supported_ops`` (missing/empty -> the legacy set :data:`LEGACY_OPS`),
  ``max_frame_bytes``, and our additions ``features`` (what the connector announces, see
  :mod:`relay.wire.compat`; missing or unreadable -> none: an original connector) and
  ``idempotency_window_s`` (how many seconds the platform deduplicates a send by its
  idempotency key, with :data:`~relay.wire.compat.IDEMPOTENT_SENDS`; a positive integer, and
  missing or anything else -> None: no window, nothing is taken as deduplicated);
* our additions are never a reason to refuse a descriptor: what cannot be read of them reads
  as "not announced", the original contract;
* unknown keys are dropped; JSON ``null`` counts as absent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal

import attrs

from relay.wire.errors import ContractVersionError, ProtocolError

__all__ = [
    "CONTRACT_VERSION",
    "DEFAULT_MAX_MESSAGE_LENGTH",
    "LEGACY_OPS",
    "CapabilityDescriptor",
    "LenUnit",
]

CONTRACT_VERSION: Final = 1
"""The relay contract version this code speaks; a descriptor with another version is refused."""

DEFAULT_MAX_MESSAGE_LENGTH: Final = 4096
"""Used when the peer's ``max_message_length`` is missing, not a positive integer, or garbage."""

LEGACY_OPS: Final[tuple[str, ...]] = ("send", "edit", "typing", "follow_up")
"""The operations every connector of the original contract supports (a descriptor that lists no
``supported_ops`` supports exactly these)."""

LenUnit = Literal["chars", "utf16"]
"""How ``max_message_length`` is counted: code points, or UTF-16 code units."""

_LEN_UNITS: Final = frozenset(("chars", "utf16"))
_REF: Final = "descriptor"


def _ops(value: Iterable[str]) -> tuple[str, ...]:
    # Invariant: supported_ops is never empty; "nothing declared" means the legacy set.
    ops = tuple(value)
    return ops if ops else LEGACY_OPS


def _check_ops(_inst: object, _attr: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    for op in value:
        if not isinstance(op, str) or not op:
            raise TypeError(f"supported_ops must hold non-empty strings, got {op!r}")


def check_strict_int(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    """attrs validator: an int that is not a bool (``TypeError`` naming the field)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{attr.name} must be an int, got {type(value).__name__}")


def _check_positive(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, int) and value <= 0:
        raise ValueError(f"{attr.name} must be positive, got {value}")


def _check_opt_positive(inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        check_strict_int(inst, attr, value)
        _check_positive(inst, attr, value)


def _features(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _check_features(_inst: object, _attr: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    for name in value:
        if not isinstance(name, str) or not name:
            raise TypeError(f"features must hold non-empty strings, got {name!r}")


def _check_len_unit(_inst: object, _attr: attrs.Attribute[Any], value: str) -> None:
    if value not in _LEN_UNITS:
        raise ValueError(f"len_unit must be 'chars' or 'utf16', got {value!r}")


_str = attrs.validators.instance_of(str)
_bool = attrs.validators.instance_of(bool)


@attrs.frozen
class CapabilityDescriptor:
    """What one platform identity behind the connector supports (frozen, hashable).

    Construct it directly for placeholders and tests (bad values raise ``TypeError`` /
    ``ValueError``), or from the peer's JSON with :meth:`from_wire` (bad values raise
    :class:`ProtocolError`). ``supported_ops`` is never empty: an empty value means
    :data:`LEGACY_OPS`.
    """

    contract_version: int = attrs.field(validator=check_strict_int)
    platform: str = attrs.field(validator=_str)
    label: str = attrs.field(validator=_str)
    max_message_length: int = attrs.field(validator=[check_strict_int, _check_positive])
    supports_draft_streaming: bool = attrs.field(validator=_bool)
    supports_edit: bool = attrs.field(validator=_bool)
    supports_threads: bool = attrs.field(validator=_bool)
    markdown_dialect: str = attrs.field(validator=_str)
    len_unit: LenUnit = attrs.field(validator=_check_len_unit)
    supported_ops: tuple[str, ...] = attrs.field(
        default=LEGACY_OPS, converter=_ops, validator=_check_ops
    )
    max_frame_bytes: int | None = attrs.field(default=None, validator=_check_opt_positive)
    features: tuple[str, ...] = attrs.field(
        default=(), converter=_features, validator=_check_features
    )
    idempotency_window_s: int | None = attrs.field(default=None, validator=_check_opt_positive)
    """Seconds the platform deduplicates a send by its idempotency key (None: it does not, or
    the connector did not say); meaningful with :data:`~relay.wire.compat.IDEMPOTENT_SENDS`."""

    def announces(self, feature: str) -> bool:
        """Return whether the connector announced ``feature`` (see :mod:`relay.wire.compat`); an
        original connector announces nothing.  Raises nothing."""
        return feature in self.features

    def supports(self, op: str) -> bool:
        """Return whether the platform performs the outbound action ``op`` (e.g. ``"edit"``).

        The caller should fall back (e.g. send instead of edit) or skip the action when False;
        sending an unsupported op gets a failed ``outbound_result`` from the connector.
        """
        return op in self.supported_ops

    def to_wire(self) -> dict[str, Any]:
        """Return the descriptor as the JSON object of the wire (``supported_ops`` always listed;
        ``max_frame_bytes``, ``features`` and ``idempotency_window_s`` only when set). Raises
        nothing; the result is a fresh dict."""
        wire: dict[str, Any] = {
            "contract_version": self.contract_version,
            "platform": self.platform,
            "label": self.label,
            "max_message_length": self.max_message_length,
            "supports_draft_streaming": self.supports_draft_streaming,
            "supports_edit": self.supports_edit,
            "supports_threads": self.supports_threads,
            "markdown_dialect": self.markdown_dialect,
            "len_unit": self.len_unit,
            "supported_ops": list(self.supported_ops),
        }
        if self.max_frame_bytes is not None:
            wire["max_frame_bytes"] = self.max_frame_bytes
        if self.features:
            wire["features"] = list(self.features)
        if self.idempotency_window_s is not None:
            wire["idempotency_window_s"] = self.idempotency_window_s
        return wire

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> CapabilityDescriptor:
        """Validate the peer's descriptor object and return the record, applying the defaults.

        Raises :class:`ContractVersionError` when ``contract_version`` is an int other than
        :data:`CONTRACT_VERSION` (checked first: another version may carry other fields), and
        :class:`ProtocolError` (``missing_field`` / ``bad_field``, ``ref="descriptor"``) for a
        missing or mistyped required field or a bad optional one. The caller should answer with an
        ``error`` frame; a :class:`ContractVersionError` means this peer cannot be used at all.
        """
        if not isinstance(obj, Mapping):
            raise ProtocolError("bad_field", "descriptor must be a JSON object", _REF)
        version = obj.get("contract_version")
        if version is None:
            raise _missing("contract_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise _bad("contract_version", "an integer", version)
        if version != CONTRACT_VERSION:
            raise ContractVersionError(CONTRACT_VERSION, version)

        len_unit = _required(obj, "len_unit", str, "a string")
        if len_unit not in _LEN_UNITS:
            raise ProtocolError("bad_field", "field 'len_unit' must be 'chars' or 'utf16'", _REF)
        raw_ops = obj.get("supported_ops")
        ops: tuple[str, ...] = LEGACY_OPS
        if raw_ops is not None:
            if not isinstance(raw_ops, list | tuple) or not all(
                isinstance(op, str) and op for op in raw_ops
            ):
                raise _bad("supported_ops", "a list of non-empty strings", raw_ops)
            ops = _ops(raw_ops)
        max_frame = obj.get("max_frame_bytes")
        if max_frame is not None and (
            not isinstance(max_frame, int) or isinstance(max_frame, bool) or max_frame <= 0
        ):
            raise _bad("max_frame_bytes", "a positive integer", max_frame)

        return cls(
            contract_version=version,
            platform=_required(obj, "platform", str, "a string"),
            label=_required(obj, "label", str, "a string"),
            max_message_length=_lenient_length(obj.get("max_message_length")),
            supports_draft_streaming=_required(obj, "supports_draft_streaming", bool, "a boolean"),
            supports_edit=_required(obj, "supports_edit", bool, "a boolean"),
            supports_threads=_required(obj, "supports_threads", bool, "a boolean"),
            markdown_dialect=_required(obj, "markdown_dialect", str, "a string"),
            len_unit=len_unit,
            supported_ops=ops,
            max_frame_bytes=max_frame,
            features=_lenient_features(obj.get("features")),
            idempotency_window_s=_lenient_window(obj.get("idempotency_window_s")),
        )


def _lenient_features(value: object) -> tuple[str, ...]:
    """Our addition is never a reason to refuse a descriptor: anything but a list of non-empty
    strings reads as "no features" (an original connector), and at most 32 names are kept."""
    if not isinstance(value, list):
        return ()
    return tuple(dict.fromkeys(f for f in value if isinstance(f, str) and f))[:32]


def _lenient_window(value: object) -> int | None:
    """Our addition, read like ``features``: a positive integer is kept; anything else (a bool,
    a float, a string, zero or less) reads as None, "no window", which promises nothing."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _lenient_length(value: object) -> int:
    """The doc's rule for max_message_length: a positive integer (or an integral float, or a
    decimal string, as sloppy connectors send) is kept; anything else, missing, or <= 0 is 4096."""
    number = 0
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif (isinstance(value, float) and value.is_integer()) or (
        isinstance(value, str) and value.strip().isdecimal() and len(value) <= 18
    ):
        number = int(value)
    return number if number > 0 else DEFAULT_MAX_MESSAGE_LENGTH


def _required(obj: Mapping[str, Any], key: str, kind: type[Any], what: str) -> Any:
    value = obj.get(key)
    if value is None:
        raise _missing(key)
    if not isinstance(value, kind):
        raise _bad(key, what, value)
    return value


def _missing(key: str) -> ProtocolError:
    return ProtocolError("missing_field", f"descriptor field {key!r} is required", _REF)


def _bad(key: str, what: str, value: object) -> ProtocolError:
    return ProtocolError(
        "bad_field", f"descriptor field {key!r} must be {what}, got {type(value).__name__}", _REF
    )

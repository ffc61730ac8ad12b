"""Field validation shared by every frame of :mod:`relay.wire.frames`: the two ways a value gets in.

* Local (a frame built in Python): attrs validators and converters that raise ``TypeError`` /
  ``ValueError`` -- the caller's bug.
* Remote (a frame read from the peer's JSON): readers that raise
  :class:`~relay.wire.errors.ProtocolError` -- the peer's bug: ``missing_field`` for an absent
  (or ``null``) required key, ``bad_field`` for a wrong type, naming the key and the frame's
  ``ref``.

The fast path of every wire check is an inline ``type(value) is str`` test in the frame's reader;
the ``as_*`` helpers run only when it fails, and either accept the value (a str subclass, an int
id, a null optional) or raise.  Private to :mod:`relay.wire`: import frames from
:mod:`relay.wire.frames`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from relay.wire.errors import ProtocolError

__all__ = [
    "as_id",
    "as_object",
    "as_opt_id",
    "as_str",
    "bad_field",
    "is_opt_str",
    "is_str",
    "missing_field",
    "normal_id",
    "str_items",
    "str_tuple",
]

# -- local validation (constructors) -------------------------------------------------------------

is_str = attrs.validators.instance_of(str)
"""attrs validator: the field holds a ``str``."""

is_opt_str = attrs.validators.optional(is_str)
"""attrs validator: the field holds a ``str`` or ``None``."""


def normal_id(value: Any) -> Any:
    """attrs converter of a platform id: an ``int`` (not a ``bool``) becomes its ``str``.

    Platforms send numeric ids; we keep one representation (str) so routes compare equal.
    A bool is not an id, and None stays None: both pass through unchanged for the validator.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    """attrs converter: an iterable of strings as a tuple; a single ``str``/``bytes`` is a
    ``TypeError`` (it would otherwise become a tuple of characters)."""
    if isinstance(value, str | bytes):
        raise TypeError("expected an iterable of strings, got a single string")
    return tuple(value)


def str_items(_inst: object, attr: attrs.Attribute[Any], value: tuple[object, ...]) -> None:
    """attrs validator: every item of the tuple field is a ``str`` (else ``TypeError``)."""
    for item in value:
        if not isinstance(item, str):
            raise TypeError(f"{attr.name} must hold strings, got {type(item).__name__}")


# -- remote validation (from_wire) ---------------------------------------------------------------


def missing_field(name: str, ref: str | None) -> ProtocolError:
    """The ``missing_field`` error for the required wire key ``name`` (returned, not raised)."""
    return ProtocolError("missing_field", f"field {name!r} is required", ref)


def bad_field(name: str, what: str, value: object, ref: str | None) -> ProtocolError:
    """The ``bad_field`` error for wire key ``name``, which must be ``what`` (returned, not
    raised).  It names the value's type, never echoes the value: it may be huge or sensitive."""
    return ProtocolError(
        "bad_field", f"field {name!r} must be {what}, got {type(value).__name__}", ref
    )


def as_str(value: object, name: str, ref: str | None) -> str:
    """Accept a required string field (a str subclass too); raise :class:`ProtocolError`."""
    if isinstance(value, str):
        return value
    if value is None:
        raise missing_field(name, ref)
    raise bad_field(name, "a string", value, ref)


def as_id(value: object, name: str, ref: str | None) -> str:
    """Accept a required platform id: a string, or an integer (not a bool) read as its ``str``;
    raise :class:`ProtocolError`."""
    if type(value) is int:
        return str(value)
    if isinstance(value, str):
        return value
    if value is None:
        raise missing_field(name, ref)
    raise bad_field(name, "a string or an integer", value, ref)


def as_opt_id(value: object, name: str, ref: str | None) -> str | None:
    """Like :func:`as_id`, but ``None`` (absent or ``null``) is accepted as ``None``."""
    return None if value is None else as_id(value, name, ref)


def as_object(value: object, name: str, ref: str | None, *, top: bool = False) -> dict[str, Any]:
    """Accept a JSON object field as a dict (a dict itself, or a copy of another mapping).

    Raises :class:`ProtocolError`: ``not_an_object`` when ``top`` (the value is the frame or
    record itself), else ``missing_field`` / ``bad_field`` naming ``name``.
    """
    if isinstance(value, dict):
        return value
    if isinstance(value, Mapping):
        return dict(value)
    if top:
        raise ProtocolError("not_an_object", "a frame or record must be a JSON object", ref)
    if value is None:
        raise missing_field(name, ref)
    raise bad_field(name, "an object", value, ref)

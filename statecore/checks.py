"""Argument checks the services share, so that bad input is refused the same way everywhere."""

from __future__ import annotations

import math

__all__ = ["platform_id", "require_positive", "require_text"]


def require_text(name: str, value: object) -> None:
    """Refuse anything but a non-empty ``str``: ``TypeError`` for another type, ``ValueError``
    for ``""``; the message names the argument."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must not be empty")


def platform_id(name: str, value: object, *, required: bool = False) -> str | None:
    """A platform id (chat, thread, message) as stored: text.  Platforms hand them out as str
    or int; an int becomes its decimal text.  None passes unless ``required``; anything else
    is refused as :func:`require_text` refuses it."""
    if value is None and not required:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    require_text(name, value)
    assert isinstance(value, str)
    return value


def require_positive(name: str, value: object) -> None:
    """Refuse anything but a positive, finite int or float (bools too): ``ValueError`` naming
    the argument."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number, not {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, not {value!r}")

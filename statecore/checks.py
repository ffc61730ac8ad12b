"""Argument checks the services share, so that bad input is refused the same way everywhere."""

from __future__ import annotations

__all__ = ["require_text"]


def require_text(name: str, value: object) -> None:
    """Refuse anything but a non-empty ``str``: ``TypeError`` for another type, ``ValueError``
    for ``""``; the message names the argument."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must not be empty")

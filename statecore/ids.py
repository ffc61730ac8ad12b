"""Deterministic identifiers for persisted entities.

An obligation id is derived from the turn that produced the reply, so recording the same reply
twice (a retried turn, a replayed handler) finds the same row instead of owing it twice.
"""

from __future__ import annotations

import hashlib

__all__ = ["OBLIGATION_ID_LENGTH", "composite_id", "compute_obligation_id"]

OBLIGATION_ID_LENGTH = 24
"""Hex characters in an obligation id (96 bits of SHA-256)."""

_DOMAIN = b"statecore/obligation/v1\x00"


def compute_obligation_id(session_key: str, message_ref: str | int | None, content: str) -> str:
    """Return the obligation id for one reply: 24 lowercase hex characters.

    The same ``session_key`` (which already names the thread), inbound ``message_ref`` and
    ``content`` always give the same id; a change in any of them gives a different one.  Each
    field is length-prefixed, so no choice of delimiter characters inside a field can make two
    different triples collide; ``None`` and ``""`` are distinct message refs, and an int ref
    equals its decimal string.  Raises ``TypeError`` for any other field type.
    """
    if not isinstance(session_key, str):
        raise TypeError(f"session_key must be a str, not {type(session_key).__name__}")
    if not isinstance(content, str):
        raise TypeError(f"content must be a str, not {type(content).__name__}")
    if isinstance(message_ref, bool) or not isinstance(message_ref, str | int | None):
        raise TypeError(
            f"message_ref must be a str, an int or None, not {type(message_ref).__name__}"
        )
    digest = hashlib.sha256(_DOMAIN)
    for field in (session_key, None if message_ref is None else str(message_ref), content):
        digest.update(_frame(field))
    return digest.hexdigest()[:OBLIGATION_ID_LENGTH]


def _frame(field: str | None) -> bytes:
    """Tag and length-prefix one field: ``N`` for None, ``S<len>:<utf-8 bytes>`` for text."""
    if field is None:
        return b"N"
    data = field.encode("utf-8", "surrogatepass")
    return b"S%d:" % len(data) + data


def composite_id(*parts: str) -> str:
    """An entity id made of several text parts: every part but the last is length-prefixed
    (``len:part|``), so no choice of characters inside the parts can make two different tuples
    share an id, while the id stays readable.  Raises ``ValueError`` for no parts."""
    if not parts:
        raise ValueError("composite_id needs at least one part")
    *head, last = parts
    return "".join(f"{len(part)}:{part}|" for part in head) + last

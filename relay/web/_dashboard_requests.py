"""What a browser may ask the dashboard, checked before anything is done with it.

A browser sends JSON objects with a ``type``:

* ``{"type": "history", "id": ID}`` -- one obligation's audit history;
* ``{"type": "auth", "token": TOKEN}`` -- who this token says the operator is (nothing written);
* ``{"type": "abandon" | "retry", "id": ID, "reason": TEXT, "token": TOKEN}`` -- an operator's
  repair (``token`` may be empty or missing: the action is then refused as read-only).

Anything else -- text that is not JSON, JSON that is not an object, an unknown type, a field of
the wrong type or past its length -- raises :class:`BadRequest` with a message safe to send back
(it quotes no input).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import attrs

__all__ = ["ACTIONS", "MAX_ID", "MAX_REASON", "MAX_TOKEN", "BadRequest", "Request", "parse"]

MAX_ID = 200
"""The longest id a browser may name (obligation ids are 24 characters)."""
MAX_REASON = 500
"""The longest reason an operator may type for the audit entry."""
MAX_TOKEN = 4096
"""The longest token accepted (the verifier refuses longer ones too)."""
ACTIONS = ("abandon", "retry")

Kind = Literal["history", "auth", "abandon", "retry"]


class BadRequest(ValueError):
    """A browser's message the dashboard does not understand; the message says why, without
    quoting the input."""


@attrs.frozen
class Request:
    """One checked request: its type and the fields that type takes (None otherwise)."""

    type: Kind
    id: str | None = None
    reason: str | None = None
    token: str | None = None


def parse(message: str | bytes) -> Request:
    """Check one WebSocket message from a browser.  Raises :class:`BadRequest` for anything
    but a well-formed request (see the module docs); the caller answers with its message and
    keeps the session open."""
    if isinstance(message, bytes):
        raise BadRequest("binary messages are not understood; send JSON text")
    try:
        data: Any = json.loads(message)
    except (ValueError, RecursionError):
        raise BadRequest("not JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("expected a JSON object")
    kind = data.get("type")
    if kind == "history":
        return Request("history", id=_text(data, "id", MAX_ID))
    if kind == "auth":
        return Request("auth", token=_text(data, "token", MAX_TOKEN, empty=True))
    if kind in ACTIONS:
        return Request(
            kind,
            id=_text(data, "id", MAX_ID),
            reason=_text(data, "reason", MAX_REASON),
            token=_text(data, "token", MAX_TOKEN, empty=True, missing=True),
        )
    if not isinstance(kind, str):
        raise BadRequest("a message needs a string 'type'")
    raise BadRequest("unknown message type; expected history, auth, abandon or retry")


def _text(
    data: dict[str, Any], field: str, limit: int, *, empty: bool = False, missing: bool = False
) -> str:
    """``data[field]`` checked: a string (stripped), at most ``limit`` characters, not empty
    unless ``empty``; ``""`` for a missing field when ``missing``."""
    if field not in data and missing:
        return ""
    value = data.get(field)
    if not isinstance(value, str):
        raise BadRequest(f"'{field}' must be a string")
    value = value.strip()
    if len(value) > limit:
        raise BadRequest(f"'{field}' is longer than {limit} characters")
    if not value and not empty:
        raise BadRequest(f"'{field}' must not be empty")
    return value

"""Peer text made safe for a log line.

What a peer sends -- a session key, a reason, a request id, a close reason, an error text, a
driver's error message -- may hold newlines, carriage returns, terminal escapes, other control
characters, Unicode line and paragraph separators and bidirectional overrides, and may be huge.
Written into a log as it is, it would start lines of its own (a forged record), rewrite the
operator's terminal, or reorder what the line shows.  Every log line that carries such text
passes it through :func:`peer_text` (or :func:`failure`, for an exception) first: the result is
one printable line of bounded length, and the same input always gives the same output.
"""

from __future__ import annotations

import os
import traceback
from typing import Final

__all__ = ["MAX_CHARS", "failure", "peer_text"]

MAX_CHARS: Final = 200
"""The longest peer text a log line carries by default (escapes included)."""

_FRAMES: Final = 3
"""The innermost frames :func:`failure` names."""


def _escape(char: str) -> str:
    """One character as the escape Python's ``repr`` writes for it (``\\n``, ``\\x1b``,
    ``\\u2028``, ``\\\\``)."""
    return repr(char)[1:-1]


def peer_text(value: object, *, limit: int = MAX_CHARS) -> str:
    """``value`` (a str as it is, anything else its ``repr``) as one printable line of at most
    ``limit`` characters plus a note of how long it was when it had to be cut.

    Every character ``str.isprintable`` rejects -- the C0 controls (newline, carriage return,
    escape, NUL...), DEL, the C1 controls, the line and paragraph separators U+2028/U+2029,
    format characters such as the bidirectional overrides, surrogates, unassigned code points
    -- and every backslash is written as the escape ``repr`` uses for it, so nothing the peer
    chose can end the line or change how it reads, and an escape in the output always means
    the character it names.  Use it for every argument of a log call that a peer decides;
    raises nothing (``limit`` below 1 is taken as 1).
    """
    if isinstance(value, str):
        text = value
    else:
        try:
            text = repr(value)
        except Exception:  # a peer's object whose repr fails must not break the log line
            text = f"<unprintable {type(value).__name__}>"
    limit = max(1, limit)
    # The common case: short, printable, no backslash -- the text itself, no copy.
    if len(text) <= limit and "\\" not in text and text.isprintable():
        return text
    # Escaped up to the limit (an escape is never cut in half), then the rest is counted.
    out: list[str] = []
    used = 0
    for index, char in enumerate(text):
        piece = char if char.isprintable() and char != "\\" else _escape(char)
        if used + len(piece) > limit:
            return "".join(out) + f"...[{len(text) - index} more of {len(text)} chars]"
        out.append(piece)
        used += len(piece)
    return "".join(out)


def failure(exc: BaseException, *, limit: int = MAX_CHARS) -> str:
    """An exception as one safe log line: its type, its text through :func:`peer_text`, and
    where it was raised (the innermost frames, ``file:line in function``).

    For failures whose text a peer may have chosen (a platform driver's error, a handler that
    tripped over a frame's field), logged instead of a traceback, which would carry that text
    raw, one line after another.  Raises nothing.
    """
    try:
        text = str(exc)
    except Exception:
        text = f"<unprintable {type(exc).__name__}>"
    kind = type(exc).__qualname__
    line = f"{kind}: {peer_text(text, limit=limit)}" if text else kind
    frames = traceback.extract_tb(exc.__traceback__)[-_FRAMES:] if exc.__traceback__ else []
    if frames:
        where = ", ".join(
            f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"
            for frame in reversed(frames)
        )
        line = f"{line} (at {peer_text(where, limit=limit)})"
    return line

"""What the command line prints: aligned tables for people, JSON for scripts, times and sizes
in words, and a progress bar on stderr for long work.

Nothing here knows a command; every command and every plugin renders through these helpers so
the output looks the same everywhere.
"""

from __future__ import annotations

import datetime
import enum
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TextIO

__all__ = [
    "Progress",
    "age",
    "duration",
    "shorten",
    "size",
    "table",
    "timestamp",
    "to_json",
]

_NONE = "-"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Render ``rows`` under ``headers`` as columns separated by two spaces, one line each,
    ending with a newline; None shows as ``-``, and a column of numbers is right-aligned.
    Cells are shown whole: shorten long ones first (:func:`shorten`)."""
    values = [list(row) for row in rows]
    cells = [[_NONE if v is None else str(v) for v in row] for row in values]
    numeric = [_numeric([row[i] for row in values]) for i in range(len(headers))]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = [_line(list(headers), widths, numeric)]
    lines.extend(_line(row, widths, numeric) for row in cells)
    return "\n".join(lines) + "\n"


def _numeric(column: list[object]) -> bool:
    """A column of numbers (and blanks), with at least one number."""
    shown = [v for v in column if v is not None]
    return bool(shown) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in shown
    )


def _line(cells: Sequence[str], widths: Sequence[int], right: Sequence[bool]) -> str:
    shown = [
        cell.rjust(width) if flush else cell.ljust(width)
        for cell, width, flush in zip(cells, widths, right, strict=True)
    ]
    return "  ".join(shown).rstrip()


def shorten(text: object, width: int = 40) -> str | None:
    """``text`` on one line, cut to ``width`` characters with an ellipsis; None stays None."""
    if text is None:
        return None
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: max(0, width - 1)] + "\u2026"


def duration(seconds: float | None) -> str:
    """A length of time in words: ``42s``, ``3m 05s``, ``2h 10m``, ``3d 4h`` (``-`` for None)."""
    if seconds is None:
        return _NONE
    whole = int(max(0.0, seconds))
    if seconds < 10 and whole < 10:
        return f"{max(0.0, seconds):.1f}s"
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def age(then: float | None, now: float) -> str:
    """How long ago ``then`` was, as of ``now`` (``-`` for None)."""
    return _NONE if then is None else duration(now - then)


def timestamp(when: float | None) -> str:
    """A time (seconds since the epoch) as UTC ISO 8601 to the second (``-`` for None)."""
    if when is None:
        return _NONE
    moment = datetime.datetime.fromtimestamp(when, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def size(n: int) -> str:
    """A number of bytes in words: ``512 B``, ``1.5 KiB``, ``12.0 MiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def to_json(data: object) -> str:
    """``data`` as indented JSON with a final newline; enums show as their values, mappings and
    sequences as objects and arrays."""
    return json.dumps(data, indent=2, ensure_ascii=False, default=_plain) + "\n"


def _plain(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, frozenset | set | tuple):
        return list(value)
    raise TypeError(f"cannot show {type(value).__name__} as JSON")


class Progress:
    """A one-line progress bar on ``stream``, drawn only when the stream is a terminal (so a
    script's captured stderr stays clean), redrawn at most ten times a second and wiped by
    :meth:`close` (or leaving the ``with`` block).

    ``total`` known: ``label [#####.....]  42%  420/1000``; unknown: ``label ... 3.2s``.
    """

    WIDTH = 30

    def __init__(
        self,
        label: str,
        total: int | None,
        stream: TextIO,
        *,
        enabled: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        interval: float = 0.1,
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.stream = stream
        self.enabled = _is_terminal(stream) if enabled is None else enabled
        self._clock = clock
        self._interval = interval
        self._started = clock()
        self._drawn_at: float | None = None
        self._drawn = False

    def __enter__(self) -> Progress:
        self.draw(force=True)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def update(self, done: int, total: int | None = None) -> None:
        """Record ``done`` units of work (of ``total``, when it changed) and redraw if due."""
        self.done = done
        learned = total is not None and self.total is None
        if total is not None:
            self.total = total
        self.draw(force=learned)

    def tick(self) -> None:
        """Redraw if due (work of unknown size is going on)."""
        self.draw()

    def draw(self, *, force: bool = False) -> None:
        """Draw the bar now if enabled and, unless ``force``, the last draw is old enough."""
        if not self.enabled:
            return
        now = self._clock()
        if not force and self._drawn_at is not None and now - self._drawn_at < self._interval:
            return
        self._drawn_at = now
        self._drawn = True
        self.stream.write("\r\x1b[K" + self.render(now))
        self.stream.flush()

    def render(self, now: float | None = None) -> str:
        """The line as it would be drawn now."""
        at = self._clock() if now is None else now
        if self.total is None:
            return f"{self.label} ... {at - self._started:.1f}s"
        total = max(self.total, 1)
        fraction = min(1.0, self.done / total)
        filled = round(fraction * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        return f"{self.label} [{bar}] {fraction:4.0%}  {self.done}/{self.total}"

    def close(self) -> None:
        """Wipe the line, if one was drawn."""
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False

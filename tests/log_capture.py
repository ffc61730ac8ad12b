"""Logs as an operator reads them, for the tests of what a peer can put there: the records and
the text a real ``StreamHandler`` with the default formatter wrote (:class:`Captured`, the
``captured`` fixture of ``tests/conftest.py``), and :data:`EVIL`, the text no log may show raw."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager

EVIL = "\nCRITICAL:statecore.ledger:forged\r\x1b[2J\x00\x07\x7f\x85\u2028\u2029\u202e\u2066\t"
"""A forged record on a line of its own, then every kind of character that must never reach a
log raw: CR, ESC, NUL, BEL, DEL, a C1 control (NEL), the Unicode line and paragraph
separators, bidirectional overrides, a tab."""


class Captured:
    """The records that reached a logger and, through a real ``StreamHandler`` with its
    default formatter, the text it wrote."""

    def __init__(self) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.records: list[logging.LogRecord] = []
        self.handler.addFilter(self._keep)

    def _keep(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return True

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def lines_with(self, marker: str) -> list[str]:
        return [line for line in self.text.split("\n") if marker in line]

    def check_one_line_each(self) -> None:
        """Assert that each record was written as one line of printable text, that the stream
        holds exactly those lines, and that none of them is a forged ``CRITICAL`` record."""
        formatted = [self.handler.format(record) for record in self.records]
        for line in formatted:
            assert line.isprintable(), repr(line)
            assert len(line.splitlines()) == 1, repr(line)
        assert self.text.splitlines() == formatted
        assert not [line for line in self.text.splitlines() if line.startswith("CRITICAL")]


@contextmanager
def capturing(name: str = "relay") -> Iterator[Captured]:
    """Everything logger ``name`` logs, at DEBUG, while the block runs."""
    capture = Captured()
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(capture.handler)
    try:
        yield capture
    finally:
        logger.removeHandler(capture.handler)
        logger.setLevel(level)

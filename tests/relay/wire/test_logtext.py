"""Tests for relay.wire.logtext and the per-kind limits of relay.wire.throttle: peer text is
one printable, bounded line; each kind of line is limited on its own and its count reported."""

from __future__ import annotations

import logging

import pytest

from relay.wire.logtext import MAX_CHARS, failure, peer_text
from relay.wire.throttle import LogLimits
from statecore.clock import FakeClock

HOSTILE = [
    ("\n", "\\n"),
    ("\r", "\\r"),
    ("\t", "\\t"),
    ("\x00", "\\x00"),
    ("\x1b", "\\x1b"),
    ("\x7f", "\\x7f"),
    ("\x85", "\\x85"),
    ("\x9b", "\\x9b"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
    ("\u202e", "\\u202e"),
    ("\u2066", "\\u2066"),
    ("\ufeff", "\\ufeff"),
    ("\ud800", "\\ud800"),
    ("\\", "\\\\"),
]


@pytest.mark.parametrize(("char", "escaped"), HOSTILE)
def test_each_character_that_could_break_or_bend_a_line_is_escaped(char: str, escaped: str) -> None:
    """A control character, a line or paragraph separator, a bidi override, a byte-order mark,
    a lone surrogate or a backslash comes out as the escape ``repr`` writes for it."""
    assert peer_text(f"a{char}b") == f"a{escaped}b"


def test_printable_text_is_left_as_it_is() -> None:
    """Printable text -- quotes, spaces and letters of any script included -- is unchanged."""
    for text in ["gw-a", 'it\'s "fine"', "Grüße, 世界, مرحبا", ""]:
        assert peer_text(text) == text


def test_a_long_text_is_cut_and_says_how_long_it_was() -> None:
    """A text over the limit is cut there (escapes count, none is cut in half) and says how
    many characters it had; the line stays printable and bounded."""
    assert (
        peer_text("x" * 10_000)
        == "x" * MAX_CHARS + f"...[{10_000 - MAX_CHARS} more of 10000 chars]"
    )
    shown = peer_text("\n" * 1000, limit=9)
    assert shown == "\\n" * 4 + "...[996 more of 1000 chars]"
    assert len(peer_text("\U0001f600\x00" * 5000)) < MAX_CHARS + 40


def test_anything_else_is_shown_as_its_repr() -> None:
    """A value that is not a str is shown as its repr, escaped like text; one whose repr fails
    is named by its type."""

    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert peer_text(None) == "None"
    assert peer_text(["a\nb"]) == "['a\\\\nb']"
    assert peer_text(Broken()) == "<unprintable Broken>"


def test_a_failure_is_one_line_naming_its_type_text_and_where_it_was_raised() -> None:
    """An exception becomes one printable line: its type, its escaped text and the frames
    where it was raised, innermost first."""

    def platform_call() -> None:
        raise ValueError("refused 'x\nCRITICAL:forged'")

    try:
        platform_call()
    except ValueError as exc:
        line = failure(exc)
    assert line.startswith("ValueError: refused 'x\\nCRITICAL:forged' (at test_logtext.py:")
    assert "in platform_call, test_logtext.py:" in line
    assert line.isprintable()
    assert failure(KeyError()) == "KeyError"


def test_each_kind_of_line_has_its_own_limit_and_count() -> None:
    """A flood of one kind of line never silences another; each kind reports its own count on
    its next line after the window, or when drained."""
    clock = FakeClock()
    limits = LogLimits(burst=2, interval_s=60.0, clock=clock)
    assert [limits.allow("interrupts") for _ in range(5)] == [0, 0, None, None, None]
    assert [limits.allow("invalid frames") for _ in range(3)] == [0, 0, None]
    clock.advance(60.0)
    assert limits.allow("interrupts") == 3
    assert limits.drain() == {"invalid frames": 1}
    assert limits.drain() == {}


def test_a_line_whose_level_is_off_is_neither_logged_nor_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``check`` skips a line whose level the logger does not log, without spending the
    limit or counting it; ``report`` logs what was suppressed once, in one line."""
    logger = logging.getLogger("tests.logtext")
    limits = LogLimits(burst=1, interval_s=60.0, clock=FakeClock())
    with caplog.at_level(logging.INFO, logger="tests.logtext"):
        assert limits.check(logger, logging.DEBUG, "ignored frames") is None
        assert limits.check(logger, logging.INFO, "interrupts") == ""
        assert limits.check(logger, logging.INFO, "interrupts") is None
        assert limits.drain() == {"interrupts": 1}
        assert limits.check(logger, logging.INFO, "interrupts") is None
        limits.report(logger, "a connection closed")
        limits.report(logger, "again")
    assert [r.getMessage() for r in caplog.records] == [
        "a connection closed: lines not logged (rate-limited): 1 interrupts"
    ]


@pytest.mark.parametrize(("burst", "interval"), [(0, 1.0), (True, 1.0), (1, 0.0)])
def test_bad_limits_are_refused(burst: int, interval: float) -> None:
    """Per-kind limits are checked as a single throttle's are."""
    with pytest.raises(ValueError, match="must be"):
        LogLimits(burst=burst, interval_s=interval)

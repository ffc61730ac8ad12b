"""Tests for statecore.ids.compute_obligation_id: shape, stability, separation and types."""

from __future__ import annotations

import hashlib
import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statecore.ids import OBLIGATION_ID_LENGTH, composite_id, compute_obligation_id

HEX24 = re.compile(r"[0-9a-f]{24}")

Ref = str | int | None


def _reference_id(session_key: str, message_ref: Ref, content: str) -> str:
    """An independent rewrite of the documented v1 scheme (domain, then tagged, length-prefixed
    fields), so that a silent change of the framing is caught even if the golden values move."""
    digest = hashlib.sha256(b"statecore/obligation/v1\x00")
    ref = None if message_ref is None else str(message_ref)
    for field in (session_key, ref, content):
        if field is None:
            digest.update(b"N")
        else:
            data = field.encode("utf-8")
            digest.update(f"S{len(data)}:".encode() + data)
    return digest.hexdigest()[:24]


def test_id_is_24_lowercase_hex() -> None:
    """An obligation id is exactly 24 lowercase hex characters."""
    oid = compute_obligation_id("sk1", "m1", "hello")
    assert OBLIGATION_ID_LENGTH == 24
    assert HEX24.fullmatch(oid)


def test_id_is_stable_for_same_inputs() -> None:
    """The same (session_key, message_ref, content) always gives the same id."""
    ids = {compute_obligation_id("sk1", "m1", "hello") for _ in range(10)}
    assert len(ids) == 1


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("sk1", "m1", "hello"), "57c67201ed604d3fc092a733"),
        (("sk1", None, "hello"), "23b4001f9c618c2193ebf6b0"),
        (("sk1", 42, "hello"), "c4b7b15caaec52a866c64b86"),
        (("", None, ""), "f5d411362f2214475aeb9319"),
        (("telegram:chat42:thread7", "msg-9", "H\u00e9llo \U0001f44b"), "c8ae19ed6957518681c3afa2"),
    ],
)
def test_golden_ids(args: tuple[str, Ref, str], expected: str) -> None:
    """Golden ids pin the v1 scheme: persisted ids must not change silently between releases."""
    assert compute_obligation_id(*args) == expected
    assert _reference_id(*args) == expected


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("sk1", "m1", "hello"), ("sk1:threadB", "m1", "hello")),
        (("sk1", "m1", "hello"), ("sk1", "m2", "hello")),
        (("sk1", "m1", "hello"), ("sk1", "m1", "hello!")),
        (("sk1", "m1", "hello"), ("sk1", "m1", "Hello")),
        (("sk1", "m1", "hello"), ("sk1", "m1", "hello ")),
    ],
    ids=["session-key", "message-ref", "content", "content-case", "content-trailing-space"],
)
def test_any_field_change_changes_id(
    one: tuple[str, Ref, str], other: tuple[str, Ref, str]
) -> None:
    """A different session key, message ref or content gives a different id."""
    assert compute_obligation_id(*one) != compute_obligation_id(*other)


FORGERY_PAIRS: list[tuple[tuple[str, Ref, str], tuple[str, Ref, str]]] = [
    # A delimiter moved between fields.
    (("a:b", "c", "x"), ("a", "b:c", "x")),
    (("a", "b", "c:d"), ("a", "b:c", "d")),
    (("a|b", "c", "x"), ("a", "b|c", "x")),
    # NUL and newlines, the classic separators.
    (("a\x00b", "c", "x"), ("a", "b\x00c", "x")),
    (("a", "b\x00", "c"), ("a", "b", "\x00c")),
    (("a\nb", "c", "x"), ("a", "b\nc", "x")),
    (("a", "b", "c\n"), ("a", "b\n", "c")),
    # Text that imitates the framing itself.
    (("S1:a", "S1:b", "S1:c"), ("a", "b", "c")),
    (("aS1:b", None, "c"), ("a", "b", "c")),
    (("a", "S1:bS1:c", ""), ("a", "b", "c")),
    (("S3:abc", None, ""), ("abc", None, "")),
    (("", "N", ""), ("", None, "")),
    (("N", None, ""), ("", None, "N")),
    (("a", None, "S1:b"), ("a", "b", "")),
    # Everything in one field versus spread over three.
    (("abc", "", ""), ("a", "b", "c")),
    (("", "", "abc"), ("a", "b", "c")),
    (("", "abc", ""), ("a", "", "bc")),
]


@pytest.mark.parametrize(("one", "other"), FORGERY_PAIRS)
def test_delimiter_forgery_cannot_collide(
    one: tuple[str, Ref, str], other: tuple[str, Ref, str]
) -> None:
    """No choice of delimiter or framing-like text inside a field makes two triples collide."""
    assert compute_obligation_id(*one) != compute_obligation_id(*other)


def test_swapping_content_between_fields_changes_id() -> None:
    """Every permutation of the same three strings over the three fields gives its own id."""
    values = ("alpha", "beta", "gamma")
    ids = {compute_obligation_id(*perm) for perm in itertools.permutations(values)}
    assert len(ids) == 6


def test_all_forgery_triples_are_pairwise_distinct() -> None:
    """All the forgery triples above give pairwise distinct ids (no accidental cross-collisions)."""
    triples = {t for pair in FORGERY_PAIRS for t in pair}
    ids = {compute_obligation_id(*t) for t in triples}
    assert len(ids) == len(triples)


def test_none_and_empty_message_ref_differ() -> None:
    """A None message ref and an empty-string message ref are different ids."""
    assert compute_obligation_id("sk1", None, "x") != compute_obligation_id("sk1", "", "x")
    assert compute_obligation_id("sk1", None, "x") != compute_obligation_id("sk1", "None", "x")


@pytest.mark.parametrize("ref", [0, 7, 42, -5, 10**30])
def test_int_ref_equals_its_decimal_string(ref: int) -> None:
    """An int message ref gives the same id as its decimal string."""
    assert compute_obligation_id("sk1", ref, "x") == compute_obligation_id("sk1", str(ref), "x")


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("sk1", "m1", b"hello"), "content"),
        (("sk1", "m1", None), "content"),
        ((None, "m1", "hello"), "session_key"),
        ((b"sk1", "m1", "hello"), "session_key"),
        (("sk1", True, "hello"), "message_ref"),
        (("sk1", False, "hello"), "message_ref"),
        (("sk1", 1.0, "hello"), "message_ref"),
        (("sk1", b"m1", "hello"), "message_ref"),
        (("sk1", ["m1"], "hello"), "message_ref"),
    ],
)
def test_wrong_types_raise_type_error(args: tuple[object, object, object], field: str) -> None:
    """Non-str key or content, and bool/float/bytes refs, raise TypeError naming the field."""
    with pytest.raises(TypeError, match=field):
        compute_obligation_id(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "content",
    [
        "\u00e9t\u00e9",
        "\u65e5\u672c\u8a9e",
        "\U0001f44b\U0001f3fd",
        "\U0001f468\u200d\U0001f469\u200d\U0001f467",
        "\u0645\u0631\u062d\u0628\u0627",
    ],
)
def test_unicode_and_emoji_fields_work(content: str) -> None:
    """Non-ASCII text and emoji in every field give a valid, stable id."""
    oid = compute_obligation_id(content, content, content)
    assert HEX24.fullmatch(oid)
    assert oid == compute_obligation_id(content, content, content)
    assert oid != compute_obligation_id(content, content, content + " ")


def test_ids_compare_exact_code_points() -> None:
    """No Unicode normalisation is applied: NFC and NFD spellings are different ids."""
    nfc = "caf\u00e9"
    nfd = "cafe\u0301"
    assert compute_obligation_id("sk", "m", nfc) != compute_obligation_id("sk", "m", nfd)


def _canonical(triple: tuple[str, Ref, str]) -> tuple[str, str | None, str]:
    session_key, ref, content = triple
    return session_key, None if ref is None else str(ref), content


refs = st.none() | st.text(max_size=20) | st.integers()
triples = st.tuples(st.text(max_size=30), refs, st.text(max_size=60))


@settings(max_examples=300, deadline=None)
@given(one=triples, other=triples)
def test_distinct_triples_give_distinct_ids(
    one: tuple[str, Ref, str], other: tuple[str, Ref, str]
) -> None:
    """Property: two triples that differ (after int refs become strings) never share an id."""
    if _canonical(one) == _canonical(other):
        assert compute_obligation_id(*one) == compute_obligation_id(*other)
    else:
        assert compute_obligation_id(*one) != compute_obligation_id(*other)


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.text(alphabet=":|\x00\nSN0123456789ab", max_size=4), min_size=6, max_size=6)
)
def test_separator_heavy_triples_never_collide(parts: list[str]) -> None:
    """Property: triples built from separator and framing characters collide only when equal."""
    one = (parts[0], parts[1], parts[2])
    other = (parts[3], parts[4], parts[5])
    if one == other:
        assert compute_obligation_id(*one) == compute_obligation_id(*other)
    else:
        assert compute_obligation_id(*one) != compute_obligation_id(*other)


@settings(max_examples=300, deadline=None)
@given(triple=triples)
def test_equal_triples_give_equal_ids(triple: tuple[str, Ref, str]) -> None:
    """Property: the id is a pure function of the triple, and matches the reference scheme."""
    copy = tuple(triple)
    oid = compute_obligation_id(*triple)
    assert oid == compute_obligation_id(*copy)  # type: ignore[arg-type]
    assert HEX24.fullmatch(oid)
    assert oid == _reference_id(*triple)


def test_composite_ids_are_length_prefixed_and_keep_their_format() -> None:
    """composite_id length-prefixes every part but the last (the stored subscription and
    provenance ids keep their format), and parts containing the separators cannot collide."""
    assert composite_id("gw-a", "loopback") == "4:gw-a|loopback"
    assert composite_id("gw", "p", "c1") == "2:gw|1:p|c1"
    assert composite_id("a|1:b", "c") != composite_id("a", "b|c")
    assert composite_id("only") == "only"
    with pytest.raises(ValueError, match="at least one part"):
        composite_id()

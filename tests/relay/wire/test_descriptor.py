"""Tests for relay.wire.descriptor: required fields, the doc's defaults, and version refusal."""

from __future__ import annotations

import pickle
from typing import Any

import attrs
import pytest

from relay.wire.descriptor import (
    CONTRACT_VERSION,
    DEFAULT_MAX_MESSAGE_LENGTH,
    LEGACY_OPS,
    CapabilityDescriptor,
)
from relay.wire.errors import ContractVersionError, ProtocolError

# The descriptor a connector of the original contract sends (no optional fields).
SEED: dict[str, Any] = {
    "contract_version": 1,
    "platform": "discord",
    "label": "Discord",
    "max_message_length": 2000,
    "supports_draft_streaming": False,
    "supports_edit": True,
    "supports_threads": True,
    "markdown_dialect": "discord",
    "len_unit": "chars",
}


def with_(**changes: Any) -> dict[str, Any]:
    """SEED with keys replaced (or removed when the value is ...)."""
    obj = {**SEED, **changes}
    return {k: v for k, v in obj.items() if v is not ...}


def refused(obj: Any) -> ProtocolError:
    """The ProtocolError CapabilityDescriptor.from_wire raises for ``obj``."""
    with pytest.raises(ProtocolError) as info:
        CapabilityDescriptor.from_wire(obj)
    return info.value


def test_contract_version_is_one() -> None:
    """This code speaks relay contract version 1."""
    assert CONTRACT_VERSION == 1


def test_seed_descriptor_decodes_with_defaults() -> None:
    """The original connector's descriptor decodes; optional fields take their defaults."""
    d = CapabilityDescriptor.from_wire(SEED)
    assert d == CapabilityDescriptor(
        contract_version=1,
        platform="discord",
        label="Discord",
        max_message_length=2000,
        supports_draft_streaming=False,
        supports_edit=True,
        supports_threads=True,
        markdown_dialect="discord",
        len_unit="chars",
    )
    assert d.supported_ops == LEGACY_OPS == ("send", "edit", "typing", "follow_up")
    assert d.max_frame_bytes is None


def test_descriptor_round_trips() -> None:
    """to_wire then from_wire gives back an equal descriptor, optional fields included."""
    d = CapabilityDescriptor.from_wire(
        with_(supported_ops=["send", "react"], max_frame_bytes=65536, len_unit="utf16")
    )
    assert CapabilityDescriptor.from_wire(d.to_wire()) == d
    assert d.to_wire()["supported_ops"] == ["send", "react"]
    assert d.to_wire()["max_frame_bytes"] == 65536
    assert "max_frame_bytes" not in CapabilityDescriptor.from_wire(SEED).to_wire()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (0, DEFAULT_MAX_MESSAGE_LENGTH),
        (-5, DEFAULT_MAX_MESSAGE_LENGTH),
        ("lots", DEFAULT_MAX_MESSAGE_LENGTH),
        (None, DEFAULT_MAX_MESSAGE_LENGTH),
        (..., DEFAULT_MAX_MESSAGE_LENGTH),
        (True, DEFAULT_MAX_MESSAGE_LENGTH),
        ([2000], DEFAULT_MAX_MESSAGE_LENGTH),
        (2000.5, DEFAULT_MAX_MESSAGE_LENGTH),
        (float("inf"), DEFAULT_MAX_MESSAGE_LENGTH),
        ("-3", DEFAULT_MAX_MESSAGE_LENGTH),
        ("0", DEFAULT_MAX_MESSAGE_LENGTH),
        (2000.0, 2000),
        ("2000", 2000),
        (1, 1),
        (40000, 40000),
    ],
)
def test_max_message_length_garbage_becomes_4096(raw: Any, expected: int) -> None:
    """max_message_length <= 0, missing or garbage reads as 4096; usable numbers are kept."""
    assert CapabilityDescriptor.from_wire(with_(max_message_length=raw)).max_message_length == (
        expected
    )


@pytest.mark.parametrize("unit", ["bytes", "CHARS", "", 1, None, ...])
def test_len_unit_must_be_chars_or_utf16(unit: Any) -> None:
    """A len_unit other than "chars"/"utf16" is a ProtocolError (missing one: missing_field)."""
    err = refused(with_(len_unit=unit))
    assert err.code == ("missing_field" if unit in (None, ...) else "bad_field")
    assert "len_unit" in err.message
    assert err.ref == "descriptor"


@pytest.mark.parametrize(
    "key",
    [
        "contract_version",
        "platform",
        "label",
        "supports_draft_streaming",
        "supports_edit",
        "supports_threads",
        "markdown_dialect",
        "len_unit",
    ],
)
def test_missing_required_field_is_refused(key: str) -> None:
    """Every required descriptor field but max_message_length is missing_field when absent."""
    err = refused(with_(**{key: ...}))
    assert err.code == "missing_field"
    assert repr(key) in err.message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("contract_version", "1"),
        ("contract_version", True),
        ("contract_version", 1.0),
        ("platform", 3),
        ("label", ["x"]),
        ("supports_draft_streaming", "false"),
        ("supports_edit", 1),
        ("supports_threads", 0),
        ("markdown_dialect", {}),
        ("supported_ops", "send"),
        ("supported_ops", [1]),
        ("supported_ops", [""]),
        ("max_frame_bytes", "65536"),
        ("max_frame_bytes", 0),
        ("max_frame_bytes", -1),
        ("max_frame_bytes", True),
    ],
)
def test_mistyped_field_is_bad_field(key: str, value: Any) -> None:
    """A descriptor field of the wrong type is bad_field naming the field."""
    err = refused(with_(**{key: value}))
    assert err.code == "bad_field"
    assert repr(key) in err.message
    assert err.ref == "descriptor"


def test_a_non_object_descriptor_is_refused() -> None:
    """from_wire refuses a descriptor that is not a JSON object."""
    assert refused(["contract_version", 1]).code == "bad_field"


@pytest.mark.parametrize("version", [0, 2, 99])
def test_another_contract_version_is_refused_naming_both(version: int) -> None:
    """A different contract_version raises ContractVersionError naming ours and theirs."""
    with pytest.raises(ContractVersionError) as info:
        CapabilityDescriptor.from_wire(with_(contract_version=version))
    err = info.value
    assert isinstance(err, ProtocolError)
    assert (err.code, err.expected, err.received, err.ref) == (
        "contract_version",
        1,
        version,
        "descriptor",
    )
    assert str(version) in str(err)
    assert str(CONTRACT_VERSION) in str(err)


def test_version_is_checked_before_the_other_fields() -> None:
    """A v2 descriptor with different fields is refused for its version, not for a field."""
    with pytest.raises(ContractVersionError):
        CapabilityDescriptor.from_wire({"contract_version": 2, "caps": {}})


def test_unknown_keys_are_dropped() -> None:
    """Keys the contract does not define are ignored and do not reappear in to_wire."""
    d = CapabilityDescriptor.from_wire(with_(emoji_reactions=True, supports_voice="maybe"))
    assert d == CapabilityDescriptor.from_wire(SEED)
    assert "emoji_reactions" not in d.to_wire()


@pytest.mark.parametrize("ops", [[], None, ...])
def test_empty_or_missing_ops_mean_the_legacy_set(ops: Any) -> None:
    """supported_ops empty, null or missing reads as the legacy send/edit/typing."""
    assert CapabilityDescriptor.from_wire(with_(supported_ops=ops)).supported_ops == LEGACY_OPS


def test_supports_answers_from_the_declared_ops() -> None:
    """supports(op) is True exactly for the declared ops (legacy set by default)."""
    legacy = CapabilityDescriptor.from_wire(SEED)
    assert legacy.supports("edit")
    assert not legacy.supports("react")
    custom = CapabilityDescriptor.from_wire(with_(supported_ops=["send", "react"]))
    assert custom.supports("react")
    assert not custom.supports("edit")


def test_constructor_refuses_bad_values_locally() -> None:
    """Building a descriptor in Python with bad values raises TypeError/ValueError."""
    good = CapabilityDescriptor.from_wire(SEED)
    with pytest.raises(ValueError, match="len_unit"):
        attrs.evolve(good, len_unit="bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_message_length"):
        attrs.evolve(good, max_message_length=0)
    with pytest.raises(TypeError):
        attrs.evolve(good, max_message_length="2000")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        attrs.evolve(good, supports_edit=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        attrs.evolve(good, contract_version=True)
    with pytest.raises(TypeError):
        attrs.evolve(good, supported_ops=("send", 3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_frame_bytes"):
        attrs.evolve(good, max_frame_bytes=0)
    with pytest.raises(TypeError):
        attrs.evolve(good, max_frame_bytes=1.5)  # type: ignore[arg-type]


def test_constructor_turns_empty_ops_into_the_legacy_set() -> None:
    """supported_ops=() in Python also means the legacy set (the field is never empty)."""
    d = attrs.evolve(CapabilityDescriptor.from_wire(SEED), supported_ops=())
    assert d.supported_ops == LEGACY_OPS


def test_descriptor_is_hashable_and_picklable() -> None:
    """A descriptor can key a dict and cross a process boundary."""
    d = CapabilityDescriptor.from_wire(with_(supported_ops=["send"], max_frame_bytes=10))
    assert {d: 1}[d] == 1
    assert pickle.loads(pickle.dumps(d)) == d


def test_features_are_our_addition_read_leniently() -> None:
    """A descriptor's features (what a connector announces) are kept when they are a list of
    names; missing or garbage reads as none (an original connector), never a refusal."""
    assert CapabilityDescriptor.from_wire(SEED).features == ()
    announced = CapabilityDescriptor.from_wire({**SEED, "features": ["error_frames", "x", "x"]})
    assert announced.features == ("error_frames", "x")
    assert announced.announces("error_frames")
    assert announced.to_wire()["features"] == ["error_frames", "x"]
    for garbage in ("error_frames", 7, {"a": 1}, [1, None, ""]):
        assert CapabilityDescriptor.from_wire({**SEED, "features": garbage}).features == ()
    assert "features" not in CapabilityDescriptor.from_wire(SEED).to_wire()

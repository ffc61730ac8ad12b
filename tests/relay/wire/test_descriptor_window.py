"""Tests for the descriptor's ``idempotency_window_s``: our addition, kept when it is a positive
integer, read as "no window" otherwise, never a reason to refuse a descriptor; and the feature
that gives it meaning, announced only by a driver whose platform deduplicates sends."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from relay.wire.codec import FrameDecoder, encode
from relay.wire.compat import IDEMPOTENT_SENDS, OUR_FEATURES
from relay.wire.descriptor import CapabilityDescriptor
from relay.wire.frames import DescriptorFrame

SEED: dict[str, Any] = {
    "contract_version": 1,
    "platform": "matrix",
    "label": "Matrix",
    "max_message_length": 60000,
    "supports_draft_streaming": False,
    "supports_edit": True,
    "supports_threads": True,
    "markdown_dialect": "commonmark",
    "len_unit": "chars",
}

DAY = 86_400


def announcing(window: int | None = DAY) -> CapabilityDescriptor:
    """The seed descriptor announcing idempotent sends with ``window``."""
    return attrs.evolve(
        CapabilityDescriptor.from_wire(SEED),
        features=(IDEMPOTENT_SENDS,),
        idempotency_window_s=window,
    )


def test_idempotent_sends_is_announced_only_by_a_driver() -> None:
    """The feature has its own name and is not in what every connector announces."""
    assert IDEMPOTENT_SENDS == "idempotent_sends"
    assert IDEMPOTENT_SENDS not in OUR_FEATURES


def test_an_original_descriptor_has_no_window_and_writes_none() -> None:
    """Without the key the window is None, and to_wire leaves the key out."""
    descriptor = CapabilityDescriptor.from_wire(SEED)
    assert descriptor.idempotency_window_s is None
    assert "idempotency_window_s" not in descriptor.to_wire()
    assert descriptor.to_wire() == {
        **SEED,
        "supported_ops": ["send", "edit", "typing", "follow_up"],
    }


def test_a_window_round_trips_with_its_feature() -> None:
    """A set window is written and read back unchanged, with the feature; also in a frame."""
    descriptor = announcing()
    wire = descriptor.to_wire()
    assert wire["idempotency_window_s"] == DAY
    assert wire["features"] == [IDEMPOTENT_SENDS]
    assert CapabilityDescriptor.from_wire(wire) == descriptor
    [frame] = FrameDecoder().feed(encode(DescriptorFrame(descriptor)))
    assert isinstance(frame, DescriptorFrame)
    assert frame.descriptor == descriptor


@pytest.mark.parametrize(
    "raw", [None, 0, -5, True, False, 3.5, 86400.0, "86400", [86400], {"s": 1}]
)
def test_a_window_that_is_not_a_positive_int_reads_as_none(raw: Any) -> None:
    """Null, zero or less, a bool, a float, a string, a list or an object: no window, and the
    rest of the descriptor is still read (our addition never refuses a descriptor)."""
    descriptor = CapabilityDescriptor.from_wire({**SEED, "idempotency_window_s": raw})
    assert descriptor.idempotency_window_s is None
    assert descriptor.platform == "matrix"


@pytest.mark.parametrize("value", [0, -1])
def test_the_constructor_refuses_a_window_that_is_not_positive(value: int) -> None:
    """Built locally, a window of zero or less is a ValueError."""
    with pytest.raises(ValueError, match="idempotency_window_s"):
        announcing(value)


@pytest.mark.parametrize("value", [True, 1.5, "60"])
def test_the_constructor_refuses_a_window_that_is_not_an_int(value: Any) -> None:
    """Built locally, a window that is not an int is a TypeError."""
    with pytest.raises(TypeError, match="idempotency_window_s"):
        announcing(value)

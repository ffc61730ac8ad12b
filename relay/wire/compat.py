"""Announcements: what each side adds to the original relay contract, and who said it knows it.

The wire contract is shared with gateways and connectors we do not control.  Everything this
project adds on top of the original contract is used only toward a peer that announced it:

* a gateway announces on the upgrade request (the :data:`FEATURES_HEADER` header: the connector
  must choose a close code before any frame is read) and in every hello (``protocol`` +
  ``features``);
* a connector announces in its descriptors (``features``); a platform driver may add what its
  platform itself does (:data:`IDEMPOTENT_SENDS`) to its own descriptor.

A peer that announces nothing is an *original* peer: it gets exactly the original contract (no
``error`` frames, 4401 + ``expired`` for an expired token, never 4409).  The feature names are
the constants below; :data:`OUR_FEATURES` is what this project's gateway and connector announce.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

__all__ = [
    "ACKED_LIVE",
    "ERROR_FRAMES",
    "EXPIRED_4419",
    "FEATURES_HEADER",
    "IDEMPOTENT_SENDS",
    "OUR_FEATURES",
    "REPLACED_4409",
    "TRACE_CONTEXT",
    "features_header",
    "parse_features",
]

ERROR_FRAMES: Final = "error_frames"
"""The peer accepts ``error`` frames about frames it sent."""
EXPIRED_4419: Final = "close_4419"
"""The peer reads close code 4419 as "token expired: re-dial at once with a fresh token"."""
REPLACED_4409: Final = "close_4409"
"""The peer reads close code 4409 as "replaced by another connection of this gateway"."""

ACKED_LIVE: Final = "acked_live"
"""The gateway acks live deliveries too: the connector writes every inbound event to its durable
buffer before delivering it, delivers it with a bufferId, and retires it only on the ack (sent
after the gateway's handler returned).  A message is then never lost with a gateway that dies
while handling it: the connector redelivers it on the next connection."""

IDEMPOTENT_SENDS: Final = "idempotent_sends"
"""The connector's platform deduplicates a send by its idempotency key for the descriptor's
``idempotency_window_s`` seconds: a resend under the same key within that window is shown at
most once, however often the connector performed it and across the connector's restarts.

Not in :data:`OUR_FEATURES`: only a platform driver whose platform does this announces it, in
the ``features`` of its own descriptor (the connector adds them to its own), together with
``idempotency_window_s``.  A descriptor announcing it without a window promises nothing."""

TRACE_CONTEXT: Final = "trace_context"
"""The peer reads and writes a W3C ``traceparent`` field on ``inbound`` (connector -> gateway)
and ``outbound`` (gateway -> connector) frames, so one trace spans both processes.

Not in :data:`OUR_FEATURES`: each side announces it only while tracing is on
(:mod:`statecore.tracing`), so a process without tracing sends exactly the frames it always
did.  The field goes only to a peer that announced it; a frame without it is never refused,
and a malformed one is ignored."""

OUR_FEATURES: Final[tuple[str, ...]] = (ERROR_FRAMES, EXPIRED_4419, REPLACED_4409, ACKED_LIVE)
"""What this project's gateway and connector announce (a driver may add
:data:`IDEMPOTENT_SENDS` to its connector's descriptors)."""

FEATURES_HEADER: Final = "X-Relay-Features"
"""The upgrade request header in which a gateway announces its features (comma-separated)."""

_MAX_FEATURES: Final = 32
_MAX_FEATURE_CHARS: Final = 64


def features_header(features: Iterable[str]) -> tuple[str, str]:
    """Return the ``(FEATURES_HEADER, "a, b")`` header announcing ``features``.

    Raises ``ValueError`` for a feature name that is empty, too long, or holds a comma, space
    or control character (it could not be read back, or could split the header).
    """
    names = list(features)
    for name in names:
        if (
            not isinstance(name, str)
            or not name
            or len(name) > _MAX_FEATURE_CHARS
            or not name.isascii()
            or not name.isprintable()
            or any(c in name for c in ", ")
        ):
            raise ValueError(f"feature name {name!r} cannot be announced in a header")
    return (FEATURES_HEADER, ", ".join(names))


def parse_features(values: Iterable[object]) -> frozenset[str]:
    """Read the features a peer announced in ``values`` (each header value, comma-separated).

    Lenient and bounded: blank items are skipped, surrounding spaces stripped, at most 32 names
    of at most 64 characters are kept (a hostile header cannot grow memory).  Raises nothing.
    """
    found: set[str] = set()
    for value in values:
        if not isinstance(value, str):
            continue
        for item in value.split(",", _MAX_FEATURES):
            name = item.strip()
            if name and len(name) <= _MAX_FEATURE_CHARS and len(found) < _MAX_FEATURES:
                found.add(name)
    return frozenset(found)

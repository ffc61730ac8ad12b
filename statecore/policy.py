"""The ledger's policy: budgets, ages, backoff and how send errors are classified.

Every decision a sweep makes is a function of (row, owner liveness, now, policy); nothing here
performs I/O.
"""

from __future__ import annotations

import math
from enum import StrEnum

import attrs

from statecore.checks import require_positive

__all__ = ["ErrorKind", "LedgerPolicy"]


class ErrorKind(StrEnum):
    """What a send error says about retrying."""

    RECONNECT = "reconnect"
    """The platform never saw the request: due immediately when the adapter (re)connects."""
    RATE_LIMITED = "rate_limited"
    """The platform asked us to slow down: retried after the backoff."""
    TRANSIENT = "transient"
    """Anything not known to be permanent: retried in-process after the backoff."""
    PERMANENT = "permanent"
    """The chat is gone, the bot is blocked, access is forbidden: never retried in-process."""


def _positive(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    require_positive(attribute.name, value)


def _non_negative_int(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name} must be a non-negative int, not {value!r}")


def _backoff(_: object, attribute: attrs.Attribute[tuple[float, ...]], value: object) -> None:
    if not isinstance(value, tuple) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
        for v in value
    ):
        raise ValueError(f"{attribute.name} must be a tuple of non-negative seconds: {value!r}")


@attrs.frozen
class LedgerPolicy:
    """Budgets and classifications for the delivery ledger (all configurable).

    * ``max_attempts``: redelivery budget; the original send is free.
    * ``stale_after``: seconds since creation after which a row is abandoned, never sent late.
    * ``retention``: seconds after which delivered/abandoned rows are pruned.
    * ``retry_backoff``: delays of the in-process retries of non-permanent failures; the last
      budgeted attempt is always kept for a restart.
    * ``reconnect_errors``: exact error texts meaning the platform never saw the request.
    * ``permanent_markers`` / ``rate_limit_markers``: case-insensitive substrings.  These three
      read only failures whose adapter gave no :class:`ErrorKind` (``SendResult.kind``); a
      typed failure is stored with its kind as given.
    * ``max_error_length``: stored error text is truncated to this many characters.
    * ``lease_s``: how long a row's owner lease lasts (owners on other hosts are presumed dead
      once it expired).
    * ``sweep_chunk``: claims per transaction in a sweep.
    """

    max_attempts: int = attrs.field(default=3, validator=_non_negative_int)
    stale_after: float = attrs.field(default=86_400.0, validator=_positive)
    retention: float = attrs.field(default=604_800.0, validator=_positive)
    retry_backoff: tuple[float, ...] = attrs.field(default=(30.0, 120.0), validator=_backoff)
    reconnect_errors: frozenset[str] = frozenset({"send_path_degraded"})
    permanent_markers: tuple[str, ...] = (
        "forbidden",
        "blocked",
        "chat not found",
        "chat_not_found",
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "deactivated",
        "kicked",
        "chat gone",
        "unauthorized",
        "egress_declined",  # the connector's tenant guard: a definite, final refusal
        "egress declined",
        "too long",  # a message over the platform's limit is refused again on every retry
        "too_long",
    )
    rate_limit_markers: tuple[str, ...] = (
        "rate limit",
        "ratelimit",
        "rate_limited",
        "too many requests",
        "retry after",
        "429",
        "flood",
    )
    max_error_length: int = attrs.field(default=1000, validator=_non_negative_int)
    lease_s: float = attrs.field(default=300.0, validator=_positive)
    sweep_chunk: int = attrs.field(default=500, validator=_non_negative_int)

    def classify(self, error: str | None) -> ErrorKind:
        """Classify an untyped send error's text (None: the send never reached the platform).

        The fallback for adapters that do not type their failures; the ledger uses a
        ``SendResult.kind`` when there is one."""
        if error is None or error in self.reconnect_errors:
            return ErrorKind.RECONNECT
        lowered = error.lower()
        if any(marker in lowered for marker in self.permanent_markers):
            return ErrorKind.PERMANENT
        if any(marker in lowered for marker in self.rate_limit_markers):
            return ErrorKind.RATE_LIMITED
        return ErrorKind.TRANSIENT

    @property
    def in_process_retries(self) -> int:
        """How many attempts the runtime sweep may spend: the last budgeted one is kept."""
        return max(0, min(len(self.retry_backoff), self.max_attempts - 1))

    def next_attempt_at(self, kind: ErrorKind, attempts: int, now: float) -> float | None:
        """When the runtime sweep may retry a row failed with ``kind`` after ``attempts``.

        None: not by a timer (reconnect errors wait for a reconnect; permanent errors and rows
        whose in-process retries are spent wait for a restart).
        """
        if kind in (ErrorKind.RECONNECT, ErrorKind.PERMANENT):
            return None
        if attempts >= self.in_process_retries:
            return None
        return now + self.retry_backoff[attempts]

    def truncate(self, error: str) -> str:
        """Bound stored error text, and make it storable: error text comes from platforms and
        may carry undecodable bytes (unpaired surrogates), which are replaced."""
        if not error.isascii():
            error = error.encode("utf-8", "replace").decode("utf-8")
        if len(error) <= self.max_error_length:
            return error
        return error[: max(0, self.max_error_length - 1)] + "\u2026"

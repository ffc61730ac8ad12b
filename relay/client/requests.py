"""What a gateway knows about one outbound request once it returned: a definite, typed result."""

from __future__ import annotations

from enum import StrEnum

import attrs

__all__ = ["RequestOutcome", "RequestResult"]


class RequestOutcome(StrEnum):
    """What is known about a request once :meth:`WebSocketRelayTransport.request` returned."""

    NOT_SENT = "not_sent"
    """It never left: retrying cannot duplicate it."""
    UNKNOWN = "unknown"
    """It may have been executed (timeout, connection lost, torn down): a retry may duplicate."""
    OK = "ok"
    """The connector acknowledged success."""
    FAILED = "failed"
    """The connector acknowledged a failure (``error``, ``code``)."""
    DECLINED = "declined"
    """The connector refused it definitely (tenant guard: ``egress_declined``)."""


@attrs.frozen
class RequestResult:
    """The definite answer of one request."""

    outcome: RequestOutcome
    request_id: str | None = None
    message_id: str | None = None
    error: str | None = None
    code: str | None = None

    @property
    def success(self) -> bool:
        """True only for an acknowledged success."""
        return self.outcome is RequestOutcome.OK

    @property
    def ambiguous(self) -> bool:
        """True when the request may have been executed without our knowing."""
        return self.outcome is RequestOutcome.UNKNOWN

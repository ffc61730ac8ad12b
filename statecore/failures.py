"""How the ledger reads the :class:`~statecore.policy.ErrorKind` of a failed send.

A failure's kind comes from the adapter when it gave one, else from the policy's reading of the
error text; a failed row keeps the kind it was stored with, and rows stored without one (older
rows, rows failed by other writers) are read from their text.  A claim handed back without any
error counts as the first reconnect error.
"""

from __future__ import annotations

from statecore.lifecycles import ObligationState
from statecore.policy import ErrorKind, LedgerPolicy
from statecore.store import Row

__all__ = ["chosen_kind", "first_reconnect_error", "stored_kind"]

_DEGRADED = "send_path_degraded"
"""The reconnect error of a policy that declares none."""


def chosen_kind(policy: LedgerPolicy, error: str, kind: ErrorKind | None) -> ErrorKind:
    """The adapter's kind when it gave one, else the policy's reading of the text.

    Raises ``TypeError`` for a kind that is neither an :class:`ErrorKind` nor None.
    """
    if kind is None:
        return policy.classify(error)
    if not isinstance(kind, ErrorKind):
        raise TypeError(f"kind must be an ErrorKind or None, not {type(kind).__name__}")
    return kind


def stored_kind(policy: LedgerPolicy, row: Row[ObligationState]) -> ErrorKind:
    """The kind stored with a failed row; rows written without one (older rows, rows
    failed by other writers) are classified from their error text."""
    stored = row["error_kind"]
    if stored is not None:
        try:
            return ErrorKind(stored)
        except ValueError:
            pass  # an unknown kind: read the text instead
    return policy.classify(row["last_error"])


def first_reconnect_error(policy: LedgerPolicy) -> str:
    """The error a claim handed back without one keeps: the policy's first reconnect error
    (in sorted order), or ``send_path_degraded`` when it declares none."""
    values = policy.reconnect_errors
    return min(values) if values else _DEGRADED

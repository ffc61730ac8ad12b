"""The obligation lifecycle: the only place its states and moves are written down.  (Sessions
and delegations declare theirs in their own modules, the relay's transport in
``relay.client.lifecycle``; ``statecore lifecycles`` lists every declared lifecycle, from all of
them and from the entry point group.)

Stores guard persisted obligations with :data:`OBLIGATION`'s compiled table; the diagrams in the
docs and ``statecore lifecycles`` are generated from this declaration.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from statecore.lifecycle import Lifecycle, Transition

__all__ = [
    "DECLARED_LIFECYCLES",
    "OBLIGATION",
    "ObligationState",
]


class ObligationState(StrEnum):
    """The delivery obligation of one final reply."""

    PENDING = "pending"
    """Recorded; the send has not begun."""
    ATTEMPTING = "attempting"
    """A send is in flight, or the row is claimed for a (re)send."""
    FAILED = "failed"
    """The platform rejected the send; the error is kept."""
    DELIVERED = "delivered"
    """Terminal: the platform acknowledged it."""
    ABANDONED = "abandoned"
    """Terminal: attempt budget or age exhausted -- visible and queryable, never silent."""


_O = ObligationState
_OWED = (_O.PENDING, _O.ATTEMPTING, _O.FAILED)

OBLIGATION: Lifecycle[ObligationState] = Lifecycle(
    "obligation",
    ObligationState,
    initial=_O.PENDING,
    terminal=(_O.DELIVERED, _O.ABANDONED),
    description="One outbound final reply, from recorded to delivered or abandoned.",
    transitions=(
        # A new id enters pending; re-recording an existing id is a no-op, not a transition.
        Transition("record", None, _O.PENDING),
        # The owner begins the send: fenced by the owner's fence.
        Transition("attempt", _O.PENDING, _O.ATTEMPTING),
        Transition("deliver", _O.ATTEMPTING, _O.DELIVERED),
        Transition("fail", _O.ATTEMPTING, _O.FAILED),
        # An unsent claim handed back: the attempt is refunded, the previous error kept.
        Transition("release", _O.ATTEMPTING, _O.FAILED),
        # A sweep takes a row for a (re)send: dead owner (startup) or own retryable failure.
        Transition("claim", _OWED, _O.ATTEMPTING),
        # Budget or age exhausted, decided by a sweep entitled to act on the row.
        Transition("abandon", _OWED, _O.ABANDONED),
        # Only settled rows are ever deleted: nothing owed can be pruned.
        Transition("prune", (_O.DELIVERED, _O.ABANDONED), None),
    ),
)


DECLARED_LIFECYCLES: tuple[Lifecycle[Any], ...] = (OBLIGATION,)
"""The lifecycles declared in this module, for tooling; ``statecore.cli`` adds the session and
delegation lifecycles and those registered through the entry point group."""

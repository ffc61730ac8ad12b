"""The obligation and transport lifecycles: the only place their states and moves are written
down.  (Sessions and delegations declare theirs in their own modules; ``statecore lifecycles``
lists every declared lifecycle, from all of them and from the entry point group.)

Stores guard persisted obligations with :data:`OBLIGATION`'s compiled table; the relay transport
attaches a live machine of :data:`TRANSPORT`; the diagrams in the docs and ``statecore
lifecycles`` are generated from these declarations.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from statecore.lifecycle import Lifecycle, Transition

__all__ = [
    "DECLARED_LIFECYCLES",
    "OBLIGATION",
    "TRANSPORT",
    "ObligationState",
    "TransportState",
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


class TransportState(StrEnum):
    """One gateway-side relay connection to a connector."""

    NEW = "new"
    """Constructed, never dialed."""
    CONNECTING = "connecting"
    """The WebSocket upgrade is in flight."""
    HANDSHAKING = "handshaking"
    """Socket up, hellos sent, waiting for the first descriptor."""
    CONNECTED = "connected"
    """Handshake complete: requests flow."""
    GOING_IDLE = "going_idle"
    """going_idle sent, waiting for its ack; still serving."""
    DORMANT = "dormant"
    """Closed after the connector acked going_idle; the supervisor stays armed."""
    RECONNECTING = "reconnecting"
    """Unexpected close; the supervisor is waiting out its backoff."""
    CLOSING = "closing"
    """A deliberate disconnect is in progress."""
    CLOSED = "closed"
    """Terminal for this object."""
    REVOKED = "revoked"
    """Terminal: the connector refused our credentials."""


_T = TransportState
_LIVE = (_T.CONNECTING, _T.HANDSHAKING, _T.CONNECTED, _T.GOING_IDLE)

TRANSPORT: Lifecycle[TransportState] = Lifecycle(
    "transport",
    TransportState,
    initial=_T.NEW,
    terminal=(_T.CLOSED, _T.REVOKED),
    description="One gateway-to-connector WebSocket, from first dial to closed or revoked.",
    transitions=(
        # Exactly one dialer: the first dial, a wake from dormancy, or a retry after backoff.
        Transition("dial", (_T.NEW, _T.DORMANT, _T.RECONNECTING), _T.CONNECTING),
        Transition("open", _T.CONNECTING, _T.HANDSHAKING),
        # The first descriptor of a connection wins.
        Transition("establish", _T.HANDSHAKING, _T.CONNECTED),
        Transition("begin_idle", _T.CONNECTED, _T.GOING_IDLE),
        # go_idle acked (the socket stays up), or go_dormant got no ack (do not suspend).
        Transition("resume", _T.GOING_IDLE, _T.CONNECTED),
        # go_dormant acked; or a wake-up dial failed and the dormant cadence continues.
        Transition("sleep", (_T.GOING_IDLE, _T.CONNECTING), _T.DORMANT),
        # Unexpected close with reconnect enabled (4419: re-dial at once with a fresh token).
        Transition("drop", _LIVE, _T.RECONNECTING),
        # Over for good without a deliberate disconnect: reconnect off, or replaced (4409).
        Transition("end", (*_LIVE, _T.DORMANT, _T.RECONNECTING), _T.CLOSED),
        # The connector refused our credentials (4401).
        Transition("revoke", _LIVE, _T.REVOKED),
        # A deliberate disconnect from any non-terminal state; it never re-dials.
        Transition("close", (_T.NEW, *_LIVE, _T.DORMANT, _T.RECONNECTING), _T.CLOSING),
        Transition("finish", _T.CLOSING, _T.CLOSED),
    ),
)

DECLARED_LIFECYCLES: tuple[Lifecycle[Any], ...] = (
    OBLIGATION,
    TRANSPORT,
)
"""The lifecycles declared in this module, for tooling; ``statecore.cli`` adds the session and
delegation lifecycles and those registered through the entry point group."""

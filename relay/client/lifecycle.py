"""The relay transport's lifecycle: the only place its states and moves are written down.

:class:`~relay.client.transport.WebSocketRelayTransport` attaches a live machine of
:data:`TRANSPORT`; a transport's state is one :class:`TransportState`, never a set of flags.
The diagrams in the docs and ``statecore lifecycles`` are generated from this declaration.
"""

from __future__ import annotations

from enum import StrEnum

from statecore.lifecycle import Lifecycle, Transition

__all__ = ["SERVING", "TRANSPORT", "TransportState", "unserved_reason"]


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

SERVING = frozenset({_T.CONNECTED, _T.GOING_IDLE})
"""The states in which a transport sends requests (and acks): connected or going idle."""


def unserved_reason(state: TransportState) -> str | None:
    """Why a request cannot be sent in ``state`` (None: it can, the state is serving): the
    transport is closed or closing, its credentials were revoked, or it is not connected."""
    if state in SERVING:
        return None
    if state is _T.REVOKED:
        return "relay credentials revoked"
    if state in TRANSPORT.terminal or state is _T.CLOSING:
        return "relay transport closed"
    return "relay not connected"

"""The lifecycle of one gateway connection at the connector (:data:`CONNECTION`).

A declaration only: the connector (:mod:`relay.connector.server`, which re-exports both names)
tracks one machine of it per authenticated connection.
"""

from __future__ import annotations

from enum import StrEnum

from statecore.lifecycle import Lifecycle, Transition

__all__ = ["CONNECTION", "ConnectionState"]


class ConnectionState(StrEnum):
    """One authenticated gateway connection, as the connector serves it."""

    AWAITING_HELLO = "awaiting_hello"
    """Authenticated and served; no identity announced yet: nothing is delivered to it."""
    STANDBY = "standby"
    """Another connection of the same gateway is served and alive: this one waits, unserved
    and not closed (its hellos are held), until that one goes."""
    REPLAYING = "replaying"
    """Said hello; its buffered backlog is being replayed: new inbound is buffered behind it."""
    LIVE = "live"
    """Caught up: inbound is delivered live."""
    BUFFERED_ONLY = "buffered_only"
    """It said going_idle: inbound is buffered durably until its next connection."""
    CLOSED = "closed"
    """Terminal: the connection ended."""


_C = ConnectionState

CONNECTION: Lifecycle[ConnectionState] = Lifecycle(
    "connection",
    ConnectionState,
    initial=_C.AWAITING_HELLO,
    terminal=(_C.CLOSED,),
    description="One gateway connection at the connector: standby, hello, replay, live, buffered.",
    transitions=(
        # A second connection of a gateway whose served one is alive waits; promoted when it goes.
        Transition("stand_by", _C.AWAITING_HELLO, _C.STANDBY),
        Transition("promote", _C.STANDBY, _C.AWAITING_HELLO),
        Transition("hello", _C.AWAITING_HELLO, _C.REPLAYING),
        Transition("caught_up", _C.REPLAYING, _C.LIVE),
        # A gateway that acks live deliveries stopped keeping up (it stopped reading): what it
        # has not been sent is delivered from the durable buffer, as a replay, until caught up.
        Transition("fall_behind", _C.LIVE, _C.REPLAYING),
        # going_idle: stop live delivery (and any replay); a repeat is acked again.
        Transition(
            "go_idle",
            (_C.AWAITING_HELLO, _C.REPLAYING, _C.LIVE, _C.BUFFERED_ONLY),
            _C.BUFFERED_ONLY,
        ),
        Transition(
            "close",
            (_C.AWAITING_HELLO, _C.STANDBY, _C.REPLAYING, _C.LIVE, _C.BUFFERED_ONLY),
            _C.CLOSED,
        ),
    ),
)

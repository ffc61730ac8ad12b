"""The chat runtime, on top of the kernel: the :class:`Gateway` a bot is built on (:class:`Turn`,
:class:`Message`), sessions, durable delegations and their routing, and the platform-adapter
protocol with its send result.  It imports the kernel only --
never ``relay``, never ``stores``.
"""

from statecore.gateway.adapter import AdapterAbilities, MessageLimit, PlatformAdapter, SendResult
from statecore.gateway.delegations import (
    DELEGATION,
    DELEGATION_KIND,
    Delegation,
    Delegations,
    DelegationState,
)
from statecore.gateway.long_replies import LongReplies
from statecore.gateway.routing import (
    USER_BOUNDARY_END_REASONS,
    Route,
    RouteVerdict,
    RoutingOrigin,
    resolve_route,
)
from statecore.gateway.runtime import Gateway
from statecore.gateway.sessions import SESSION, SESSION_KIND, Session, SessionState, SessionStore
from statecore.gateway.turn import Message, Turn

__all__ = [
    "DELEGATION",
    "DELEGATION_KIND",
    "SESSION",
    "SESSION_KIND",
    "USER_BOUNDARY_END_REASONS",
    "AdapterAbilities",
    "Delegation",
    "DelegationState",
    "Delegations",
    "Gateway",
    "LongReplies",
    "Message",
    "MessageLimit",
    "PlatformAdapter",
    "Route",
    "RouteVerdict",
    "RoutingOrigin",
    "SendResult",
    "Session",
    "SessionState",
    "SessionStore",
    "Turn",
    "resolve_route",
]

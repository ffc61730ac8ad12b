"""statecore: gateways that never lose a reply.

Every lifecycle that matters is an explicit, declared state machine (:class:`Lifecycle`), and
the store enforces it with one atomic conditional write per transition.  This package is the
pure core: declarations, the Store protocol, the delivery ledger, ownership, clocks, ids and
errors.  It performs no I/O of its own; stores live in ``stores``, the wire in ``relay``.
"""

from statecore.adapter import PlatformAdapter, SendResult
from statecore.async_ledger import AsyncLedger
from statecore.batch import BatchStore, Creation, Move
from statecore.clock import Clock, Deadline, FakeClock, SystemClock
from statecore.delegations import (
    DELEGATION,
    DELEGATION_KIND,
    Delegation,
    Delegations,
    DelegationState,
)
from statecore.entity import EntityKind, Field, Index
from statecore.errors import (
    DeclarationError,
    InvalidTransition,
    StaleState,
    StatecoreError,
    StoreError,
    UnknownEntity,
)
from statecore.ids import compute_obligation_id
from statecore.ledger import Ledger
from statecore.lifecycle import Lifecycle, Transition
from statecore.lifecycles import (
    DECLARED_LIFECYCLES,
    OBLIGATION,
    ObligationState,
)
from statecore.machine import StateMachine
from statecore.obligation import (
    OBLIGATION_KIND,
    RECONNECTED_MARKER,
    RECOVERED_MARKER,
    Claim,
    Obligation,
    Owner,
)
from statecore.ownership import (
    Incarnation,
    LivenessCache,
    ProcessProbe,
    PsutilProbe,
    owner_alive,
)
from statecore.policy import ErrorKind, LedgerPolicy
from statecore.routing import (
    USER_BOUNDARY_END_REASONS,
    Route,
    RouteVerdict,
    RoutingOrigin,
    resolve_route,
)
from statecore.sessions import SESSION, SESSION_KIND, Session, SessionState, SessionStore
from statecore.store import Audit, Row, Store, TransitionRecord

__all__ = [
    "DECLARED_LIFECYCLES",
    "DELEGATION",
    "DELEGATION_KIND",
    "OBLIGATION",
    "OBLIGATION_KIND",
    "RECONNECTED_MARKER",
    "RECOVERED_MARKER",
    "SESSION",
    "SESSION_KIND",
    "USER_BOUNDARY_END_REASONS",
    "AsyncLedger",
    "Audit",
    "BatchStore",
    "Claim",
    "Clock",
    "Creation",
    "Deadline",
    "DeclarationError",
    "Delegation",
    "DelegationState",
    "Delegations",
    "EntityKind",
    "ErrorKind",
    "FakeClock",
    "Field",
    "Incarnation",
    "Index",
    "InvalidTransition",
    "Ledger",
    "LedgerPolicy",
    "Lifecycle",
    "LivenessCache",
    "Move",
    "Obligation",
    "ObligationState",
    "Owner",
    "PlatformAdapter",
    "ProcessProbe",
    "PsutilProbe",
    "Route",
    "RouteVerdict",
    "RoutingOrigin",
    "Row",
    "SendResult",
    "Session",
    "SessionState",
    "SessionStore",
    "StaleState",
    "StateMachine",
    "StatecoreError",
    "Store",
    "StoreError",
    "SystemClock",
    "Transition",
    "TransitionRecord",
    "UnknownEntity",
    "compute_obligation_id",
    "owner_alive",
    "resolve_route",
]

"""statecore: gateways that never lose a reply.

Every lifecycle that matters is an explicit, declared state machine (:class:`Lifecycle`), and
the store enforces it with one atomic conditional write per transition.  This package is the
pure core: declarations, ownership, clocks, ids and errors.  It performs no I/O of its own.
"""

from statecore.clock import Clock, Deadline, FakeClock, SystemClock
from statecore.errors import (
    DeclarationError,
    InvalidTransition,
    StaleState,
    StatecoreError,
    StoreError,
)
from statecore.ids import compute_obligation_id
from statecore.lifecycle import Lifecycle, Transition
from statecore.lifecycles import (
    DECLARED_LIFECYCLES,
    OBLIGATION,
    TRANSPORT,
    ObligationState,
    TransportState,
)
from statecore.machine import StateMachine
from statecore.ownership import (
    Incarnation,
    LivenessCache,
    ProcessProbe,
    PsutilProbe,
    owner_alive,
)

__all__ = [
    "DECLARED_LIFECYCLES",
    "OBLIGATION",
    "TRANSPORT",
    "Clock",
    "Deadline",
    "DeclarationError",
    "FakeClock",
    "Incarnation",
    "InvalidTransition",
    "Lifecycle",
    "LivenessCache",
    "ObligationState",
    "ProcessProbe",
    "PsutilProbe",
    "StaleState",
    "StateMachine",
    "StatecoreError",
    "StoreError",
    "SystemClock",
    "Transition",
    "TransportState",
    "compute_obligation_id",
    "owner_alive",
]

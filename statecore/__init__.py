"""statecore: gateways that never lose a reply.

Every lifecycle that matters is an explicit, declared state machine (:class:`Lifecycle`), and
the store enforces it with one atomic conditional write per transition.  This package is the
kernel: declarations, the Store protocol, the delivery ledger, ownership, clocks, ids and
errors.  It knows no chat and performs no I/O of its own; the chat runtime's notions (sessions,
delegations, routing, the platform-adapter protocol) live in :mod:`statecore.gateway`, stores in
``stores``, the wire in ``relay``.
"""

from importlib import metadata as _metadata

from statecore.async_ledger import AsyncLedger
from statecore.batch import BatchStore, Creation, Move
from statecore.clock import Clock, Deadline, FakeClock, SystemClock
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
from statecore.lifecycle import Lifecycle, Migration, Timer, Transition
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
from statecore.store import Audit, Due, Row, Store, TransitionRecord
from statecore.timers import AsyncTimers, Fired, Timers

try:
    __version__ = _metadata.version("statecore")
except _metadata.PackageNotFoundError:  # a source tree used without being installed
    __version__ = "0+unknown"

__all__ = [
    "DECLARED_LIFECYCLES",
    "OBLIGATION",
    "OBLIGATION_KIND",
    "RECONNECTED_MARKER",
    "RECOVERED_MARKER",
    "AsyncLedger",
    "AsyncTimers",
    "Audit",
    "BatchStore",
    "Claim",
    "Clock",
    "Creation",
    "Deadline",
    "DeclarationError",
    "Due",
    "EntityKind",
    "ErrorKind",
    "FakeClock",
    "Field",
    "Fired",
    "Incarnation",
    "Index",
    "InvalidTransition",
    "Ledger",
    "LedgerPolicy",
    "Lifecycle",
    "LivenessCache",
    "Migration",
    "Move",
    "Obligation",
    "ObligationState",
    "Owner",
    "ProcessProbe",
    "PsutilProbe",
    "Row",
    "StaleState",
    "StateMachine",
    "StatecoreError",
    "Store",
    "StoreError",
    "SystemClock",
    "Timer",
    "Timers",
    "Transition",
    "TransitionRecord",
    "UnknownEntity",
    "compute_obligation_id",
    "owner_alive",
]

"""What each collaborator of the connector reads of it: one small protocol per collaborator.

The collaborators (:mod:`relay.connector._delivery`, ``_roster``, ...) are handed the
:class:`~relay.connector.server.Connector` itself and read its settings and parts when they use
them, never a copy, so that all of them always agree with its attributes.  They see it through
these protocols, which name exactly what each one reads: they never import the server module,
which imports them (module import arrows point one way).  Every member is read-only here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from relay.connector.buffer import InboundBuffer
from relay.connector.driver_notes import DriverNotes
from relay.connector.held import HeldEvents
from relay.connector.platform import PlatformDriver
from relay.connector.provenance import Provenance
from relay.connector.rejected import RejectedEvents
from relay.connector.seen import SeenKeys
from relay.connector.subscriptions import Subscriptions
from relay.wire.descriptor import CapabilityDescriptor
from statecore.clock import Clock
from statecore.metrics import Metrics

__all__ = [
    "BufferSettings",
    "EgressSettings",
    "GuardSettings",
    "HandshakeSettings",
    "HousekeepingSettings",
    "HttpSettings",
    "InboundSettings",
    "MetricsText",
    "ReaderSettings",
    "RosterSettings",
    "StoreSettings",
    "WakeHook",
]

WakeHook = Callable[[str], Awaitable[None]]
"""``await hook(gateway_id)``: called when the first event is buffered for a sleeping
instance, so a deployment can wake it (rate-limited per instance)."""

MetricsText = Callable[[], bytes | str]
"""``metrics_text()``: the body ``GET /metrics`` answers with (Prometheus text exposition, e.g.
``prometheus_client.generate_latest``); called on a worker thread."""


class BufferSettings(Protocol):
    """What the store thread and replay (the live pump and the replay records) read of the
    connector."""

    @property
    def buffer(self) -> InboundBuffer:
        """The durable inbound buffer a replay reads and the write rounds append to."""
        ...

    @property
    def clock(self) -> Clock:
        """The clock of backlog ages and of the replay records' grace."""
        ...

    @property
    def metrics(self) -> Metrics:
        """Where buffer depth and replay lag are reported."""
        ...


class StoreSettings(BufferSettings, Protocol):
    """What the store thread's write rounds read of the connector besides the buffer: the
    dedupe keys and the hold each event's key or hold is written to, and the hold's bound."""

    @property
    def seen(self) -> SeenKeys:
        """The durable dedupe keys of the platforms' event ids."""
        ...

    @property
    def hold(self) -> HeldEvents:
        """The durable hold of events no gateway listens to yet."""
        ...

    @property
    def max_held(self) -> int:
        """The most events the hold keeps (every platform together)."""
        ...


class RosterSettings(Protocol):
    """What the roster (served connections, standbys, liveness probes) reads of the connector."""

    @property
    def clock(self) -> Clock:
        """The clock the probes wait on."""
        ...

    @property
    def liveness_probe_s(self) -> float:
        """How long a served connection has to answer a ping (and how often it is probed)."""
        ...


class ReaderSettings(Protocol):
    """What the reader of a connection reads of the connector."""

    @property
    def max_frame_bytes(self) -> int:
        """The largest frame a connection may send."""
        ...


class HandshakeSettings(Protocol):
    """What answering hellos reads of the connector."""

    @property
    def descriptors(self) -> Mapping[str, CapabilityDescriptor]:
        """Platform → the descriptor a hello for it is answered with."""
        ...

    @property
    def drivers(self) -> Mapping[str, PlatformDriver]:
        """Platform → its driver: the platforms this connector fronts."""
        ...

    @property
    def subscriptions(self) -> Subscriptions:
        """The durable record of which gateways said hello for which platform."""
        ...


class GuardSettings(Protocol):
    """What the tenant guard and provenance read of the connector, for egress and inbound."""

    @property
    def tenants(self) -> Mapping[str, frozenset[str]] | None:
        """Gateway id -> its approved scope (and user) ids; None: no tenants table."""
        ...

    @property
    def open_egress(self) -> bool:
        """True when, without a tenants table, any target may be addressed (nothing is
        recorded in the provenance then)."""
        ...

    @property
    def provenance(self) -> Provenance:
        """The chats and users each gateway received inbound from (without a tenants table)."""
        ...


class EgressSettings(GuardSettings, Protocol):
    """What the outbound path (the guard and the drivers) reads of the connector."""

    @property
    def drivers(self) -> Mapping[str, PlatformDriver]:
        """Platform -> the driver that performs its outbound actions."""
        ...


class InboundSettings(GuardSettings, Protocol):
    """What routing inbound events (and waking a sleeping gateway) reads of the connector."""

    @property
    def wake_hook(self) -> WakeHook | None:
        """Called for a sleeping gateway when an event is buffered for it."""
        ...

    @property
    def wake_interval_s(self) -> float:
        """The least time between two wake calls for one gateway."""
        ...

    @property
    def clock(self) -> Clock:
        """The clock the wake interval is measured on."""
        ...

    @property
    def seen(self) -> SeenKeys:
        """The dedupe keys: an event whose key is cached as taken is a copy."""
        ...

    @property
    def metrics(self) -> Metrics:
        """Where copies skipped are counted (when the hook counts them)."""
        ...


class HousekeepingSettings(StoreSettings, Protocol):
    """What the housekeeping timer reads of the connector: the buffer, the hold and the keys
    whose old rows it expires and prunes, on its clock, counted in its metrics, and these."""

    @property
    def provenance(self) -> Provenance:
        """The provenance memory whose forgotten targets it prunes."""
        ...

    @property
    def rejected(self) -> RejectedEvents:
        """The rejected events whose dismissed records it prunes."""
        ...

    @property
    def notes(self) -> DriverNotes:
        """The drivers' notes whose dropped ones it prunes."""
        ...

    @property
    def seen_retention_s(self) -> float:
        """How long a dedupe key is kept (longer than any platform's redelivery window)."""
        ...

    @property
    def buffer_retention_s(self) -> float:
        """How long a settled (acked or expired) entry, or a forgotten target, is kept."""
        ...

    @property
    def prune_interval_s(self) -> float:
        """How often the timer runs (0: never)."""
        ...


class HttpSettings(Protocol):
    """What the HTTP endpoints (``/healthz``, ``/metrics``) read of the connector."""

    @property
    def buffer(self) -> InboundBuffer:
        """The durable inbound buffer whose backlog ``/healthz`` reports."""
        ...

    @property
    def clock(self) -> Clock:
        """The clock the oldest entry's age is measured on."""
        ...

    @property
    def http_metrics(self) -> MetricsText | None:
        """What ``/metrics`` answers with (None: 404)."""
        ...

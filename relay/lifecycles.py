"""The relay's declared lifecycles, for tooling (``statecore lifecycles`` finds them through the
``statecore.lifecycles`` entry point)."""

from __future__ import annotations

from typing import Any

from relay.client.dedupe import DEDUPE, DEDUPE_KIND, UNDELIVERABLE, UNDELIVERABLE_KIND
from relay.client.lifecycle import TRANSPORT
from relay.connector.buffer import BUFFER, BUFFER_KIND
from relay.connector.chat_tenants import CHAT_TENANT, CHAT_TENANT_KIND
from relay.connector.connection import CONNECTION
from relay.connector.driver_notes import NOTE, NOTE_KIND
from relay.connector.held import HOLD, HOLD_KIND
from relay.connector.nodes import NODE, NODE_KIND
from relay.connector.provenance import PROVENANCE, PROVENANCE_KIND
from relay.connector.rejected import REJECTED, REJECTED_KIND
from relay.connector.seen import SEEN, SEEN_KIND
from relay.connector.subscriptions import SUBSCRIPTION, SUBSCRIPTION_KIND
from statecore.entity import EntityKind
from statecore.lifecycle import Lifecycle

__all__ = ["RELAY_KINDS", "RELAY_LIFECYCLES"]

RELAY_LIFECYCLES: tuple[Lifecycle[Any], ...] = (
    TRANSPORT,
    BUFFER,
    CHAT_TENANT,
    CONNECTION,
    DEDUPE,
    PROVENANCE,
    SUBSCRIPTION,
    UNDELIVERABLE,
    SEEN,
    HOLD,
    REJECTED,
    NOTE,
    NODE,
)
"""Every lifecycle the relay declares."""

RELAY_KINDS: tuple[EntityKind[Any], ...] = (
    BUFFER_KIND,
    CHAT_TENANT_KIND,
    DEDUPE_KIND,
    PROVENANCE_KIND,
    SUBSCRIPTION_KIND,
    UNDELIVERABLE_KIND,
    SEEN_KIND,
    HOLD_KIND,
    REJECTED_KIND,
    NOTE_KIND,
    NODE_KIND,
)
"""Every entity kind the relay persists (the ``statecore.kinds`` entry point)."""

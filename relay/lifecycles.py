"""The relay's declared lifecycles, for tooling (``statecore lifecycles`` finds them through the
``statecore.lifecycles`` entry point)."""

from __future__ import annotations

from typing import Any

from relay.client.dedupe import DEDUPE, UNDELIVERABLE
from relay.client.lifecycle import TRANSPORT
from relay.connector.buffer import BUFFER
from relay.connector.chat_tenants import CHAT_TENANT
from relay.connector.connection import CONNECTION
from relay.connector.driver_notes import NOTE
from relay.connector.held import HOLD
from relay.connector.provenance import PROVENANCE
from relay.connector.rejected import REJECTED
from relay.connector.seen import SEEN
from relay.connector.subscriptions import SUBSCRIPTION
from statecore.lifecycle import Lifecycle

__all__ = ["RELAY_LIFECYCLES"]

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
)
"""Every lifecycle the relay declares."""

"""The chat runtime's declared lifecycles, for tooling (``statecore lifecycles`` finds them
through the ``statecore.lifecycles`` entry point)."""

from __future__ import annotations

from typing import Any

from statecore.entity import EntityKind
from statecore.gateway.delegations import DELEGATION, DELEGATION_KIND
from statecore.gateway.sessions import SESSION, SESSION_KIND
from statecore.lifecycle import Lifecycle

__all__ = ["GATEWAY_KINDS", "GATEWAY_LIFECYCLES"]

GATEWAY_LIFECYCLES: tuple[Lifecycle[Any], ...] = (SESSION, DELEGATION)
"""Every lifecycle the chat runtime declares."""

GATEWAY_KINDS: tuple[EntityKind[Any], ...] = (SESSION_KIND, DELEGATION_KIND)
"""Every entity kind the chat runtime persists (the ``statecore.kinds`` entry point)."""

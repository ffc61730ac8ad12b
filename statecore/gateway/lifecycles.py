"""The chat runtime's declared lifecycles, for tooling (``statecore lifecycles`` finds them
through the ``statecore.lifecycles`` entry point)."""

from __future__ import annotations

from typing import Any

from statecore.gateway.delegations import DELEGATION
from statecore.gateway.sessions import SESSION
from statecore.lifecycle import Lifecycle

__all__ = ["GATEWAY_LIFECYCLES"]

GATEWAY_LIFECYCLES: tuple[Lifecycle[Any], ...] = (SESSION, DELEGATION)
"""Every lifecycle the chat runtime declares."""

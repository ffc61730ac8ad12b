"""A loopback platform that deduplicates sends by a key, as Matrix does with a send's
transaction id: the driver double of the tests of idempotent sends."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from relay.connector.platform import LoopbackPlatform
from relay.wire.compat import IDEMPOTENT_SENDS
from relay.wire.descriptor import CapabilityDescriptor
from relay.wire.frames import OutboundOutcome

DAY_S = 86_400
"""The window the double announces (Matrix keeps a transaction id for a day)."""


class DedupingPlatform(LoopbackPlatform):
    """A :class:`LoopbackPlatform` that is an ``IdempotentDriver``: ``perform_once`` records
    ``(action, key)`` and performs the action only for a key it has not performed yet (the
    platform's memory, which outlives a connector restart: keep the instance); its descriptor
    announces ``idempotent_sends`` with ``window_s`` (None: the feature without a window)."""

    def __init__(self, *, window_s: int | None = DAY_S) -> None:
        super().__init__()
        self.once: list[tuple[dict[str, Any], str]] = []
        """Every ``perform_once(action, key)``, in order."""
        self.plain: list[dict[str, Any]] = []
        """Every ``perform(action)`` the connector called directly, in order."""
        self._done: dict[str, OutboundOutcome] = {}
        self._window_s = window_s

    def descriptor(self) -> CapabilityDescriptor:
        """The loopback descriptor, announcing idempotent sends and the window."""
        return attrs.evolve(
            super().descriptor(),
            features=(IDEMPOTENT_SENDS,),
            idempotency_window_s=self._window_s,
        )

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        """Record a direct call, then perform it as the loopback platform does."""
        self.plain.append(dict(action))
        return await super().perform(action)

    async def perform_once(self, action: Mapping[str, Any], key: str) -> OutboundOutcome:
        """Record the call; perform the action unless ``key`` was performed already (its first
        successful outcome is the answer then)."""
        self.once.append((dict(action), key))
        done = self._done.get(key)
        if done is not None:
            return done
        outcome = await super().perform(action)
        if outcome.success:
            self._done[key] = outcome
        return outcome

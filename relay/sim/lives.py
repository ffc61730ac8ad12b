"""Process lives of the real-runtime simulation: who the running code belongs to.

A simulated process runs in a *life*; a restart is a new life, and a killed life never runs
again (:meth:`relay.sim.loop.SimLoop.kill`).  The running code's life travels in the context
variable :data:`PROCESS` into every task and callback it starts.
"""

from __future__ import annotations

import contextvars

import attrs

__all__ = ["PROCESS", "Life"]


@attrs.frozen
class Life:
    """One life of a simulated process: its name, its host, and which life it is."""

    name: str
    host: str
    n: int

    def __str__(self) -> str:
        return f"{self.name}#{self.n}"


PROCESS: contextvars.ContextVar[Life | None] = contextvars.ContextVar(
    "relay_sim_process", default=None
)
"""The life the running code belongs to (None: the world itself)."""

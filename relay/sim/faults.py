"""The faults a world injects, drawn from its seed before it runs, and the store that fails
its next writes on demand."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import attrs

from statecore.entity import EntityKind
from statecore.errors import StoreError
from statecore.store import Row, Store, TransitionRecord

__all__ = ["KINDS", "REAL_KINDS", "Fault", "FlakyStore", "schedule"]

KINDS = (
    "crash_gateway",
    "crash_connector",
    "drop_connection",
    "partition",
    "delay_spike",
    "clock_jump",
    "secret_rotation",
    "store_fail",
    "platform_refuse",
    "platform_slow",
    "duplicate_delivery",
)
"""Every kind of fault a world of models may inject."""

REAL_KINDS = (*KINDS, "half_open")
"""Every kind of fault a world of the real runtime may inject (:mod:`relay.sim.real`):
``half_open`` leaves a gateway's connections silently dead, both ends believing them open."""


@attrs.frozen
class Fault:
    """One fault: when, what, on which part, and its size (seconds, writes, messages; 0 for
    ``half_open``, which has none)."""

    at: float
    kind: str
    target: str
    size: float

    def __str__(self) -> str:
        return f"t={self.at:7.3f} {self.kind:<18} {self.target:<10} {self.size:g}"


def schedule(
    rng: Any,
    *,
    seconds: float,
    gateways: Sequence[str],
    count: int,
    kinds: Sequence[str] = KINDS,
) -> list[Fault]:
    """``count`` faults at random times within ``seconds``, of random ``kinds`` and targets."""
    faults = []
    for _ in range(count):
        kind = rng.choice(kinds)
        at = rng.uniform(0.5, seconds)
        gateway = rng.choice(list(gateways))
        if kind == "crash_gateway":
            fault = Fault(at, kind, gateway, rng.uniform(0.1, 4.0))
        elif kind == "crash_connector":
            fault = Fault(at, kind, "connector", rng.uniform(0.1, 4.0))
        elif kind in ("drop_connection", "partition", "half_open"):
            size = rng.uniform(0.5, 8.0)  # drawn for each: every later draw stays the seed's
            fault = Fault(at, kind, gateway, 0.0 if kind == "half_open" else size)
        elif kind == "delay_spike":
            fault = Fault(at, kind, "network", rng.uniform(1.0, 5.0))
        elif kind == "clock_jump":  # one process's wall clock; the monotonic clock is steady
            target = rng.choice([*gateways, "connector"])
            fault = Fault(at, kind, target, rng.choice((-3600.0, -30.0, 5.0, 600.0)))
        elif kind == "secret_rotation":  # the gateway picks up the new secret after ``size`` s
            fault = Fault(at, kind, gateway, rng.uniform(0.0, 6.0))
        elif kind == "store_fail":
            fault = Fault(at, kind, rng.choice([*gateways, "connector"]), rng.randint(1, 4))
        elif kind == "platform_refuse":
            fault = Fault(at, kind, "platform", rng.randint(1, 3))
        elif kind == "platform_slow":
            fault = Fault(at, kind, "platform", rng.uniform(1.0, 6.0))
        else:
            fault = Fault(at, kind, "platform", rng.randint(1, 3))
        faults.append(fault)
    return sorted(faults, key=lambda f: (f.at, f.kind, f.target))


Watch = Callable[[EntityKind[Any], Sequence[str], str], None]
"""``watch(kind, entity_ids, event)``: told of each transition just before it is written."""


class FlakyStore:
    """A store whose next ``fail_writes`` writes raise ``StoreError`` (a locked database, an
    I/O error) before anything is written; reads always work.  Everything else is delegated.
    ``watch`` (optional) is told of every transition before it is written (an observer of the
    world's, e.g. to see when an entry is acked)."""

    def __init__(self, inner: Store, *, watch: Watch | None = None) -> None:
        self.inner = inner
        self.fail_writes = 0
        self.failed = 0
        self.watch = watch

    def _write(self) -> None:
        if self.fail_writes > 0:
            self.fail_writes -= 1
            self.failed += 1
            raise StoreError("injected: database is locked")

    def register(self, kind: EntityKind[Any]) -> None:
        self.inner.register(kind)

    def insert(
        self, kind: EntityKind[Any], entity_id: str, values: Mapping[str, object], **kw: Any
    ) -> tuple[Row[Any], bool]:
        self._write()
        return self.inner.insert(kind, entity_id, values, **kw)

    def transition(self, kind: EntityKind[Any], entity_id: str, event: str, **kw: Any) -> Row[Any]:
        self._write()
        if self.watch is not None:
            self.watch(kind, (entity_id,), event)
        return self.inner.transition(kind, entity_id, event, **kw)

    def transition_many(
        self, kind: EntityKind[Any], entity_ids: Sequence[str], event: str, **kw: Any
    ) -> list[Row[Any]]:
        self._write()
        if self.watch is not None:
            self.watch(kind, entity_ids, event)
        return self.inner.transition_many(kind, entity_ids, event, **kw)

    def get(self, kind: EntityKind[Any], entity_id: str) -> Row[Any] | None:
        return self.inner.get(kind, entity_id)

    def select(self, kind: EntityKind[Any], **kw: Any) -> list[Row[Any]]:
        return self.inner.select(kind, **kw)

    def count(self, kind: EntityKind[Any], **kw: Any) -> int:
        return self.inner.count(kind, **kw)

    def prune(self, kind: EntityKind[Any], event: str, **kw: Any) -> int:
        self._write()
        return self.inner.prune(kind, event, **kw)

    def history(self, kind: EntityKind[Any], entity_id: str) -> list[TransitionRecord]:
        return self.inner.history(kind, entity_id)

    def atomic(self) -> AbstractContextManager[None]:
        return self.inner.atomic()

    def close(self) -> None:
        self.inner.close()

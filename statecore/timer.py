"""Declared timers: the moves a lifecycle declares with ``after`` (see
:class:`~statecore.lifecycle.Transition`), derived and checked once per declaration.  The
service that fires them is :mod:`statecore.timers`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum
from typing import Any, Generic, Protocol, TypeVar

import attrs

from statecore.errors import DeclarationError

__all__ = ["Timer", "declared_timers"]

S = TypeVar("S", bound=Enum)


@attrs.frozen
class Timer(Generic[S]):
    """One declared timer: ``event`` fires by itself once an entity has been in ``source`` for
    ``after`` seconds (a number), or for as many seconds as its field ``after`` holds (a name).
    Derived from the transitions declared with ``after`` (:attr:`Lifecycle.timers`), one per
    source state."""

    event: str
    source: S
    target: S
    after: float | str

    @property
    def field(self) -> str | None:
        """The field holding the duration, or None for a fixed duration."""
        return self.after if isinstance(self.after, str) else None

    @property
    def seconds(self) -> float | None:
        """The fixed duration, or None when a field holds it."""
        return None if isinstance(self.after, str) else float(self.after)

    def describe(self, seconds: float | None = None) -> str:
        """The audit reason of a firing: ``fired by timer after 30 s`` (with the field named
        when a field held the duration)."""
        shown = self.seconds if seconds is None else seconds
        text = "fired by timer after " + ("?" if shown is None else f"{shown:g} s")
        return text if self.field is None else f"{text} ({self.field})"


class _Declared(Protocol):
    @property
    def event(self) -> str: ...
    @property
    def sources(self) -> tuple[Any, ...]: ...
    @property
    def target(self) -> Any: ...
    @property
    def after(self) -> float | str | None: ...


def declared_timers(lifecycle: str, transitions: Sequence[_Declared]) -> tuple[Timer[Any], ...]:
    """The timers of ``transitions``: each ``after`` a move's, a positive number of seconds or
    a field's name (the entity kind checks the field).  (Timers on terminal states are refused
    with the transitions themselves.)  Raises :class:`DeclarationError` naming the timer."""
    timers: list[Timer[Any]] = []
    for t in transitions:
        after = t.after
        if after is None:
            continue
        where = f"timer {t.event!r}"
        if not t.sources or t.target is None:
            raise DeclarationError(
                lifecycle, f"{where}: a timer must be a move (from a state to a state)"
            )
        if isinstance(after, str):
            if not after.isidentifier():
                raise DeclarationError(lifecycle, f"{where}: after={after!r} is not a field name")
        elif (
            isinstance(after, bool)
            or not isinstance(after, int | float)
            or not math.isfinite(after)
            or after <= 0
        ):
            raise DeclarationError(
                lifecycle,
                f"{where}: after must be a positive number of seconds or a field name, "
                f"not {after!r}",
            )
        timers.extend(Timer(t.event, source, t.target, after) for source in t.sources)
    return tuple(timers)

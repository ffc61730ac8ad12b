"""What a platform driver gets from its connector, beyond the plain intake call.

A driver of a real platform keeps the one rule of ``docs/platforms.md``: it moves the
platform's cursor (a ``/sync`` token, an update offset, an envelope ack) only after the
connector's intake returned for every event the cursor covers.  To keep it, a driver needs
three things from the connector, all durable in the connector's store:

* the intake itself, ``await intake(platform, event)``: when it returns, the event is the
  connector's (in a gateway's buffer, delivered under the contract, held for a gateway that has
  not said hello yet, or recognised as a copy of one already taken); it raises
  :class:`IntakeFull` when the connector cannot take it now, and the driver must then leave its
  cursor where it is and try again later;
* :meth:`DriverIntake.reject`: an event the driver cannot map is recorded with its raw form and
  the reason (visible to operators), never dropped silently, never blocking what follows;
* :meth:`DriverIntake.load` / :meth:`DriverIntake.save`: small named notes of the driver's
  own (its cursor, its credentials and device), surviving restarts.

The connector hands a :class:`DriverIntake` to every driver's ``attach``; a plain callable
(``Intake``) is what drivers written for the loopback and web chat need and still work with.
Drivers that run a loop of their own (a long poll, a socket) implement :class:`RunningDriver`,
and the connector starts them after it listens and stops them before its store closes.
Drivers whose platform deduplicates sends by a key implement :class:`IdempotentDriver`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from relay.wire.frames import InboundEvent, OutboundOutcome
from statecore.errors import StatecoreError

__all__ = ["DriverIntake", "IdempotentDriver", "IntakeFull", "RunningDriver"]


class IntakeFull(StatecoreError):
    """The connector cannot take the event now (its bounded hold for events no gateway listens
    to is full, or its store is failing).  Nothing was recorded: the driver must not move its
    platform cursor past the event, and should offer it again after a backoff."""


@runtime_checkable
class DriverIntake(Protocol):
    """The connector's side of a driver (see the module docs)."""

    async def __call__(self, platform: str, event: InboundEvent) -> None:
        """Take one inbound event of ``platform``; when this returns the event is durably the
        connector's (or a copy of one it took, by ``event.message_id``).  Raises
        :class:`IntakeFull` when it could not be taken: the caller keeps its cursor."""
        ...

    async def reject(
        self, platform: str, raw: str, reason: str, *, event_id: str | None = None
    ) -> None:
        """Record durably that an event of ``platform`` could not be mapped: its raw form (as
        received, bounded), why, and the platform's id for it when it had one.  Raises
        :class:`IntakeFull` when the record could not be written."""
        ...

    async def load(self, platform: str, name: str) -> str | None:
        """The note ``name`` the driver of ``platform`` saved last, None if none.  Raises
        ``StoreError`` when the store cannot be read."""
        ...

    async def save(self, platform: str, name: str, value: str) -> None:
        """Save the note ``name`` durably (it is on disk when this returns).  Raises
        ``StoreError`` when it could not be written: the caller must not act as if it was."""
        ...


@runtime_checkable
class RunningDriver(Protocol):
    """A driver with a loop of its own; the connector calls :meth:`start` once it listens and
    :meth:`stop` before it closes its store."""

    async def start(self) -> None:
        """Start reading the platform (after ``attach``); returns once the loop is running.
        Raises what makes the driver unusable (bad credentials); a platform that is merely
        unreachable is retried with backoff, not raised."""
        ...

    async def stop(self) -> None:
        """Stop reading and writing the platform; bounded, idempotent, never raises."""
        ...


@runtime_checkable
class IdempotentDriver(Protocol):
    """A driver whose platform deduplicates sends by a key the driver derives from ``key``.

    The connector calls :meth:`perform_once` instead of ``perform`` for every outbound request
    that carries an idempotency key; ``key`` is unique per gateway and request (the gateway id
    and the request's idempotency key), stable across retries and restarts of both sides.
    """

    async def perform_once(self, action: Mapping[str, Any], key: str) -> OutboundOutcome:
        """Perform ``action`` so that every call with the same ``key`` within the platform's
        window is one effect on the platform; never raise for a platform refusal."""
        ...

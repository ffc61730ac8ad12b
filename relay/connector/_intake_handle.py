"""What the connector hands every driver's ``attach``: a
:class:`~relay.connector.intake.DriverIntake` over the connector's inbound path, its rejected
records and its drivers' notes, all written on the store thread."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

from relay.connector._log import limited, log
from relay.connector._store_thread import StoreThread
from relay.connector.driver_notes import DriverNotes, check_note
from relay.connector.intake import IntakeFull
from relay.connector.rejected import RejectedEvents
from relay.wire.frames import InboundEvent
from relay.wire.logtext import peer_text
from relay.wire.throttle import LogLimits
from statecore.errors import StoreError
from statecore.metrics import IntakeMetrics, IntakeOutcome, Metrics

__all__ = ["ConnectorIntake"]


class ConnectorIntake:
    """The connector's :class:`~relay.connector.intake.DriverIntake`.

    Called like the plain intake (``await intake(platform, event)``), so drivers written for
    it keep working; a store failure while taking an event is :class:`IntakeFull` here (the
    driver's one signal to keep its cursor), chained to the ``StoreError``.
    """

    def __init__(
        self,
        route: Callable[[str, InboundEvent], Awaitable[None]],
        *,
        store: StoreThread,
        notes: DriverNotes,
        rejected: RejectedEvents,
        metrics: Callable[[], Metrics],
        log_limits: LogLimits,
    ) -> None:
        self._route = route
        self._store = store
        self._notes = notes
        self._rejected = rejected
        self._metrics = metrics
        self._log_limits = log_limits
        self.rejections = 0
        """Rejected events recorded by this connector (redelivered copies not counted)."""

    async def __call__(self, platform: str, event: InboundEvent) -> None:
        """Take one inbound event (``Connector.intake``).  When this returns the event is the
        connector's; raises :class:`IntakeFull` when it is not (the hold is full, or the
        store failed): the driver must keep its cursor and offer it again later."""
        try:
            await self._route(platform, event)
        except StoreError as exc:
            raise IntakeFull(f"the connector's store failed: {exc}") from exc

    async def reject(
        self, platform: str, raw: str, reason: str, *, event_id: str | None = None
    ) -> None:
        """Record an event the driver could not map (raw form cut to
        :data:`~relay.connector.rejected.MAX_REJECTED_RAW_CHARS`); the driver may move its
        cursor past it once this returned.  Raises ``TypeError`` / ``ValueError`` for bad
        arguments (nothing written), :class:`IntakeFull` when the store failed."""
        RejectedEvents.check(platform, raw, reason, event_id)
        try:
            written = await self._store.run(
                functools.partial(self._rejected.record, platform, raw, reason, event_id)
            )
        except StoreError as exc:
            raise IntakeFull(f"the rejected event could not be recorded: {exc}") from exc
        if not written:
            return  # a redelivered copy of one recorded before
        self.rejections += 1
        metrics = self._metrics()
        if isinstance(metrics, IntakeMetrics):
            metrics.intake(platform, IntakeOutcome.REJECTED)
        more = limited(self._log_limits, "rejected events", logging.WARNING)
        if more is not None:
            log.warning(
                "connector: the %s driver could not map event %s (%s); recorded as rejected%s",
                peer_text(platform, limit=80),
                peer_text(event_id),
                peer_text(reason),
                more,
            )

    async def load(self, platform: str, name: str) -> str | None:
        """The note ``name`` of ``platform``'s driver, None if none.  Raises ``TypeError`` /
        ``ValueError`` for a bad name, ``StoreError`` when the store cannot be read."""
        check_note(platform, name)
        return await self._store.run(functools.partial(self._notes.load, platform, name))

    async def save(self, platform: str, name: str, value: str) -> None:
        """Save the note durably: committed when this returns.  Raises ``TypeError`` /
        ``ValueError`` for a bad name or a value over
        :data:`~relay.connector.driver_notes.MAX_NOTE_BYTES` (nothing written), ``StoreError``
        when it could not be written."""
        check_note(platform, name, value)
        await self._store.run(functools.partial(self._notes.save, platform, name, value))

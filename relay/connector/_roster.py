"""Which connection serves each gateway id: one served connection per gateway, newer ones held
on standby while it answers its liveness probes, the newest promoted the moment it goes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from relay.connector._delivery import Delivery
from relay.connector._instance import Instance
from relay.connector._log import limited, log, report_suppressed
from relay.connector._settings import RosterSettings
from relay.connector._tasks import Tasks
from relay.wire.compat import REPLACED_4409
from relay.wire.throttle import LogLimits
from relay.wire.urls import CLOSE_REPLACED, CLOSE_REVOKED

__all__ = ["Roster"]

_MAX_STANDBYS = 4
"""Standby connections kept per gateway id; a newer one beyond this closes the oldest."""


class Roster:
    """The served connection of each gateway id and the standbys waiting behind it.

    ``served`` (gateway id → connection) and ``standbys`` (gateway id → waiting connections,
    oldest first) are the connector's tables, kept here.  ``on_promoted`` answers the hellos a
    standby said while it waited, once it is served.  The probe time is the connector's
    ``liveness_probe_s``.
    """

    def __init__(
        self,
        connector: RosterSettings,
        *,
        served: dict[str, Instance],
        standbys: dict[str, list[Instance]],
        delivery: Delivery,
        tasks: Tasks,
        on_promoted: Callable[[Instance], Coroutine[Any, Any, None]],
    ) -> None:
        self._connector = connector
        self._served = served
        self._standbys = standbys
        self._delivery = delivery
        self._tasks = tasks
        self._on_promoted = on_promoted
        self._watchers: dict[str, asyncio.Task[None]] = {}  # liveness probes, per gateway
        # A gateway decides how often it connects: its lines here are rate-limited per gateway
        # id (authenticated ids only, so the table is as small as the secrets).
        self._log_limits: dict[str, LogLimits] = {}
        self.on_change: Callable[[], None] | None = None
        """Called (on the loop, must not raise) whenever the served table changes: a cluster
        node publishes its part of the cluster's roster then (:mod:`relay.connector.nodes`)."""

    def admit(self, instance: Instance) -> None:
        """Serve a new authenticated connection, or -- its gateway being served already -- hold
        it on standby."""
        if instance.gateway_id in self._served:
            self._stand_by(instance)
        else:
            self._served[instance.gateway_id] = instance
            self._changed()

    def closed(self, instance: Instance) -> None:
        """The connection ended: settle its bookkeeping and, if it was the served one, promote
        a standby of its gateway."""
        if instance.machine.can("close"):
            instance.machine.fire("close")
        self._delivery.closed(instance)
        gateway_id = instance.gateway_id
        standbys = self._standbys.get(gateway_id)
        if standbys is not None and instance in standbys:
            standbys.remove(instance)
            if not standbys:
                del self._standbys[gateway_id]
        if self._served.get(gateway_id) is instance:
            del self._served[gateway_id]
            self._promote(gateway_id)
            self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def clear(self) -> None:
        """Forget every connection (the connector stopped; their tasks are cancelled), and log
        what the rate limits suppressed."""
        self._served.clear()
        self._standbys.clear()
        self._watchers.clear()
        for gateway_id, limits in self._log_limits.items():
            report_suppressed(limits, f"the connections of {gateway_id}")
        self._log_limits.clear()

    def _limits(self, gateway_id: str) -> LogLimits:
        limits = self._log_limits.get(gateway_id)
        if limits is None:
            limits = self._log_limits[gateway_id] = LogLimits(clock=self._connector.clock)
        return limits

    def _stand_by(self, instance: Instance) -> None:
        """Hold a second connection of a served gateway: unserved, not closed (closing it would
        make an original gateway redial at once, for ever), and probe the served one."""
        gateway_id = instance.gateway_id
        instance.machine.fire("stand_by")
        standbys = self._standbys.setdefault(gateway_id, [])
        standbys.append(instance)
        if len(standbys) > _MAX_STANDBYS:
            oldest = standbys.pop(0)
            # 4409 to a gateway that knows it (it stops); an original gateway knows no 4409 and
            # redials at once after any other close -- except an early 4401, a start-up race it
            # backs off from, so that is what it gets.
            code = CLOSE_REPLACED if REPLACED_4409 in oldest.features else CLOSE_REVOKED
            more = limited(self._limits(gateway_id), "oldest waiting closed", logging.WARNING)
            if more is not None:
                log.warning(
                    "connector: %s has more than %d waiting connections; closing the oldest (%d)%s",
                    gateway_id,
                    _MAX_STANDBYS,
                    code,
                    more,
                )
            self._tasks.spawn(oldest.close(code, "replaced by a newer connection"))
        more = limited(self._limits(gateway_id), "connections held", logging.INFO)
        if more is not None:
            log.info(
                "connector: %s connected again while its connection is served; holding the new "
                "one until the served one goes (probing it every %g s)%s",
                gateway_id,
                self._connector.liveness_probe_s,
                more,
                extra={"gateway_id": gateway_id},
            )
        watcher = self._watchers.get(gateway_id)
        if watcher is None or watcher.done():
            self._watchers[gateway_id] = self._tasks.spawn(self._watch(gateway_id))

    async def _watch(self, gateway_id: str) -> None:
        """While a standby waits, probe the served connection: one that does not answer a ping
        within the probe time is dead (or unreachable) and is cut, and the standby served."""
        try:
            while self._standbys.get(gateway_id):
                served = self._served.get(gateway_id)
                if served is None:
                    self._promote(gateway_id)
                    continue
                if await self._answers_ping(served.ws):
                    await self._connector.clock.sleep(self._connector.liveness_probe_s)
                    continue
                more = limited(self._limits(gateway_id), "unanswered probes", logging.WARNING)
                if more is not None:
                    log.warning(
                        "connector: the served connection of %s did not answer a ping within "
                        "%g s; serving its newer connection%s",
                        gateway_id,
                        self._connector.liveness_probe_s,
                        more,
                        extra={"gateway_id": gateway_id},
                    )
                served.ws.transport.abort()  # dead or unreachable: no close handshake to wait for
                self.closed(served)  # promotes now; its own reader's cleanup is then a no-op
        finally:
            if self._watchers.get(gateway_id) is asyncio.current_task():
                del self._watchers[gateway_id]

    async def _answers_ping(self, ws: ServerConnection) -> bool:
        """True when ``ws`` answers a ping within the liveness probe time."""
        try:
            pong = asyncio.ensure_future(await ws.ping())
        except ConnectionClosed:
            return False
        sleeper = asyncio.ensure_future(
            self._connector.clock.sleep(self._connector.liveness_probe_s)
        )
        try:
            await asyncio.wait({pong, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
        if not pong.done():
            pong.cancel()
            return False
        return not pong.cancelled() and pong.exception() is None

    def _promote(self, gateway_id: str) -> None:
        """Serve the newest standby of ``gateway_id`` (if any): it gets the descriptors for the
        hellos it said while waiting, then its replay -- as if it had just connected."""
        standbys = self._standbys.get(gateway_id)
        while standbys:
            candidate = standbys.pop()
            if not candidate.is_standby():
                continue
            if not standbys:
                del self._standbys[gateway_id]
            candidate.machine.fire("promote")
            self._served[gateway_id] = candidate
            more = limited(self._limits(gateway_id), "waiting connections served", logging.INFO)
            if more is not None:
                log.info(
                    "connector: serving the waiting connection of %s%s",
                    gateway_id,
                    more,
                    extra={"gateway_id": gateway_id},
                )
            self._tasks.spawn(self._on_promoted(candidate))
            return
        self._standbys.pop(gateway_id, None)

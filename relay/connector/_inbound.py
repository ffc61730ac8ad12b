"""Routing a platform's inbound events: which gateways see each one, delivered live or through
the durable buffer (provenance recorded first), held when no gateway listens, a copy of an
event taken before skipped (its platform id is its durable dedupe key,
:mod:`relay.connector.seen`), and the wake hook for a sleeping gateway."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping

from relay.connector._delivery import Delivery
from relay.connector._hold import Holding
from relay.connector._instance import Instance
from relay.connector._log import limited, log
from relay.connector._settings import InboundSettings
from relay.connector._store_thread import StoreThread
from relay.connector._tasks import Tasks
from relay.connector._tracing import traceparent_for
from relay.connector.chat_tenants import ChatTenants
from relay.connector.intake import IntakeFull
from relay.wire.codec import encode, with_traceparent
from relay.wire.frames import Inbound, InboundEvent
from relay.wire.logtext import peer_text
from relay.wire.throttle import LogLimits
from statecore import tracing
from statecore.metrics import IntakeMetrics, IntakeOutcome

__all__ = ["InboundRouter"]


class InboundRouter:
    """The connector's inbound path (``Connector.intake``).

    It reads the connector's ``tenants``, ``open_egress``, ``provenance`` and wake settings when
    it routes; ``served`` and ``subscribed`` are the connector's tables of served connections
    and of the platforms each gateway said hello for; ``chat_tenants`` is the table of the
    tenant each chat belongs to, which it fills for the egress guard.  ``log_limits`` are the
    connector's own rate limits (the platform's users decide how many events there are).
    """

    def __init__(
        self,
        connector: InboundSettings,
        *,
        served: Mapping[str, Instance],
        subscribed: Mapping[str, set[str]],
        chat_tenants: ChatTenants,
        delivery: Delivery,
        store: StoreThread,
        tasks: Tasks,
        log_limits: LogLimits,
        holding: Holding,
    ) -> None:
        self._connector = connector
        self._holding = holding
        # One audience rule for the intake and the release of held events.
        holding.audience = self._audience
        self._log_limits = log_limits
        self._served = served
        self._subscribed = subscribed
        self._chat_tenants = chat_tenants
        self._delivery = delivery
        self._store = store
        self._tasks = tasks
        self._last_wake: dict[str, float] = {}  # gateway id -> when it was last woken
        self.refresh: Callable[[], Awaitable[None]] | None = None
        """What re-reads the shared subscriptions before an event is found undeliverable (a
        cluster node's; None: this connector's table is the whole truth)."""
        self.undeliverable = 0
        """Inbound events no gateway listened to when they arrived (logged at WARNING,
        rate-limited): held, or refused because the hold was full."""
        self.duplicates = 0
        """Copies of events taken before (by their platform id) that were not routed."""

    async def intake(self, platform: str, event: InboundEvent) -> None:
        """Route one inbound event from ``platform`` to the gateways that should see it.

        Delivered live to a listening instance; appended to the durable buffer for one that is
        asleep, disconnected, buffered-only or still replaying its backlog (so order holds);
        held when no gateway listens.  An event whose platform id was taken before is a copy
        and routed nowhere.  Raises :class:`~relay.connector.intake.IntakeFull` when it should
        be held and the hold is full, ``StoreError`` when the store fails: in both cases
        nothing of it was written and the caller must offer it again.
        """
        connector = self._connector
        key = connector.seen.key(platform, event)
        if key is not None and connector.seen.cached(key):
            self._copy(platform, event)
            return
        source = event.source
        tenant = source.scope_id
        if tenant is None and source.chat_type == "dm":
            tenant = source.user_id  # a DM belongs to its user
        chat_tenants = self._chat_tenants
        if (
            tenant is not None
            and connector.tenants is not None
            and chat_tenants.changes(platform, source.chat_id, tenant)
        ):
            # Durable before the event goes out: the answer must pass the guard even after a
            # restart of this connector.
            await self._store.run(
                functools.partial(chat_tenants.learn, platform, source.chat_id, tenant)
            )
        audience = self._audience(platform, event)
        if not audience and self.refresh is not None:
            # A cluster node: a peer may have recorded the first hello of a gateway moments
            # ago (its notice still on the way); the shared table decides.
            await self.refresh()
            audience = self._audience(platform, event)
        if not audience:
            async with self._holding.lock:
                # Decided again under the lock a hello's subscription takes: either this event
                # is held before that hello releases the hold, or it sees the new subscriber.
                audience = self._audience(platform, event)
                if not audience:
                    await self._hold(platform, event, key)
                    return
        await self._route(platform, event, key, audience)

    async def _route(
        self, platform: str, event: InboundEvent, key: str | None, audience: list[str]
    ) -> None:
        """Deliver ``event`` to ``audience``: its key and every buffer append in one write,
        then the live sends to gateways that do not ack live deliveries."""
        connector = self._connector
        source = event.source
        buffered: list[str] = []  # gateways whose buffer gets it in this event's write
        offered: list[Instance | None] = []  # of each, the connection its pump hands it to
        live: list[str] = []  # gateways it is sent to live, once its key is written
        for gateway_id in audience:
            if connector.tenants is None and not connector.open_egress:
                # Provenance first, durably: the gateway may answer this chat (and user) as soon
                # as it sees the event, so the permission must exist before the event goes out.
                fresh = connector.provenance.unknown(
                    gateway_id, platform, (source.chat_id, source.user_id)
                )
                if fresh:
                    await self._store.run(
                        functools.partial(connector.provenance.learn, gateway_id, platform, fresh)
                    )
            instance = self._served.get(gateway_id)
            if instance is not None and instance.live and platform in instance.platforms():
                if instance.acked_live:
                    # Durable first: in the buffer before it goes out; only the gateway's ack
                    # (after its handler) retires it, so a gateway that dies with it loses
                    # nothing.
                    buffered.append(gateway_id)
                    offered.append(instance)
                else:
                    live.append(gateway_id)
                continue
            if instance is not None and instance.is_replaying():
                # Counted before the append is queued: the replay then knows to read again
                # (the store thread runs the append before that read).
                instance.appended += 1
            buffered.append(gateway_id)
            offered.append(None)
        # The connector's span for this event (statecore.tracing), for gateways that trace.
        trace = tracing.current_traceparent() if tracing.enabled else None
        if buffered or key is not None:
            # The key and the appends commit together: a crash leaves both or neither, and a
            # redelivered copy finds the key.
            lines = await self._store.take(platform, event, buffered, key=key)
            if lines is None:
                self._copy(platform, event)
                return
            for gateway_id, instance, line in zip(buffered, offered, lines, strict=True):
                if instance is not None:
                    buffer_id, seq, text = line
                    if trace is not None and (tp := traceparent_for(instance, trace)):
                        text = with_traceparent(text, tp)
                    self._delivery.offer(instance, buffer_id, seq, text)
                else:
                    self._maybe_wake(gateway_id)
        for gateway_id in live:
            instance = self._served.get(gateway_id)
            if (
                instance is not None
                and instance.live
                and platform in instance.platforms()
                and await instance.send(
                    encode(Inbound(event, None, trace and traceparent_for(instance, trace)))
                )
            ):
                continue  # delivered live (a failed live send falls back to the buffer)
            if instance is not None and instance.is_replaying():
                instance.appended += 1
            await self._store.append(gateway_id, platform, event)
            self._maybe_wake(gateway_id)

    async def _hold(self, platform: str, event: InboundEvent, key: str | None) -> None:
        """Hold an event no gateway listens to (its key in the same write); a copy of one
        taken before is skipped.  Raises ``IntakeFull`` when the hold is full."""
        source = event.source
        try:
            taken = await self._store.take(platform, event, [], key=key, hold=True)
        except IntakeFull:
            self.undeliverable += 1
            more = limited(self._log_limits, "events refused by a full hold", logging.WARNING)
            if more is not None:
                log.warning(
                    "connector: no gateway listens to %s chat %s and the hold is full; event %s "
                    "refused (the platform keeps it)%s",
                    platform,
                    peer_text(source.chat_id),
                    peer_text(event.message_id),
                    more,
                )
            raise
        if taken is None:
            self._copy(platform, event)
            return
        self.undeliverable += 1
        more = limited(self._log_limits, "undeliverable events", logging.WARNING)
        if more is not None:
            log.warning(
                "connector: no gateway listens to %s chat %s; event %s held until one says hello%s",
                platform,
                peer_text(source.chat_id),
                peer_text(event.message_id),
                more,
            )

    def _copy(self, platform: str, event: InboundEvent) -> None:
        """Count (and log, rate-limited) a copy of an event taken before."""
        self.duplicates += 1
        metrics = self._connector.metrics
        if isinstance(metrics, IntakeMetrics):
            metrics.intake(platform, IntakeOutcome.DUPLICATE)
        more = limited(self._log_limits, "redelivered events", logging.INFO)
        if more is not None:
            log.info(
                "connector: %s event %s was taken before; this copy is not routed again%s",
                platform,
                peer_text(event.message_id),
                more,
            )

    def _audience(self, platform: str, event: InboundEvent) -> list[str]:
        """The gateways that should see ``event``: those approved for its scope (or, without
        one, its user) in the tenants table; without a table, those subscribed to its
        platform."""
        tenants = self._connector.tenants
        if tenants is None:
            return sorted(g for g, platforms in self._subscribed.items() if platform in platforms)
        scope, user = event.source.scope_id, event.source.user_id
        return sorted(
            gateway_id
            for gateway_id, approved in tenants.items()
            if (scope is not None and scope in approved)
            or (scope is None and user is not None and user in approved)
        )

    def _maybe_wake(self, gateway_id: str) -> None:
        """Call the wake hook for a gateway that is not awake, at most once per interval."""
        connector = self._connector
        if connector.wake_hook is None:
            return
        instance = self._served.get(gateway_id)
        if instance is not None and instance.awake:
            return  # awake, just replaying
        now = connector.clock.monotonic()
        last = self._last_wake.get(gateway_id)
        if last is not None and now - last < connector.wake_interval_s:
            return
        self._last_wake[gateway_id] = now
        self._tasks.spawn(self._wake(gateway_id))

    async def _wake(self, gateway_id: str) -> None:
        wake_hook = self._connector.wake_hook
        assert wake_hook is not None
        try:
            await wake_hook(gateway_id)
        except Exception:
            log.warning("connector: wake hook for %s failed", gateway_id, exc_info=True)

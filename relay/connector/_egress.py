"""Outbound actions a gateway asks for: checked against the identities it said hello for and the
tenant guard (or provenance), performed by the platform's driver at most once per idempotency
key, and answered with their outcome.

A request with an idempotency key is performed at most once per process and scope (its outcome
is remembered under :func:`platform_key`, the scope below and the request's key); when the
platform's driver is an :class:`~relay.connector.intake.IdempotentDriver` it is also handed the
key (:func:`platform_key`: a scope and the request's key), so that the platform itself
deduplicates a resend, across the connector's restarts too. The scope is the bot a gateway that
announced our features said hello as (its keys are obligation ids, derived from the reply
itself, or random: every gateway of a fleet resending a reply resends it under the same key),
and the gateway id of an original gateway (whose keys may be counters of its own, which another
gateway's must never meet).

Remembering by scope, not by gateway, is what keeps a fleet's zombie from a visible duplicate: a
gateway paused past its lease (or cut from its store) may wake with a reply's send already under
way, after a peer claimed the reply and redelivered it, labelled, under the same key (the
obligation id).  Through the same node, that late send is answered with the redelivery's outcome
instead of being performed again.  (A node does not know what another node performed: across
nodes only an idempotent platform deduplicates.)
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from relay.connector._instance import Instance
from relay.connector._log import limited
from relay.connector._settings import EgressSettings
from relay.connector.chat_tenants import ChatTenants
from relay.connector.intake import IdempotentDriver
from relay.connector.platform import target_chat
from relay.wire.codec import encode
from relay.wire.frames import EGRESS_DECLINED, Outbound, OutboundOutcome, OutboundResult
from relay.wire.logtext import failure

__all__ = ["EGRESS_DECLINED_MESSAGE", "Egress", "dedupe_scope", "platform_key"]

# Every part of the connector logs to the one logger docs/configuration.md names.
log = logging.getLogger("relay.connector.server")

EGRESS_DECLINED_MESSAGE = "egress declined: target not approved for this connection"
"""The one refusal text of the tenant guard: it says nothing about other tenants."""

_IDEMPOTENCY_CACHE = 10_000
"""Idempotency keys whose outcome is remembered (the oldest forgotten first)."""


def platform_key(scope: str, idempotency_key: str) -> str:
    """The key an :class:`~relay.connector.intake.IdempotentDriver` is given for a request:
    ``"{len(scope)}:{scope}:{idempotency_key}"`` (see the module docs for the scope).

    The length prefix makes it unambiguous whatever the scope and the key hold (no scope and
    key can spell another pair); it is the same for every retry of the request, from any
    connection, before and after either side restarts.  Raises nothing.
    """
    return f"{len(scope)}:{scope}:{idempotency_key}"


def dedupe_scope(instance: Instance, platform: str, bot_id: str | None) -> str:
    """The scope of a request's platform key (module docs): ``bot/<bot id>`` for a gateway that
    announced our features, ``gateway/<gateway id>`` for an original one.  Raises nothing."""
    if not instance.announced:
        return "gateway/" + instance.gateway_id
    bot = bot_id or next((b for p, b in instance.identities if p == platform), "")
    return "bot/" + bot


class Egress:
    """The connector's outbound path.

    The guard reads the connector's ``tenants``, ``open_egress`` and ``provenance`` when it
    decides; ``chat_tenants`` is the connector's table of the tenant each chat belongs to, as
    the platform's own inbound traffic showed it.
    """

    def __init__(self, connector: EgressSettings, *, chat_tenants: ChatTenants) -> None:
        self._connector = connector
        self._chat_tenants = chat_tenants
        # platform_key(scope, idempotency key) -> the outcome of the request executed under it.
        self._outcomes: dict[str, asyncio.Future[OutboundOutcome]] = {}
        self._outcome_order: collections.deque[str] = collections.deque()
        self.recheck: Callable[[str, str, str], Awaitable[bool]] | None = None
        """A cluster node's read of the shared provenance for a target this node's memory does
        not hold (None: a lone connector, whose memory is the whole truth)."""
        self.read_tenant: Callable[[str, str], Awaitable[str | None]] | None = None
        """A cluster node's read of a chat's tenant in the shared store, into its memory (None:
        a lone connector, whose memory is the whole truth)."""

    async def outbound(self, instance: Instance, frame: Outbound) -> None:
        """Perform one outbound request of ``instance`` and send it the outcome."""
        outcome = await self._perform(instance, frame)
        await instance.send(encode(OutboundResult(frame.request_id, outcome)))

    async def _perform(self, instance: Instance, frame: Outbound) -> OutboundOutcome:
        if not instance.identities:
            return OutboundOutcome(False, None, "say hello first", "no_hello")
        platform = frame.platform or instance.identities[0][0]
        if platform not in instance.platforms():
            return OutboundOutcome(
                False, None, f"no hello for platform {platform!r}", "unknown_identity"
            )
        if not await self._guard(instance.gateway_id, platform, frame.action):
            # A peer decides how many requests it sends: rate-limited, with counts.
            more = limited(instance.log_limit, "declined egress", logging.INFO)
            if more is not None:
                log.info(
                    "connector: declined egress of %s to a chat on %s%s",
                    instance.gateway_id,
                    platform,
                    more,
                )
            return OutboundOutcome(False, None, EGRESS_DECLINED_MESSAGE, EGRESS_DECLINED)
        if frame.idempotency_key is None:
            return await self._drive(instance, platform, frame.action, None)
        key = platform_key(dedupe_scope(instance, platform, frame.bot_id), frame.idempotency_key)
        earlier = self._outcomes.get(key)
        if earlier is not None:
            # A retry of a request this scope executed (or is executing), from this gateway or
            # another of its bot's fleet: never perform it twice.
            return await asyncio.shield(earlier)
        future: asyncio.Future[OutboundOutcome] = asyncio.get_running_loop().create_future()
        self._remember_outcome(key, future)
        outcome = await self._drive(instance, platform, frame.action, key)
        future.set_result(outcome)
        if not outcome.success:
            self._outcomes.pop(key, None)  # a definite failure may be retried for real
        return outcome

    async def _drive(
        self, instance: Instance, platform: str, action: Mapping[str, Any], key: str | None
    ) -> OutboundOutcome:
        """``action`` performed by ``platform``'s driver: with ``key`` (the request's
        :func:`platform_key`) through ``perform_once`` when the driver deduplicates by a key."""
        try:
            driver = self._connector.drivers[platform]
            if key is not None and isinstance(driver, IdempotentDriver):
                return await driver.perform_once(action, key)
            return await driver.perform(action)
        except Exception as exc:
            # One line, not a traceback: a driver's error often quotes the request (the peer's
            # text) or the platform's answer; and a peer decides how many requests fail.
            more = limited(instance.log_limit, "driver failures", logging.ERROR)
            if more is not None:
                log.error(
                    "connector: driver %s failed for %s: %s%s",
                    platform,
                    instance.gateway_id,
                    failure(exc),
                    more,
                )
            return OutboundOutcome(False, None, f"driver error: {exc}", "driver_error")

    def _remember_outcome(self, key: str, future: asyncio.Future[OutboundOutcome]) -> None:
        self._outcomes[key] = future
        self._outcome_order.append(key)
        while len(self._outcome_order) > _IDEMPOTENCY_CACHE:
            self._outcomes.pop(self._outcome_order.popleft(), None)

    async def _guard(self, gateway_id: str, platform: str, action: Mapping[str, Any]) -> bool:
        """The tenant guard, with a cluster node's reads of the shared store: a chat this node
        holds no tenant for is read before the guard decides, one whose tenant the guard would
        decline is read again first (another node may have learned or moved it); a store that
        cannot be read declines.  A hit that allows is one lookup."""
        read_tenant = self.read_tenant
        chat_id = target_chat(action)
        if read_tenant is None or self._connector.tenants is None or chat_id is None:
            return self._allowed(gateway_id, platform, action) or (
                await self._learned_elsewhere(gateway_id, platform, action)
            )
        if self._chat_tenants.get(platform, chat_id) is not None and self._allowed(
            gateway_id, platform, action
        ):
            return True
        try:
            await read_tenant(platform, chat_id)
        except Exception:
            log.warning("connector: reading the tenant of a chat failed", exc_info=True)
            return False
        return self._allowed(gateway_id, platform, action)

    async def _learned_elsewhere(
        self, gateway_id: str, platform: str, action: Mapping[str, Any]
    ) -> bool:
        """A cluster node's second look before it declines: the target may have been learned
        by another node (provenance, read from the shared store; see ``recheck``)."""
        recheck = self.recheck
        connector = self._connector
        if recheck is None or connector.tenants is not None or connector.open_egress:
            return False
        target = target_chat(action)
        if target is None:
            return False
        try:
            return await recheck(gateway_id, platform, target)
        except Exception:
            log.warning("connector: reading the provenance of a target failed", exc_info=True)
            return False

    def _allowed(self, gateway_id: str, platform: str, action: Mapping[str, Any]) -> bool:
        """The tenant guard: the target chat's tenant must be approved for this gateway; with no
        tenants table, the target must be a chat or user it received inbound from (provenance),
        unless egress is explicitly open."""
        connector = self._connector
        if connector.tenants is None:
            if connector.open_egress:
                return True
            target = target_chat(action)
            return target is not None and connector.provenance.allows(gateway_id, platform, target)
        approved = connector.tenants.get(gateway_id, frozenset())
        chat_id = target_chat(action)
        known = None if chat_id is None else self._chat_tenants.get(platform, chat_id)
        if known is not None:
            # What the platform told us about the chat outranks what the gateway claims.
            return known in approved
        # A chat the platform never showed us: the gateway's metadata, scope first, then user.
        metadata = action.get("metadata")
        meta = metadata if isinstance(metadata, Mapping) else {}
        # Ids are text on the wire; anything else (a list, an object) is never approved.
        scope = meta.get("scope_id")
        if scope is not None:
            return isinstance(scope, str) and scope in approved
        user = meta.get("user_id")
        return isinstance(user, str) and user in approved

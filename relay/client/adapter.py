"""The platform adapter over a relay transport: what the gateway runtime sends replies through.

``RelayAdapter`` adopts the connector's capability descriptor, turns sends into relay requests
with typed results, remembers per chat the tenant discriminators (``scope_id``, ``user_id``)
learned from inbound traffic and attaches them to outbound metadata, tears its transport
down within a budget it measures itself, hands the gateway's housekeeping the jobs that
prune its transport's dedupe store (handled-replay keys, dismissed undeliverable records), and
says how long the connector's platform deduplicates a resend under one idempotency key.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, Protocol

import attrs

from relay.client.lifecycle import SERVING, TransportState
from relay.client.requests import RequestOutcome, RequestResult
from relay.client.teardown import default_disconnect_budget_s
from relay.wire.compat import IDEMPOTENT_SENDS
from relay.wire.descriptor import CONTRACT_VERSION, CapabilityDescriptor
from relay.wire.errors import RelayBroken, RelayClosed
from relay.wire.frames import EGRESS_DECLINED, InboundEvent
from relay.wire.logtext import peer_text
from statecore.clock import Clock, Deadline, SystemClock
from statecore.gateway.adapter import AdapterAbilities, MessageLimit, SendResult
from statecore.policy import ErrorKind

__all__ = [
    "SEND_PATH_DEGRADED",
    "ChatRoute",
    "RelayAdapter",
    "RelayTransportLike",
]

log = logging.getLogger(__name__)

_KIND_OF_CODE = {
    EGRESS_DECLINED: ErrorKind.PERMANENT,
    "rate_limited": ErrorKind.RATE_LIMITED,
    # The platform's refusals of the action itself: the same action is refused again.
    "too_long": ErrorKind.PERMANENT,
    "bad_action": ErrorKind.PERMANENT,
    "unsupported_op": ErrorKind.PERMANENT,
    "not_found": ErrorKind.PERMANENT,
}
"""Result codes whose meaning for a retry is known (others: the error text is classified)."""

SEND_PATH_DEGRADED = "send_path_degraded"
"""The send error meaning the platform never saw the request (the ledger's reconnect error)."""

_GO_IDLE_MAX_S = 10.0


class RelayTransportLike(Protocol):
    """What the adapter needs of its transport (:class:`WebSocketRelayTransport` is one; a
    test double implements the same methods)."""

    @property
    def platform(self) -> str:
        """The platform this transport's connector serves."""
        ...

    @property
    def state(self) -> TransportState:
        """The transport's lifecycle state."""
        ...

    @property
    def listeners(self) -> list[Callable[[TransportState, TransportState, str], None]]:
        """Observers of every state change ``(from, to, event)``."""
        ...

    async def connect(self) -> None:
        """Dial."""
        ...

    async def handshake(self) -> CapabilityDescriptor:
        """Wait for the descriptor."""
        ...

    def set_inbound_handler(
        self, handler: Callable[[InboundEvent], Awaitable[None]] | None
    ) -> None:
        """Receive inbound events (None: stop receiving them)."""
        ...

    async def request(
        self, action: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> RequestResult:
        """Send one outbound action and wait for its definite result."""
        ...

    async def go_idle(self, timeout_s: float = 10) -> bool:
        """Ask the connector to buffer new inbound; True once it acked."""
        ...

    async def go_dormant(self, timeout_s: float = 10) -> bool:
        """Go dormant; True once the connector acked and the socket is closed."""
        ...

    async def disconnect(self, budget_s: float | None = None) -> None:
        """Tear down within ``budget_s``."""
        ...


@attrs.frozen
class ChatRoute:
    """What the adapter remembers about one chat, for the connector's tenant guard."""

    scope_id: str | None = None
    user_id: str | None = None


class RelayAdapter:
    """A platform adapter whose platform is reached through a relay connector.

    ``RelayAdapter(transport, *, placeholder=None, profile="default")``.  Until the connector's
    descriptor is adopted, ``descriptor`` is ``placeholder`` (or a conservative default).
    """

    abilities: ClassVar[AdapterAbilities] = AdapterAbilities(
        connects=True,
        disconnects=True,
        delivers_inbound=True,
        announces_reconnects=True,
        primes_routes=True,
        keeps_house=True,
        shows_typing=True,
        edits=True,
        limits_length=True,
        dedupes_sends=True,
    )
    """Everything the runtime may ask of an adapter (typing and edits are sent only where the
    connector's descriptor lists the op; elsewhere they are refused without a request; a dedupe
    window only where the descriptor announces one)."""

    def __init__(
        self,
        transport: RelayTransportLike,
        *,
        placeholder: CapabilityDescriptor | None = None,
        profile: str = "default",
        clock: Clock | None = None,
    ) -> None:
        self.transport = transport
        self.profile = profile
        self.platform = transport.platform
        self.descriptor = placeholder or CapabilityDescriptor(
            contract_version=CONTRACT_VERSION,
            platform=self.platform,
            label="Relay",
            max_message_length=4096,
            supports_draft_streaming=False,
            supports_edit=False,
            supports_threads=False,
            markdown_dialect="plain",
            len_unit="chars",
        )
        self._descriptor_known = placeholder is not None
        self._clock: Clock = clock or SystemClock()
        self._routes: dict[str, ChatRoute] = {}
        self._handler: Callable[[InboundEvent], Awaitable[None]] | None = None

    @property
    def connected(self) -> bool:
        """True while the transport can carry a send now (derived from its lifecycle state, so
        it turns False during a reconnect and True again after it)."""
        return self.transport.state in SERVING

    # -- connecting ----------------------------------------------------------------------------

    def on_reconnect(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` every time the transport completes a handshake (the first
        connection and every reconnection).  It runs inside the transport's state change: it
        must not raise or block (schedule work instead)."""

        def changed(before: object, after: object, event: str) -> None:
            del before, after
            if event == "establish":
                callback()

        self.transport.listeners.append(changed)

    def on_message(self, handler: Callable[[InboundEvent], Awaitable[None]] | None) -> None:
        """Deliver inbound events to ``handler`` (after the adapter has learned their route).

        Until a handler is set, the transport has none either, so buffered deliveries stay
        unacked (and are replayed) instead of being acked unhandled.
        """
        self._handler = handler
        self.transport.set_inbound_handler(self._on_inbound if handler is not None else None)

    async def connect(self, is_reconnect: bool = False) -> bool:
        """Register the inbound handler, dial, handshake and adopt the connector's descriptor.

        ``is_reconnect`` is accepted for interface compatibility and ignored: the transport's
        supervisor owns reconnection.  Returns False (logged) when the connector cannot be
        reached or refuses us; never raises for the network.
        """
        del is_reconnect
        if self._handler is not None:
            self.transport.set_inbound_handler(self._on_inbound)
        try:
            await self.transport.connect()
            self.descriptor = await self.transport.handshake()
            self._descriptor_known = True
        except (RelayBroken, RelayClosed, OSError) as exc:
            # The error may quote the connector (a close reason, an HTTP status line): escaped.
            log.warning(
                "relay adapter %s/%s: connect failed: %s",
                self.platform,
                self.profile,
                peer_text(str(exc)),
            )
            return False
        return True

    async def _on_inbound(self, event: InboundEvent) -> None:
        self.remember(
            event.source.chat_id, scope_id=event.source.scope_id, user_id=event.source.user_id
        )
        if self._handler is not None:
            await self._handler(event)

    # -- routes --------------------------------------------------------------------------------

    def remember(
        self, chat_id: str, *, scope_id: str | None = None, user_id: str | None = None
    ) -> None:
        """Remember (or refresh) a chat's scope and user; None leaves a known value in place."""
        known = self._routes.get(chat_id, ChatRoute())
        self._routes[chat_id] = ChatRoute(scope_id or known.scope_id, user_id or known.user_id)

    def prime(self, origin: Mapping[str, Any] | Any) -> None:
        """Prime the memory from a persisted routing origin (a mapping or an object with
        ``chat_id``, ``scope_id``, ``user_id``), e.g. when a route is rebuilt after a restart."""
        get = origin.get if isinstance(origin, Mapping) else lambda k: getattr(origin, k, None)
        chat_id = get("chat_id")
        if chat_id is None:
            return
        self.remember(str(chat_id), scope_id=get("scope_id"), user_id=get("user_id"))

    def route(self, chat_id: str) -> ChatRoute:
        """What is known about ``chat_id`` (empty when nothing is)."""
        return self._routes.get(chat_id, ChatRoute())

    @property
    def message_limit(self) -> MessageLimit | None:
        """The longest message the connector's platform takes (its descriptor's
        ``max_message_length`` in its ``len_unit``); None until a descriptor was adopted (or
        a ``placeholder`` given)."""
        if not self._descriptor_known:
            return None
        return MessageLimit(self.descriptor.max_message_length, self.descriptor.len_unit)

    @property
    def dedupe_window_s(self) -> float | None:
        """How many seconds the connector's platform shows a send once per idempotency key
        (every :meth:`send` with the same ``metadata["idempotency_key"]``, through the same
        gateway id): the descriptor's ``idempotency_window_s`` when it announces
        :data:`~relay.wire.compat.IDEMPOTENT_SENDS`; None otherwise (an original connector, a
        platform that does not, a window not given) and until a descriptor was adopted.  Read
        from the transport's latest handshake when it has one (a connector reached again may
        have changed).  The caller must label a resend that may repeat when this is None."""
        latest = getattr(self.transport, "descriptor", None)
        if isinstance(latest, CapabilityDescriptor):
            descriptor = latest
        elif self._descriptor_known:
            descriptor = self.descriptor
        else:
            return None
        if not descriptor.announces(IDEMPOTENT_SENDS):
            return None
        window = descriptor.idempotency_window_s
        return None if window is None else float(window)

    # -- sending -------------------------------------------------------------------------------

    async def send(
        self, chat_id: str, content: str, metadata: Mapping[str, Any] | None = None
    ) -> SendResult:
        """Send ``content`` to ``chat_id`` through the connector; never raises for the network.

        ``metadata`` may carry ``thread_id``, ``reply_to`` and ``idempotency_key`` (reuse it
        when retrying an ambiguous send); the chat's remembered ``scope_id`` / ``user_id`` are
        attached unless given.  A timeout or a lost connection gives ``ambiguous=True``; a
        refusal is definite.
        """
        # The contract's body field is ``content`` for every action that carries a message.
        action = self._action("send", chat_id, metadata, content=content)
        return await self._perform(action, (metadata or {}).get("idempotency_key"))

    async def typing(
        self, chat_id: str, status: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> SendResult:
        """Show the bot typing in ``chat_id`` (``status``: a text where the platform shows one;
        ``""`` clears it), when the connector's descriptor lists ``typing``; else a
        ``PERMANENT`` failure without a request.  Never raises for the network."""
        if not self.descriptor.supports("typing"):
            return SendResult.failed(
                f"{self.platform} does not show typing", kind=ErrorKind.PERMANENT
            )
        fields = {} if status is None else {"content": status}
        return await self._perform(self._action("typing", chat_id, metadata, **fields), None)

    async def edit(
        self,
        chat_id: str,
        message_id: str,
        content: str,
        metadata: Mapping[str, Any] | None = None,
    ) -> SendResult:
        """Replace the text of the bot's message ``message_id`` in ``chat_id``, when the
        connector's descriptor lists ``edit``; else a ``PERMANENT`` failure without a request.
        Never raises for the network."""
        if not (self.descriptor.supports("edit") and self.descriptor.supports_edit):
            return SendResult.failed(
                f"{self.platform} does not edit messages", kind=ErrorKind.PERMANENT
            )
        action = self._action("edit", chat_id, metadata, message_id=message_id, content=content)
        return await self._perform(action, None)

    def _action(
        self, op: str, chat_id: str, metadata: Mapping[str, Any] | None, **fields: Any
    ) -> dict[str, Any]:
        """The action ``op`` for ``chat_id``: its ``fields``, the ``thread_id`` and
        ``reply_to`` that ``metadata`` carries, and the chat's tenant discriminators (those
        given in ``metadata``, else the remembered ones) as its ``metadata``."""
        meta = metadata or {}
        route = self.route(chat_id)
        action: dict[str, Any] = {"op": op, "chat_id": chat_id, **fields}
        for key in ("thread_id", "reply_to"):
            if meta.get(key) is not None:
                action[key] = meta[key]
        outbound_meta = {
            "scope_id": meta.get("scope_id") or route.scope_id,
            "user_id": meta.get("user_id") or route.user_id,
        }
        action["metadata"] = {k: v for k, v in outbound_meta.items() if v is not None}
        return action

    async def _perform(self, action: Mapping[str, Any], idempotency_key: Any) -> SendResult:
        """One request for ``action``, its outcome typed for the ledger."""
        result = await self.transport.request(action, idempotency_key=idempotency_key)
        if result.outcome is RequestOutcome.OK:
            return SendResult.ok(result.message_id)
        if result.outcome is RequestOutcome.NOT_SENT:
            # It never left: the platform did not see it.  The ledger retries it as soon as the
            # relay is back instead of spending attempts.
            return SendResult.failed(SEND_PATH_DEGRADED, kind=ErrorKind.RECONNECT)
        error = result.error or result.outcome.value
        if result.outcome is RequestOutcome.DECLINED:
            if "egress" not in error:
                error = f"{EGRESS_DECLINED}: {error}"
            return SendResult.failed(error, kind=ErrorKind.PERMANENT)  # final: never retried
        if result.outcome is RequestOutcome.UNKNOWN:
            return SendResult.failed(error, ambiguous=True)
        # The platform's own refusal: its code when it is one we know, else its text decides.
        return SendResult.failed(error, kind=_KIND_OF_CODE.get(result.code or ""))

    # -- housekeeping --------------------------------------------------------------------------

    def housekeeping(self, retention_s: float) -> dict[str, Callable[[], Awaitable[int]]]:
        """The jobs that prune the transport's dedupe store for the gateway's housekeeping:
        ``dedupe`` (keys handled more than ``retention_s`` ago) and ``undeliverable`` (records
        dismissed more than ``retention_s`` ago), when the transport has a dedupe that names
        its jobs (:meth:`relay.StoreBufferDedupe.housekeeping`); else none."""
        dedupe = getattr(self.transport, "dedupe", None)
        jobs = getattr(dedupe, "housekeeping", None)
        return dict(jobs(retention_s)) if callable(jobs) else {}

    # -- idle, dormancy, teardown --------------------------------------------------------------

    async def go_dormant(self) -> bool:
        """Let the transport go dormant; False (never raises) when it cannot."""
        try:
            return bool(await self.transport.go_dormant())
        except Exception:
            log.warning("relay adapter %s: go_dormant failed", self.platform, exc_info=True)
            return False

    async def disconnect(
        self, *, budget_s: float | None = None, deadline: Deadline | None = None
    ) -> None:
        """Emit going_idle as part of the drain, then tear the transport down with the budget
        that is left.

        The budget is ``deadline`` (absolute, preferred), else ``budget_s``, else the
        environment default; the time spent on going_idle is subtracted before the transport
        gets the remainder.
        """
        if deadline is None:
            budget = default_disconnect_budget_s() if budget_s is None else budget_s
            deadline = Deadline.after(self._clock, budget)
        try:
            await self.transport.go_idle(timeout_s=min(_GO_IDLE_MAX_S, deadline.remaining()))
        except Exception:
            log.warning("relay adapter %s: going_idle failed", self.platform, exc_info=True)
        await self.transport.disconnect(budget_s=deadline.remaining())

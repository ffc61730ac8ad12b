"""Outbound requests of the gateway's transport: the typed result a caller gets, and the table
of requests still awaiting theirs."""

from __future__ import annotations

import asyncio
import itertools
import secrets
from enum import StrEnum
from typing import Any

import attrs
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from relay.client.teardown import wait_future
from relay.wire.codec import encode
from relay.wire.errors import RelayBroken, RelayClosed
from relay.wire.frames import Outbound, OutboundOutcome
from statecore import tracing
from statecore.clock import Clock, Deadline

__all__ = ["PendingRequests", "RequestOutcome", "RequestResult", "result_of"]


class RequestOutcome(StrEnum):
    """What is known about a request once :meth:`WebSocketRelayTransport.request` returned."""

    NOT_SENT = "not_sent"
    """It never left: retrying cannot duplicate it."""
    UNKNOWN = "unknown"
    """It may have been executed (timeout, connection lost, torn down): a retry may duplicate."""
    OK = "ok"
    """The connector acknowledged success."""
    FAILED = "failed"
    """The connector acknowledged a failure (``error``, ``code``)."""
    DECLINED = "declined"
    """The connector refused it definitely (tenant guard: ``egress_declined``)."""


@attrs.frozen
class RequestResult:
    """The definite answer of one request."""

    outcome: RequestOutcome
    request_id: str | None = None
    message_id: str | None = None
    error: str | None = None
    code: str | None = None

    @property
    def success(self) -> bool:
        """True only for an acknowledged success."""
        return self.outcome is RequestOutcome.OK

    @property
    def ambiguous(self) -> bool:
        """True when the request may have been executed without our knowing."""
        return self.outcome is RequestOutcome.UNKNOWN


class PendingRequests:
    """The requests of one transport that await their result, and its going-idle waiters.

    Ids are unique per transport (a random prefix and a counter), so a result for a request of
    an earlier connection, or of another transport, never resolves the wrong caller.  Every
    registered future is resolved exactly once: by its result, by a peer's error frame naming
    it, or by :meth:`fail_all` when the connection is lost or torn down.
    """

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(4)
        self._ids = itertools.count(1)
        self._results: dict[str, asyncio.Future[OutboundOutcome]] = {}
        self._idle: dict[str, asyncio.Future[bool]] = {}
        self.traced = False
        """Whether the connector announced the trace feature (outbound frames may then carry
        a ``traceparent``; set by the reader from each connection's descriptor)."""

    def __len__(self) -> int:
        """How many requests await their result."""
        return len(self._results)

    def new_id(self, kind: str = "") -> str:
        """A fresh request id (``kind`` marks going-idle requests in logs)."""
        return f"{self._prefix}-{kind}{next(self._ids)}"

    def default_key(self, request_id: str) -> str:
        """The idempotency key of a request given none: unique, derived from its id."""
        return f"{self._prefix}-k{request_id}"

    def expect(self, request_id: str) -> asyncio.Future[OutboundOutcome]:
        """Register ``request_id``; its result resolves the returned future.  The caller must
        :meth:`forget` it once done waiting, whatever happened."""
        future: asyncio.Future[OutboundOutcome] = asyncio.get_running_loop().create_future()
        self._results[request_id] = future
        return future

    def forget(self, request_id: str) -> None:
        """Stop expecting ``request_id`` (a no-op when it is not registered)."""
        self._results.pop(request_id, None)

    def resolve(self, request_id: str, outcome: OutboundOutcome) -> None:
        """Hand ``outcome`` to the caller waiting for ``request_id``; unknown or already
        resolved ids are ignored (a late or duplicated result)."""
        future = self._results.get(request_id)
        if future is not None and not future.done():
            future.set_result(outcome)

    def unresolved(self) -> list[asyncio.Future[OutboundOutcome]]:
        """The futures still waiting, for a drain."""
        return [f for f in self._results.values() if not f.done()]

    def expect_idle_ack(self, request_id: str) -> asyncio.Future[bool]:
        """Register a going-idle request; :meth:`idle_acked` resolves it with True.  The caller
        must :meth:`forget_idle` it once done waiting."""
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._idle[request_id] = waiter
        return waiter

    def forget_idle(self, request_id: str) -> None:
        """Stop expecting an ack for the going-idle request ``request_id``."""
        self._idle.pop(request_id, None)

    def idle_acked(self, request_id: str | None) -> None:
        """A going-idle ack: it resolves the request it names, or -- naming none or an unknown
        one (an original connector acks without an id) -- every waiting one."""
        waiters = (
            list(self._idle.values())
            if request_id is None or request_id not in self._idle
            else [self._idle[request_id]]
        )
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(True)

    async def perform(
        self,
        ws: ClientConnection,
        action: dict[str, Any],
        idempotency_key: str | None,
        platform: str | None,
        bot_id: str | None,
        *,
        clock: Clock,
        deadline: Deadline,
        timeout_s: float,
        traceparent: str | None = None,
    ) -> RequestResult:
        """Send one outbound action on ``ws`` and wait for its result until ``deadline``.

        A send on a closed socket, no result in time, or a failure by :meth:`fail_all` gives
        ``UNKNOWN`` (it may have been executed); otherwise the connector's answer.  The request
        is registered only while it is waited for.  While tracing is on the request is a
        ``transport outbound`` span whose context the frame carries (``traceparent``; only to a
        connector that announced it).
        """
        if tracing.enabled and traceparent is None:
            return await self._traced(
                ws,
                action,
                idempotency_key,
                platform,
                bot_id,
                clock=clock,
                deadline=deadline,
                timeout_s=timeout_s,
            )
        request_id = self.new_id()
        key = idempotency_key or self.default_key(request_id)
        future = self.expect(request_id)
        try:
            try:
                frame = Outbound(request_id, action, key, platform, bot_id, traceparent or None)
                await ws.send(encode(frame))
            except ConnectionClosed:
                return RequestResult(RequestOutcome.UNKNOWN, request_id, error="connection lost")
            if not await wait_future(clock, future, deadline.remaining()):
                return RequestResult(
                    RequestOutcome.UNKNOWN, request_id, error=f"no result within {timeout_s:g} s"
                )
            try:
                outcome = future.result()
            except (RelayClosed, RelayBroken) as exc:
                return RequestResult(RequestOutcome.UNKNOWN, request_id, error=str(exc))
        finally:
            self.forget(request_id)
        return result_of(request_id, outcome)

    async def _traced(
        self,
        ws: ClientConnection,
        action: dict[str, Any],
        idempotency_key: str | None,
        platform: str | None,
        bot_id: str | None,
        *,
        clock: Clock,
        deadline: Deadline,
        timeout_s: float,
    ) -> RequestResult:
        """:meth:`perform` inside its ``transport outbound`` span (tracing is on)."""
        chat = action.get("chat_id")
        attributes = {
            "relay.op": str(action.get("op")),
            "relay.chat_id": chat if isinstance(chat, str | int) else None,
            "relay.platform": platform,
            "relay.idempotency_key": idempotency_key,
        }
        with tracing.span("transport outbound", attributes, kind=tracing.Kind.CLIENT) as span:
            # "": no field on the wire (the connector did not announce it), and no second span.
            traceparent = (tracing.current_traceparent() if self.traced else None) or ""
            result = await self.perform(
                ws,
                action,
                idempotency_key,
                platform,
                bot_id,
                clock=clock,
                deadline=deadline,
                timeout_s=timeout_s,
                traceparent=traceparent,
            )
            if span is not None:
                span.set_attribute("relay.request_id", result.request_id or "")
                span.set_attribute("relay.outcome", result.outcome.value)
            return result

    def fail_all(self, error: Exception) -> None:
        """Fail every waiting request with ``error`` and every going-idle waiter with False."""
        pending, self._results = self._results, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved here: nobody may be waiting any more
        for waiter in self._idle.values():
            if not waiter.done():
                waiter.set_result(False)


def result_of(request_id: str, outcome: OutboundOutcome) -> RequestResult:
    """The typed result of a request the connector answered with ``outcome``."""
    if outcome.success:
        return RequestResult(RequestOutcome.OK, request_id, outcome.message_id)
    kind = RequestOutcome.DECLINED if outcome.declined else RequestOutcome.FAILED
    return RequestResult(kind, request_id, None, outcome.error, outcome.code)

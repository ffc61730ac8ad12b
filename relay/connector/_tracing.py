"""The connector's spans (:mod:`statecore.tracing`): ``connector inbound`` for each platform
event taken in, ``connector send`` for each outbound action performed -- a child of the
gateway's ``transport outbound`` span when the frame carries its ``traceparent``.

:func:`traced` installs both on a connector's inbound router and egress while tracing is on
(the connector calls it when built); :func:`traceparent_for` is the trace context an
``inbound`` line may carry to one gateway -- only to one that announced
:data:`~relay.wire.compat.TRACE_CONTEXT`.  Nothing here runs while tracing is off.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from relay.connector._instance import Instance
from relay.wire.compat import TRACE_CONTEXT
from relay.wire.frames import InboundEvent, Outbound
from statecore import tracing

__all__ = ["traced", "traceparent_for"]


def traceparent_for(instance: Instance, traceparent: str | None) -> str | None:
    """``traceparent`` when ``instance``'s gateway announced the trace feature, else None (an
    original or untraced gateway never sees the field).  Raises nothing."""
    if traceparent is None or TRACE_CONTEXT not in instance.features:
        return None
    return traceparent


def traced(router: Any, egress: Any, connector_name: str) -> None:
    """Wrap ``router.intake`` and ``egress.outbound`` (instance attributes) in their spans;
    ``connector_name`` is the ``relay.connector`` attribute.  A no-op while tracing is off."""
    if not tracing.enabled:
        return
    router.intake = _intake(router.intake, connector_name)
    egress.outbound = _outbound(egress.outbound, connector_name)


def _intake(
    intake: Callable[[str, InboundEvent], Awaitable[None]], name: str
) -> Callable[[str, InboundEvent], Awaitable[None]]:
    @functools.wraps(intake)
    async def traced_intake(platform: str, event: InboundEvent) -> None:
        source = event.source
        attributes = {
            "relay.connector": name,
            "relay.platform": platform,
            "relay.chat_id": source.chat_id,
            "relay.chat_type": source.chat_type,
            "relay.message_id": event.message_id,
            "relay.scope_id": source.scope_id,
        }
        with tracing.span("connector inbound", attributes, kind=tracing.Kind.CONSUMER):
            await intake(platform, event)

    return traced_intake


def _outbound(
    outbound: Callable[[Instance, Outbound], Awaitable[None]], name: str
) -> Callable[[Instance, Outbound], Awaitable[None]]:
    @functools.wraps(outbound)
    async def traced_outbound(instance: Instance, frame: Outbound) -> None:
        action = frame.action
        chat = action.get("chat_id")
        attributes = {
            "relay.connector": name,
            "relay.gateway_id": instance.gateway_id,
            "relay.platform": frame.platform
            or (instance.identities[0][0] if instance.identities else None),
            "relay.op": str(action.get("op")),
            "relay.chat_id": chat if isinstance(chat, str | int) else None,
            "relay.request_id": frame.request_id,
            "relay.idempotency_key": frame.idempotency_key,
        }
        with tracing.span(
            "connector send",
            attributes,
            parent=frame.traceparent,
            kind=tracing.Kind.SERVER,
            source=f"gateway {instance.gateway_id}",
        ):
            await outbound(instance, frame)

    return traced_outbound

"""Delivering what delegated work finished: each owed completion routed with the one resolver
and sent into its session as a ledgered final reply."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from statecore.gateway.adapter import SendResult
from statecore.gateway.delegations import Delegation, Delegations
from statecore.gateway.routing import Route, RouteVerdict
from statecore.gateway.sessions import Session, SessionStore
from statecore.gateway.turn import Replier
from statecore.obligation import DEFAULT_PROFILE

__all__ = ["deliver_completions"]


async def deliver_completions(
    delegations: Delegations,
    sessions: SessionStore,
    render: Callable[[Delegation], str],
    *,
    send: Replier,
    prime: Callable[[tuple[str, str], Any], None],
) -> list[tuple[Delegation, Route[Session], SendResult | None]]:
    """Route and deliver every owed completion (see ``Gateway.deliver_completions``).

    ``send`` is the gateway (its ``send_final``); ``prime(target, origin)`` lets the target's
    adapter learn the chat's route from the persisted origin before the send.  Store work runs
    off the event loop (through the ``aio`` facades).
    """
    outcomes: list[tuple[Delegation, Route[Session], SendResult | None]] = []
    for job in await delegations.aio.pending_completions():
        route = await delegations.aio.route_completion(job.delegation_id, sessions)
        if route.verdict is RouteVerdict.TERMINAL:
            await delegations.aio.mark_dropped(job.delegation_id, route.reason)
            outcomes.append((job, route, None))
            continue
        if route.verdict is RouteVerdict.RETRY or route.session is None:
            await delegations.aio.defer(job.delegation_id, route.reason)
            outcomes.append((job, route, None))
            continue
        origin = job.origin
        # The rebuilt route carries scope_id/user_id onwards.
        prime((origin.platform, DEFAULT_PROFILE), origin)
        result = await send.send_final(
            session_key=route.session.session_key,
            platform=origin.platform,
            chat_id=origin.chat_id,
            content=render(job),
            message_ref=f"delegation:{job.delegation_id}",
            thread_id=origin.thread_id,
        )
        if result.success:
            await delegations.aio.mark_delivered(job.delegation_id, session_id=route.session_id)
        outcomes.append((job, route, result))
    return outcomes

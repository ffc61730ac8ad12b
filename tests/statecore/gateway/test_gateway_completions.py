"""Gateway.deliver_completions: durable async work reaches the route the one resolver picks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from statecore.gateway import (
    AdapterAbilities,
    Delegation,
    Delegations,
    Gateway,
    RouteVerdict,
    RoutingOrigin,
    SendResult,
    SessionStore,
)
from stores import InMemoryStore


class _Adapter:
    abilities = AdapterAbilities(primes_routes=True)

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict[str, Any]]] = []
        self.primed: list[Any] = []

    def prime(self, origin: Any) -> None:
        self.primed.append(origin)

    async def send(
        self, chat_id: str, content: str, metadata: Mapping[str, Any] | None = None
    ) -> SendResult:
        self.sent.append((chat_id, content, dict(metadata or {})))
        return SendResult.ok(f"m{len(self.sent)}")


def _render(job: Delegation) -> str:
    return f"late result: {job.result}"


async def _setup() -> tuple[Gateway, _Adapter, SessionStore, Delegations]:
    store = InMemoryStore()
    sessions = SessionStore(store)
    gateway = Gateway(store, sessions=sessions)
    adapter = _Adapter()
    gateway.add_adapter("chat", adapter)
    return gateway, adapter, sessions, Delegations(store)


def _origin(sessions: SessionStore, key: str, chat: str) -> RoutingOrigin:
    pinned = sessions.start(key)
    return RoutingOrigin(
        platform="chat",
        chat_id=chat,
        chat_type="dm",
        session_key=key,
        parent_session_id=pinned.session_id,
        user_id="u1",
        scope_id="team-a",
    )


@pytest.mark.asyncio
async def test_a_completion_is_delivered_once_into_its_live_session() -> None:
    """A completed job whose pinned session is live is sent to its chat (the adapter primed
    with the persisted origin), marked delivered, and never sent again."""
    gateway, adapter, sessions, delegations = await _setup()
    try:
        origin = _origin(sessions, "agent:default:chat:dm:c1", "c1")
        job = delegations.dispatch(origin, {"goal": "sum"})
        delegations.complete(job, 42)
        outcomes = await gateway.deliver_completions(delegations, sessions, _render)
        assert [(r.verdict, res is not None and res.success) for _, r, res in outcomes] == [
            (RouteVerdict.DELIVER, True)
        ]
        assert [(chat, text) for chat, text, _ in adapter.sent] == [("c1", "late result: 42")]
        assert adapter.primed
        assert adapter.primed[0].scope_id == "team-a"
        assert delegations.pending_completions() == []
        assert await gateway.deliver_completions(delegations, sessions, _render) == []
        assert len(adapter.sent) == 1
    finally:
        await gateway.stop(budget_s=1)


@pytest.mark.asyncio
async def test_a_completion_after_a_user_boundary_is_dropped_unsent() -> None:
    """When the user reset the pinned session, the completion is dropped and nothing is sent."""
    gateway, adapter, sessions, delegations = await _setup()
    try:
        origin = _origin(sessions, "agent:default:chat:dm:c2", "c2")
        job = delegations.dispatch(origin, {"goal": "sum"})
        assert origin.parent_session_id is not None
        sessions.end(origin.parent_session_id, "session_reset")
        delegations.complete(job, 1)
        outcomes = await gateway.deliver_completions(delegations, sessions, _render)
        assert [(r.verdict, res) for _, r, res in outcomes] == [(RouteVerdict.TERMINAL, None)]
        assert adapter.sent == []
        assert delegations.pending_completions() == []
    finally:
        await gateway.stop(budget_s=1)

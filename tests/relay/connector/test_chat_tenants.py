"""The tenant guard's memory of which tenant each chat belongs to is durable: a restarted
connector still lets a gateway answer its own tenant's chat (with no scope in the metadata, as
a reply recovered after a gateway restart is sent) and still refuses a gateway that claims
another tenant's chat.  The simulation of the real runtime found the first one lost."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from relay.client.requests import RequestOutcome
from relay.connector.chat_tenants import CHAT_TENANT_KIND, ChatTenants, ChatTenantState
from statecore.clock import FakeClock
from statecore.errors import InvalidTransition, StoreError
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from tests.relay.connector.connector_harness import (
    BOUND,
    Harness,
    Recorder,
    eventually,
    send_action,
)

TENANTS = {"gw-a": {"scope-a"}, "gw-b": {"scope-b"}}


@pytest_asyncio.fixture
async def sqlite_harness(tmp_path: Path) -> AsyncIterator[Harness]:
    """A harness whose connectors share one SQLite file (restarts keep it)."""
    store = SQLiteStore(tmp_path / "connector.db")
    harness = Harness(store)
    try:
        yield harness
    finally:
        await harness.close()
        store.close()


@pytest.mark.asyncio
async def test_a_restarted_connector_still_knows_each_chats_tenant(
    sqlite_harness: Harness,
) -> None:
    h = sqlite_harness
    first = await h.start(tenants=TENANTS)
    seen = Recorder()
    await h.gateway(first, "gw-a", seen)
    await h.platform.inject("chat-a", "hello", user_id="u1", scope_id="scope-a")
    await eventually(lambda: seen.texts == ["hello"], "delivered to gw-a")
    await first.stop()

    second = await h.start(tenants=TENANTS)
    a = await h.gateway(second, "gw-a")
    b = await h.gateway(second, "gw-b")
    # The reply a restarted gateway recovers carries no scope: the platform's word decides.
    answered = await a.request(send_action("chat-a", "echo: hello"), timeout_s=BOUND)
    assert answered.outcome is RequestOutcome.OK
    # Gateway B claiming its own scope for tenant A's chat is refused as before the restart.
    forged = await b.request(send_action("chat-a", "x", scope_id="scope-b"), timeout_s=BOUND)
    assert forged.outcome is RequestOutcome.DECLINED
    assert h.platform.texts("chat-a") == ["echo: hello"]


def test_chat_tenants_persist_move_and_forget(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "tenants.db"
    store = SQLiteStore(path)
    tenants = ChatTenants(store, clock=clock)
    assert tenants.learn("p", "c1", "t1") is True
    assert tenants.learn("p", "c1", "t1") is False  # known: nothing written
    assert tenants.learn("p", "c1", "t2") is True  # the platform moved it
    store.close()

    store = SQLiteStore(path)
    reopened = ChatTenants(store, clock=clock)
    assert reopened.get("p", "c1") == "t2"
    assert reopened.get("p", "c2") is None
    events = [
        r.event for r in store.history(CHAT_TENANT_KIND, store.select(CHAT_TENANT_KIND)[0].id)
    ]
    assert events == ["learn", "move"]
    reopened.forget("p", "c1")
    assert reopened.get("p", "c1") is None
    with pytest.raises(InvalidTransition):
        reopened.forget("p", "c1")
    assert reopened.learn("p", "c1", "t3") is True  # taught again by the next inbound event
    assert ChatTenants(store, clock=clock).get("p", "c1") == "t3"
    [row] = store.select(CHAT_TENANT_KIND)
    assert row.state is ChatTenantState.KNOWN
    store.close()


class _FailingStore(InMemoryStore):
    """An in-memory store whose writes fail with ``StoreError`` while ``failing`` is set."""

    failing = False

    def insert(self, *args: Any, **kwargs: Any) -> Any:
        if self.failing:
            raise StoreError("the disk is full")
        return super().insert(*args, **kwargs)

    def transition(self, *args: Any, **kwargs: Any) -> Any:
        if self.failing:
            raise StoreError("the disk is full")
        return super().transition(*args, **kwargs)


def test_a_learn_the_store_refuses_leaves_memory_as_it_was() -> None:
    store = _FailingStore()
    tenants = ChatTenants(store, clock=FakeClock())
    assert tenants.learn("p", "c1", "t1") is True
    store.failing = True
    with pytest.raises(StoreError):
        tenants.learn("p", "c1", "t2")  # a move
    with pytest.raises(StoreError):
        tenants.learn("p", "c2", "t1")  # a new chat
    # Memory holds only what the store holds: the guard never acts on a failed write.
    assert (tenants.get("p", "c1"), tenants.get("p", "c2")) == ("t1", None)
    assert tenants.changes("p", "c1", "t2")
    assert tenants.changes("p", "c2", "t1")
    assert [(r["chat_id"], r["tenant"]) for r in store.select(CHAT_TENANT_KIND)] == [("c1", "t1")]
    store.failing = False
    assert tenants.learn("p", "c1", "t2") is True  # the next inbound event teaches it
    assert ChatTenants(store).get("p", "c1") == "t2"


@pytest.mark.asyncio
async def test_without_a_tenants_table_no_chat_tenant_is_written(tmp_path: Path) -> None:
    store = InMemoryStore()
    h = Harness(store)
    try:
        connector = await h.start()  # no tenants: provenance decides egress
        seen = Recorder()
        await h.gateway(connector, "gw-a", seen)
        await h.platform.inject("chat-a", "hello", user_id="u1", scope_id="scope-a")
        await eventually(lambda: seen.texts == ["hello"], "delivered to gw-a")
        assert connector.chat_tenants.get("loopback", "chat-a") is None
        assert store.select(CHAT_TENANT_KIND) == []
    finally:
        await h.close()

"""The gateway's timer prunes settled obligations past their retention, never owed ones."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from statecore import OBLIGATION_KIND, FakeClock, LedgerPolicy
from statecore.gateway import Gateway, SendResult
from stores import InMemoryStore


class _Adapter:
    connected = True

    async def send(
        self, chat_id: str, content: str, metadata: Mapping[str, Any] | None = None
    ) -> SendResult:
        return SendResult.ok("m1")


class _Sessions:
    async def clear_resume_pending(self, session_key: str) -> None:
        del session_key


@pytest.mark.asyncio
async def test_timer_prunes_settled_rows_past_retention_and_keeps_owed_ones() -> None:
    """Once the retention and the prune interval have passed, a delivered reply is pruned with
    its history, while an owed reply of the same age stays."""
    clock = FakeClock()
    store = InMemoryStore()
    gateway = Gateway(
        store,
        sessions=_Sessions(),
        clock=clock,
        policy=LedgerPolicy(retention=100.0, stale_after=10_000.0),
        retry_interval_s=10.0,
        prune_interval_s=50.0,
    )
    gateway.add_adapter("chat", _Adapter())
    await gateway.start()
    try:
        sent = await gateway.send_final(
            session_key="k", platform="chat", chat_id="c1", content="done", message_ref="m1"
        )
        assert sent.success
        owed = await gateway.ledger.record(
            session_key="k", platform="elsewhere", chat_id="c2", content="owed"
        )
        assert store.count(OBLIGATION_KIND) == 2
        for _ in range(20):  # 200 s of timer ticks
            clock.advance(10.0)
            for _ in range(50):
                await asyncio.sleep(0)
        # The prune runs on the ledger's writer thread: wait for it, bounded.
        deadline = asyncio.get_running_loop().time() + 5
        while store.count(OBLIGATION_KIND) != 1:
            assert asyncio.get_running_loop().time() < deadline, "the delivered row was kept"
            await asyncio.sleep(0.01)
        assert [ob.content for ob in await gateway.ledger.owed()] == ["owed"]
        assert len(await gateway.ledger.history(owed.obligation_id)) == 1
    finally:
        await gateway.stop(budget_s=1)


def test_invalid_intervals_are_refused() -> None:
    """Timer intervals must be non-negative numbers, and the retry interval positive."""
    with pytest.raises(ValueError, match="prune_interval_s"):
        Gateway(InMemoryStore(), sessions=_Sessions(), prune_interval_s=-1)
    with pytest.raises(ValueError, match="retry_interval_s"):
        Gateway(InMemoryStore(), sessions=_Sessions(), retry_interval_s=0)

"""``threads=False``: the async ledger, the relay's dedupe and the connector's store thread do
their store work in turns of the event loop, with no thread -- the same outcomes, the same
order, writes of one turn committed together -- so that a deterministic loop decides it all."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path

import pytest

from relay.client.dedupe import StoreBufferDedupe
from relay.connector._store_thread import StoreThread
from relay.connector.buffer import InboundBuffer
from relay.sim.loop import SimLoop, collect_quietly
from relay.wire.frames import EventSource, InboundEvent
from statecore import AsyncLedger, FakeClock, InvalidTransition, ObligationState, StoreError
from statecore.metrics import NO_METRICS
from stores.sqlite import SQLiteStore


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate()}


@pytest.mark.asyncio
async def test_a_threadless_ledger_commits_one_turns_writes_together(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ledger.db")
    before = _threads()
    ledger = AsyncLedger(store, clock=FakeClock(), threads=False)
    records = [
        ledger.record(session_key="s", platform="p", chat_id="c", content=f"r{n}", message_ref=n)
        for n in range(10)
    ]
    rows = await asyncio.gather(*records)
    assert [r.content for r in rows] == [f"r{n}" for n in range(10)]
    assert (ledger.batches, ledger.operations) == (1, 10)  # one turn, one transaction
    first = rows[0].obligation_id
    await ledger.mark_attempting(first)
    with pytest.raises(InvalidTransition):  # a refusal is still the caller's own
        await ledger.mark_attempting(first)
    assert (await ledger.get(first)).state is ObligationState.ATTEMPTING  # type: ignore[union-attr]
    assert len(await ledger.owed()) == 10
    assert _threads() == before  # no writer, no readers
    await ledger.aclose()
    with pytest.raises(StoreError):
        await ledger.get(first)
    store.close()


def test_threads_must_be_a_bool(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "x.db")
    with pytest.raises(TypeError):
        AsyncLedger(store, threads="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        StoreBufferDedupe(store, threads=0)  # type: ignore[arg-type]
    store.close()


@pytest.mark.asyncio
async def test_a_threadless_dedupe_answers_and_remembers_in_turns(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "dedupe.db")
    before = _threads()
    dedupe = StoreBufferDedupe(store, clock=FakeClock(), threads=False)
    assert await dedupe.seen("b1") is False
    # Remembered and asked in one turn: the lookup sees the remember of its own round.
    _, seen = await asyncio.gather(dedupe.remember("b1"), dedupe.seen("b1"))
    assert seen is True
    assert await StoreBufferDedupe(store, threads=False).seen("b1") is True  # durable
    assert _threads() == before
    store.close()


class _Settings:
    """What the store thread reads of a connector."""

    def __init__(self, buffer: InboundBuffer) -> None:
        self.buffer = buffer
        self.metrics = NO_METRICS
        self.clock = buffer.clock


@pytest.mark.asyncio
async def test_a_threadless_store_thread_keeps_the_order_of_its_work(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "buffer.db")
    buffer = InboundBuffer(store, clock=FakeClock())
    work = StoreThread(_Settings(buffer), threads=False)  # type: ignore[arg-type]
    before = _threads()
    source = EventSource(platform="p", chat_id="c", chat_type="dm", user_id="u")
    appended = [
        asyncio.ensure_future(work.append("gw", "p", InboundEvent(text=f"e{n}", source=source)))
        for n in range(3)
    ]
    # Submitted after the appends: it sees all three, as on the thread.
    depth = asyncio.ensure_future(work.run(lambda: buffer.backlog_stats("gw")[0]))
    lines = await asyncio.gather(*appended)
    assert await depth == 3
    assert [seq for _, seq, _ in lines] == sorted(seq for _, seq, _ in lines)
    assert _threads() == before
    await work.stop()
    store.close()


def test_a_threadless_store_thread_stops_after_the_work_submitted(tmp_path: Path) -> None:
    """stop() returns only once the work already submitted ran -- on the deterministic loop,
    where nothing else would give that work its turn before stop() returns."""
    store = SQLiteStore(tmp_path / "buffer.db")
    buffer = InboundBuffer(store, clock=FakeClock())
    source = EventSource(platform="p", chat_id="c", chat_type="dm", user_id="u")
    buffer_id = buffer.append("gw", "p", InboundEvent(text="e", source=source))
    work = StoreThread(_Settings(buffer), threads=False)  # type: ignore[arg-type]

    async def main() -> list[int]:
        work.record_sent("gw", [buffer_id])  # submitted, not awaited
        await work.stop()
        return [entry.replays for entry in buffer.backlog("gw")]  # read right after stop()

    loop = SimLoop(random.Random(1))
    try:
        assert loop.run_until_complete(main()) == [1]
    finally:
        loop.bury()
        loop.close()
        del loop
        collect_quietly()
    store.close()


@pytest.mark.asyncio
async def test_a_threadless_store_thread_hands_any_failure_to_its_caller(tmp_path: Path) -> None:
    """Work that raises something other than an Exception still settles its caller's await."""
    store = SQLiteStore(tmp_path / "buffer.db")
    work = StoreThread(_Settings(InboundBuffer(store, clock=FakeClock())), threads=False)  # type: ignore[arg-type]

    class _Abort(BaseException):
        pass

    def abort() -> None:
        raise _Abort

    with pytest.raises(_Abort):
        await asyncio.wait_for(work.run(abort), timeout=5)
    assert await work.run(lambda: 7) == 7  # the work after it runs as before
    await work.stop()
    store.close()

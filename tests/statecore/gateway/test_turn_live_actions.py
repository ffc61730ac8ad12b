"""A handler shows typing and edits what it sent through its :class:`Turn`: sent once, not
ledgered, through adapters that declare the ability, and a definite no-op elsewhere."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from statecore.clock import FakeClock
from statecore.gateway import Gateway, Message, Turn
from statecore.gateway.adapter import AdapterAbilities, MessageLimit, SendResult
from statecore.gateway.turn import session_key_for
from statecore.policy import ErrorKind
from statecore.store import Store
from tests.statecore.gateway.gateway_rig import FakeAdapter, Rig, rows
from tests.waiting import BOUND


class LiveAdapter(FakeAdapter):
    """A fake adapter that shows typing, edits and announces a limit; it logs every call."""

    abilities = AdapterAbilities(connects=True, shows_typing=True, edits=True, limits_length=True)

    def __init__(self, *, fail_edit: SendResult | None = None) -> None:
        super().__init__()
        self.message_limit = MessageLimit(500)
        self.actions: list[tuple[str, str, str | None, dict[str, Any]]] = []
        self.fail_edit = fail_edit

    async def typing(
        self, chat_id: str, status: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> SendResult:
        """Log the typing status."""
        self.actions.append(("typing", chat_id, status, dict(metadata or {})))
        return SendResult.ok()

    async def edit(
        self,
        chat_id: str,
        message_id: str,
        content: str,
        metadata: Mapping[str, Any] | None = None,
    ) -> SendResult:
        """Log the edit (``message_id:content``)."""
        self.actions.append(("edit", chat_id, f"{message_id}:{content}", dict(metadata or {})))
        return self.fail_edit or SendResult.ok(message_id)


def _turn(gateway: Gateway, *, thread_id: str | None = "t1") -> Turn:
    message = Message(
        platform="slack",
        profile="default",
        chat_id="C1",
        chat_type="channel",
        text="hi",
        message_id="m1",
        thread_id=thread_id,
        user_id="U1",
        user_name="ann",
        scope_id=None,
        session_key=session_key_for("default", "slack", "channel", "C1", thread_id),
    )
    return Turn(gateway, message)


@pytest.mark.asyncio
async def test_typing_and_an_edit_of_the_reply_reach_the_adapter_in_the_thread(
    rig: Rig, store: Store
) -> None:
    """``turn.typing()`` and ``turn.edit(reply, text)`` go to the adapter for the message's
    chat and thread; the edit names the reply's message id and records no obligation."""
    gateway = rig.gateway()
    adapter = LiveAdapter()
    gateway.add_adapter("slack", adapter)
    turn = _turn(gateway)
    assert (await turn.typing("thinking")).success
    sent = await turn.reply("draft")
    assert sent.success
    edited = await turn.edit(sent, "final")
    assert edited.success
    assert adapter.actions == [
        ("typing", "C1", "thinking", {"thread_id": "t1"}),
        ("edit", "C1", f"{sent.message_id}:final", {"thread_id": "t1"}),
    ]
    assert [ob.content for ob in rows(store)] == ["draft"]  # the edit is not an obligation


@pytest.mark.asyncio
async def test_an_adapter_without_the_abilities_makes_them_definite_no_ops(rig: Rig) -> None:
    """A send-only adapter is never asked to type or edit: each returns a permanent failure
    saying the adapter cannot, and the reply itself still goes out."""
    gateway = rig.gateway()
    adapter = FakeAdapter()
    gateway.add_adapter("slack", adapter)
    turn = _turn(gateway)
    shown = await turn.typing()
    assert not shown.success
    assert shown.kind is ErrorKind.PERMANENT
    assert "cannot show typing" in (shown.error or "")
    sent = await turn.reply("answer")
    edited = await turn.edit(sent, "changed")
    assert not edited.success
    assert edited.kind is ErrorKind.PERMANENT
    assert "cannot edit" in (edited.error or "")
    assert adapter.contents == ["answer"]


@pytest.mark.asyncio
async def test_an_edit_without_a_message_id_or_too_long_is_refused_unsent(rig: Rig) -> None:
    """An edit of a reply that carries no message id, or with text over the announced limit,
    is refused without reaching the adapter; bad types raise."""
    gateway = rig.gateway()
    adapter = LiveAdapter()
    gateway.add_adapter("slack", adapter)
    turn = _turn(gateway)
    no_id = await turn.edit(SendResult.ok(), "x")
    assert not no_id.success
    assert "no message id" in (no_id.error or "")
    too_long = await turn.edit("pm1", "x" * 501)
    assert not too_long.success
    assert too_long.kind is ErrorKind.PERMANENT
    assert "too long" in (too_long.error or "")
    assert adapter.actions == []
    with pytest.raises(TypeError):
        await turn.edit(42, "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await turn.edit("pm1", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await turn.typing(3)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_an_adapter_that_raises_gives_an_ambiguous_failure_not_a_crash(rig: Rig) -> None:
    """An adapter whose edit raises makes the turn's edit an ambiguous failure; the handler
    goes on."""

    class Raising(LiveAdapter):
        async def edit(self, *args: Any, **kwargs: Any) -> SendResult:
            raise ConnectionError("socket gone")

    gateway = rig.gateway()
    gateway.add_adapter("slack", Raising())
    result = await _turn(gateway).edit("pm1", "x")
    assert not result.success
    assert result.ambiguous
    assert "socket gone" in (result.error or "")


@pytest.mark.asyncio
async def test_keep_typing_refreshes_on_the_clock_and_clears_at_the_end(rig: Rig) -> None:
    """``async with turn.keep_typing():`` shows typing at once, again every period of the
    gateway's clock, and clears it (``""``) when the block ends, also when it raises."""
    clock = FakeClock()
    gateway = rig.gateway(clock=clock)
    adapter = LiveAdapter()
    gateway.add_adapter("slack", adapter)
    turn = _turn(gateway, thread_id=None)
    entered = asyncio.Event()
    release = asyncio.Event()

    async def handler() -> None:
        async with turn.keep_typing(every_s=4.0):
            entered.set()
            await release.wait()
            raise RuntimeError("the model failed")

    task = asyncio.ensure_future(handler())
    await asyncio.wait_for(entered.wait(), BOUND)
    for _ in range(3):
        clock.advance(4.0)
        for _ in range(5):
            await asyncio.sleep(0)
    statuses = [status for op, _, status, _ in adapter.actions if op == "typing"]
    assert statuses == [None, None, None, None]
    release.set()
    with pytest.raises(RuntimeError, match="model failed"):
        await asyncio.wait_for(task, BOUND)
    assert [status for _, _, status, _ in adapter.actions][-1] == ""
    clock.advance(40.0)
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(adapter.actions) == 5  # nothing after the clear


@pytest.mark.asyncio
async def test_keep_typing_on_an_adapter_that_cannot_type_sends_nothing(rig: Rig) -> None:
    """On a send-only adapter the block just runs; nothing is refreshed or cleared."""
    gateway = rig.gateway(clock=FakeClock())
    adapter = FakeAdapter()
    gateway.add_adapter("slack", adapter)
    async with _turn(gateway).keep_typing():
        pass
    assert adapter.calls == []
    with pytest.raises(ValueError, match="every_s"):
        async with _turn(gateway).keep_typing(every_s=0):
            pass

"""Replies longer than the platform takes: fitted to the adapter's announced limit before they
are recorded (split into parts sent in order, or truncated with a mark), never sent whole to be
refused; a refusal for length is permanent at once."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statecore.clock import FakeClock
from statecore.gateway import Gateway, LongReplies, MessageLimit
from statecore.gateway.adapter import AdapterAbilities, SendResult
from statecore.gateway.long_replies import TRUNCATION_MARK, fit_reply
from statecore.lifecycles import ObligationState
from statecore.obligation import OBLIGATION_KIND, RECONNECTED_MARKER, RECOVERED_MARKER
from statecore.policy import ErrorKind, LedgerPolicy
from statecore.store import Store
from stores.memory import InMemoryStore
from tests.statecore.gateway.gateway_rig import (
    FakeAdapter,
    FakeSessions,
    Rig,
    reply,
    rows,
)

_O = ObligationState
LABEL = max(len(RECOVERED_MARKER), len(RECONNECTED_MARKER)) + 2


class LimitedAdapter(FakeAdapter):
    """A fake adapter that announces the platform's longest message."""

    abilities = AdapterAbilities(connects=True, limits_length=True)

    def __init__(self, *outcomes: SendResult, limit: MessageLimit | None) -> None:
        super().__init__(*outcomes)
        self.message_limit = limit


# -- the pure fitting ------------------------------------------------------------------------


def test_a_reply_that_fits_or_has_no_known_limit_is_left_whole() -> None:
    """Text within the limit, and any text when no limit is known, is one message unchanged."""
    assert fit_reply("hello", MessageLimit(5), LongReplies.SPLIT) == ["hello"]
    assert fit_reply("x" * 10_000, None, LongReplies.SPLIT) == ["x" * 10_000]


def test_split_cuts_at_paragraphs_then_lines_then_spaces() -> None:
    """Parts end at the best break in their second half: a paragraph, else a line, else a
    space; the break itself is not sent."""
    limit = MessageLimit(LABEL + 100)
    paragraphs = [c * 80 for c in "abcd"]
    assert fit_reply("\n\n".join(paragraphs), limit, LongReplies.SPLIT) == paragraphs
    mixed = "a" * 60 + "\n" + "b" * 10 + "\n\n" + "c" * 80 + "\n" + "d" * 80 + " " + "e" * 80
    assert fit_reply(mixed, limit, LongReplies.SPLIT) == [
        "a" * 60 + "\n" + "b" * 10,
        "c" * 80,
        "d" * 80,
        "e" * 80,
    ]
    words = " ".join(["word"] * 40)
    parts = fit_reply(words, limit, LongReplies.SPLIT)
    assert " ".join(parts) == words
    assert all(not p.startswith(" ") and not p.endswith(" ") for p in parts)


def test_split_cuts_a_word_longer_than_a_part() -> None:
    """Text with no break at all is cut where the part is full."""
    limit = MessageLimit(LABEL + 100)
    text = "z" * 250
    assert fit_reply(text, limit, LongReplies.SPLIT) == ["z" * 100, "z" * 100, "z" * 50]


def test_truncate_ends_with_the_visible_mark() -> None:
    """Truncation keeps one message that fits, labelled, ending with the mark."""
    limit = MessageLimit(LABEL + 100)
    (only,) = fit_reply("q" * 500, limit, LongReplies.TRUNCATE)
    assert only.endswith(TRUNCATION_MARK)
    assert len(only) == 100
    assert only.startswith("q" * (100 - len(TRUNCATION_MARK)))


def test_utf16_limits_count_astral_characters_twice_and_never_halve_one() -> None:
    """On a platform counting UTF-16 units, an emoji takes two, and a part never ends between
    the two halves of one."""
    limit = MessageLimit(LABEL + 101, "utf16")  # room for 101 units: 50 emoji, not 50.5
    text = "\U0001f600" * 120  # 240 units
    parts = fit_reply(text, limit, LongReplies.SPLIT)
    assert "".join(parts) == text
    assert [limit.length(p) for p in parts] == [100, 100, 40]
    assert limit.length("a\U0001f600") == 3
    assert MessageLimit(5).length("a\U0001f600") == 2


def test_a_tiny_limit_uses_its_whole_length_for_parts() -> None:
    """When the redelivery label would take more than half the limit, parts fill the limit."""
    limit = MessageLimit(20)
    assert fit_reply("y" * 45, limit, LongReplies.SPLIT) == ["y" * 20, "y" * 20, "y" * 5]


def test_bad_limits_and_modes_are_refused() -> None:
    """A limit that is not a positive int in a known unit, or a mode that is not a
    LongReplies, is a typed error."""
    with pytest.raises(ValueError, match="positive"):
        MessageLimit(0)
    with pytest.raises(TypeError, match="int"):
        MessageLimit(True)
    with pytest.raises(ValueError, match="unit"):
        MessageLimit(10, "bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="LongReplies"):
        fit_reply("x", MessageLimit(10), "split")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="LongReplies"):
        Gateway(InMemoryStore(), long_replies="cut")  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(
        alphabet=st.sampled_from(["a", "b", " ", "\n", "\u00e9", "\U0001f600"]), min_size=1
    ),
    size=st.integers(min_value=1, max_value=200),
    unit=st.sampled_from(["chars", "utf16"]),
)
def test_every_part_fits_with_room_for_a_label_and_nothing_but_breaks_is_lost(
    text: str, size: int, unit: str
) -> None:
    """For any text and limit: each part fits the limit (with room for the label when the
    limit allows it), no part is empty, and the parts are the text less only the breaks they
    were cut at."""
    limit = MessageLimit(size, unit)  # type: ignore[arg-type]
    parts = fit_reply(text, limit, LongReplies.SPLIT)
    assert parts
    assert all(parts)
    if len(parts) > 1:
        room = size - limit.length("x" * LABEL)
        bound = room if room * 2 >= size else size
        assert all(limit.length(p) <= max(bound, 2) for p in parts)
    squeezed = "".join(text.split())
    assert "".join("".join(p.split()) for p in parts) == squeezed


# -- the gateway ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_long_reply_is_split_into_parts_sent_in_order_each_its_own_obligation(
    rig: Rig, store: Store
) -> None:
    """A reply over the adapter's limit is recorded as parts, each delivered, in order; each
    part has its own id and history, and the first alone replies to the message."""
    gateway = rig.gateway()
    adapter = LimitedAdapter(limit=MessageLimit(LABEL + 100))
    gateway.add_adapter("slack", adapter)
    text = "\n\n".join(f"paragraph {n} " + "x" * 80 for n in range(5))
    result = await reply(gateway, text)
    assert result.success
    assert "\n\n".join(adapter.contents) == text
    assert len(adapter.contents) == 5
    assert all(len(c) <= 100 for c in adapter.contents)
    stored = rows(store)
    assert len({ob.obligation_id for ob in stored}) == 5
    assert all(ob.state is _O.DELIVERED for ob in stored)
    assert adapter.calls[0].metadata.get("reply_to") == "m1"
    assert all("reply_to" not in call.metadata for call in adapter.calls[1:])
    assert all(call.metadata.get("thread_id") == "171.001" for call in adapter.calls)
    assert result.message_id == "pm5"


@pytest.mark.asyncio
async def test_a_replayed_turn_records_the_same_parts_and_sends_none_again(rig: Rig) -> None:
    """The same long reply to the same message maps to the same part ids: a replay sends
    nothing twice."""
    gateway = rig.gateway()
    adapter = LimitedAdapter(limit=MessageLimit(LABEL + 100))
    gateway.add_adapter("slack", adapter)
    text = " ".join(["word"] * 60)
    assert (await reply(gateway, text)).success
    sent = len(adapter.contents)
    assert sent > 2
    assert (await reply(gateway, text)).success
    assert len(adapter.contents) == sent


@pytest.mark.asyncio
async def test_a_part_that_fails_stops_the_rest_which_stay_owed(rig: Rig, store: Store) -> None:
    """When a part is not delivered, the parts after it are not sent by this call: they stay
    owed (pending) for the ledger's recovery, and the failure is returned."""
    gateway = rig.gateway()
    adapter = LimitedAdapter(
        SendResult.ok("p1"),
        SendResult.failed("upstream timeout", kind=ErrorKind.TRANSIENT),
        limit=MessageLimit(LABEL + 100),
    )
    gateway.add_adapter("slack", adapter)
    result = await reply(gateway, "z" * 400)
    assert not result.success
    assert len(adapter.contents) == 2
    states = [ob.state for ob in rows(store)]
    assert sorted(states) == sorted([_O.DELIVERED, _O.FAILED, _O.PENDING, _O.PENDING])


@pytest.mark.asyncio
async def test_the_owed_parts_are_sent_by_the_stuck_sweep(store: Store) -> None:
    """Parts left pending after a failed part go out plainly with the stuck-row recovery."""
    clock = FakeClock()
    rig = Rig(store)
    try:
        gateway = rig.gateway(clock=clock, stuck_after_s=30.0)
        adapter = LimitedAdapter(
            SendResult.failed("upstream timeout", kind=ErrorKind.TRANSIENT),
            limit=MessageLimit(LABEL + 100),
        )
        gateway.add_adapter("slack", adapter)
        await reply(gateway, "z" * 300)
        assert adapter.contents == ["z" * 100]
        clock.advance(31.0)
        assert await gateway.redeliver_stuck() == 2
        assert adapter.contents == ["z" * 100] * 3  # plain: the sends provably never began
    finally:
        await rig.close()


@pytest.mark.asyncio
async def test_truncate_mode_sends_one_message_with_the_mark(store: Store) -> None:
    """A gateway configured to truncate sends one message cut to fit, with the mark."""
    rig = Rig(store)
    gateway = Gateway(store, sessions=FakeSessions(), long_replies=LongReplies.TRUNCATE)
    rig.gateways.append(gateway)
    try:
        adapter = LimitedAdapter(limit=MessageLimit(LABEL + 100))
        gateway.add_adapter("slack", adapter)
        assert (await reply(gateway, "w" * 1000)).success
        (only,) = adapter.contents
        assert only.endswith(TRUNCATION_MARK)
        assert len(only) == 100
    finally:
        await rig.close()


@pytest.mark.asyncio
async def test_a_split_part_resent_with_its_label_still_fits(rig: Rig, store: Store) -> None:
    """A part that failed and is retried carries the redelivery label and stays within the
    platform's limit."""
    clock = FakeClock()
    gateway = rig.gateway(clock=clock, policy=LedgerPolicy(retry_backoff=(1.0, 2.0)))
    limit = MessageLimit(LABEL + 100)
    adapter = LimitedAdapter(
        SendResult.failed("upstream timeout", kind=ErrorKind.TRANSIENT), limit=limit
    )
    gateway.add_adapter("slack", adapter)
    await reply(gateway, "v" * 100 + " " + "u" * 100)
    assert adapter.contents == ["v" * 100]
    clock.advance(2.0)
    assert await gateway.redeliver_failed("slack") == 1
    resent = adapter.contents[-1]
    assert resent.startswith(RECONNECTED_MARKER)
    assert limit.length(resent) <= limit.max_length


@pytest.mark.asyncio
async def test_an_adapter_without_a_limit_sends_whole_and_a_length_refusal_is_permanent(
    rig: Rig, store: Store
) -> None:
    """Without an announced limit the reply goes whole; the platform's "message too long" is
    classified permanent at once, so no in-process retry repeats it."""
    clock = FakeClock()
    gateway = rig.gateway(clock=clock, policy=LedgerPolicy(retry_backoff=(1.0, 2.0)))
    adapter = FakeAdapter(SendResult.failed("message too long"))
    gateway.add_adapter("slack", adapter)
    result = await reply(gateway, "t" * 5000)
    assert not result.success
    (ob,) = rows(store)
    assert ob.state is _O.FAILED
    stored = store.get(OBLIGATION_KIND, ob.obligation_id)
    assert stored is not None
    assert stored["error_kind"] == "permanent"
    clock.advance(3600.0)
    assert await gateway.redeliver_failed("slack") == 0
    assert len(adapter.contents) == 1


@pytest.mark.asyncio
async def test_many_long_replies_at_once_keep_each_ones_order(rig: Rig) -> None:
    """Concurrent long replies to different messages each arrive in their own order."""
    gateway = rig.gateway()
    adapter = LimitedAdapter(limit=MessageLimit(LABEL + 100))
    gateway.add_adapter("slack", adapter)
    texts = {f"m{n}": "".join(f"{n}{i:03d}" for i in range(80)) for n in range(1, 4)}
    await asyncio.gather(
        *(reply(gateway, text, message_ref=ref, chat_id=ref) for ref, text in texts.items())
    )
    for ref, text in texts.items():
        mine = [c.content for c in adapter.calls if c.chat_id == ref]
        assert "".join(mine) == text

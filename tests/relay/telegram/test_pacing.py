"""The Telegram driver's pacing: per chat, per group a minute, overall, and a 429's hold.

The slots themselves on a fake clock; then the spacing a person sees in a chat of the fake
server when the driver sends a burst.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from relay.telegram import TelegramDriver
from relay.telegram._outbound import Pacer
from relay.telegram.testing import FakeTelegram
from statecore.clock import FakeClock
from tests.relay.notes_intake import NotesIntake, running


def pacer(clock: FakeClock, **options: float) -> Pacer:
    settings = {"chat_rate_per_s": 1.0, "group_rate_per_min": 20.0, "global_rate_per_s": 30.0}
    settings.update(options)
    return Pacer(clock, burst=3, **settings)


def test_a_private_chat_gets_a_burst_then_one_a_second() -> None:
    clock = FakeClock(monotonic_start=100.0)
    pace = pacer(clock)
    assert [pace.slot("42") - 100.0 for _ in range(6)] == [0, 0, 0, 1, 2, 3]
    clock.advance(10)
    assert pace.slot("42") == 110.0  # idle long enough: no debt left
    assert pace.slot("7") == 110.0  # another chat has its own pace


def test_a_group_gets_twenty_a_minute_and_a_429_holds_its_chat() -> None:
    clock = FakeClock(monotonic_start=0.0)
    pace = pacer(clock)
    assert [pace.slot("-100") for _ in range(5)] == [0, 0, 0, 3, 6]
    pace.hold("42", 5.0)
    assert pace.slot("42") == 5.0
    assert pace.slot("43") == 0.0


def test_every_chat_together_stays_under_the_global_rate() -> None:
    clock = FakeClock(monotonic_start=0.0)
    pace = pacer(clock)
    assert [pace.slot(str(chat)) for chat in range(1, 61)] == [0.0] * 60
    slots = [pace.global_slot() for _ in range(60)]
    assert slots[:30] == [0.0] * 30
    assert slots[30] == pytest.approx(1 / 30)
    assert slots[59] == pytest.approx(30 / 30)


@pytest.mark.asyncio
async def test_a_burst_of_sends_reaches_the_chat_spaced() -> None:
    async with FakeTelegram() as fake:
        fake.user_writes(42, "hello")
        driver = TelegramDriver(
            fake.token, api_url=fake.api_url, poll_timeout_s=1, chat_rate_per_s=5.0, burst=1
        )
        async with running(driver, NotesIntake()):
            outcomes = await asyncio.gather(
                *(
                    driver.perform({"op": "send", "chat_id": "42", "content": f"n{n}"})
                    for n in range(5)
                )
            )
    assert all(outcome.success for outcome in outcomes)
    sent = [m for m in fake.chat(42) if m.from_bot]
    assert [m.text for m in sent] == [f"n{n}" for n in range(5)]  # in the order asked
    gaps = [b.at - a.at for a, b in itertools.pairwise(sent)]
    assert min(gaps) >= 0.18
    assert driver.pacer.waited_s > 0

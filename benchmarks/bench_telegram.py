"""Taking updates from the Bot API: the Telegram driver's own reader against python-telegram-bot.

Run: ``.venv/bin/python benchmarks/bench_telegram.py [--updates N] [--rounds R]``.

Both read the same backlog of ``N`` updates (100 a ``getUpdates``, the Bot API's most) from the
fake Bot API server (``relay.telegram.testing``) on loopback, advancing the offset after each
batch, until it is drained:

* ``driver``: the driver's :class:`~relay.telegram._polling.Poller` -- ``getUpdates`` through
  aiohttp, every update mapped to an ``InboundEvent`` and handed to an intake that only keeps it,
  the offset saved as a note (in memory here) after each batch;
* ``ptb``: ``telegram.Bot.get_updates(offset=..., limit=100)`` (python-telegram-bot 22), which
  parses every update into ``telegram.Update`` objects -- and nothing more: no mapping, no
  intake, no note.

Printed: updates per second (median over rounds) and the median time to take one batch of 100.
The connector's real intake (a SQLite write round) costs more than either; this measures what
the choice of client adds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import warnings

from relay.telegram._api import TelegramApi
from relay.telegram._polling import Poller, Taker
from relay.telegram.testing import FakeTelegram
from relay.wire.frames import InboundEvent


class KeepingIntake:
    """An intake that keeps what it is given (notes in a dict)."""

    def __init__(self) -> None:
        self.events: list[InboundEvent] = []
        self.notes: dict[tuple[str, str], str] = {}

    async def __call__(self, platform: str, event: InboundEvent) -> None:
        self.events.append(event)

    async def reject(
        self, platform: str, raw: str, reason: str, *, event_id: str | None = None
    ) -> None:
        raise AssertionError(reason)

    async def load(self, platform: str, name: str) -> str | None:
        return self.notes.get((platform, name))

    async def save(self, platform: str, name: str, value: str) -> None:
        self.notes[(platform, name)] = value


def backlog(fake: FakeTelegram, count: int) -> None:
    for n in range(count):
        fake.user_writes(1000 + n % 50, f"message {n} " + "x" * 80)


async def with_driver(fake: FakeTelegram, count: int) -> tuple[float, list[float]]:
    intake = KeepingIntake()
    api = TelegramApi(fake.token, api_url=fake.api_url)
    taker = Taker(platform="telegram", intake=lambda: intake, bot_id=lambda: fake.bot.id)
    poller = Poller(api, taker, platform="telegram", intake=lambda: intake, poll_timeout_s=0)
    batches: list[float] = []
    began = time.perf_counter()
    try:
        while len(intake.events) < count:
            start = time.perf_counter()
            await poller.round()
            batches.append(time.perf_counter() - start)
    finally:
        await api.close()
    return time.perf_counter() - began, batches


async def with_ptb(fake: FakeTelegram, count: int) -> tuple[float, list[float]]:
    import telegram  # noqa: PLC0415  (only this bench needs it)

    batches: list[float] = []
    taken = 0
    offset = None
    async with telegram.Bot(fake.token, base_url=fake.api_url) as bot:
        began = time.perf_counter()
        while taken < count:
            start = time.perf_counter()
            updates = await bot.get_updates(offset=offset, limit=100, timeout=0)
            batches.append(time.perf_counter() - start)
            taken += len(updates)
            if updates:
                offset = updates[-1].update_id + 1
        elapsed = time.perf_counter() - began
    return elapsed, batches


async def main(count: int, rounds: int) -> None:
    warnings.simplefilter("ignore")
    results: dict[str, list[tuple[float, float]]] = {"driver": [], "ptb": []}
    for n in range(rounds):
        order = ("driver", "ptb") if n % 2 == 0 else ("ptb", "driver")
        for name in order:
            async with FakeTelegram() as fake:
                backlog(fake, count)
                run = with_driver if name == "driver" else with_ptb
                elapsed, batches = await run(fake, count)
                results[name].append((count / elapsed, statistics.median(batches)))
    print(f"taking {count} updates (100 a getUpdates) from the fake Bot API, {rounds} rounds")
    for name, rows in results.items():
        rate = statistics.median(r for r, _ in rows)
        batch = statistics.median(b for _, b in rows)
        print(f"  {name:<7} {rate:>9.0f} updates/s   a batch of 100 in {batch * 1000:6.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--updates", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.updates, args.rounds))

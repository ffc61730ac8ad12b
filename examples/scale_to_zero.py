"""Scale to zero: a bot that goes dormant when idle and answers, in order, what users wrote
while it slept.

* When the bot has been idle for a moment it calls ``adapter.go_dormant()``: the connector is
  told to buffer (``going_idle``), then the WebSocket is closed -- the transport is *dormant*.
* Users keep writing.  The connector appends every message to its durable buffer (a SQLite file
  here) and calls its wake hook, where a deployment would start the bot's container.
* The dormant transport re-dials on its dormant cadence (``dormant_redial_s``); the connector
  replays the buffer in order, each delivery with a ``bufferId`` that the gateway acks only
  after the handler returned.
* ``StoreBufferDedupe`` remembers every handled ``bufferId`` in the bot's store *before* the
  ack.  The last act kills an instance between the two -- a message handled, its ack never sent
  -- and shows the replacement instance ack the replay without handling it a second time.

Run it: ``python examples/scale_to_zero.py``.
"""

from __future__ import annotations

import asyncio
import collections
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from relay.client.adapter import RelayAdapter
from relay.client.dedupe import StoreBufferDedupe
from relay.client.lifecycle import TransportState
from relay.client.transport import WebSocketRelayTransport
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from statecore import Store
from statecore.gateway import Gateway, Turn
from stores import SQLiteStore

GATEWAY_ID = "sleepy-gateway"
SECRET = "scale-to-zero-example-secret"
IDLE_S = 0.3  # how long without a message before the bot goes dormant
DORMANT_REDIAL_S = 1.0  # how often a dormant transport re-dials (the wake-up cadence)
WAIT_S = 10.0  # the bound on every wait in this example


async def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll ``predicate`` until it holds; raise ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.01)


class Bot:
    """The bot's logic: answers every message; counts how often each message was handled."""

    def __init__(self) -> None:
        self.handled: collections.Counter[str] = collections.Counter()
        self.order: list[str] = []
        self.last_activity = time.monotonic()

    async def __call__(self, turn: Turn) -> None:
        message = turn.message
        self.last_activity = time.monotonic()
        self.handled[message.text] += 1
        self.order.append(message.text)
        print(f"  bot handles {message.text!r} from {message.user_id}")
        await turn.reply(f"got it: {message.text}")
        self.last_activity = time.monotonic()


class ObservedDedupe:
    """``StoreBufferDedupe`` with counters, and a way to die between remember and ack.

    With ``die_after_remember`` set, the first ``remember`` records the bufferId durably and
    then never returns: the ack that would follow is never sent, exactly as if the instance had
    been scaled down at that moment.
    """

    def __init__(self, inner: StoreBufferDedupe) -> None:
        self.inner = inner
        self.replays_skipped = 0
        self.die_after_remember = False
        self.died = asyncio.Event()

    async def seen(self, buffer_id: str) -> bool:
        if await self.inner.seen(buffer_id):
            self.replays_skipped += 1
            print(f"  dedupe: bufferId {buffer_id} was handled before -> acked, not handled")
            return True
        return False

    async def remember(self, buffer_id: str) -> None:
        await self.inner.remember(buffer_id)
        if self.die_after_remember:
            print(f"  dedupe: remembered {buffer_id}; the instance dies before its ack")
            self.died.set()
            await asyncio.Event().wait()  # the instance is torn down while we wait here

    async def record_undeliverable(
        self, buffer_id: str, *, frame_type: str, reason: str, raw_line: str
    ) -> None:
        print(f"  dedupe: bufferId {buffer_id} cannot be handled ({reason}) -> recorded, acked")
        await self.inner.record_undeliverable(
            buffer_id, frame_type=frame_type, reason=reason, raw_line=raw_line
        )


class Instance:
    """One running instance of the bot: transport, adapter and gateway over the bot's store."""

    def __init__(self, url: str, store: Store, bot: Bot, name: str) -> None:
        self.dedupe = ObservedDedupe(StoreBufferDedupe(store))
        self.transport = WebSocketRelayTransport(
            url,
            "loopback",
            "sleepy-bot",
            gateway_id=GATEWAY_ID,
            secret=SECRET,
            dormant_redial_s=DORMANT_REDIAL_S,
            dedupe=self.dedupe,
        )
        self.transport.listeners.append(self._show)
        self.adapter = RelayAdapter(self.transport)
        self.gateway = Gateway(store)
        self.gateway.add_adapter("loopback", self.adapter)
        self.gateway.on_message(bot)
        self.name = name

    def _show(self, before: TransportState, after: TransportState, event: str) -> None:
        print(f"  [{self.name} transport] {before.value} -> {after.value} ({event})")

    async def sleep_when_idle(self, bot: Bot) -> None:
        """Wait until the bot has been idle for ``IDLE_S``, then go dormant."""
        while time.monotonic() - bot.last_activity < IDLE_S:
            await asyncio.sleep(0.05)
        if not await self.adapter.go_dormant():
            raise RuntimeError("the connector did not ack going_idle: staying awake")


class Demo:
    """The connector, its chat, the bot's store and the bot's instances, act by act."""

    def __init__(self, workdir: Path) -> None:
        self.platform = LoopbackPlatform()
        self.connector_store = SQLiteStore(workdir / "connector.db")  # the durable buffer
        self.connector = Connector(
            self.connector_store,
            secrets={GATEWAY_ID: [SECRET]},
            drivers={"loopback": self.platform},
            wake_hook=self.wake_hook,
            wake_interval_s=1.0,  # at most one wake call per second
        )
        self.store = SQLiteStore(workdir / "bot.db")  # the bot's ledger and dedupe memory
        self.bot = Bot()
        self.instances: list[Instance] = []

    async def wake_hook(self, gateway_id: str) -> None:
        print(f"  connector wake hook: {gateway_id!r} has mail (a deployment starts it here)")

    def show_buffered(self, note: str = "") -> int:
        count = self.connector.buffered(GATEWAY_ID)
        print(f"  connector.buffered({GATEWAY_ID!r}) = {count}{note}")
        return count

    async def start_instance(self) -> Instance:
        instance = Instance(
            self.connector.url, self.store, self.bot, f"bot#{len(self.instances) + 1}"
        )
        self.instances.append(instance)
        await instance.gateway.start()
        return instance

    async def sleep_and_wake(self, instance: Instance) -> bool:
        """Acts 2-4: dormant when idle, messages buffered, woken by the cadence, answered."""
        print(f"\n2. idle for {IDLE_S} s: the bot goes dormant")
        await instance.sleep_when_idle(self.bot)
        print(f"  transport state: {instance.transport.state.value}")

        print("\n3. users write while it sleeps")
        asleep = [("chat-a", "alice", "are you there?"), ("chat-b", "carol", "good morning")]
        asleep.append(("chat-a", "alice", "one more thing"))
        for chat, user, text in asleep:
            await self.platform.inject(chat, text, user_id=user)
        self.show_buffered()

        print(f"\n4. the dormant transport re-dials (every {DORMANT_REDIAL_S} s) and catches up")
        handled_before = len(self.bot.order)
        await wait_until(lambda: len(self.bot.order) == handled_before + 3, "the buffered ones")
        await wait_until(lambda: self.connector.buffered(GATEWAY_ID) == 0, "the acks")
        self.show_buffered()
        in_order = self.bot.order[handled_before:] == [text for _, _, text in asleep]
        print(f"  handled in the order written: {in_order}")
        return in_order

    async def die_between_handle_and_ack(self, instance: Instance) -> Instance:
        """Acts 5-6: an instance dies after handling a buffered message but before its ack;
        the next instance's replay is deduplicated."""
        print("\n5. dormant again; this time the instance dies between a handle and its ack")
        await instance.sleep_when_idle(self.bot)
        for text in ("ping", "pong"):
            await self.platform.inject("chat-b", text, user_id="carol")
        self.show_buffered()
        instance.dedupe.die_after_remember = True
        await asyncio.wait_for(instance.dedupe.died.wait(), WAIT_S)
        await instance.gateway.stop(budget_s=2.0)  # the scaled-down instance is gone
        self.show_buffered(f" after {instance.name} is gone (unacked)")

        print("\n6. a new instance starts on the same store; the connector replays")
        second = await self.start_instance()
        await wait_until(lambda: self.bot.handled["pong"] == 1, "'pong' to be handled")
        await wait_until(lambda: self.connector.buffered(GATEWAY_ID) == 0, "the acks")
        self.show_buffered()
        await second.gateway.stop(budget_s=2.0)
        return second

    async def run(self) -> int:
        await self.connector.start("127.0.0.1", 0)
        try:
            print("1. the bot is awake")
            first = await self.start_instance()
            await self.platform.inject("chat-a", "hi", user_id="alice")
            texts = self.platform.texts
            await wait_until(lambda: "got it: hi" in texts("chat-a"), "the first answer")
            in_order = await self.sleep_and_wake(first)
            second = await self.die_between_handle_and_ack(first)

            print("\nthe chats:")
            for chat in ("chat-a", "chat-b"):
                for message in self.platform.transcript[chat]:
                    print(f"  {chat} [{message.sender}] {message.text}")
            handled = self.bot.handled
            twice = sorted(text for text, n in handled.items() if n > 1)
            replies = len(texts("chat-a")) + len(texts("chat-b"))
            skipped = second.dedupe.replays_skipped
            print(f"\nmessages handled: {sum(handled.values())}, handled twice: {twice or 'none'}")
            print(f"replies sent: {replies}; replays skipped by dedupe: {skipped}")
            return 0 if in_order and not twice and replies == 6 and skipped == 1 else 1
        finally:
            for instance in self.instances:
                await instance.gateway.stop(budget_s=2.0)  # a no-op for a stopped one
            await self.connector.stop()
            self.store.close()
            self.connector_store.close()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="statecore-scale-to-zero-") as tmp:
        raise SystemExit(asyncio.run(Demo(Path(tmp)).run()))

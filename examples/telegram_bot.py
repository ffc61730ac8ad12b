"""A Telegram bot on statecore: against the fake Bot API server, or the real Telegram.

One process runs the whole stack on one SQLite file (``--data``, default ``telegram-data/``):

* the Bot API: by default the fake server of ``relay.telegram.testing`` on 127.0.0.1, where
  *you* are the person -- every line you type is a message in a private chat with the bot (a
  line starting with ``#`` goes to a forum topic of a group instead), and the chat is printed as
  the person would see it; or the real Telegram, with the bot's token from @BotFather in
  ``STATECORE_TELEGRAM_TOKEN`` (``--real``): write to your bot from any Telegram app;
* the reference connector with the **Telegram driver** (:class:`relay.telegram.TelegramDriver`):
  it long-polls ``getUpdates`` and moves the offset only past messages the connector took
  durably, and paces its sends;
* a gateway with a small bot that answers every message in its chat, topic and as a reply to
  it, its replies ledgered like any other.

``python examples/telegram_bot.py [--data DIR] [--real] [--say TEXT ...]``: ``--say`` writes
the given messages (to the fake server), prints the chat once they are answered, and exits;
without it the bot serves until Ctrl-C (or the end of your input).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import sys
from pathlib import Path

from relay.client.adapter import RelayAdapter
from relay.client.dedupe import StoreBufferDedupe
from relay.client.transport import WebSocketRelayTransport
from relay.connector.server import Connector
from relay.telegram import TelegramAuthError, TelegramDriver
from relay.telegram.testing import FakeTelegram, TelegramUser
from statecore.gateway import Gateway, Turn
from stores import SQLiteStore

PLATFORM = "telegram"
GATEWAY_ID = "telegram-bot"
PRIVATE_CHAT = 4242
FORUM_CHAT = -1004242
TOPIC = 7
ANSWER_S = 15.0


async def answer(turn: Turn) -> None:
    """The bot: answers every message, in its topic, as a reply to it."""
    text = turn.message.text.strip()
    words = len(text.split())
    await turn.reply(f"You said: {text}\n({words} word{'s' if words != 1 else ''})")


class Person:
    """You, in the fake server's chats: what you type is written there, answers are shown."""

    def __init__(self, fake: FakeTelegram) -> None:
        self.fake = fake
        self.me = TelegramUser(PRIVATE_CHAT, "You", "you")
        self.shown: dict[int, int] = {}

    def write(self, line: str) -> int:
        """Write ``line`` (``#...`` in the forum topic); returns the chat it went to."""
        if line.startswith("#"):
            self.fake.user_writes(
                FORUM_CHAT,
                line[1:].strip() or "#",
                user=self.me,
                chat_type="supergroup",
                forum=True,
                thread_id=TOPIC,
                title="statecore forum",
            )
            return FORUM_CHAT
        self.fake.user_writes(PRIVATE_CHAT, line, user=self.me)
        return PRIVATE_CHAT

    def show_new(self) -> int:
        """Print what is new in the chats; returns how many bot messages were new."""
        new = 0
        for chat_id in (PRIVATE_CHAT, FORUM_CHAT):
            messages = self.fake.chat(chat_id)
            for message in messages[self.shown.get(chat_id, 0) :]:
                where = "private" if chat_id == PRIVATE_CHAT else f"forum, topic {TOPIC}"
                reply = f" (reply to #{message.reply_to})" if message.reply_to else ""
                print(f"[{where}] #{message.message_id} {message.sender}{reply}: {message.text}")
                new += message.from_bot
            self.shown[chat_id] = len(messages)
        return new

    async def say(self, lines: list[str]) -> bool:
        """Write each line and wait (bounded) for its answer; False if one never came."""
        for line in lines:
            self.write(line)
            self.show_new()
            got = 0
            for _ in range(int(ANSWER_S / 0.1)):
                got += self.show_new()
                if got:
                    break
                await asyncio.sleep(0.1)
            if not got:
                print(f"no answer to {line!r} within {ANSWER_S:g} s", file=sys.stderr)
                return False
        return True

    async def chat_from_stdin(self, stop: asyncio.Event) -> None:
        """Every line of input is a message; the answers are printed as they come."""
        loop = asyncio.get_running_loop()
        print("type a message (a line starting with # goes to the forum topic); Ctrl-D ends")
        while not stop.is_set():
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            if line.strip():
                self.write(line.rstrip("\n"))
            for _ in range(30):
                self.show_new()
                await asyncio.sleep(0.1)


async def serve(args: argparse.Namespace) -> int:
    """Run the stack; 0 when it ended as asked, 1 when an answer never came, 2 for a token
    the Bot API refuses."""
    data: Path = args.data
    data.mkdir(parents=True, exist_ok=True)
    db = data / "bot.db"
    secret = secrets.token_urlsafe(24)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        fake: FakeTelegram | None = None
        if args.real:
            token = os.environ.get("STATECORE_TELEGRAM_TOKEN", "")
            if not token:
                print("--real needs the bot's token in STATECORE_TELEGRAM_TOKEN", file=sys.stderr)
                return 2
            driver = TelegramDriver(token)
        else:
            fake = await stack.enter_async_context(FakeTelegram())
            driver = TelegramDriver(fake.token, api_url=fake.api_url, poll_timeout_s=10)
            print(f"the fake Bot API server listens on {fake.url}")
        stores = [SQLiteStore(db) for _ in range(2)]
        for store in stores:
            stack.callback(store.close)
        connector_store, gateway_store = stores
        connector = Connector(
            connector_store, secrets={GATEWAY_ID: [secret]}, drivers={PLATFORM: driver}
        )
        await connector.start()
        stack.push_async_callback(connector.stop)
        if PLATFORM in connector.driver_failures:
            print(f"the Telegram driver cannot start: {connector.driver_failures[PLATFORM]}")
            return 2
        transport = WebSocketRelayTransport(
            connector.url,
            PLATFORM,
            "bot",
            gateway_id=GATEWAY_ID,
            secret=secret,
            dedupe=StoreBufferDedupe(gateway_store),
        )
        gateway = Gateway(gateway_store)
        gateway.on_message(answer)
        gateway.add_adapter(PLATFORM, RelayAdapter(transport))
        await gateway.start()
        stack.push_async_callback(gateway.stop)
        if fake is None:
            print(f"the bot @{driver.username} is listening on Telegram. Ctrl-C stops it.")
            await stop.wait()
            return 0
        person = Person(fake)
        if args.say:
            return 0 if await person.say(list(args.say)) else 1
        await person.chat_from_stdin(stop)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Serve (see the module docs); the exit status of :func:`serve`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, default=Path("telegram-data"), help="data folder")
    parser.add_argument("--real", action="store_true", help="the real Telegram (needs a token)")
    parser.add_argument("--say", nargs="+", help="write these messages, print the chat, exit")
    args = parser.parse_args(argv)
    try:
        code = asyncio.run(serve(args))
    except TelegramAuthError as exc:
        print(exc, file=sys.stderr)
        return 2
    print("stopped.")
    return code


if __name__ == "__main__":
    sys.exit(main())

"""A Discord bot on statecore: the connector's Discord driver, a gateway, one SQLite folder.

``python examples/discord_bot.py`` runs the whole stack against the fake Discord of
``relay.discord.testing`` (on 127.0.0.1): two people write (a DM, and a thread of a guild
channel), the bot answers each in its channel, thread and as a reply, and the script prints
what every channel shows, then exits.  ``--serve`` keeps it running until Ctrl-C.

With ``DISCORD_TOKEN`` set in the environment (a bot token from the developer portal, with
the MESSAGE CONTENT intent enabled) it runs against Discord itself and serves until Ctrl-C:
DM the bot, or mention it in a channel it can read.

``python examples/discord_bot.py [--data DIR] [--serve]``
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
from relay.discord import DiscordAuthError, DiscordDriver
from relay.discord.testing import FakeDiscord
from statecore.gateway import Gateway, Turn
from stores import SQLiteStore

PLATFORM = "discord"
GATEWAY_ID = "discord-bot"


async def answer(turn: Turn) -> None:
    """The bot: answers every message, in its thread, as a reply to it."""
    text = turn.message.text.strip()
    words = len(text.split())
    await turn.reply(f"You said: **{text}** ({words} word{'s' if words != 1 else ''})")


async def serve(data: Path, driver: DiscordDriver, stop: asyncio.Event) -> None:
    """The connector with ``driver`` and a gateway with :func:`answer`, until ``stop``."""
    secret = secrets.token_urlsafe(24)
    connector_store = SQLiteStore(data / "connector.db")
    gateway_store = SQLiteStore(data / "gateway.db")
    connector = Connector(
        connector_store, secrets={GATEWAY_ID: [secret]}, drivers={PLATFORM: driver}
    )
    gateway = Gateway(gateway_store)
    try:
        await connector.start(port=0)
        transport = WebSocketRelayTransport(
            connector.url,
            PLATFORM,
            "bot",
            gateway_id=GATEWAY_ID,
            secret=secret,
            dedupe=StoreBufferDedupe(gateway_store),
        )
        gateway.on_message(answer)
        gateway.add_adapter(PLATFORM, RelayAdapter(transport))
        await gateway.start()
        await stop.wait()
    finally:
        await gateway.stop()
        await connector.stop()
        gateway_store.close()
        connector_store.close()


async def demo(data: Path, keep_serving: bool) -> int:
    """Against the fake Discord: two people write, the answers are printed."""
    async with FakeDiscord() as fake:
        stop = asyncio.Event()
        driver = DiscordDriver(fake.token, api_base=fake.api_base)
        task = asyncio.create_task(serve(data, driver, stop))
        try:
            async with asyncio.timeout(30):
                await driver.gateway.connected.wait()
                fake.user_writes("1001", "hello bot", author="ann")
                fake.user_writes(
                    "2002",
                    "and in a thread?",
                    author="bob",
                    guild_id="42",
                    thread=True,
                    parent_id="2001",
                )
                await fake.wait_until(
                    lambda: bool(fake.bot_messages("1001") and fake.bot_messages("2002"))
                )
            for channel in ("1001", "2002"):
                print(f"#{channel}:")
                for message in fake.channel(channel):
                    shown = message.content.replace("\n", " ")
                    reply = f" (reply to {message.reply_to})" if message.reply_to else ""
                    print(f"  {message.author_name}: {shown}{reply}")
            if keep_serving:
                print(f"the fake Discord serves on {fake.url}; Ctrl-C stops", flush=True)
                await _until_interrupted()
        finally:
            stop.set()
            await task
    return 0


async def _until_interrupted() -> None:
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, interrupted.set)
    await interrupted.wait()


async def real(data: Path, token: str) -> int:
    """Against Discord itself, until Ctrl-C."""
    stop = asyncio.Event()
    driver = DiscordDriver(token)
    task = asyncio.create_task(serve(data, driver, stop))
    waiting = asyncio.create_task(_until_interrupted())
    await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    waiting.cancel()
    try:
        await task
    except DiscordAuthError as exc:
        print(f"discord: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the example (see the module docs)."""
    parser = argparse.ArgumentParser(description="a Discord bot on statecore")
    parser.add_argument("--data", default="discord-data", help="the SQLite folder")
    parser.add_argument("--serve", action="store_true", help="keep serving the fake Discord")
    args = parser.parse_args(argv)
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    token = os.environ.get("DISCORD_TOKEN", "").strip()
    if token:
        return asyncio.run(real(data, token))
    return asyncio.run(demo(data, bool(args.serve)))


if __name__ == "__main__":
    sys.exit(main())

"""A Slack bot behind the statecore connector (one command: ``python examples/slack_bot.py``).

One process runs the whole stack on one SQLite file (``--data``, default ``slack-data/``):

* Slack: by default the fake Slack of ``relay.slack.testing`` on 127.0.0.1, and you are the
  person: every line you type is a message in a direct chat with the bot (``#C1 text`` writes in
  the channel C1, ``> text`` in the thread of your last message), and the bot's answers are
  printed as that chat shows them.  With ``SLACK_BOT_TOKEN`` (``xoxb-``) and
  ``SLACK_APP_TOKEN`` (``xapp-``, Socket Mode enabled) in the environment it is your workspace
  instead: write to the bot there;
* the reference connector with the **Slack driver** (:class:`relay.slack.SlackDriver`, Socket
  Mode): it acks each event only once the connector holds it durably;
* a gateway with a small bot that answers every message in its channel and thread, its replies
  ledgered like any other.

``--demo`` (with the fake) writes three messages, prints the chat and exits.  Ctrl-D or Ctrl-C
stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import sys
from pathlib import Path

from relay.client.adapter import RelayAdapter
from relay.client.dedupe import StoreBufferDedupe
from relay.client.transport import WebSocketRelayTransport
from relay.connector.server import Connector
from relay.slack import SlackAuthError, SlackDriver
from relay.slack.testing import FakeSlack
from statecore.gateway import Gateway, Turn
from stores import SQLiteStore

PLATFORM = "slack"
GATEWAY_ID = "slack-bot"
DIRECT = "D0PERSON"


async def answer(turn: Turn) -> None:
    """The bot: answers every message in its channel and thread."""
    text = turn.message.text.strip()
    words = len(text.split())
    await turn.reply(f"You said: *{text}* ({words} word{'s' if words != 1 else ''})")


async def person(fake: FakeSlack, lines: list[str] | None) -> None:
    """Plays the person on the fake: reads lines (stdin, or ``lines``), writes them, shows the
    bot's answers."""
    last: dict[str, str] = {}
    shown = 0
    loop = asyncio.get_running_loop()
    feed = iter(lines) if lines is not None else None
    async with asyncio.timeout(20):  # the driver's first Socket Mode connection
        while not fake.delivery.open_sockets():
            await asyncio.sleep(0.05)
    while True:
        if feed is not None:
            line = next(feed, None)
        else:
            print("you> ", end="", flush=True)
            line = await loop.run_in_executor(None, sys.stdin.readline)
            line = line if line else None
        if line is None:
            return
        text, channel, thread = line.strip(), DIRECT, None
        if text.startswith("#") and " " in text:
            channel, text = text[1:].split(" ", 1)
        if text.startswith("> "):
            text, thread = text[2:], last.get(channel)
        if not text:
            continue
        kind = "im" if channel.startswith("D") else "channel"
        ts = fake.user_writes(channel, text, channel_type=kind, thread_ts=thread)
        last[channel] = thread or ts
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                while sum(len(fake.channel(c).bot_texts()) for c in fake.channels()) <= shown:
                    await asyncio.sleep(0.05)
        for name in fake.channels():
            for message in fake.channel(name).messages:
                if message.bot and message.ts > ts:
                    where = f" (thread {message.thread_ts})" if message.thread_ts else ""
                    print(f"bot in {name}{where}: {message.text}", flush=True)
        shown = sum(len(fake.channel(c).bot_texts()) for c in fake.channels())


async def serve(data: Path, driver: SlackDriver, until: asyncio.Future[None]) -> None:
    """Run the connector and the gateway until ``until`` is done."""
    data.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(24)
    stores = [SQLiteStore(data / "bot.db") for _ in range(2)]
    connector = Connector(stores[0], secrets={GATEWAY_ID: [secret]}, drivers={PLATFORM: driver})
    gateway = Gateway(stores[1])
    gateway.on_message(answer)
    async with contextlib.AsyncExitStack() as stack:
        for store in stores:
            stack.callback(store.close)
        await connector.start()
        stack.push_async_callback(connector.stop)
        transport = WebSocketRelayTransport(
            connector.url,
            PLATFORM,
            "bot",
            gateway_id=GATEWAY_ID,
            secret=secret,
            dedupe=StoreBufferDedupe(stores[1]),
        )
        gateway.add_adapter(PLATFORM, RelayAdapter(transport))
        await gateway.start()
        stack.push_async_callback(gateway.stop)
        print("the bot is listening.", flush=True)
        await until


async def run(args: argparse.Namespace) -> int:
    bot_token, app_token = os.environ.get("SLACK_BOT_TOKEN"), os.environ.get("SLACK_APP_TOKEN")
    if bot_token and app_token:
        driver = SlackDriver(bot_token, app_token=app_token)
        forever: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        print("Slack: your workspace (Socket Mode); write to the bot there. Ctrl-C stops it.")
        await serve(args.data, driver, forever)
        return 0
    fake = FakeSlack()
    await fake.start()
    try:
        driver = SlackDriver(fake.bot_token, app_token=fake.app_token, api_url=fake.api_url)
        print(f"Slack: the fake one at {fake.api_url}; you write in {DIRECT}.")
        demo = ["hello", "> and in the thread", "#C1 hello channel"] if args.demo else None
        await serve(args.data, driver, asyncio.ensure_future(person(fake, demo)))
    finally:
        await fake.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Serve until the person stops (fake) or Ctrl-C (real); 2 when Slack refuses a token."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, default=Path("slack-data"), help="the data folder")
    parser.add_argument("--demo", action="store_true", help="(fake) three messages, then exit")
    args = parser.parse_args(argv)
    try:
        code = asyncio.run(run(args))
    except SlackAuthError as exc:
        print(f"slack refused a token: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        code = 0
    print("stopped.")
    return code


if __name__ == "__main__":
    sys.exit(main())

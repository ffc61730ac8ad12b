"""A bot people reach from any Matrix client (``make matrix``).

One process runs the whole stack on one SQLite file (``--data``, default ``matrix-data/``):

* a Matrix homeserver: by default a throwaway one (Synapse, on 127.0.0.1, deleted when the
  bot stops) with two accounts made for this run, the bot and a person to log in as; or a
  homeserver of yours (``--homeserver URL --user @bot:example.org``, the password in
  ``STATECORE_MATRIX_PASSWORD``);
* the reference connector with the **Matrix driver** (:class:`relay.matrix.MatrixDriver`): it
  joins the rooms the bot is invited to, takes every message durably before it moves its sync
  token, and sends each reply under a transaction id derived from the reply's obligation, so a
  resend is never a second message in the room;
* a gateway with a small bot that answers every message in its room, thread and as a reply
  (Markdown shows formatted: ``*this*`` is emphasis), its replies ledgered like any other;
* the **dashboard** (``/dashboard/``), with the operator token printed below.

Run it; it prints the homeserver's address and the person's login.  Log in with any Matrix
client that can reach the address (Element, nheko, gomuks, or ``matrix-commander``), start a
direct chat with the bot, and write.  Ctrl-C stops it.

``python examples/matrix_bot.py [--data DIR] [--homeserver URL --user ID] [--port 8080]``
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
from relay.matrix import MatrixDriver
from relay.web.dashboard import Dashboard
from relay.web.server import WebServer
from relay.wire.auth import mint_token
from statecore.gateway import Gateway, Turn
from stores import SQLiteStore

PLATFORM = "matrix"
GATEWAY_ID = "matrix-bot"
TOKEN_TTL_S = 12 * 3600
"""How long the operator token printed at start works (a local run's whole session)."""


async def answer(turn: Turn) -> None:
    """The bot: answers every message, in its thread, as a reply to it."""
    text = turn.message.text.strip()
    words = len(text.split())
    await turn.reply(f"You said: *{text}*\n\n({words} word{'s' if words != 1 else ''})")


async def serve(
    data: Path, driver: MatrixDriver, port: int, stop: asyncio.Event, lines: list[str]
) -> None:
    """Run the connector, the gateway and the dashboard until ``stop`` is set."""
    data.mkdir(parents=True, exist_ok=True)
    db = data / "bot.db"
    secret = secrets.token_urlsafe(24)  # this run's credential, shared by bot and operator
    stores = [SQLiteStore(db) for _ in range(3)]
    connector_store, gateway_store, dashboard_store = stores
    connector = Connector(
        connector_store, secrets={GATEWAY_ID: [secret]}, drivers={PLATFORM: driver}
    )
    dashboard = Dashboard(
        dashboard_store,
        secrets={"operator": [secret]},
        show_content=True,  # this local page is yours alone
        max_token_ttl_s=TOKEN_TTL_S,
    )
    web = WebServer([dashboard])
    gateway = Gateway(gateway_store)
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
            dedupe=StoreBufferDedupe(gateway_store),
        )
        gateway.add_adapter(PLATFORM, RelayAdapter(transport))
        try:
            await web.start("127.0.0.1", port)
        except OSError:
            await web.start("127.0.0.1", 0)  # the port is taken: any free one
        stack.push_async_callback(dashboard.close)
        stack.push_async_callback(web.stop)
        await gateway.start()
        stack.push_async_callback(gateway.stop)
        token = mint_token("operator", secret, ttl_s=TOKEN_TTL_S)
        for line in lines:
            print(line)
        print(f"dashboard:   {web.url}/dashboard/")
        print(f"operator token (this run only, for the dashboard's actions):\n  {token}")
        print("the bot is listening. Ctrl-C stops it.", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGINT or SIGTERM; 2 for options that cannot work."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, default=Path("matrix-data"), help="the data folder")
    parser.add_argument("--homeserver", help="a homeserver of yours (default: a throwaway one)")
    parser.add_argument("--user", help="the bot's Matrix id on --homeserver")
    parser.add_argument("--port", type=int, default=8080, help="the dashboard's port")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.homeserver:
            password = os.environ.get("STATECORE_MATRIX_PASSWORD")
            if not args.user or not password:
                print("--homeserver needs --user and STATECORE_MATRIX_PASSWORD", file=sys.stderr)
                return 2
            driver = MatrixDriver(args.homeserver, args.user, password=password)
            lines = [f"homeserver:  {args.homeserver}", f"bot:         {args.user}"]
        else:
            from relay.matrix.testing import start_homeserver  # noqa: PLC0415

            print("starting a throwaway homeserver (Synapse, a few seconds)...", flush=True)
            server = stack.enter_context(start_homeserver())
            bot = server.register("bot", secrets.token_urlsafe(12))
            person = server.register("person", secrets.token_urlsafe(12))
            driver = MatrixDriver(server.url, bot.user_id, password=bot.password)
            lines = [
                f"homeserver:  {server.url}  (log in with any Matrix client)",
                f"person:      {person.user_id}  password: {person.password}",
                f"bot:         {bot.user_id}  (start a direct chat with it and write)",
            ]

        async def run() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await serve(args.data, driver, args.port, stop, lines)

        asyncio.run(run())
    print("stopped.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

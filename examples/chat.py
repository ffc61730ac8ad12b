"""Talk to a bot in your browser, and watch its lifecycles (``make chat``).

One process runs the whole stack on one SQLite file (``--data``, default ``chat-data/``):

* the reference connector, fronting the **web chat** platform (:class:`relay.web.WebChatPlatform`);
* a gateway with a small bot: it answers every message (``/slow`` makes it type for a few
  seconds first, ``/edit`` sends a draft and edits it into the answer, an answer longer than
  the page takes arrives in parts), its replies ledgered like any other;
* one web server with the chat page (``/chat/``) and the **dashboard** (``/dashboard/``): counts
  per state, a live stream of transitions, each reply's history, the lifecycle diagrams, and
  the operator's actions -- with the operator token printed below (a credential for this local
  run only, new each time).

Run it, open the chat URL it prints, pick a name and write; keep the dashboard open in another
tab.  Ctrl-C stops it (the conversation's obligations stay in the database).

``python examples/chat.py [--data DIR] [--host 127.0.0.1] [--port 8080]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import signal
import sys
from pathlib import Path

from relay.client.adapter import RelayAdapter
from relay.client.dedupe import StoreBufferDedupe
from relay.client.transport import WebSocketRelayTransport
from relay.connector.server import Connector
from relay.web.chat import WebChatPlatform
from relay.web.dashboard import Dashboard
from relay.web.server import WebServer
from relay.wire.auth import mint_token
from statecore.gateway import Gateway, Turn
from stores import SQLiteStore

PLATFORM = "webchat"
GATEWAY_ID = "chat-bot"
TOKEN_TTL_S = 12 * 3600
"""How long the operator token printed at start works (a local run's whole session)."""


async def answer(turn: Turn) -> None:
    """The bot: answers every message (an answer longer than the page takes arrives in parts).

    ``/slow`` shows the bot typing for a few seconds before it answers; ``/edit`` sends a
    draft, then edits it into the answer."""
    text = turn.message.text.strip()
    words = len(text.split())
    answer_text = f"You said: {text}\n({words} word{'s' if words != 1 else ''})"
    if text.startswith("/slow"):
        async with turn.keep_typing():
            await asyncio.sleep(3.0)
    if text.startswith("/edit"):
        draft = await turn.reply("Thinking\u2026")
        await asyncio.sleep(1.0)
        await turn.edit(draft, answer_text)
        return
    await turn.reply(answer_text)


async def serve(data: Path, host: str, port: int, stop: asyncio.Event) -> None:
    """Run the stack until ``stop`` is set."""
    data.mkdir(parents=True, exist_ok=True)
    db = data / "chat.db"
    secret = secrets.token_urlsafe(24)  # this run's credential, shared by bot and operator
    chat = WebChatPlatform(PLATFORM)
    connector_store, gateway_store, dashboard_store = (SQLiteStore(db) for _ in range(3))
    connector = Connector(connector_store, secrets={GATEWAY_ID: [secret]}, drivers={PLATFORM: chat})
    # show_content: this local page is yours alone; a shared dashboard keeps replies hidden.
    dashboard = Dashboard(
        dashboard_store,
        secrets={"operator": [secret]},
        show_content=True,
        max_token_ttl_s=TOKEN_TTL_S,  # the token below lasts the run; the default cap is 1 h
    )
    web = WebServer([chat, dashboard])
    gateway = Gateway(gateway_store)
    gateway.on_message(answer)
    async with contextlib.AsyncExitStack() as stack:
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
            await web.start(host, port)
        except OSError:
            await web.start(host, 0)  # the port is taken: any free one
        stack.push_async_callback(dashboard.close)  # after the server stopped (LIFO)
        stack.push_async_callback(web.stop)
        await gateway.start()
        stack.push_async_callback(gateway.stop)
        token = mint_token("operator", secret, ttl_s=TOKEN_TTL_S)
        print(f"chat:       {web.url}/chat/")
        print(f"dashboard:  {web.url}/dashboard/")
        print(f"operator token (this run only, for the dashboard's actions):\n  {token}")
        print("Ctrl-C stops it.", flush=True)
        await stop.wait()
    for store in (connector_store, gateway_store, dashboard_store):
        store.close()


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, default=Path("chat-data"), help="the data folder")
    parser.add_argument("--host", default="127.0.0.1", help="the web server's address")
    parser.add_argument("--port", type=int, default=8080, help="the web server's port")
    args = parser.parse_args(argv)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(args.data, args.host, args.port, stop)

    asyncio.run(run())
    print("stopped.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

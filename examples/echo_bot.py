"""An echo bot: the smallest complete statecore gateway.

The pieces, all in this one process, all on 127.0.0.1:

* a **connector** (the edge that holds platform credentials) in front of a simulated chat, the
  ``LoopbackPlatform``;
* a **bot gateway**: a ``Gateway`` whose delivery ledger lives in a SQLite file, reaching the
  connector through a ``RelayAdapter`` over one WebSocket (``WebSocketRelayTransport``);
* the bot's logic: a handler that answers every message with its echo.  ``turn.reply`` is a
  *ledgered* send: the reply is recorded before it is sent and settled after, so a crash in
  between never loses it (see ``crash_recovery.py``).

Run it: ``python examples/echo_bot.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from relay.client.adapter import RelayAdapter
from relay.client.transport import WebSocketRelayTransport
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from statecore.gateway import Gateway, Turn
from stores import InMemoryStore, SQLiteStore

GATEWAY_ID = "echo-gateway"
SECRET = "echo-example-secret"  # shared by the connector and the gateway (tokens are minted)
CHAT = "chat-1"
WAIT_S = 10.0  # the bound on every wait in this example


async def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll ``predicate`` until it holds; raise ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.01)


async def write_and_wait(platform: LoopbackPlatform, text: str) -> None:
    """alice writes ``text``; wait (bounded) for its echo, so the chat stays in order."""
    print(f"  user  -> {text!r}")
    await platform.inject(CHAT, text, user_id="alice")
    expected = f"echo: {text}"
    await wait_until(lambda: expected in platform.texts(CHAT), f"the reply {expected!r}")


async def echo(turn: Turn) -> None:
    """The bot's logic: answer every message with its echo (a durable, ledgered reply)."""
    print(f"  bot   <- {turn.message.text!r} (chat {turn.message.chat_id})")
    result = await turn.reply(f"echo: {turn.message.text}")
    print(f"  bot   -> reply sent: {result.success}")


async def main(workdir: Path) -> int:
    # The connector and its chat platform.  The connector's inbound buffer (for gateways that
    # are asleep) may live in any store; memory is enough here.
    platform = LoopbackPlatform()
    connector = Connector(
        InMemoryStore(), secrets={GATEWAY_ID: [SECRET]}, drivers={"loopback": platform}
    )
    await connector.start("127.0.0.1", 0)  # port 0: any free port
    print(f"connector listening on {connector.url}")

    # The bot gateway: a ledger on SQLite, one relay adapter for the loopback platform.
    store = SQLiteStore(workdir / "echo-bot.db")
    transport = WebSocketRelayTransport(
        connector.url, "loopback", "echo-bot", gateway_id=GATEWAY_ID, secret=SECRET
    )
    gateway = Gateway(store)
    gateway.add_adapter("loopback", RelayAdapter(transport))
    gateway.on_message(echo)
    try:
        await gateway.start()  # connects the adapter (and would redeliver anything owed)
        await wait_until(lambda: connector.connected(GATEWAY_ID), "the gateway's handshake")
        print(f"gateway connected (transport state: {transport.state.value})")

        for text in ("hello", "how are you?", "bye"):
            await write_and_wait(platform, text)

        # A reply shows in the chat as the platform performs it; the gateway counts it
        # delivered once the platform's answer is back and its ledger row settled, a moment
        # later.  (Not there in time: the check below says so.)
        with contextlib.suppress(TimeoutError):
            await wait_until(lambda: gateway.delivered == 3, "the last reply settled")
        print("\nthe chat, as alice sees it:")
        for message in platform.transcript[CHAT]:
            print(f"  [{message.sender}] {message.text}")
        print(f"\nreplies delivered by the gateway: {gateway.delivered}")
        return 0 if gateway.delivered == 3 else 1
    finally:
        await gateway.stop(budget_s=5.0)  # drains, disconnects, closes the ledger
        await connector.stop()
        store.close()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="statecore-echo-") as tmp:
        raise SystemExit(asyncio.run(main(Path(tmp))))

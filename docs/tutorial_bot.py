"""The tutorial bot (docs/tutorial.md): a gateway that never loses a reply, step by step.

Run it from the repository root with ``.venv/bin/python docs/tutorial_bot.py``.  It needs no
network: the chat platform is the built-in loopback one and everything listens on 127.0.0.1.
It writes its two SQLite files into a fresh temporary directory (or into the directory given
as the first argument) and takes a few seconds:

1. a connector in front of the loopback chat platform;
2. the bot: a gateway on SQLite whose handler answers with ``turn.reply``;
3. a conversation;
4. a crash: a second process runs the same bot and is killed in the middle of a reply;
5. the restart: the reply the dead process owed is delivered, labelled as a possible repeat;
6. going dormant: messages written while the bot sleeps are buffered and answered on wake;
7. a summary read from the ledger.

The crash needs POSIX signals (Linux, macOS).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from relay import (
    Connector,
    LoopbackPlatform,
    RelayAdapter,
    StoreBufferDedupe,
    WebSocketRelayTransport,
)
from statecore import RECOVERED_MARKER, compute_obligation_id
from statecore.gateway import Gateway, SendResult, Turn
from statecore.gateway.turn import session_key_for
from stores import SQLiteStore

GATEWAY_ID = "tutorial-bot"
SECRET = "tutorial-secret"  # shared by the connector and the gateway; keep real ones secret
CHAT = "chat-42"


# -- step 1: the connector and the chat platform -----------------------------------------------


async def start_connector(workdir: Path) -> tuple[Connector, LoopbackPlatform, SQLiteStore]:
    platform = LoopbackPlatform()  # a simulated chat: inject() plays a user writing
    store = SQLiteStore(workdir / "connector.db")  # the connector's durable inbound buffer

    async def wake(gateway_id: str) -> None:
        print(f"[connector] {gateway_id} is asleep and has mail: a deployment would wake it now")

    connector = Connector(
        store,
        secrets={GATEWAY_ID: [SECRET]},  # gateway id -> its secrets, newest first
        drivers={"loopback": platform},  # platform name -> driver
        wake_hook=wake,
    )
    await connector.start()  # 127.0.0.1, any free port
    print(f"[connector] listening on {connector.url}")
    return connector, platform, store


# -- step 2: the bot ---------------------------------------------------------------------------


async def answer(turn: Turn) -> None:
    """The bot's logic: called once per inbound message."""
    await turn.reply(f"you said: {turn.message.text}")


def build_gateway(
    url: str, workdir: Path, *, adapter_type: type[RelayAdapter] = RelayAdapter
) -> tuple[Gateway, RelayAdapter, SQLiteStore]:
    store = SQLiteStore(workdir / "bot.db")  # the ledger, sessions and handled-replay memory
    transport = WebSocketRelayTransport(
        url,
        "loopback",  # the platform this connection fronts
        "tutorial-bot",  # the bot's identity on it
        gateway_id=GATEWAY_ID,
        secret=SECRET,
        dedupe=StoreBufferDedupe(store),  # a replayed message is never handled twice
        dormant_redial_s=2.0,  # how long a dormant transport waits before it dials again
    )
    adapter = adapter_type(transport)
    gateway = Gateway(store)
    gateway.add_adapter("loopback", adapter)
    gateway.on_message(answer)
    return gateway, adapter, store


# -- step 4: a bot process that dies in the middle of a reply ------------------------------------


class DyingAdapter(RelayAdapter):
    """Kills its own process at the moment the reply is handed to the platform."""

    async def send(
        self, chat_id: str, content: str, metadata: Mapping[str, Any] | None = None
    ) -> SendResult:
        print(f"[doomed bot] pid {os.getpid()} sending {content!r} ... and dying", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


async def doomed_bot(url: str, workdir: Path) -> None:
    """The child process: the same bot, with the dying adapter."""
    gateway, _, _ = build_gateway(url, workdir, adapter_type=DyingAdapter)
    await gateway.start()
    print("[doomed bot] connected", flush=True)
    await asyncio.Event().wait()  # serve until killed


# -- the story -----------------------------------------------------------------------------------


async def until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Wait (bounded) until ``condition()`` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def bot_says(platform: LoopbackPlatform) -> list[str]:
    return platform.texts(CHAT)


async def story(workdir: Path) -> int:
    connector, platform, connector_store = await start_connector(workdir)

    # -- step 3: a conversation
    gateway, adapter, store = build_gateway(connector.url, workdir)
    await gateway.start()
    await until(lambda: connector.connected(GATEWAY_ID), "the bot to connect")
    await platform.inject(CHAT, "hello")
    await until(lambda: "you said: hello" in bot_says(platform), "the first reply")
    print(f"[chat] bot: {bot_says(platform)[-1]}")
    await gateway.stop(budget_s=5)  # a graceful stop: goes idle, then disconnects
    store.close()
    await until(lambda: not connector.connected(GATEWAY_ID), "the bot to be gone")

    # -- step 4: the crash
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--doomed-bot", connector.url, str(workdir)
    )
    await until(lambda: connector.connected(GATEWAY_ID), "the doomed bot to connect")
    message_id = await platform.inject(CHAT, "are you still there?")
    print(f"[bot process] exited with {await child.wait()} (-9: SIGKILL)")

    # -- step 5: the restart
    gateway, adapter, store = build_gateway(connector.url, workdir)
    await gateway.start()  # finds what the dead process owed, claims it and resends it
    print("[bot] restarted")
    await until(lambda: len(bot_says(platform)) == 2, "the recovered reply")
    print(f"[chat] bot: {bot_says(platform)[-1]!r}")
    reply_id = compute_obligation_id(
        session_key_for("default", "loopback", "dm", CHAT),
        message_id,
        "you said: are you still there?",
    )
    for entry in await gateway.ledger.history(reply_id):
        before = entry.from_state.value if entry.from_state else "(new)"
        print(f"[ledger] {entry.event:8} {before:>10} -> {entry.to_state.value}")

    # -- step 6: going dormant
    assert await adapter.go_dormant()  # False (and still connected) if the connector did not ack
    print("[bot] dormant: socket closed, the connector buffers for it")
    await platform.inject(CHAT, "ping while you sleep")
    await platform.inject(CHAT, "and another")
    print(f"[connector] buffered for the sleeping bot: {connector.buffered(GATEWAY_ID)}")
    await until(lambda: len(bot_says(platform)) == 4, "the answers after waking")
    await until(lambda: connector.buffered(GATEWAY_ID) == 0, "the buffer to be acked")
    for text in bot_says(platform)[-2:]:
        print(f"[chat] bot: {text}")

    # -- step 7: the summary
    said = [m.text for m in platform.transcript[CHAT] if m.sender != "bot"]
    answers = [text.split("\n\n")[-1] for text in bot_says(platform)]  # labels stripped
    lost = [text for text in said if f"you said: {text}" not in answers]
    labelled = [text for text in bot_says(platform) if text.startswith(RECOVERED_MARKER)]
    owed = await gateway.ledger.owed()
    abandoned = await gateway.ledger.abandoned()
    print(
        f"summary: messages {len(said)}, replies {len(answers)}, labelled {len(labelled)}, "
        f"lost {len(lost)}, owed {len(owed)}, abandoned {len(abandoned)}"
    )
    await gateway.stop(budget_s=5)
    store.close()
    await connector.stop()
    connector_store.close()
    return 1 if lost or owed or abandoned else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--doomed-bot"]:
        asyncio.run(doomed_bot(argv[1], Path(argv[2])))
        return 1  # not reached: the doomed bot is killed
    if argv:
        Path(argv[0]).mkdir(parents=True, exist_ok=True)
        return asyncio.run(story(Path(argv[0])))
    with tempfile.TemporaryDirectory(prefix="statecore-tutorial-") as workdir:
        return asyncio.run(story(Path(workdir)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

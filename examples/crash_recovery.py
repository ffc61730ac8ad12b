"""Crash recovery: the bot process is SIGKILLed in the middle of a send, and the reply still
arrives -- labelled -- after the restart.

Three processes take part (POSIX: the example really sends SIGKILL):

* this script, the **parent**: the connector and its simulated chat (``LoopbackPlatform``).  It
  plays the user, kills the bot, restarts it and prints the chat;
* the **bot, first life** (this script again, with ``--bot``): a ``Gateway`` whose ledger is a
  SQLite file.  Its adapter is wrapped so that the first send hangs forever: the reply has been
  recorded and marked *attempting* -- the send has begun -- when the parent kills the process;
* the **bot, second life** (``--bot --recover``): the same gateway code on the same SQLite file.
  ``gateway.start()`` finds the row whose owner is provably dead (its pid is gone), claims it and
  redelivers it.  Because the first life may have reached the platform before dying, the resend
  carries the recovered-reply banner: the user is never silently sent something twice, and
  never silently loses a reply.

Run it: ``python examples/crash_recovery.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from relay.client.adapter import RelayAdapter
from relay.client.transport import WebSocketRelayTransport
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from relay.wire.frames import InboundEvent
from statecore import RECOVERED_MARKER
from statecore.clock import Deadline
from statecore.gateway import AdapterAbilities, Gateway, SendResult, Turn
from stores import InMemoryStore, SQLiteStore

GATEWAY_ID = "crash-gateway"
SECRET = "crash-example-secret"
CHAT = "chat-bob"
QUESTION = "what is the answer to everything?"
ANSWER = "The answer to everything is 42."
WAIT_S = 15.0  # the bound on every wait in this example

# -- the bot (child process) ---------------------------------------------------------------------


class HangOnFirstSend:
    """A platform adapter that wraps a ``RelayAdapter`` and hangs forever in its first send.

    It declares the abilities it passes through to the wrapped adapter (connecting, inbound
    messages, disconnecting within a deadline); only ``send`` is changed.  This stands in
    for any real way a process dies mid-send: OOM killer, a deploy, a power cut.
    """

    abilities = AdapterAbilities(connects=True, disconnects=True, delivers_inbound=True)

    def __init__(self, inner: RelayAdapter) -> None:
        self.inner = inner
        self.transport = inner.transport
        self.hung = False

    @property
    def connected(self) -> bool:
        return self.inner.connected

    def on_message(self, handler: Callable[[InboundEvent], Awaitable[None]] | None) -> None:
        self.inner.on_message(handler)

    async def connect(self) -> bool:
        return await self.inner.connect()

    async def disconnect(self, *, deadline: Deadline) -> None:
        await self.inner.disconnect(deadline=deadline)

    async def send(
        self, chat_id: str, content: str, metadata: Mapping[str, Any] | None = None
    ) -> SendResult:
        if not self.hung:
            self.hung = True
            key = (metadata or {}).get("idempotency_key")
            # The ledger row is 'attempting' now: the gateway marked it before calling us.
            say(f"HANGING in the send of obligation {key} (ledger state: attempting)")
            await asyncio.Event().wait()  # forever: the parent SIGKILLs us here
        return await self.inner.send(chat_id, content, metadata)


def say(line: str) -> None:
    """Print a line for the parent (which reads our stdout line by line)."""
    print(line, flush=True)


async def answer(turn: Turn) -> None:
    """The bot's logic: think, then answer with a ledgered reply."""
    say(f"handling {turn.message.text!r} from {turn.message.user_id}")
    await turn.reply(ANSWER)


async def run_bot(url: str, db_path: str, *, recover: bool) -> int:
    """One life of the bot.  The first life never returns (it is killed mid-send)."""
    life = "second life (recovering)" if recover else "first life"
    say(f"bot pid {os.getpid()}, {life}")
    store = SQLiteStore(db_path)
    transport = WebSocketRelayTransport(
        url, "loopback", "crash-bot", gateway_id=GATEWAY_ID, secret=SECRET
    )
    relay_adapter = RelayAdapter(transport)
    gateway = Gateway(store)
    gateway.add_adapter("loopback", relay_adapter if recover else HangOnFirstSend(relay_adapter))
    gateway.on_message(answer)
    try:
        # start(): connect, claim what dead owners left for connected platforms, redeliver in
        # the background (plain if the send never began, labelled if it may have).
        claimed = await gateway.start()
        say(f"READY: connected; claimed {claimed} owed reply(s) left by a dead process")
        if not recover:
            await asyncio.sleep(WAIT_S)  # the parent kills us long before this ends
            say("not killed?")
            return 1
        deadline = time.monotonic() + WAIT_S
        while gateway.redelivered < claimed and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        say(f"redelivered {gateway.redelivered} reply(s), {gateway.labelled} of them labelled")
        return 0 if gateway.redelivered == claimed == 1 else 1
    finally:
        await gateway.stop(budget_s=5.0)
        store.close()


# -- the parent: connector, chat, kill and restart -----------------------------------------------


class Bot:
    """A bot child process whose stdout is echoed, indented, as it arrives."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def spawn(cls, url: str, db_path: Path, *, recover: bool) -> Bot:
        args = [sys.executable, __file__, "--bot", url, str(db_path)]
        if recover:
            args.append("--recover")
        proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE)
        return cls(proc)

    async def expect(self, marker: str, timeout: float = WAIT_S) -> str:
        """Echo the bot's lines until one contains ``marker``; return it (bounded)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            raw = await asyncio.wait_for(self.proc.stdout.readline(), max(0.0, remaining))
            if not raw:
                raise RuntimeError(f"the bot exited before saying {marker!r}")
            line = raw.decode().rstrip()
            print(f"    | {line}")
            if marker in line:
                return line

    async def finish(self, timeout: float = WAIT_S) -> int:
        """Echo the rest of the bot's output and wait for it to exit (bounded)."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            async for raw in self.proc.stdout:
                print(f"    | {raw.decode().rstrip()}")
            return await self.proc.wait()

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


async def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll ``predicate`` until it holds; raise ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.01)


def print_chat(platform: LoopbackPlatform) -> None:
    print(f"  the chat {CHAT}, as bob sees it:")
    for message in platform.transcript.get(CHAT, []):
        for n, text in enumerate(message.text.splitlines() or [""]):
            print(f"    {f'[{message.sender}]' if n == 0 else '':<8}{text}".rstrip())


async def run_parent(workdir: Path) -> int:
    platform = LoopbackPlatform()
    connector = Connector(
        InMemoryStore(), secrets={GATEWAY_ID: [SECRET]}, drivers={"loopback": platform}
    )
    await connector.start("127.0.0.1", 0)
    db_path = workdir / "bot-ledger.db"
    print(f"connector on {connector.url}; the bot's ledger: {db_path.name} (SQLite)")
    bots: list[Bot] = []
    try:
        print("\n1. start the bot (first life)")
        first = await Bot.spawn(connector.url, db_path, recover=False)
        bots.append(first)
        await first.expect("READY")

        print(f"\n2. bob writes {QUESTION!r}; the bot starts to answer and hangs mid-send")
        await platform.inject(CHAT, QUESTION, user_id="bob")
        await first.expect("HANGING")

        print(f"\n3. SIGKILL the bot (pid {first.proc.pid})")
        os.kill(first.proc.pid, signal.SIGKILL)
        code = await asyncio.wait_for(first.proc.wait(), WAIT_S)
        killed = code == -signal.SIGKILL
        print(f"  the bot exited with {code}: killed by SIGKILL = {killed}")
        print_chat(platform)
        print(f"  bot replies so far: {len(platform.texts(CHAT))}")

        print("\n4. restart the bot (second life) on the same ledger file")
        second = await Bot.spawn(connector.url, db_path, recover=True)
        bots.append(second)
        code2 = await second.finish()
        await wait_until(lambda: bool(platform.texts(CHAT)), "the recovered reply")

        print("\n5. the outcome")
        print_chat(platform)
        replies = platform.texts(CHAT)
        labelled = len(replies) == 1 and replies[0].startswith(RECOVERED_MARKER)
        complete = ANSWER in replies[0]
        print(f"  recovered reply delivered: {complete}; labelled: {labelled}")
        print(f"  replies sent {len(replies)}, lost 0" if complete else "  the reply was LOST")
        return 0 if killed and code2 == 0 and labelled and complete else 1
    finally:
        for bot in bots:
            bot.kill()
        await connector.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bot", nargs=2, metavar=("URL", "DB"), help="run as the bot process")
    parser.add_argument("--recover", action="store_true", help="the bot's second life")
    args = parser.parse_args()
    if args.bot is not None:
        url, db_path = args.bot
        return asyncio.run(run_bot(url, db_path, recover=args.recover))
    with tempfile.TemporaryDirectory(prefix="statecore-crash-") as tmp:
        return asyncio.run(run_parent(Path(tmp)))


if __name__ == "__main__":
    raise SystemExit(main())

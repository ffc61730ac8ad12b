"""A delegating bot: durable async work whose late result finds the right chat after a restart.

A command like ``/summarize the Q3 report`` is too slow to answer within the turn.  The bot
*dispatches* it as a delegation (``Delegations.dispatch``) together with a ``RoutingOrigin``
captured from the message -- platform, chat, chat type, user, user name, tenant scope, session
key and the session that is live now (the *pin*) -- answers "on it", and works on it in the
background.  The delegation and its origin are rows in the bot's SQLite file.

The story, across three processes (POSIX: the example really sends SIGKILL):

1. the parent (this script) runs the connector and a simulated chat with three users in two
   tenant scopes; the bot's first life (``--bot``) takes three jobs.  One finishes (its result
   is stored), two are still running; one of their users then types ``/reset``;
2. the parent SIGKILLs the bot before its completion router has run;
3. the bot's second life runs the same code: at startup ``recover_abandoned`` marks the dead
   process's running jobs *unknown* (their origins kept), and the router asks
   ``route_completion`` -- the one resolver -- where each completion goes now:

   * the finished summary: ``deliver`` to its pinned session -- the late result arrives;
   * the interrupted research whose chat is unchanged: ``deliver`` an honest "outcome unknown";
   * the interrupted research whose user reset the conversation: ``terminal`` -- dropped, not
     delivered into a conversation the user closed.

   Delivery is ``gateway.send_final`` (ledgered, like any reply); the adapter is primed with the
   persisted origin, so the reply carries the chat's tenant scope after a restart too.

Run it: ``python examples/delegating_bot.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relay.client.adapter import RelayAdapter
from relay.client.transport import WebSocketRelayTransport
from relay.connector.platform import LoopbackPlatform
from relay.connector.server import Connector
from statecore.gateway import Delegation, Delegations, Gateway, RoutingOrigin, SessionStore, Turn
from stores import InMemoryStore, SQLiteStore

GATEWAY_ID = "delegating-gateway"
SECRET = "delegating-example-secret"
ROUTER_EVERY_S = 30.0  # the live bot routes completions at startup and then on this cadence
WAIT_S = 15.0  # the bound on every wait in this example

# The three conversations: (chat id, chat type, user id, user name, tenant scope).
ADA = ("team-a-room", "group", "ada", "Ada", "team-a")
BO = ("bo-dm", "dm", "bo", "Bo", "team-b")
CY = ("cy-dm", "dm", "cy", "Cy", "team-a")

# -- the bot (child process) ---------------------------------------------------------------------


def say(line: str) -> None:
    """Print a line for the parent (which reads our stdout line by line)."""
    print(line, flush=True)


class DelegatingBot:
    """The bot's logic and its completion router, over one store."""

    def __init__(self, store: SQLiteStore, gateway: Gateway, adapter: RelayAdapter) -> None:
        self.sessions = SessionStore(store)
        self.delegations = Delegations(store)
        self.gateway = gateway
        self.adapter = adapter
        self.workers: set[asyncio.Task[None]] = set()

    # The store API is synchronous: every call below runs in a worker thread, off the loop.

    async def __call__(self, turn: Turn) -> None:
        """Handle one message: ``/reset``, or a command that becomes a delegation."""
        m = turn.message
        session = await asyncio.to_thread(self.sessions.current, m.session_key)
        if session is None:
            session = await asyncio.to_thread(
                self.sessions.start, m.session_key, platform=m.platform, chat_id=m.chat_id
            )
        command, _, topic = m.text.partition(" ")
        if command == "/reset":
            # A user boundary: late results pinned to the old session will be dropped.
            await asyncio.to_thread(self.sessions.end, session.session_id, "session_reset")
            await asyncio.to_thread(
                self.sessions.start, m.session_key, platform=m.platform, chat_id=m.chat_id
            )
            say(f"{m.user_id}: session reset")
            await turn.reply("Fresh start: earlier requests are forgotten.")
            return
        origin = RoutingOrigin(
            platform=m.platform,
            chat_id=m.chat_id,
            chat_type=m.chat_type,
            thread_id=m.thread_id,
            user_id=m.user_id,
            user_name=m.user_name,
            scope_id=m.scope_id,
            session_key=m.session_key,
            parent_session_id=session.session_id,  # the pin
        )
        task = command.lstrip("/")
        job = await asyncio.to_thread(
            self.delegations.dispatch, origin, {"task": task, "topic": topic}
        )
        say(f"{m.user_id}: dispatched {task} job {job[:8]} (scope {m.scope_id})")
        await turn.reply(f"On it: {task} of {topic!r} is job {job[:8]}.")
        worker = asyncio.create_task(self.work(job, task, topic))
        self.workers.add(worker)
        worker.add_done_callback(self.workers.discard)

    async def work(self, job: str, task: str, topic: str) -> None:
        """The slow work.  A summary takes a moment; research takes far longer than we live."""
        await asyncio.sleep(0.1 if task == "summarize" else 3600)
        result = {"summary": f"{topic}: revenue up 12 %, costs flat, outlook steady."}
        await asyncio.to_thread(self.delegations.complete, job, result)
        say(f"COMPLETED job {job[:8]} (result stored; the router delivers it)")

    async def recover(self) -> None:
        """At startup: jobs a dead process was running have an unknown outcome now."""
        for event in await asyncio.to_thread(self.delegations.recover_abandoned):
            job = event["delegation_id"]
            say(f"recovered job {job[:8]} of a dead process: status {event['status']}")

    async def route_completions(self) -> int:
        """Route every owed completion with the one resolver; returns how many were sent."""
        sent = 0
        for job, route, result in await self.gateway.deliver_completions(
            self.delegations, self.sessions, render
        ):
            origin = job.origin
            where = f"{origin.platform}/{origin.chat_id} (scope {origin.scope_id})"
            say(f"route {job.delegation_id[:8]} -> {where}: {route.verdict.value}, {route.reason}")
            if result is not None and result.success:
                sent += 1
        return sent

    async def router(self) -> None:
        while True:
            await asyncio.sleep(ROUTER_EVERY_S)
            await self.route_completions()


def render(job: Delegation) -> str:
    """The late message for a completion: the result, or an honest 'unknown'."""
    payload: dict[str, Any] = dict(job.payload)
    noun = {"summarize": "summary"}.get(payload["task"], payload["task"])
    name = f"{noun} of {payload['topic']!r} (job {job.delegation_id[:8]})"
    if job.status == "completed":
        return f"Your {name} is ready: {job.result['summary']}"
    return f"Your {name} was interrupted by a restart; its outcome is unknown. Please ask again."


async def run_bot(url: str, db_path: str, *, exit_after_startup: bool) -> int:
    say(f"bot pid {os.getpid()}, {'second' if exit_after_startup else 'first'} life")
    store = SQLiteStore(db_path)
    transport = WebSocketRelayTransport(
        url, "loopback", "delegating-bot", gateway_id=GATEWAY_ID, secret=SECRET
    )
    adapter = RelayAdapter(transport)
    gateway = Gateway(store)
    gateway.add_adapter("loopback", adapter)
    bot = DelegatingBot(store, gateway, adapter)
    gateway.on_message(bot)
    router: asyncio.Task[None] | None = None
    try:
        await gateway.start()
        await bot.recover()
        sent = await bot.route_completions()
        say(f"READY: startup routing sent {sent} late result(s)")
        if exit_after_startup:
            return 0
        router = asyncio.create_task(bot.router())
        await asyncio.sleep(WAIT_S)  # the parent kills us long before this ends
        say("not killed?")
        return 1
    finally:
        if router is not None:
            router.cancel()
        for worker in bot.workers:
            worker.cancel()
        await gateway.stop(budget_s=5.0)
        store.close()


# -- the parent: connector, chat, kill and restart -----------------------------------------------


class Bot:
    """A bot child process; a reader task echoes its lines (indented) and keeps them."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def spawn(cls, url: str, db_path: Path, *, second_life: bool) -> Bot:
        args = [sys.executable, __file__, "--bot", url, str(db_path)]
        if second_life:
            args.append("--exit-after-startup")
        return cls(await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE))

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode().rstrip()
            self.lines.append(line)
            print(f"    | {line}")

    async def expect(self, marker: str) -> None:
        await wait_until(lambda: any(marker in line for line in self.lines), repr(marker))

    async def finish(self) -> int:
        code = await asyncio.wait_for(self.proc.wait(), WAIT_S)
        await asyncio.wait_for(self.reader, WAIT_S)
        return code

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        self.reader.cancel()


async def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll ``predicate`` until it holds; raise ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.01)


async def write(platform: LoopbackPlatform, who: tuple[str, ...], text: str) -> None:
    """``who`` writes ``text`` and waits (bounded) for the bot's answer."""
    chat, chat_type, user, name, scope = who
    before = len(platform.texts(chat))
    print(f"  {name} ({scope}, {chat_type} {chat}) -> {text!r}")
    await platform.inject(
        chat, text, user_id=user, user_name=name, scope_id=scope, chat_type=chat_type
    )
    await wait_until(lambda: len(platform.texts(chat)) > before, f"the answer to {text!r}")


async def run_parent(workdir: Path) -> int:
    platform = LoopbackPlatform()
    connector = Connector(
        InMemoryStore(),
        secrets={GATEWAY_ID: [SECRET]},
        drivers={"loopback": platform},
        tenants={GATEWAY_ID: ["team-a", "team-b"]},  # the scopes this gateway may serve
    )
    await connector.start("127.0.0.1", 0)
    db_path = workdir / "bot.db"
    bots: list[Bot] = []
    try:
        print("1. the bot's first life takes three jobs")
        first = await Bot.spawn(connector.url, db_path, second_life=False)
        bots.append(first)
        await first.expect("READY")
        await write(platform, ADA, "/summarize the Q3 report")
        await write(platform, BO, "/research cold fusion")
        await write(platform, CY, "/research tides")
        await write(platform, CY, "/reset")
        await first.expect("COMPLETED")

        print(f"\n2. SIGKILL the bot (pid {first.proc.pid}) before its router runs")
        os.kill(first.proc.pid, signal.SIGKILL)
        code = await first.finish()
        print(f"  the bot exited with {code}: killed by SIGKILL = {code == -signal.SIGKILL}")

        print("\n3. the bot's second life: recover, route, deliver")
        second = await Bot.spawn(connector.url, db_path, second_life=True)
        bots.append(second)
        code2 = await second.finish()

        print("\n4. the chats")
        for chat, *_ in (ADA, BO, CY):
            for message in platform.transcript.get(chat, []):
                print(f"  {chat:<12} [{message.sender}] {message.text}")
        late = [s for s in platform.sent if s.content is not None and s.content.startswith("Your ")]
        for sent in late:
            scope = sent.metadata.get("scope_id")
            print(f"  late result to {sent.chat_id} carried scope_id={scope}")
        ok = (
            code == -signal.SIGKILL
            and code2 == 0
            and sorted(s.chat_id for s in late) == ["bo-dm", "team-a-room"]
            and any("is ready" in text for text in platform.texts(ADA[0]))
            and all(s.metadata.get("scope_id") is not None for s in late)
        )
        print(f"\nlate results delivered to the right chats: {ok}")
        return 0 if ok else 1
    finally:
        for bot in bots:
            bot.kill()
        await connector.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description="A delegating bot that survives a restart.")
    parser.add_argument("--bot", nargs=2, metavar=("URL", "DB"), help="run as the bot process")
    parser.add_argument("--exit-after-startup", action="store_true", help="the second life")
    args = parser.parse_args()
    if args.bot is not None:
        url, db_path = args.bot
        return asyncio.run(run_bot(url, db_path, exit_after_startup=args.exit_after_startup))
    with tempfile.TemporaryDirectory(prefix="statecore-delegating-") as tmp:
        return asyncio.run(run_parent(Path(tmp)))


if __name__ == "__main__":
    raise SystemExit(main())

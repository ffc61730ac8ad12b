"""The inbound half of the Discord driver: the gateway connection, and the cursor rule.

One connection: HELLO gives the heartbeat interval; the first heartbeat goes after
``interval * random()``, then one every interval, each carrying the last seq taken; a heartbeat
whose ACK has not come when the next is due means a zombied connection: it is closed (a code
that keeps the session) and the driver resumes.  With a stored session the driver sends RESUME
(``session_id`` and the stored ``seq``) to the session's ``resume_gateway_url``, else IDENTIFY
(the intents GUILDS, GUILD_MESSAGES, DIRECT_MESSAGES, MESSAGE_CONTENT).

**The cursor** is the seq of the last dispatch taken, kept with the session as the connector's
note ``gateway_session``.  A reader task reads every frame at once (ACKs and heartbeat requests
are answered there, so a slow intake never looks like a zombie); dispatches go, in order, to
one worker that hands each message to the connector's intake and only when that returned (or
the dispatch was recorded as rejected, or passed over) moves the seq -- saved at once after a
message, and otherwise when the worker has nothing left to do.  A dispatch whose seq is not
above the one taken (a duplicate, a replay) is skipped.  When the connection ends, the worker
finishes what it received before the driver resumes from the seq it saved, so Discord replays
exactly what was not taken.  An intake that refuses (``IntakeFull``, a failing store) is asked
again, with backoff, without moving the seq.

INVALID_SESSION ``d=true``: resume after a wait of 1 to 5 s; ``d=false`` (and close codes 4007,
4009): the session is gone, the driver identifies anew, and what happened since its last seq
is lost (Discord does not keep it).  RECONNECT: close and resume.  Close code 4004 (a bad
token), 4013 and 4014 (intents) raise :class:`~relay.discord._api.DiscordAuthError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, Final

import aiohttp
import attrs

from relay.connector.intake import DriverIntake
from relay.discord._api import DiscordApi, DiscordAuthError, DiscordError, DiscordUnreachable
from relay.discord._events import Channels, Message, Rejected, classify, raw_text
from relay.wire.frames import InboundEvent
from relay.wire.throttle import LogLimits
from statecore.clock import Clock

__all__ = [
    "INTENTS",
    "NOTE_SESSION",
    "NOTE_USER",
    "ConnectionEnded",
    "GatewayClient",
    "SessionNote",
    "describe",
]

log = logging.getLogger("relay.discord")

NOTE_SESSION: Final = "gateway_session"
NOTE_USER: Final = "user_id"
INTENTS: Final = (1 << 0) | (1 << 9) | (1 << 12) | (1 << 15)
"""GUILDS, GUILD_MESSAGES, DIRECT_MESSAGES, MESSAGE_CONTENT (a privileged intent: enable it for
the bot in the developer portal, or guild messages arrive without their content)."""
_FATAL_CLOSES: Final = {
    4004: "Discord refused the bot's token (close 4004)",
    4010: "Discord refused the shard (close 4010)",
    4011: "the bot needs sharding (close 4011)",
    4012: "Discord refused the API version (close 4012)",
    4013: "Discord refused the intents (close 4013)",
    4014: (
        "the bot may not use an intent it asked for (close 4014): enable MESSAGE CONTENT "
        "INTENT for the bot in the developer portal"
    ),
}
_NEW_SESSION_CLOSES: Final = frozenset((4007, 4009))
_RETRY_S: Final = (0.25, 0.5, 1.0, 2.0, 5.0)
_KEEP_SESSION_CLOSE: Final = 4000
"""The code the driver closes with when it means to resume (1000/1001 would end the session)."""


@attrs.frozen
class SessionNote:
    """The session to resume and the seq taken: the driver's cursor."""

    session_id: str
    resume_url: str
    seq: int

    def text(self) -> str:
        """As the note's text."""
        return json.dumps(
            {"session_id": self.session_id, "resume_url": self.resume_url, "seq": self.seq}
        )

    @classmethod
    def read(cls, text: str | None) -> SessionNote | None:
        """The note read back; None when absent or unreadable."""
        try:
            obj = json.loads(text) if text else None
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        sid, url, seq = obj.get("session_id"), obj.get("resume_url"), obj.get("seq")
        if isinstance(sid, str) and isinstance(url, str) and isinstance(seq, int):
            return cls(sid, url, seq)
        return None


class ConnectionEnded(Exception):
    """How one connection ended: ``new_session`` when the stored session is gone."""

    def __init__(self, why: str, *, new_session: bool = False, wait_s: float = 0.0) -> None:
        super().__init__(why)
        self.new_session = new_session
        self.wait_s = wait_s


class GatewayClient:
    """One bot's gateway connections, one after the other (see the module docs)."""

    def __init__(
        self,
        api: DiscordApi,
        *,
        platform: str,
        intake: Callable[[], DriverIntake],
        to_event: Callable[[Message], Awaitable[InboundEvent]],
        channels: Channels,
        clock: Clock,
        intents: int = INTENTS,
        invalid_wait_s: tuple[float, float] = (1.0, 5.0),
        queue_max: int = 10_000,
    ) -> None:
        self._api = api
        self._platform = platform
        self._intake = intake
        self._to_event = to_event
        self._channels = channels
        self._clock = clock
        self._intents = intents
        self._invalid_wait_s = invalid_wait_s
        self._queue_max = queue_max
        self._log_limits = LogLimits(clock=clock)
        self._rng = random.Random()
        self.me: str | None = None
        self.session: SessionNote | None = None
        self.seq = 0
        """The seq of the last dispatch taken in the current session."""
        self.gateway_url: str | None = None
        self.went_live = False
        """Whether the last connection reached a live session (READY or RESUMED)."""
        self.connected = asyncio.Event()
        """Set while a session is live (READY or RESUMED seen)."""
        self.taken = 0
        self.rejected = 0
        self.skipped = 0
        """Dispatches not taken again (their seq was already taken)."""
        self.identifies = 0
        self.resumes = 0
        self.zombies = 0
        self.invalid_sessions = 0
        self.lost_sessions = 0
        """Sessions Discord would not resume: what came after their seq is gone."""

    # -- one connection ------------------------------------------------------------------------

    async def connect_once(self) -> None:
        """Connect, identify or resume, and serve until the connection ends; what was received
        is taken before this returns.  Raises :class:`DiscordAuthError` (fatal close codes),
        ``ConnectionEnded`` (a reconnect is wanted), or what the connection failed with."""
        self.went_live = False
        if self.session is None:
            self.session = SessionNote.read(await self._intake().load(self._platform, NOTE_SESSION))
            self.seq = self.session.seq if self.session else 0
        if self.session is not None:
            url = self.session.resume_url
        else:
            if self.gateway_url is None:
                answer = await self._api.request("GET", "/gateway/bot", route="GET /gateway/bot")
                found = answer.get("url") if isinstance(answer, dict) else None
                if not isinstance(found, str) or not found.startswith(("ws://", "wss://")):
                    raise DiscordUnreachable("GET /gateway/bot: no gateway url in the answer")
                self.gateway_url = found
            url = self.gateway_url
        ws = await self._api.session.ws_connect(
            _with_query(url),
            autoping=True,
            heartbeat=None,
            max_msg_size=16 * 1024 * 1024,
            timeout=aiohttp.ClientWSTimeout(ws_close=3.0),
        )
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        worker = asyncio.create_task(self._work(queue), name="discord-gateway-worker")
        try:
            await self._serve(ws, queue)
        finally:
            self.connected.clear()
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                worker.cancel()  # the driver stops: what is not taken is replayed next time
            with contextlib.suppress(Exception):
                await ws.close(code=_KEEP_SESSION_CLOSE)
            queue.put_nowait(None)
            # Everything received is taken (or refused) before a resume.
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            if worker.cancelled() and current is not None and current.cancelling():
                raise asyncio.CancelledError

    async def _serve(
        self, ws: aiohttp.ClientWebSocketResponse, queue: asyncio.Queue[dict[str, Any] | None]
    ) -> None:
        hello = await ws.receive(timeout=30.0)
        payload = _payload(hello.data) if hello.type == aiohttp.WSMsgType.TEXT else None
        data = payload.get("d") if payload else None
        interval = data.get("heartbeat_interval") if isinstance(data, dict) else None
        if payload is None or payload.get("op") != 10 or not isinstance(interval, int | float):
            raise ConnectionEnded(f"no HELLO from the gateway ({_close_text(ws, hello)})")
        acked = [True]
        beat = asyncio.create_task(self._heartbeat(ws, interval / 1000, acked))
        try:
            if self.session is not None:
                self.resumes += 1
                resume = {
                    "token": self._api.token,
                    "session_id": self.session.session_id,
                    "seq": self.seq,
                }
                await ws.send_json({"op": 6, "d": resume})
            else:
                self.identifies += 1
                self.seq = 0
                await ws.send_json({"op": 2, "d": identify(self._api.token, self._intents)})
            await self._read(ws, queue, acked)
        finally:
            beat.cancel()
            with contextlib.suppress(BaseException):
                await beat

    async def _heartbeat(
        self, ws: aiohttp.ClientWebSocketResponse, interval_s: float, acked: list[bool]
    ) -> None:
        await asyncio.sleep(interval_s * self._rng.random())
        while not ws.closed:
            if not acked[0]:
                self.zombies += 1
                self._warn(
                    "zombie",
                    "discord: no HEARTBEAT_ACK: the connection is a zombie; resuming on a new one",
                )
                await ws.close(code=_KEEP_SESSION_CLOSE)
                return
            acked[0] = False
            await ws.send_json({"op": 1, "d": self.seq or None})
            await asyncio.sleep(interval_s)

    async def _read(
        self,
        ws: aiohttp.ClientWebSocketResponse,
        queue: asyncio.Queue[dict[str, Any] | None],
        acked: list[bool],
    ) -> None:
        while True:
            message = await ws.receive()
            if message.type != aiohttp.WSMsgType.TEXT:
                raise closed_error(ws, message)
            payload = _payload(message.data)
            if payload is None:
                queue.put_nowait({"op": -1, "raw": str(message.data)[:16_384]})
                continue
            op = payload.get("op")
            if op == 11:
                acked[0] = True
            elif op == 1:
                await ws.send_json({"op": 1, "d": self.seq or None})
            elif op == 0:
                if queue.qsize() >= self._queue_max:
                    raise ConnectionEnded("the intake is far behind the gateway; resuming later")
                queue.put_nowait(payload)
            elif op == 7:
                raise ConnectionEnded("Discord asked to reconnect (op 7)")
            elif op == 9:
                self.invalid_sessions += 1
                wait = self._rng.uniform(*self._invalid_wait_s)
                raise ConnectionEnded(
                    "INVALID_SESSION", new_session=payload.get("d") is not True, wait_s=wait
                )
            else:
                queue.put_nowait({"op": -1, "raw": raw_text(payload)})

    # -- the worker: the cursor rule -----------------------------------------------------------

    async def _work(self, queue: asyncio.Queue[dict[str, Any] | None]) -> None:
        dirty = False
        while True:
            payload = await queue.get()
            if payload is None:
                break
            moved, urgent = await self._take(payload)
            dirty = dirty or moved
            if dirty and (urgent or queue.empty()):
                await self._stubborn(self._save)
                dirty = False
        if dirty:
            await self._stubborn(self._save)

    async def _take(self, payload: dict[str, Any]) -> tuple[bool, bool]:
        """Take one received frame; (the seq moved, save it now)."""
        if payload.get("op") == -1:
            raw = str(payload.get("raw"))
            await self._stubborn(
                lambda: self._reject(
                    None, "a gateway payload that is not a JSON object with an op", raw
                )
            )
            return False, False
        seq, event, data = payload.get("s"), payload.get("t"), payload.get("d")
        if isinstance(seq, int) and not isinstance(seq, bool):
            if seq <= self.seq and event not in ("READY", "RESUMED"):
                self.skipped += 1
                return False, False
        else:
            seq = None
        if not isinstance(event, str):
            event = ""
        if event == "READY":
            self._ready(data)
        elif event == "RESUMED":
            self.went_live = True
            self.connected.set()
            log.info("discord: resumed session at seq %d", self.seq)
        self._channels.note_dispatch(event, data)
        found = classify(event, data, payload, me=self.me)
        if isinstance(found, Rejected):
            await self._stubborn(lambda: self._reject(found.event_id, found.reason, found.raw))
        elif isinstance(found, Message):
            await self._stubborn(lambda: self._deliver(found))
        if seq is not None:
            self.seq = max(self.seq, seq)
        urgent = found is not None or event in ("READY", "RESUMED")
        return seq is not None, urgent

    def _ready(self, data: object) -> None:
        if not isinstance(data, dict):
            return
        sid, url, user = data.get("session_id"), data.get("resume_gateway_url"), data.get("user")
        if isinstance(user, dict) and isinstance(user.get("id"), str):
            self.me = user["id"]
        if isinstance(sid, str) and isinstance(url, str):
            self.session = SessionNote(sid, url, 0)
        self.went_live = True
        self.connected.set()
        log.info("discord: a new gateway session (READY)")

    async def _deliver(self, message: Message) -> None:
        try:
            event = await self._to_event(message)
        except (TypeError, ValueError) as exc:
            await self._reject(
                message.event_id,
                f"a message that cannot be mapped: {exc}",
                raw_text(attrs.asdict(message)),
            )
            return
        await self._intake()(self._platform, event)
        self.taken += 1

    async def _reject(self, event_id: str | None, reason: str, raw: str) -> None:
        await self._intake().reject(self._platform, raw, reason, event_id=event_id)
        self.rejected += 1

    async def _save(self) -> None:
        if self.session is None:
            return
        self.session = attrs.evolve(self.session, seq=self.seq)
        await self._intake().save(self._platform, NOTE_SESSION, self.session.text())

    async def _stubborn(self, step: Callable[[], Awaitable[None]]) -> None:
        """Run ``step`` until it succeeds: the connector could not take it now (the seq stays
        where it is meanwhile); cancelled only by the driver's stop."""
        failures = 0
        while True:
            try:
                await step()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = _RETRY_S[min(failures, len(_RETRY_S) - 1)]
                failures += 1
                self._warn(
                    "intake",
                    f"discord: the connector cannot take a dispatch now "
                    f"({type(exc).__name__}: {str(exc)[:200]}); the seq stays at "
                    f"{self.seq}, asking again in {delay:g} s",
                )
                await self._clock.sleep(delay)

    async def forget_session(self) -> None:
        """The session cannot be resumed: forget it (the next connection identifies)."""
        if self.session is not None:
            self.lost_sessions += 1
            self._warn(
                "lost",
                f"discord: the gateway session is gone; what happened after "
                f"seq {self.seq} is lost (Discord does not replay it to a new session)",
            )
        self.session = None
        self.seq = 0
        await self._intake().save(self._platform, NOTE_SESSION, "")

    def _warn(self, kind: str, line: str) -> None:
        more = self._log_limits.check(log, logging.WARNING, kind)
        if more is not None:
            log.warning("%s%s", line, more)


def identify(token: str, intents: int) -> dict[str, Any]:
    """The IDENTIFY payload's data."""
    return {
        "token": token,
        "intents": intents,
        "properties": {"os": "linux", "browser": "statecore", "device": "statecore"},
    }


def closed_error(ws: aiohttp.ClientWebSocketResponse, message: aiohttp.WSMessage) -> Exception:
    """What a closed connection means: a fatal refusal, or a reconnect (anew for 4007/4009)."""
    code = ws.close_code
    if message.type == aiohttp.WSMsgType.CLOSE and isinstance(message.data, int):
        code = message.data
    if code in _FATAL_CLOSES:
        return DiscordAuthError(_FATAL_CLOSES[code])
    return ConnectionEnded(
        f"the gateway closed the connection ({_close_text(ws, message)})",
        new_session=code in _NEW_SESSION_CLOSES,
    )


def _payload(data: object) -> dict[str, Any] | None:
    if not isinstance(data, str):
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) and "op" in value else None


def _with_query(url: str) -> str:
    base = url.split("?", 1)[0]
    return base + "?v=10&encoding=json"


def _close_text(ws: aiohttp.ClientWebSocketResponse, message: aiohttp.WSMessage) -> str:
    code = message.data if isinstance(message.data, int) else ws.close_code
    return f"close code {code}" if code is not None else f"{message.type.name.lower()}"


def describe(exc: BaseException) -> str:
    """A failed connection's cause, for one log line."""
    if isinstance(exc, DiscordError | DiscordUnreachable | ConnectionEnded):
        return str(exc)[:300]
    return f"{type(exc).__name__}: {str(exc)[:300]}"

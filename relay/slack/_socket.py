"""Socket Mode: the driver's WebSocket connections to Slack, on aiohttp.

``apps.connections.open`` (with the app-level token) gives a single-use ``wss://`` URL; the
driver keeps ``connections`` of them open (Slack allows 10 per app and sends each event on any
one).  On each connection:

* ``hello``: the connection is live;
* ``events_api``: offered to the connector (:class:`~relay.slack._take.Taker`); the envelope ack
  ``{"envelope_id": ...}`` is sent on the same connection only when the taker says so, within
  Slack's 3 s window; otherwise nothing is sent and Slack delivers the event again;
* ``disconnect`` (``refresh_requested``, ``warning``, ``too_many_websockets``): a replacement
  is opened at once while the old connection stays open for the acks still owed on it, until
  Slack closes it (or ``drain_s`` has passed); ``link_disabled`` (Socket Mode switched off for
  the app): logged as an error, and opening is retried slowly;
* other envelopes (slash commands, interactivity) are acked and passed over (this driver speaks
  messages); a frame that is not JSON, or an ``events_api`` without an envelope id, is recorded
  as rejected with its raw text.

``slack_sdk``'s ``SocketModeClient`` is not used: on a ``disconnect`` it closes the old
connection before it opens the new one, and sends the acks still owed on whichever connection
is current (measured against the fake: the envelope in the intake during a refresh was acked on
the new connection, not taken as acked, and delivered again).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any, Final

import aiohttp

from relay.connector.intake import DriverIntake
from relay.slack._api import SlackError, SlackUnreachable, WebApi
from relay.slack._events import Frame, Rejected, read_frame
from relay.slack._take import Taker
from relay.wire.throttle import LogLimits
from statecore.clock import Clock

__all__ = ["SocketMode"]

log = logging.getLogger("relay.slack")

_BACKOFF_S: Final = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
_DISABLED_WAIT_S: Final = 60.0


class SocketMode:
    """Keeps ``connections`` Socket Mode connections open (see the module docs)."""

    def __init__(
        self,
        app_api: WebApi,
        *,
        platform: str,
        taker: Taker,
        intake: Callable[[], DriverIntake],
        connections: int,
        clock: Clock,
        drain_s: float = 15.0,
        heartbeat_s: float = 20.0,
    ) -> None:
        self._api = app_api
        self._platform = platform
        self._taker = taker
        self._intake = intake
        self._wanted = connections
        self._clock = clock
        self._drain_s = drain_s
        self._heartbeat_s = heartbeat_s
        self._session: aiohttp.ClientSession | None = None
        self._links: set[asyncio.Task[None]] = set()
        self._live = 0
        """Connections opening or open that were not told to disconnect."""
        self._changed = asyncio.Event()
        self._log_limits = LogLimits(clock=clock)
        self.hellos = 0
        """Connections that said hello."""
        self.disconnects: list[str] = []
        """The reasons of every ``disconnect`` received."""
        self.acks = 0

    async def run(self) -> None:
        """Keep the connections open until cancelled."""
        self._session = aiohttp.ClientSession(trust_env=False)
        failures = 0
        try:
            while True:
                while self._live < self._wanted:
                    self._live += 1
                    task = asyncio.get_running_loop().create_task(self._link())
                    self._links.add(task)
                    task.add_done_callback(self._links.discard)
                self._changed.clear()
                await self._changed.wait()
                failures = failures + 1 if self._failed else 0
                if self._failed:
                    self._failed = False
                    await self._clock.sleep(self._backoff(failures))
        finally:
            for task in list(self._links):
                task.cancel()
            if self._links:
                await asyncio.wait(set(self._links), timeout=5.0)
            await self._session.close()

    _failed = False
    _disabled = False

    def _backoff(self, failures: int) -> float:
        if self._disabled:
            return _DISABLED_WAIT_S
        return _BACKOFF_S[min(failures - 1, len(_BACKOFF_S) - 1)]

    def _gone(self, *, live: bool, failed: bool) -> None:
        if live:
            self._live -= 1
        self._failed = self._failed or failed
        self._changed.set()

    async def _link(self) -> None:
        live, failed = True, True
        try:
            url = await self._open_url()
            if url is None:
                return
            assert self._session is not None
            async with self._session.ws_connect(url, heartbeat=self._heartbeat_s) as ws:
                live, failed = await self._read(ws, live)
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._warn(
                "connect",
                f"slack: a Socket Mode connection failed ({type(exc).__name__}: {str(exc)[:200]})",
            )
        finally:
            self._gone(live=live, failed=failed)

    async def _open_url(self) -> str | None:
        try:
            answer = await self._api.call("apps.connections.open")
        except (SlackError, SlackUnreachable) as exc:
            self._disabled = isinstance(exc, SlackError) and exc.auth
            self._warn("open", f"slack: apps.connections.open failed: {exc}")
            return None
        url = answer.get("url")
        if not isinstance(url, str) or not url.startswith(("wss://", "ws://")):
            self._warn("open", "slack: apps.connections.open gave no WebSocket URL")
            return None
        self._disabled = False
        return url

    async def _read(self, ws: aiohttp.ClientWebSocketResponse, live: bool) -> tuple[bool, bool]:
        """Serve one connection until it closes; (still counted live, failed before hello)."""
        said_hello = False
        drain_timer: asyncio.TimerHandle | None = None
        acks: set[asyncio.Task[None]] = set()
        try:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    continue
                received = self._clock.monotonic()
                frame = read_frame(message.data)
                if isinstance(frame, Rejected):
                    await self._reject(frame)
                    continue
                if frame.type == "hello":
                    said_hello = True
                    self.hellos += 1
                elif frame.type == "disconnect":
                    self.disconnects.append(frame.reason or "")
                    if frame.reason == "link_disabled":
                        self._disabled = True
                        log.error("slack: Socket Mode is switched off for the app (link_disabled)")
                    if live:
                        live = False
                        self._gone(live=True, failed=frame.reason == "link_disabled")
                    if drain_timer is None:
                        drain_timer = asyncio.get_running_loop().call_later(
                            self._drain_s, lambda: asyncio.ensure_future(ws.close())
                        )
                elif frame.type == "events_api":
                    if frame.envelope_id is None:
                        await self._reject(
                            Rejected(
                                None,
                                "an events_api envelope without an envelope_id",
                                message.data[:16_384],
                            )
                        )
                        continue
                    task = asyncio.get_running_loop().create_task(self._take(ws, frame, received))
                    acks.add(task)
                    task.add_done_callback(acks.discard)
                elif frame.envelope_id is not None:
                    await self._ack(ws, frame.envelope_id)  # slash commands, interactivity
        finally:
            if drain_timer is not None:
                drain_timer.cancel()
            for task in acks:
                task.cancel()
        return live, not said_hello

    async def _take(
        self, ws: aiohttp.ClientWebSocketResponse, frame: Frame, received: float
    ) -> None:
        assert frame.envelope_id is not None
        if await self._taker.take(frame.payload, received_at=received):
            await self._ack(ws, frame.envelope_id)

    async def _ack(self, ws: aiohttp.ClientWebSocketResponse, envelope_id: str) -> None:
        if ws.closed:
            return
        with contextlib.suppress(ConnectionError, RuntimeError, aiohttp.ClientError):
            await ws.send_str(json.dumps({"envelope_id": envelope_id}))
            self.acks += 1

    async def _reject(self, rejected: Rejected) -> None:
        try:
            await self._intake().reject(
                self._platform, rejected.raw, rejected.reason, event_id=rejected.event_id
            )
            self._taker.rejected += 1
        except Exception as exc:  # a frame nobody can ack: logged, never fatal
            self._warn(
                "reject", f"slack: a rejected frame could not be recorded ({type(exc).__name__})"
            )

    def _warn(self, kind: str, line: str) -> None:
        more = self._log_limits.check(log, logging.WARNING, kind)
        if more is not None:
            log.warning("%s%s", line, more)

    def state(self) -> dict[str, Any]:
        """Counts for operators (connections live, hellos, disconnects, acks)."""
        return {
            "live": self._live,
            "hellos": self.hellos,
            "disconnects": list(self.disconnects),
            "acks": self.acks,
        }

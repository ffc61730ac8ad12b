"""The inbound half of the Matrix driver: ``/sync`` long polls, and the cursor rule.

One round: ask ``/sync`` from the stored token; check the answer (:mod:`relay.matrix._events`);
join the rooms the bot is invited to (when configured to); fill a timeline gap the server
reported (``limited``) from ``/messages`` back to the token; hand every event of every room to
the connector's intake, each room in order (rooms side by side); and only when all of that
returned, save ``next_batch`` as the connector's note.  Anything that fails in a round (the
server, the intake, the store) leaves the token where it was: the next round asks again from
there, and the connector recognises the events it already took by their event ids.

The very first round of a bot (no token stored) does not answer history: it takes the server's
current position (joining pending invites) unless ``backlog_on_first_start`` is set.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from relay.connector.intake import DriverIntake
from relay.matrix._api import MatrixApi, MatrixError, path
from relay.matrix._events import (
    Message,
    Rejected,
    RoomBatch,
    SyncBatch,
    classify,
    read_sync,
)
from relay.matrix._session import NOTE_NEXT_BATCH
from relay.wire.frames import EventSource, InboundEvent
from relay.wire.logtext import peer_text

__all__ = ["Rooms", "SyncRound", "describe", "sync_filter"]

log = logging.getLogger("relay.matrix")

_BACKFILL_PAGES = 50
"""Pages of ``/messages`` read at most to fill one room's gap (100 events each)."""


def sync_filter(timeline_limit: int) -> str:
    """The inline filter of every sync: timelines, member state lazily, no presence."""
    return json.dumps(
        {
            "presence": {"types": []},
            "account_data": {"types": ["m.direct"]},
            "room": {
                "timeline": {"limit": timeline_limit},
                "state": {"lazy_load_members": True},
                "ephemeral": {"types": []},
                "account_data": {"types": []},
            },
        },
        separators=(",", ":"),
    )


class Rooms:
    """What the driver knows of its rooms: member counts (DM or group) and display names."""

    def __init__(self) -> None:
        self.members: dict[str, int] = {}
        self.direct: set[str] = set()
        self.names: dict[tuple[str, str], str] = {}

    def forget(self, room_id: str) -> None:
        """The bot left ``room_id``: nothing kept of it."""
        self.members.pop(room_id, None)
        self.direct.discard(room_id)
        for key in [k for k in self.names if k[0] == room_id]:
            del self.names[key]

    def note_state(self, room_id: str, events: tuple[Any, ...]) -> None:
        """Read member events: a change of membership makes the count unknown again."""
        for event in events:
            if not (isinstance(event, dict) and event.get("type") == "m.room.member"):
                continue
            self.members.pop(room_id, None)
            user, content = event.get("state_key"), event.get("content")
            if isinstance(user, str) and isinstance(content, dict):
                name = content.get("displayname")
                if isinstance(name, str) and name:
                    self.names[(room_id, user)] = name[:200]


class SyncRound:
    """Runs sync rounds for one driver (see the module docs)."""

    def __init__(
        self,
        api: MatrixApi,
        *,
        platform: str,
        me: str,
        intake: Callable[[], DriverIntake],
        rooms: Rooms,
        auto_join: bool,
        sync_timeout_ms: int,
        timeline_limit: int,
    ) -> None:
        self._api = api
        self._platform = platform
        self._me = me
        self._intake = intake
        self.rooms = rooms
        self._auto_join = auto_join
        self._sync_timeout_ms = sync_timeout_ms
        self._filter = sync_filter(timeline_limit)
        self.taken = 0
        """Events handed to the intake (copies the connector recognised included)."""
        self.rejected = 0
        """Events recorded as rejected."""

    async def fetch(self, since: str | None, *, timeout_ms: int | None = None) -> SyncBatch:
        """One ``/sync`` from ``since``; raises ``MatrixError``, ``MatrixUnreachable`` or
        ``MalformedSync``."""
        wait_ms = self._sync_timeout_ms if timeout_ms is None else timeout_ms
        query = {"timeout": str(wait_ms), "filter": self._filter, "set_presence": "offline"}
        if since is not None:
            query["since"] = since
        body = await self._api.request(
            "GET", path("sync"), query=query, timeout_s=wait_ms / 1000 + 30.0
        )
        return read_sync(body, me=self._me)

    async def first(self, *, backlog: bool) -> str:
        """The first round of a bot with no stored token; returns the token saved."""
        batch = await self.fetch(None, timeout_ms=0)
        await self._join(batch)
        if backlog:
            await self._take_rooms(batch, None)
        await self._intake().save(self._platform, NOTE_NEXT_BATCH, batch.next_batch)
        return batch.next_batch

    async def run(self, since: str) -> str:
        """One round from ``since``; returns the token now stored (``since`` when unchanged).
        Raises whatever stopped it before the token moved."""
        batch = await self.fetch(since)
        await self._join(batch)
        for room_id in batch.left:
            self.rooms.forget(room_id)
        if batch.direct_rooms is not None:
            self.rooms.direct = set(batch.direct_rooms)
        await self._take_rooms(batch, since)
        if batch.next_batch != since:
            await self._intake().save(self._platform, NOTE_NEXT_BATCH, batch.next_batch)
        return batch.next_batch

    async def _join(self, batch: SyncBatch) -> None:
        for room_id, direct in batch.invites:
            if not self._auto_join:
                continue
            try:
                await self._api.request("POST", path("join", room_id), body={})
            except MatrixError as exc:
                if exc.transient:
                    raise  # the invite is offered again from the same token
                log.warning("matrix: could not join %s (invited): %s", peer_text(room_id), exc)
                continue
            if direct:
                self.rooms.direct.add(room_id)
            log.info("matrix: joined %s (invited)", peer_text(room_id))

    async def _take_rooms(self, batch: SyncBatch, since: str | None) -> None:
        rooms = [room for room in batch.rooms if room.events or room.limited]
        outcomes = await asyncio.gather(
            *(self._take_room(room, since) for room in rooms), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _take_room(self, room: RoomBatch, since: str | None) -> None:
        self.rooms.note_state(room.room_id, room.state_events)
        if room.joined_members is not None:
            self.rooms.members[room.room_id] = room.joined_members
        events = list(room.events)
        if room.limited and room.prev_batch and since is not None:
            events = await self._gap(room.room_id, room.prev_batch, since) + events
        intake = self._intake()
        for event in events:
            if isinstance(event, dict) and event.get("type") == "m.room.member":
                self.rooms.note_state(room.room_id, (event,))
            seen = classify(event, room.room_id, me=self._me)
            if isinstance(seen, Rejected):
                await intake.reject(self._platform, seen.raw, seen.reason, event_id=seen.event_id)
                self.rejected += 1
            elif isinstance(seen, Message):
                await intake(self._platform, await self._inbound(seen))
                self.taken += 1

    async def _gap(self, room_id: str, prev_batch: str, since: str) -> list[Any]:
        """The events the server left out of a ``limited`` timeline, oldest first."""
        found: list[Any] = []
        token: str | None = prev_batch
        for _ in range(_BACKFILL_PAGES):
            if token is None:
                break
            page = await self._api.request(
                "GET",
                path("rooms", room_id, "messages"),
                query={"from": token, "to": since, "dir": "b", "limit": "100"},
            )
            chunk = page.get("chunk")
            if not isinstance(chunk, list) or not chunk:
                break
            found.extend(chunk)
            end = page.get("end")
            token = end if isinstance(end, str) and end != token else None
        else:
            log.warning(
                "matrix: the gap in %s is longer than %d pages; the older part is not read",
                peer_text(room_id),
                _BACKFILL_PAGES,
            )
        found.reverse()
        return found

    async def _inbound(self, message: Message) -> InboundEvent:
        room = message.room_id
        return InboundEvent(
            text=message.text,
            message_type=message.message_type,
            message_id=message.event_id,
            reply_to_message_id=message.reply_to,
            media_urls=message.media_urls,
            source=EventSource(
                platform=self._platform,
                chat_id=room,
                chat_type="dm" if await self._is_direct(room) else "group",
                user_id=message.sender,
                user_name=self.rooms.names.get((room, message.sender)),
                thread_id=message.thread_id,
            ),
        )

    async def _is_direct(self, room_id: str) -> bool:
        """A room is a direct chat when ``m.direct`` says so or it has two members."""
        if room_id in self.rooms.direct:
            return True
        count = self.rooms.members.get(room_id)
        if count is None:
            answer = await self._api.request("GET", path("rooms", room_id, "joined_members"))
            joined = answer.get("joined")
            count = len(joined) if isinstance(joined, dict) else 0
            self.rooms.members[room_id] = count
        return count <= 2


def describe(exc: BaseException) -> str:
    """A failed round's cause, for one log line (no traceback: it may quote the server)."""
    if isinstance(exc, MatrixError | ValueError):
        return str(exc)[:300]
    return f"{type(exc).__name__}: {str(exc)[:300]}"

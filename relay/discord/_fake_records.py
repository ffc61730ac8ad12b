"""The records behind :mod:`relay.discord.testing`: messages, channels, requests, faults and
rate-limit buckets as the fake keeps them, and how a REST path maps to its route template."""

from __future__ import annotations

import datetime
from typing import Any, Final

import attrs
from aiohttp import web

__all__ = [
    "DM",
    "EDIT_ROUTE",
    "GUILD_TEXT",
    "MAX_CONTENT",
    "PUBLIC_THREAD",
    "SEND_ROUTE",
    "TYPING_ROUTE",
    "Bucket",
    "Channel",
    "FakeMessage",
    "Fault",
    "RecordedRequest",
    "Req",
    "form_error",
    "now_iso",
    "route_of",
]

SEND_ROUTE: Final = "POST /channels/{channel_id}/messages"
EDIT_ROUTE: Final = "PATCH /channels/{channel_id}/messages/{message_id}"
TYPING_ROUTE: Final = "POST /channels/{channel_id}/typing"
MAX_CONTENT: Final = 2000
DM, GUILD_TEXT, PUBLIC_THREAD = 1, 0, 11


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


@attrs.define(eq=False)
class FakeMessage:
    """One message as its channel shows it (edits applied)."""

    id: str
    channel_id: str
    author_id: str
    author_name: str
    content: str
    bot: bool
    guild_id: str | None = None
    reply_to: str | None = None
    nonce: str | int | None = None
    timestamp: str = attrs.field(factory=now_iso)
    edited_timestamp: str | None = None

    @property
    def edited(self) -> bool:
        """Whether the message was edited since it was made."""
        return self.edited_timestamp is not None

    def to_json(self) -> dict[str, Any]:
        """The message object of the API."""
        body: dict[str, Any] = {
            "id": self.id,
            "channel_id": self.channel_id,
            "author": {
                "id": self.author_id,
                "username": self.author_name,
                "global_name": self.author_name,
                "discriminator": "0",
                **({"bot": True} if self.bot else {}),
            },
            "content": self.content,
            "timestamp": self.timestamp,
            "edited_timestamp": self.edited_timestamp,
            "tts": False,
            "mention_everyone": False,
            "mentions": [],
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "pinned": False,
            "type": 19 if self.reply_to else 0,
        }
        if self.nonce is not None:
            body["nonce"] = self.nonce
        if self.reply_to is not None:
            body["message_reference"] = {
                "type": 0,
                "message_id": self.reply_to,
                "channel_id": self.channel_id,
                **({"guild_id": self.guild_id} if self.guild_id else {}),
            }
        return body


@attrs.define(eq=False)
class Channel:
    id: str
    type: int
    guild_id: str | None
    parent_id: str | None
    messages: list[FakeMessage] = attrs.field(factory=list)
    forbidden: bool = False

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "type": self.type, "name": f"channel-{self.id}"}
        if self.guild_id is not None:
            body["guild_id"] = self.guild_id
        if self.parent_id is not None:
            body["parent_id"] = self.parent_id
        return body


@attrs.frozen
class RecordedRequest:
    """One REST request the fake received (its route template, path and JSON body)."""

    method: str
    route: str
    path: str
    body: Any
    status: int


@attrs.define
class Fault:
    kind: str
    route: str | None
    count: int
    retry_after: float = 0.0
    is_global: bool = False
    status: int = 500


@attrs.define
class Req:
    request: web.Request
    route: str
    path: str
    body: Any


@attrs.define
class Bucket:
    remaining: int
    reset_at: float


def route_of(method: str, parts: list[str]) -> tuple[str, dict[str, str]]:
    """The route template of a path (``POST /channels/{channel_id}/messages``) and its ids."""
    if parts[:1] == ["channels"] and len(parts) >= 2:
        params = {"channel_id": parts[1]}
        rest = parts[2:]
        if rest == ["messages"]:
            return f"{method} /channels/{{channel_id}}/messages", params
        if len(rest) == 2 and rest[0] == "messages":
            params["message_id"] = rest[1]
            return f"{method} /channels/{{channel_id}}/messages/{{message_id}}", params
        if rest == ["typing"]:
            return f"{method} /channels/{{channel_id}}/typing", params
        if not rest:
            return f"{method} /channels/{{channel_id}}", params
    return f"{method} /" + "/".join(parts), {}


def form_error(field: str, code: str, message: str) -> dict[str, Any]:
    return {
        "message": "Invalid Form Body",
        "code": 50035,
        "errors": {field: {"_errors": [{"code": code, "message": message}]}},
    }

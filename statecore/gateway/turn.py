"""One inbound message as a bot's handler sees it (:class:`Message`), and the :class:`Turn` a
handler replies through; session keys are derived here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs

from statecore.gateway.adapter import InboundLike, SendResult

__all__ = ["Message", "MessageHandler", "Replier", "Turn", "session_key_for"]


def session_key_for(
    profile: str, platform: str, chat_type: str, chat_id: str, thread_id: str | None = None
) -> str:
    """The session key of a conversation: one per (bot profile, platform, chat, thread)."""
    key = f"agent:{profile}:{platform}:{chat_type}:{chat_id}"
    return key if thread_id is None else f"{key}:{thread_id}"


@attrs.frozen
class Message:
    """One inbound user message, as the bot's handler sees it."""

    platform: str
    profile: str
    chat_id: str
    chat_type: str
    text: str
    message_id: str | None
    thread_id: str | None
    user_id: str | None
    user_name: str | None
    scope_id: str | None
    session_key: str
    media_urls: tuple[str, ...] = ()
    """Attachments' URLs, in order."""

    @classmethod
    def from_event(cls, event: InboundLike, *, profile: str) -> Message:
        """Build from an adapter's inbound event (e.g. the relay's ``InboundEvent``) for the
        adapter of ``profile``."""
        source = event.source
        return cls(
            platform=source.platform,
            profile=profile,
            chat_id=source.chat_id,
            chat_type=source.chat_type,
            text=event.text,
            message_id=event.message_id,
            thread_id=source.thread_id,
            user_id=source.user_id,
            user_name=source.user_name,
            scope_id=source.scope_id,
            session_key=session_key_for(
                profile, source.platform, source.chat_type, source.chat_id, source.thread_id
            ),
            media_urls=event.media_urls,
        )


class Replier(Protocol):
    """What a turn replies through (the :class:`~statecore.gateway.Gateway` is one)."""

    async def send_final(
        self,
        *,
        session_key: str,
        platform: str,
        chat_id: str,
        content: str,
        message_ref: str | int | None,
        thread_id: str | None = None,
        reply_to: str | None = None,
        profile: str = "default",
    ) -> SendResult:
        """Send a final reply durably."""
        ...


class Turn:
    """One message being handled: reply with :meth:`reply` (each reply is ledgered)."""

    def __init__(self, gateway: Replier, message: Message) -> None:
        self.gateway = gateway
        self.message = message

    async def reply(self, text: str) -> SendResult:
        """Send a final reply to the message's chat (thread), durably: see ``send_final``."""
        m = self.message
        return await self.gateway.send_final(
            session_key=m.session_key,
            platform=m.platform,
            chat_id=m.chat_id,
            content=text,
            message_ref=m.message_id,
            thread_id=m.thread_id,
            reply_to=m.message_id,
            profile=m.profile,
        )


MessageHandler = Callable[[Turn], Awaitable[None]]
"""A bot's logic: ``await handler(turn)`` for every inbound message."""

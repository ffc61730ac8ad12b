"""One inbound message as a bot's handler sees it (:class:`Message`), and the :class:`Turn` a
handler replies through; session keys are derived here."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

import attrs

from statecore import tracing
from statecore.clock import Clock
from statecore.gateway.adapter import InboundLike, SendResult
from statecore.gateway.live import LiveActions
from statecore.policy import ErrorKind

__all__ = [
    "TYPING_REFRESH_S",
    "Message",
    "MessageHandler",
    "Replier",
    "Turn",
    "run_handler",
    "session_key_for",
]

TYPING_REFRESH_S = 4.0
"""How often :meth:`Turn.keep_typing` shows typing again: platforms drop the status by
themselves after about five seconds."""


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


class TurnHost(Replier, Protocol):
    """What a turn works through besides its replies (the :class:`~statecore.gateway.Gateway`
    is one): its clock and its live actions."""

    @property
    def clock(self) -> Clock:
        """The clock :meth:`Turn.keep_typing` waits on."""
        ...

    @property
    def live(self) -> LiveActions:
        """Typing and edits (:mod:`statecore.gateway.live`)."""
        ...


class Turn:
    """One message being handled: reply with :meth:`reply` (each reply is ledgered); show
    typing with :meth:`typing` or :meth:`keep_typing`, change a sent reply with :meth:`edit`.

    Typing and edits are live actions, not obligations: they are sent once, never recorded or
    resent, and an adapter that does not declare the ability (``AdapterAbilities.shows_typing``
    / ``edits``) makes them a no-op whose result says so.  A final answer belongs in a reply.
    """

    def __init__(self, gateway: TurnHost, message: Message) -> None:
        self.gateway = gateway
        self.message = message

    async def typing(self, status: str | None = None) -> SendResult:
        """Show the bot typing in the message's chat (thread) now; ``status`` is a short text
        where the platform shows one (``""`` clears it).  The platform drops it after a few
        seconds, and a reply ends it: for a longer wait use :meth:`keep_typing`.  Returns the
        platform's answer (a ``PERMANENT`` failure, nothing sent, when the adapter cannot show
        typing); never raises for the platform."""
        m = self.message
        return await self.gateway.live.typing(
            platform=m.platform,
            chat_id=m.chat_id,
            status=status,
            thread_id=m.thread_id,
            profile=m.profile,
        )

    @contextlib.asynccontextmanager
    async def keep_typing(
        self, status: str | None = None, *, every_s: float = TYPING_REFRESH_S
    ) -> AsyncIterator[None]:
        """``async with turn.keep_typing():`` shows typing while the block runs (again every
        ``every_s`` seconds on the gateway's clock) and clears it when the block ends, however
        it ends.  Raises ``ValueError`` for an ``every_s`` that is not a positive number."""
        if isinstance(every_s, bool) or not isinstance(every_s, int | float) or not every_s > 0:
            raise ValueError(f"every_s must be a positive number of seconds, not {every_s!r}")
        first = await self.typing(status)
        if not first.success and first.kind is ErrorKind.PERMANENT:
            yield  # the adapter cannot show typing: nothing to keep up or clear
            return

        async def refresh() -> None:
            while True:
                await self.gateway.clock.sleep(every_s)
                await self.typing(status)

        refreshing = asyncio.ensure_future(refresh())
        try:
            yield
        finally:
            refreshing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refreshing
            await asyncio.shield(self.typing(""))

    async def edit(self, sent: SendResult | str, text: str) -> SendResult:
        """Replace the text of a message the bot sent in this chat: ``sent`` is what
        :meth:`reply` returned (its ``message_id``) or a message id.  Returns the platform's
        answer; a definite failure, nothing sent, when the adapter cannot edit, when ``sent``
        carries no message id (a reply that failed, or one recorded by an earlier run of this
        turn), or when ``text`` is longer than the platform takes.  Raises ``TypeError`` for a
        ``sent`` or ``text`` of another type, ``ValueError`` for an empty ``text``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        if isinstance(sent, SendResult):
            message_id = sent.message_id
        elif isinstance(sent, str):
            message_id = sent or None
        else:
            raise TypeError(f"sent must be a SendResult or a message id, not {type(sent).__name__}")
        if message_id is None:
            return SendResult.failed(
                "no message id to edit (the reply was not sent by this call)",
                kind=ErrorKind.PERMANENT,
            )
        m = self.message
        return await self.gateway.live.edit(
            platform=m.platform,
            chat_id=m.chat_id,
            message_id=message_id,
            content=text,
            thread_id=m.thread_id,
            profile=m.profile,
        )

    async def reply(self, text: str) -> SendResult:
        """Send a final reply to the message's chat (thread), durably: see ``send_final``
        (a reply longer than the platform takes is split or truncated there).  The result's
        ``message_id`` (the last part's) is what :meth:`edit` changes."""
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


def run_handler(handler: MessageHandler, turn: Turn) -> Awaitable[None]:
    """``handler(turn)``; while tracing is on (:mod:`statecore.tracing`), inside the turn's
    ``gateway handle`` span (a child of the ``transport inbound`` span current then).  Await
    the result; it raises what the handler raises."""
    if not tracing.enabled:
        return handler(turn)
    return _traced(handler, turn)


async def _traced(handler: MessageHandler, turn: Turn) -> None:
    m = turn.message
    attributes = {
        "statecore.platform": m.platform,
        "statecore.profile": m.profile,
        "statecore.chat_id": m.chat_id,
        "statecore.chat_type": m.chat_type,
        "statecore.message_id": m.message_id,
        "statecore.session_key": m.session_key,
    }
    with tracing.span("gateway handle", attributes):
        await handler(turn)

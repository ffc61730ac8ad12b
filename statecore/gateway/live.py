"""The live actions of a turn: typing and edits, sent once through the adapter of the chat's
(platform, profile) when it declares the ability (``AdapterAbilities.shows_typing`` /
``edits``), never ledgered.

An edit or a typing status is not an obligation: nothing records it before it is sent or
resends it after a crash, so a final answer belongs in a reply (``Gateway.send_final``).  An
adapter that cannot do it gets no call: the result is a ``PERMANENT`` failure saying so, which
a handler may ignore (:meth:`Turn.keep_typing <statecore.gateway.Turn.keep_typing>` does).
"""

from __future__ import annotations

from statecore.gateway.adapter import SendResult
from statecore.gateway.adapters import AdapterSet

__all__ = ["LiveActions"]


class LiveActions:
    """Typing and edits through one gateway's adapters (see the module docs)."""

    def __init__(self, adapters: AdapterSet) -> None:
        self._adapters = adapters

    async def typing(
        self,
        *,
        platform: str,
        chat_id: str,
        status: str | None = None,
        thread_id: str | None = None,
        profile: str = "default",
    ) -> SendResult:
        """Show the bot typing in ``chat_id`` (``status``: a short text where the platform
        shows one; ``""`` clears it) through the adapter of ``(platform, profile)``.  Returns
        the platform's answer; a ``PERMANENT`` failure, nothing sent, when that adapter does
        not declare ``shows_typing`` or there is none.  Never raises for the platform;
        ``TypeError`` for a ``status`` that is neither a str nor None."""
        if status is not None and not isinstance(status, str):
            raise TypeError(f"status must be a str or None, not {type(status).__name__}")
        metadata = {} if thread_id is None else {"thread_id": thread_id}
        return await self._adapters.typing((platform, profile), chat_id, status, metadata)

    async def edit(
        self,
        *,
        platform: str,
        chat_id: str,
        message_id: str,
        content: str,
        thread_id: str | None = None,
        profile: str = "default",
    ) -> SendResult:
        """Replace the text of the bot's message ``message_id`` in ``chat_id`` through the
        adapter of ``(platform, profile)``.  Returns the platform's answer; a ``PERMANENT``
        failure, nothing sent, when that adapter does not declare ``edits`` (or there is none)
        or ``content`` is longer than its announced limit (an edit cannot be split).  Raises
        ``TypeError``/``ValueError`` for an empty or non-text id or content."""
        for name, value in (("message_id", message_id), ("content", content)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, not {type(value).__name__}")
            if not value:
                raise ValueError(f"{name} must not be empty")
        metadata = {} if thread_id is None else {"thread_id": thread_id}
        return await self._adapters.edit(
            (platform, profile), chat_id, message_id, content, metadata
        )

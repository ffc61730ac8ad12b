"""Platform drivers: how a connector reaches a chat platform, and the built-in loopback one.

A driver is the connector's edge to one platform: the connector hands it outbound actions
(:meth:`PlatformDriver.perform`) and it hands the connector inbound events through the intake
the connector attaches.  :class:`LoopbackPlatform` is a simulated chat for tests, examples and
the demo: a test (or a person) injects user messages and reads what the bot did, with message
ids, threads and edits.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, cast, runtime_checkable

import attrs

from relay.wire.descriptor import CONTRACT_VERSION, LEGACY_OPS, CapabilityDescriptor
from relay.wire.frames import CHAT_TYPES, ChatType, EventSource, InboundEvent, OutboundOutcome

__all__ = [
    "ChatMessage",
    "Intake",
    "LoopbackPlatform",
    "PlatformDriver",
    "SentAction",
    "target_chat",
]

Intake = Callable[[str, InboundEvent], Awaitable[None]]
"""The connector's entry for inbound events: ``await intake(platform, event)``."""


@runtime_checkable
class PlatformDriver(Protocol):
    """What a connector needs from a platform."""

    platform: str

    def attach(self, intake: Intake) -> None:
        """Deliver every inbound event of the platform through ``intake`` from now on."""
        ...

    def descriptor(self) -> CapabilityDescriptor:
        """What the platform supports (sent to gateways in answer to hello)."""
        ...

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        """Perform one outbound action (``op``: send, edit, typing, ...); never raise for a
        platform refusal: return a failed outcome with an ``error`` (and ``code``)."""
        ...


@attrs.frozen
class SentAction:
    """One outbound action the bot performed on the loopback platform."""

    op: str
    chat_id: str
    content: str | None
    """The action's ``content``: the message body; for ``typing`` its status text, None when it
    had none (plain typing) and ``""`` when it clears the status."""
    message_id: str | None
    thread_id: str | None = None
    reply_to: str | None = None
    metadata: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ChatMessage:
    """One message in a loopback chat's transcript (from a user or from the bot)."""

    message_id: str
    chat_id: str
    sender: str
    text: str
    thread_id: str | None = None
    edited: bool = False


class LoopbackPlatform:
    """A simulated chat platform (no network): see the module docs.

    ``inject()`` plays a user writing; ``sent`` lists what the bot did, in order; ``transcript``
    shows each chat as the users would see it.  ``fail_next(error, code=None)`` makes the next
    send fail definitely; ``down`` makes every action fail (the platform is unreachable).

    Message ids are ``<prefix>-<n>``: ``n`` counts from 1 within the instance and ``id_prefix``
    (default: random, 8 hex digits) is the instance's own, so ids never repeat across
    instances -- a bot whose ledger outlives the process (a persistent ``bot.db``) never sees a
    new message under an old message's id.  Pass a fixed ``id_prefix`` only where reproducible
    ids matter more than that.
    """

    def __init__(
        self,
        platform: str = "loopback",
        *,
        label: str = "Loopback chat",
        max_message_length: int = 4096,
        supported_ops: tuple[str, ...] = LEGACY_OPS,
        id_prefix: str | None = None,
    ) -> None:
        if id_prefix is not None and (not isinstance(id_prefix, str) or not id_prefix):
            raise ValueError(f"id_prefix must be a non-empty str or None, not {id_prefix!r}")
        self.platform = platform
        self.id_prefix = secrets.token_hex(4) if id_prefix is None else id_prefix
        """What every message id of this instance starts with."""
        self._descriptor = CapabilityDescriptor(
            contract_version=CONTRACT_VERSION,
            platform=platform,
            label=label,
            max_message_length=max_message_length,
            supports_draft_streaming=False,
            supports_edit="edit" in supported_ops,
            supports_threads=True,
            markdown_dialect="plain",
            len_unit="chars",
            supported_ops=supported_ops,
        )
        self.sent: list[SentAction] = []
        self.transcript: dict[str, list[ChatMessage]] = {}
        self.down = False
        self._failures: list[tuple[str, str | None]] = []
        self._intake: Intake | None = None
        self._ids = itertools.count(1)
        self.sent_event = asyncio.Event()
        """Set after every performed send (a test may clear it and wait for the next)."""

    def attach(self, intake: Intake) -> None:
        """Called by the connector: inbound events go through ``intake``."""
        self._intake = intake

    def descriptor(self) -> CapabilityDescriptor:
        """The loopback platform's capabilities."""
        return self._descriptor

    def fail_next(self, error: str, code: str | None = None) -> None:
        """Make the next send fail definitely with ``error``."""
        self._failures.append((error, code))

    async def inject(
        self,
        chat_id: str,
        text: str,
        *,
        user_id: str | None = None,
        scope_id: str | None = None,
        chat_type: str = "dm",
        thread_id: str | None = None,
        user_name: str | None = None,
    ) -> str:
        """A user writes ``text`` in ``chat_id``: the connector receives it; returns its id.

        Raises ``RuntimeError`` when no connector is attached.
        """
        if self._intake is None:
            raise RuntimeError("the loopback platform is not attached to a connector")
        message_id = self._next_id()
        self._log(ChatMessage(message_id, chat_id, user_id or "user", text, thread_id))
        event = InboundEvent(
            text=text,
            message_type="text",
            message_id=message_id,
            reply_to_message_id=None,
            source=EventSource(
                platform=self.platform,
                chat_id=chat_id,
                chat_type=_chat_type(chat_type),
                user_id=user_id,
                user_name=user_name,
                thread_id=thread_id,
                scope_id=scope_id,
            ),
        )
        await self._intake(self.platform, event)
        return message_id

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        """Perform ``send``, ``edit``, ``typing`` or ``follow_up`` like a real platform would.

        The body is the action's ``content`` (docs/wire-contract.md); ``follow_up`` carries no
        ``chat_id`` and goes to ``metadata.chat_id``.  A refusal is a failed outcome with a
        ``code`` (``bad_action``, ``unsupported_op``, ``not_found``, ``too_long`` ...).
        """
        op = action.get("op")
        if self.down:
            return OutboundOutcome(False, None, "platform unreachable", "platform_down")
        if op not in self._descriptor.supported_ops:
            return OutboundOutcome(False, None, f"unsupported op {op!r}", "unsupported_op")
        metadata = action.get("metadata")
        meta = dict(metadata) if isinstance(metadata, Mapping) else {}
        chat_id = target_chat(action)
        if chat_id is None:
            return OutboundOutcome(False, None, "chat_id is required", "bad_action")
        content = action.get("content")
        if op == "typing":
            status = content if isinstance(content, str) else None
            self.sent.append(SentAction("typing", chat_id, status, None, metadata=meta))
            return OutboundOutcome(True)
        if not isinstance(content, str) or not content:
            return OutboundOutcome(False, None, "content is required", "bad_action")
        text = content
        if op == "edit":
            return self._edit(chat_id, action.get("message_id"), text, meta)
        if self._failures:
            error, code = self._failures.pop(0)
            return OutboundOutcome(False, None, error, code)
        if len(text) > self._descriptor.max_message_length:
            return OutboundOutcome(False, None, "message too long", "too_long")
        message_id = self._next_id()
        thread_id = _opt_str(action.get("thread_id"))
        reply_to = _opt_str(action.get("reply_to"))
        self._log(ChatMessage(message_id, chat_id, "bot", text, thread_id))
        self.sent.append(SentAction(str(op), chat_id, text, message_id, thread_id, reply_to, meta))
        self.sent_event.set()
        return OutboundOutcome(True, message_id)

    def _edit(
        self, chat_id: str, message_id: object, text: str, meta: dict[str, Any]
    ) -> OutboundOutcome:
        messages = self.transcript.get(chat_id, [])
        for index, message in enumerate(messages):
            if message.message_id == message_id and message.sender == "bot":
                messages[index] = attrs.evolve(message, text=text, edited=True)
                self.sent.append(
                    SentAction("edit", chat_id, text, message.message_id, metadata=meta)
                )
                return OutboundOutcome(True, message.message_id)
        return OutboundOutcome(False, None, "no such bot message to edit", "not_found")

    def _next_id(self) -> str:
        """A message id no other instance hands out (see the class docs)."""
        return f"{self.id_prefix}-{next(self._ids)}"

    def _log(self, message: ChatMessage) -> None:
        self.transcript.setdefault(message.chat_id, []).append(message)

    def texts(self, chat_id: str) -> list[str]:
        """What the bot sent to ``chat_id``, in order (edits applied)."""
        return [m.text for m in self.transcript.get(chat_id, []) if m.sender == "bot"]


def target_chat(action: Mapping[str, Any]) -> str | None:
    """The chat an outbound action addresses: its ``chat_id`` (a string, or an integer id), or
    for an action without one (``follow_up``) its ``metadata.chat_id``; None when it names none.
    The connector's egress guard and the loopback driver read the target the same way."""
    chat_id = action.get("chat_id")
    if chat_id is None:
        metadata = action.get("metadata")
        chat_id = metadata.get("chat_id") if isinstance(metadata, Mapping) else None
    if isinstance(chat_id, int) and not isinstance(chat_id, bool):
        return str(chat_id)
    return chat_id if isinstance(chat_id, str) and chat_id else None


def _chat_type(value: str) -> ChatType:
    if value not in CHAT_TYPES:
        raise ValueError(f"chat_type must be one of {sorted(CHAT_TYPES)}, not {value!r}")
    return cast(ChatType, value)


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)

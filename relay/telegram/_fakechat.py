"""The chats of the fake Bot API server (``relay.telegram.testing``): who wrote what where, as
a person in the chat would see it, and the Bot API's checks of what the bot sends (sans-I/O).

Every refusal is a :class:`ApiRefusal` with the status and the ``description`` the real Bot
API answers (``Bad Request: message is too long``, ``Forbidden: bot was blocked by the user``
...), so a driver under test meets the texts it meets in production.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Final

import attrs

__all__ = [
    "CHAT_ACTIONS",
    "MAX_TEXT_UTF16",
    "ApiRefusal",
    "Chat",
    "ChatAction",
    "ChatMessage",
    "TelegramUser",
    "utf16_len",
]

MAX_TEXT_UTF16: Final = 4096
"""The longest message text, in UTF-16 code units (how Telegram counts)."""
CHAT_ACTIONS: Final = frozenset(
    (
        "typing",
        "upload_photo",
        "record_video",
        "upload_video",
        "record_voice",
        "upload_voice",
        "upload_document",
        "choose_sticker",
        "find_location",
        "record_video_note",
        "upload_video_note",
    )
)
CHAT_KINDS: Final = frozenset(("private", "group", "supergroup", "channel"))


def utf16_len(text: str) -> int:
    """How many UTF-16 code units ``text`` is (an emoji outside the BMP counts two)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


class ApiRefusal(Exception):
    """An error answer of the Bot API: ``status`` (its ``error_code``) and ``description``;
    ``retry_after`` for a 429."""

    def __init__(self, status: int, description: str, *, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        """The JSON answer: ``{"ok": false, "error_code": ..., "description": ...}``."""
        answer: dict[str, Any] = {
            "ok": False,
            "error_code": self.status,
            "description": self.description,
        }
        if self.retry_after is not None:
            answer["parameters"] = {"retry_after": self.retry_after}
        return answer


@attrs.frozen
class TelegramUser:
    """A person (or the bot) on the fake server."""

    id: int
    first_name: str
    username: str | None = None
    is_bot: bool = False

    def to_api(self) -> dict[str, Any]:
        """The Bot API's ``User`` object."""
        user: dict[str, Any] = {"id": self.id, "is_bot": self.is_bot, "first_name": self.first_name}
        if self.username is not None:
            user["username"] = self.username
        return user


@attrs.frozen
class ChatMessage:
    """One message as the chat shows it (edits applied: ``edited`` says it was edited)."""

    message_id: int
    chat_id: int
    sender: str
    """``"bot"`` for the bot's messages, else the person's first name."""
    sender_id: int
    text: str
    thread_id: int | None = None
    reply_to: int | None = None
    edited: bool = False
    date: float = 0.0
    """Wall-clock time it was sent."""
    at: float = 0.0
    """``time.monotonic()`` when it was sent (spacing checks)."""

    @property
    def from_bot(self) -> bool:
        """True for the bot's own messages."""
        return self.sender == "bot"


@attrs.frozen
class ChatAction:
    """A chat action the bot sent (``typing`` ...)."""

    action: str
    thread_id: int | None
    at: float


class Chat:
    """One chat: its kind, its messages in order, its forum topics and the bot's actions."""

    def __init__(
        self, chat_id: int, kind: str, *, title: str | None = None, is_forum: bool = False
    ) -> None:
        if kind not in CHAT_KINDS:
            raise ValueError(f"chat_type must be one of {sorted(CHAT_KINDS)}, not {kind!r}")
        if is_forum and kind != "supergroup":
            raise ValueError("only a supergroup can be a forum")
        self.id = chat_id
        self.kind = kind
        self.title = title
        self.is_forum = is_forum
        self.messages: list[ChatMessage] = []
        self.actions: list[ChatAction] = []
        self.topics: set[int] = set()
        self.blocked = False
        """The person blocked the bot (private chats): every send is refused with 403."""
        self.first_name: str | None = None
        self._ids = itertools.count(1)

    def to_api(self) -> dict[str, Any]:
        """The Bot API's ``Chat`` object."""
        chat: dict[str, Any] = {"id": self.id, "type": self.kind}
        if self.kind == "private":
            chat["first_name"] = self.first_name or "person"
        else:
            chat["title"] = self.title or f"chat {self.id}"
        if self.is_forum:
            chat["is_forum"] = True
        return chat

    def find(self, message_id: int) -> ChatMessage | None:
        """The message ``message_id`` of this chat, None if there is none."""
        for message in self.messages:
            if message.message_id == message_id:
                return message
        return None

    def add(
        self,
        sender: str,
        sender_id: int,
        text: str,
        *,
        thread_id: int | None,
        reply_to: int | None,
    ) -> ChatMessage:
        """Append a new message (ids count from 1 within the chat, as in Telegram)."""
        message = ChatMessage(
            next(self._ids),
            self.id,
            sender,
            sender_id,
            text,
            thread_id,
            reply_to,
            date=time.time(),
            at=time.monotonic(),
        )
        self.messages.append(message)
        return message

    def replace(self, message: ChatMessage, text: str) -> ChatMessage:
        """Apply an edit to ``message`` (it keeps its place)."""
        edited = attrs.evolve(message, text=text, edited=True)
        self.messages[self.messages.index(message)] = edited
        return edited

    # -- the Bot API's checks of what the bot sends ------------------------------------------

    def check_send(self, text: object, thread_id: int | None) -> str:
        """The text of a ``sendMessage`` once checked; raises :class:`ApiRefusal`."""
        if self.blocked:
            raise ApiRefusal(403, "Forbidden: bot was blocked by the user")
        if not isinstance(text, str) or not text.strip():
            raise ApiRefusal(400, "Bad Request: message text is empty")
        if utf16_len(text) > MAX_TEXT_UTF16:
            raise ApiRefusal(400, "Bad Request: message is too long")
        if thread_id is not None and thread_id not in self.topics:
            raise ApiRefusal(400, "Bad Request: message thread not found")
        return text

    def reply_target(self, reply_to: int | None, *, without_reply_ok: bool) -> int | None:
        """The message a send replies to (None: none); raises :class:`ApiRefusal` for a
        target that is not in the chat unless ``without_reply_ok``."""
        if reply_to is None:
            return None
        if self.find(reply_to) is not None:
            return reply_to
        if without_reply_ok:
            return None
        raise ApiRefusal(400, "Bad Request: message to be replied not found")

    def check_edit(self, message_id: int, text: object) -> tuple[ChatMessage, str]:
        """The bot's message to edit and the new text; raises :class:`ApiRefusal`."""
        message = self.find(message_id)
        if message is None:
            raise ApiRefusal(400, "Bad Request: message to edit not found")
        if not message.from_bot:
            raise ApiRefusal(400, "Bad Request: message can't be edited")
        if not isinstance(text, str) or not text.strip():
            raise ApiRefusal(400, "Bad Request: message text is empty")
        if utf16_len(text) > MAX_TEXT_UTF16:
            raise ApiRefusal(400, "Bad Request: message is too long")
        if text == message.text:
            raise ApiRefusal(
                400,
                "Bad Request: message is not modified: specified new message content and "
                "reply markup are exactly the same as a current content and reply markup of "
                "the message",
            )
        return message, text

    def message_api(self, message: ChatMessage, sender: TelegramUser) -> dict[str, Any]:
        """The Bot API's ``Message`` object for ``message`` (sent by ``sender``)."""
        body: dict[str, Any] = {
            "message_id": message.message_id,
            "date": int(message.date),
            "chat": self.to_api(),
            "text": message.text,
        }
        if self.kind == "channel":
            body["sender_chat"] = self.to_api()
        else:
            body["from"] = sender.to_api()
        if message.thread_id is not None:
            body["message_thread_id"] = message.thread_id
            body["is_topic_message"] = True
        if message.reply_to is not None:
            target = self.find(message.reply_to)
            if target is not None:
                body["reply_to_message"] = {
                    "message_id": target.message_id,
                    "date": int(target.date),
                    "chat": self.to_api(),
                    "text": target.text,
                }
        if message.edited:
            body["edit_date"] = int(time.time())
        return body

"""The outbound half of the Telegram driver: one action, one Bot API call, paced.

The Bot API has no idempotent send: a ``sendMessage`` asked again is a second message.  So a
send is asked again only when Telegram certainly did not act on it -- a 429 (wait its
``retry_after``), a connection that could not be made -- and never after a call that may have
reached it (no answer, a reset, a 5xx): that is a failed outcome (code ``platform_down``) and
the gateway's ledger resends it later with its "possible repeat" label.  An edit and a chat
action are the same effect when repeated, so they are asked again after those too.

Pacing (:class:`Pacer`): at most ``chat_rate_per_s`` messages a second in one chat (groups and
channels also ``group_rate_per_min`` a minute) and ``global_rate_per_s`` over all chats, each
with a small burst; a 429 holds that chat until its ``retry_after`` has passed.  Everything
stops at ``send_budget_s``: what is left is a failed outcome, never an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from relay.connector.driver_kit import SEND_BACKOFF_S, Backoff
from relay.connector.platform import target_chat
from relay.telegram._api import TelegramApi, TelegramError, TelegramUnreachable
from relay.telegram._updates import message_ref, parse_ref
from relay.wire.frames import OutboundOutcome
from statecore.clock import Clock

__all__ = ["MAX_MESSAGE_UTF16", "OPS", "Pacer", "Sender", "utf16_len"]

OPS: Final = ("send", "edit", "typing", "follow_up")
"""What the driver performs (its descriptor's ``supported_ops``)."""
MAX_MESSAGE_UTF16: Final = 4096
"""Telegram's limit on a message's text, in UTF-16 code units."""


def utf16_len(text: str) -> int:
    """``text``'s length as Telegram counts it (UTF-16 code units)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


class _Gcra:
    """A reservation-based rate (the generic cell rate algorithm): every caller gets the
    earliest slot that keeps ``interval_s`` between slots on average with ``burst`` at once."""

    __slots__ = ("_tat", "burst", "interval_s")

    def __init__(self, interval_s: float, burst: int) -> None:
        self.interval_s = interval_s
        self.burst = burst
        self._tat = 0.0  # the theoretical arrival time of the next slot

    def reserve(self, now: float) -> float:
        """Reserve the next slot; returns when it is (>= now)."""
        slot = max(now, self._tat - (self.burst - 1) * self.interval_s)
        self._tat = max(self._tat, slot) + self.interval_s
        return slot

    def idle(self, now: float) -> bool:
        return self._tat < now


class Pacer:
    """The send pacing of one driver (see the module docs); a slot is kept in call order."""

    def __init__(
        self,
        clock: Clock,
        *,
        chat_rate_per_s: float,
        group_rate_per_min: float,
        global_rate_per_s: float,
        burst: int,
    ) -> None:
        self._clock = clock
        self._chat_interval = 1.0 / chat_rate_per_s
        self._group_interval = 60.0 / group_rate_per_min
        self._burst = burst
        self._global = _Gcra(1.0 / global_rate_per_s, max(burst, int(global_rate_per_s)))
        self._chats: dict[str, _Gcra] = {}
        self._groups: dict[str, _Gcra] = {}
        self._held: dict[str, float] = {}
        self.waited_s = 0.0
        """Seconds sends waited for their slot, in all."""

    def hold(self, chat: str, seconds: float) -> None:
        """A 429 for ``chat``: nothing goes there for ``seconds``."""
        until = self._clock.monotonic() + seconds
        self._held[chat] = max(self._held.get(chat, 0.0), until)

    def slot(self, chat: str) -> float:
        """Reserve the next send to ``chat`` (its own pace, a group's minute, a 429's hold);
        returns the monotonic time it may go, once :meth:`global_slot` lets it."""
        now = self._clock.monotonic()
        if len(self._chats) > 10_000:
            self._forget(now)
        chat_rate = self._chats.get(chat)
        if chat_rate is None:
            chat_rate = self._chats[chat] = _Gcra(self._chat_interval, self._burst)
        at = max(now, self._held.get(chat, 0.0))
        at = max(at, chat_rate.reserve(at))
        if chat.startswith("-"):  # groups, supergroups and channels have negative ids
            group = self._groups.get(chat)
            if group is None:
                group = self._groups[chat] = _Gcra(self._group_interval, self._burst)
            at = max(at, group.reserve(at))
        return at

    def global_slot(self) -> float:
        """Reserve a slot of the overall pace now (after the chat's slot came: a slot reserved
        ahead for one chat must not hold back the others)."""
        return self._global.reserve(self._clock.monotonic())

    def _forget(self, now: float) -> None:
        for table in (self._chats, self._groups):
            for chat in [c for c, rate in table.items() if rate.idle(now - 60.0)]:
                del table[chat]
        for chat in [c for c, until in self._held.items() if until < now]:
            del self._held[chat]


class Sender:
    """Performs outbound actions for one driver (see the module docs)."""

    def __init__(self, api: TelegramApi, pacer: Pacer, *, clock: Clock, send_budget_s: float):
        self._api = api
        self._pacer = pacer
        self._clock = clock
        self._budget_s = send_budget_s
        self.rate_limited = 0
        """429 answers waited out."""
        self.ambiguous = 0
        """Sends that may have reached Telegram without an answer (left to the ledger)."""

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        """Perform ``action``; never raises for refusals (module docs)."""
        op = action.get("op")
        if op not in OPS:
            shown = str(op)[:40]
            return OutboundOutcome(False, None, f"unsupported op {shown!r}", "unsupported_op")
        chat = target_chat(action)
        chat_id = _chat_id(chat)
        if chat is None or chat_id is None:
            return OutboundOutcome(False, None, "chat_id must be a Telegram chat id", "bad_action")
        thread = _int(action.get("thread_id"))
        content = action.get("content")
        if op == "typing":
            if isinstance(content, str) and content == "":
                return OutboundOutcome(True)  # Telegram's chat action ends by itself
            params: dict[str, Any] = {"chat_id": chat_id, "action": "typing"}
            if thread is not None:
                params["message_thread_id"] = thread
            return await self._call("sendChatAction", chat, params, repeatable=True)
        if not isinstance(content, str) or not content.strip():
            return OutboundOutcome(False, None, "content is required", "bad_action")
        if utf16_len(content) > MAX_MESSAGE_UTF16:
            return OutboundOutcome(False, None, "message is too long", "too_long")
        if op == "edit":
            target = parse_ref(action.get("message_id"))
            if target is None or target[0] not in (None, chat_id):
                return OutboundOutcome(False, None, "message_id must be a message id", "bad_action")
            edit = {"chat_id": chat_id, "message_id": target[1], "text": content}
            outcome = await self._call("editMessageText", chat, edit, repeatable=True, paced=True)
            if not outcome.success:
                return outcome
            return OutboundOutcome(True, f"{chat_id}:{target[1]}")
        params = {"chat_id": chat_id, "text": content}
        if thread is not None:
            params["message_thread_id"] = thread
        reply = parse_ref(action.get("reply_to"))
        if reply is not None and reply[0] in (None, chat_id):
            params["reply_parameters"] = {
                "message_id": reply[1],
                "allow_sending_without_reply": True,
            }
        return await self._call("sendMessage", chat, params, repeatable=False, paced=True)

    async def _call(
        self,
        method: str,
        chat: str,
        params: Mapping[str, Any],
        *,
        repeatable: bool,
        paced: bool = False,
    ) -> OutboundOutcome:
        clock = self._clock
        deadline = clock.monotonic() + self._budget_s
        backoff = Backoff(SEND_BACKOFF_S)
        while True:
            if paced:
                for reserve in (self._pacer.slot, lambda _: self._pacer.global_slot()):
                    at = reserve(chat)
                    if at > deadline:
                        return OutboundOutcome(False, None, "rate limited (paced)", "rate_limited")
                    wait = at - clock.monotonic()
                    if wait > 0:
                        self._pacer.waited_s += wait
                        await clock.sleep(wait)
            try:
                answer = await self._api.call(method, params)
            except TelegramUnreachable as exc:
                if exc.maybe_acted and not repeatable:
                    self.ambiguous += 1
                    return OutboundOutcome(
                        False, None, f"{exc} -- it may have been sent", "platform_down"
                    )
                outcome = OutboundOutcome(False, None, str(exc)[:300], "platform_down")
            except TelegramError as exc:
                if exc.rate_limited:
                    self.rate_limited += 1
                    pause = exc.retry_after if exc.retry_after is not None else 1.0
                    self._pacer.hold(chat, pause)
                    if clock.monotonic() + pause > deadline:
                        return OutboundOutcome(False, None, str(exc)[:300], "rate_limited")
                    if not paced:
                        await clock.sleep(pause)
                    continue
                if exc.status >= 500 and not repeatable:
                    self.ambiguous += 1
                    return OutboundOutcome(
                        False, None, f"{exc} -- it may have been sent", "platform_down"
                    )
                refused = refusal(exc)
                if refused is not None:
                    return OutboundOutcome(True, None) if refused.code == "unchanged" else refused
                outcome = OutboundOutcome(False, None, str(exc)[:300], "platform_down")
            else:
                return _sent(answer)
            if not await backoff.sleep_within(clock, deadline):
                return outcome


def refusal(exc: TelegramError) -> OutboundOutcome | None:
    """The outcome of a definite refusal (None: a server error worth asking again)."""
    if exc.status >= 500:
        return None
    text = str(exc)[:300]
    lowered = exc.description.lower()
    if exc.unauthorized:
        return OutboundOutcome(False, None, f"{text} (the bot's token is refused)", "auth")
    if exc.status == 403:
        return OutboundOutcome(False, None, text, "forbidden")
    if "message is not modified" in lowered:
        return OutboundOutcome(False, None, text, "unchanged")
    if "too long" in lowered:
        return OutboundOutcome(False, None, text, "too_long")
    if "not found" in lowered:
        return OutboundOutcome(False, None, text, "not_found")
    if exc.migrate_to is not None:
        return OutboundOutcome(
            False, None, f"{text} (the group is now the supergroup {exc.migrate_to})", "not_found"
        )
    return OutboundOutcome(False, None, text, "bad_action")


def _sent(answer: Any) -> OutboundOutcome:
    if isinstance(answer, dict):
        chat = answer.get("chat")
        message_id = answer.get("message_id")
        chat_id = chat.get("id") if isinstance(chat, dict) else None
        if isinstance(chat_id, int) and isinstance(message_id, int):
            return OutboundOutcome(True, message_ref(chat_id, message_id))
    return OutboundOutcome(True, None)


def _chat_id(chat: str | None) -> int | str | None:
    if chat is None:
        return None
    if chat.startswith("@") and len(chat) > 1:
        return chat  # a public channel's username
    return _int(chat)


def _int(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None

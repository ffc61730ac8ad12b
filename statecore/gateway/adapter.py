"""What the runtime needs from a platform adapter: a send with a definite, typed result.

Any object with ``async send(chat_id, content, metadata=None) -> SendResult`` is an adapter; the
relay's ``RelayAdapter`` is one, a test double is another.  Whatever else an adapter can do
(connect, disconnect within a deadline, deliver inbound messages, announce reconnections, prime
a chat's route) it declares in an ``abilities`` attribute holding an :class:`AdapterAbilities`;
the runtime calls only what is declared, and never probes for methods.  An adapter without the
attribute can only send.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

from statecore.clock import Deadline
from statecore.policy import ErrorKind

__all__ = [
    "AdapterAbilities",
    "Connecting",
    "DedupingSends",
    "Disconnecting",
    "Editing",
    "InboundDelivering",
    "InboundLike",
    "InboundSource",
    "KeepingHouse",
    "LengthLimited",
    "MessageLimit",
    "PlatformAdapter",
    "ReconnectAnnouncing",
    "RoutePriming",
    "SendResult",
    "ShowingTyping",
    "abilities_of",
]


@attrs.frozen
class SendResult:
    """The outcome of one send, typed so that nobody re-reads error text.

    * ``success``: the platform acknowledged it (``message_id`` when it gave one).
    * not ``success``: ``error`` says why, for people; ``kind`` (an
      :class:`~statecore.policy.ErrorKind`) says what a retry may do, for the ledger: never
      seen by the platform (``RECONNECT``), slow down (``RATE_LIMITED``), try again
      (``TRANSIENT``) or never again (``PERMANENT``).  An adapter that leaves ``kind`` unset has
      its error text classified by the ledger's policy instead.
    * ``ambiguous``: it may or may not have gone out (timeout, connection lost mid-request); the
      ledger never takes it for a send the platform did not see, and its history says so.  Not
      ambiguous: it definitely did not go out.
    """

    success: bool
    error: str | None = None
    message_id: str | None = None
    ambiguous: bool = False
    kind: ErrorKind | None = None

    @classmethod
    def ok(cls, message_id: str | None = None) -> SendResult:
        """An acknowledged send."""
        return cls(True, None, message_id, False, None)

    @classmethod
    def failed(
        cls, error: str, *, kind: ErrorKind | None = None, ambiguous: bool = False
    ) -> SendResult:
        """A send that failed (definitely, unless ``ambiguous``); ``kind`` when the adapter
        knows what a retry may do.  Raises ``TypeError`` for a kind that is not an
        :class:`~statecore.policy.ErrorKind`."""
        if kind is not None and not isinstance(kind, ErrorKind):
            raise TypeError(f"kind must be an ErrorKind or None, not {type(kind).__name__}")
        return cls(False, error, None, ambiguous, kind)


class InboundSource(Protocol):
    """Where an inbound message came from, as an adapter hands it over (ids are text)."""

    @property
    def platform(self) -> str: ...
    @property
    def chat_id(self) -> str: ...
    @property
    def chat_type(self) -> str: ...
    @property
    def thread_id(self) -> str | None: ...
    @property
    def user_id(self) -> str | None: ...
    @property
    def user_name(self) -> str | None: ...
    @property
    def scope_id(self) -> str | None: ...


class InboundLike(Protocol):
    """An inbound message as an adapter hands it to the runtime (``relay``'s ``InboundEvent``
    is one): its text, ids, attachments and :class:`InboundSource`."""

    @property
    def text(self) -> str: ...
    @property
    def message_id(self) -> str | None: ...
    @property
    def media_urls(self) -> tuple[str, ...]: ...
    @property
    def source(self) -> InboundSource: ...


@runtime_checkable
class PlatformAdapter(Protocol):
    """The one method the runtime calls to deliver a reply."""

    async def send(
        self, chat_id: str, content: str, metadata: Mapping[str, Any] | None = None
    ) -> SendResult:
        """Send ``content`` to ``chat_id``; never raise for a platform refusal (return it)."""
        ...


@attrs.frozen
class AdapterAbilities:
    """What an adapter can do besides :meth:`PlatformAdapter.send`, declared as a value.

    An adapter sets ``abilities = AdapterAbilities(...)`` (a class attribute is enough) and
    implements the protocol each true field names; the runtime reads nothing else.

    * ``connects``: :class:`Connecting` -- a ``connected`` flag and ``async connect()``; the
      runtime connects it at start and sends (and recovers) only while it is connected.
    * ``disconnects``: :class:`Disconnecting` -- ``async disconnect(*, deadline)``, called at
      stop with the one deadline of the whole stop.
    * ``delivers_inbound``: :class:`InboundDelivering` -- ``on_message(handler)``.
    * ``announces_reconnects``: :class:`ReconnectAnnouncing` -- ``on_reconnect(callback)``; the
      runtime retries what the adapter could not send after each reconnection.
    * ``primes_routes``: :class:`RoutePriming` -- ``prime(origin)``, called with a persisted
      routing origin before a delegation's completion is sent to its chat.
    * ``keeps_house``: :class:`KeepingHouse` -- ``housekeeping(retention_s)``, asked once when
      the adapter is added, for the jobs that prune the settled rows the adapter keeps (the
      gateway runs them on its housekeeping timer, see :mod:`statecore.gateway.housekeeping`).
    * ``shows_typing``: :class:`ShowingTyping` -- ``async typing(chat_id, status, metadata)``,
      what :meth:`Turn.typing <statecore.gateway.Turn.typing>` calls.
    * ``edits``: :class:`Editing` -- ``async edit(chat_id, message_id, content, metadata)``,
      what :meth:`Turn.edit <statecore.gateway.Turn.edit>` calls.
    * ``limits_length``: :class:`LengthLimited` -- a ``message_limit`` (a
      :class:`MessageLimit` or None), read when a reply is recorded: a longer reply is split
      into parts (or truncated) that each fit, instead of being refused by the platform.
    * ``dedupes_sends``: :class:`DedupingSends` -- a ``dedupe_window_s`` (seconds or None),
      read when a claimed reply that may repeat is resent: within the window the platform shows
      a send once per idempotency key, so the resend needs no possible-repeat label.
    """

    connects: bool = attrs.field(default=False, kw_only=True)
    disconnects: bool = attrs.field(default=False, kw_only=True)
    delivers_inbound: bool = attrs.field(default=False, kw_only=True)
    announces_reconnects: bool = attrs.field(default=False, kw_only=True)
    primes_routes: bool = attrs.field(default=False, kw_only=True)
    keeps_house: bool = attrs.field(default=False, kw_only=True)
    shows_typing: bool = attrs.field(default=False, kw_only=True)
    edits: bool = attrs.field(default=False, kw_only=True)
    limits_length: bool = attrs.field(default=False, kw_only=True)
    dedupes_sends: bool = attrs.field(default=False, kw_only=True)

    def __attrs_post_init__(self) -> None:
        for field in attrs.fields(type(self)):
            if type(getattr(self, field.name)) is not bool:
                raise TypeError(f"AdapterAbilities.{field.name} must be a bool")


SEND_ONLY = AdapterAbilities()
"""The abilities of an adapter that declares none."""


def abilities_of(adapter: object) -> AdapterAbilities:
    """The abilities ``adapter`` declares (:data:`SEND_ONLY` when it declares none).

    Raises ``TypeError`` when its ``abilities`` attribute is not an :class:`AdapterAbilities`
    (a typo there would otherwise silently turn an adapter into a send-only one).
    """
    declared = getattr(adapter, "abilities", SEND_ONLY)
    if not isinstance(declared, AdapterAbilities):
        raise TypeError(
            f"{type(adapter).__name__}.abilities must be an AdapterAbilities, "
            f"not {type(declared).__name__}"
        )
    return declared


class Connecting(Protocol):
    """``AdapterAbilities.connects``: connection state and an explicit connect."""

    @property
    def connected(self) -> bool:
        """True while a send can go out now."""
        ...

    async def connect(self) -> object:
        """Connect (the result is ignored; failures are logged, never raised to the runtime)."""
        ...


class Disconnecting(Protocol):
    """``AdapterAbilities.disconnects``: a teardown bounded by the caller's deadline."""

    async def disconnect(self, *, deadline: Deadline) -> None:
        """Tear down, returning by ``deadline``."""
        ...


class InboundDelivering(Protocol):
    """``AdapterAbilities.delivers_inbound``: inbound messages handed to one handler."""

    def on_message(self, handler: Callable[[Any], Awaitable[None]] | None) -> None:
        """Deliver each inbound message to ``handler`` (None: hold them, acknowledge none)."""
        ...


class ReconnectAnnouncing(Protocol):
    """``AdapterAbilities.announces_reconnects``: a callback on every (re)connection."""

    def on_reconnect(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after each connection is made; it must not block or raise."""
        ...


class RoutePriming(Protocol):
    """``AdapterAbilities.primes_routes``: a chat's route rebuilt from a persisted origin."""

    def prime(self, origin: Any) -> None:
        """Remember what ``origin`` says about its chat (scope, user)."""
        ...


class KeepingHouse(Protocol):
    """``AdapterAbilities.keeps_house``: the adapter keeps settled rows of its own."""

    def housekeeping(self, retention_s: float) -> Mapping[str, Callable[[], Awaitable[int]]]:
        """The jobs (name -> ``async job() -> int``) that delete the adapter's settled rows
        older than ``retention_s`` seconds, never an owed one; each returns how many it
        deleted.  Empty when the adapter keeps nothing."""
        ...


class ShowingTyping(Protocol):
    """``AdapterAbilities.shows_typing``: the bot's typing status, shown in a chat."""

    async def typing(
        self, chat_id: str, status: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> SendResult:
        """Show that the bot is typing in ``chat_id`` (``status``: a short text such as
        ``"thinking"`` where the platform shows one; ``""`` clears it).  The platform drops
        the status by itself after a few seconds; never raise for a refusal (return it)."""
        ...


class Editing(Protocol):
    """``AdapterAbilities.edits``: a message the bot sent, changed in place."""

    async def edit(
        self,
        chat_id: str,
        message_id: str,
        content: str,
        metadata: Mapping[str, Any] | None = None,
    ) -> SendResult:
        """Replace the text of the bot's message ``message_id`` in ``chat_id``; never raise
        for a refusal (return it, ``PERMANENT`` when the platform cannot edit at all)."""
        ...


LengthUnit = Literal["chars", "utf16"]
"""How a platform counts a message's length: code points, or UTF-16 code units."""


@attrs.frozen
class MessageLimit:
    """The longest message a platform takes: ``max_length`` in ``unit`` (``"chars"``: code
    points, ``"utf16"``: UTF-16 code units, as JavaScript-based platforms count).  Raises
    ``TypeError``/``ValueError`` for a length that is not a positive int or an unknown unit."""

    max_length: int
    unit: LengthUnit = "chars"

    def __attrs_post_init__(self) -> None:
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int):
            raise TypeError(f"max_length must be an int, not {type(self.max_length).__name__}")
        if self.max_length < 1:
            raise ValueError(f"max_length must be positive, not {self.max_length}")
        if self.unit not in ("chars", "utf16"):
            raise ValueError(f"unit must be 'chars' or 'utf16', not {self.unit!r}")

    def length(self, text: str) -> int:
        """``text``'s length as the platform counts it."""
        if self.unit == "chars":
            return len(text)
        return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


class LengthLimited(Protocol):
    """``AdapterAbilities.limits_length``: the platform's longest message, when known."""

    @property
    def message_limit(self) -> MessageLimit | None:
        """The limit the platform announced (None: not known, nothing is split)."""
        ...


class DedupingSends(Protocol):
    """``AdapterAbilities.dedupes_sends``: the platform shows a send once per idempotency key.

    Every send of a reply carries ``metadata["idempotency_key"]``, the obligation id, the same
    on each attempt.  An adapter declares this only when, for ``dedupe_window_s`` seconds after
    a send, any resend with that key -- from this process or a later one with the same
    configuration -- is shown on the platform at most once in all.
    """

    @property
    def dedupe_window_s(self) -> float | None:
        """How long the platform deduplicates a send by its key, in seconds (None: it does not,
        or it is not known now; every possible repeat is then labelled)."""
        ...

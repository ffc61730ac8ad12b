"""What the runtime needs from a platform adapter: a send with a definite, typed result.

Any object with ``async send(chat_id, content, metadata=None) -> SendResult`` is an adapter; the
relay's ``RelayAdapter`` is one, a test double is another.  ``connect()`` / ``disconnect()`` are
optional.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from statecore.policy import ErrorKind

__all__ = [
    "InboundLike",
    "InboundSource",
    "PlatformAdapter",
    "SendResult",
    "accepts_budget",
    "accepts_keyword",
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


def accepts_budget(function: Callable[..., Any]) -> bool:
    """True when ``function`` takes a ``budget_s`` keyword (or any keyword)."""
    return accepts_keyword(function, "budget_s")


def accepts_keyword(function: Callable[..., Any], name: str) -> bool:
    """True when ``function`` takes the keyword ``name`` (or any keyword)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )

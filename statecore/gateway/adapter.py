"""What the runtime needs from a platform adapter: a send with a definite, typed result.

Any object with ``async send(chat_id, content, metadata=None) -> SendResult`` is an adapter; the
relay's ``RelayAdapter`` is one, a test double is another.  ``connect()`` / ``disconnect()`` are
optional.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

__all__ = ["PlatformAdapter", "SendResult"]


@attrs.frozen
class SendResult:
    """The outcome of one send.

    * ``success``: the platform acknowledged it (``message_id`` when it gave one).
    * not ``success`` and not ``ambiguous``: it definitely did not go out (``error`` says why);
      a retry cannot duplicate it.
    * ``ambiguous``: it may or may not have gone out (timeout, connection lost mid-request); a
      retry must be labelled as a possible duplicate.
    """

    success: bool
    error: str | None = None
    message_id: str | None = None
    ambiguous: bool = False

    @classmethod
    def ok(cls, message_id: str | None = None) -> SendResult:
        """An acknowledged send."""
        return cls(True, None, message_id, False)

    @classmethod
    def failed(cls, error: str, *, ambiguous: bool = False) -> SendResult:
        """A send that failed (definitely, unless ``ambiguous``)."""
        return cls(False, error, None, ambiguous)


@runtime_checkable
class PlatformAdapter(Protocol):
    """The one method the runtime calls to deliver a reply."""

    async def send(
        self, chat_id: str, content: str, metadata: Mapping[str, Any] | None = None
    ) -> SendResult:
        """Send ``content`` to ``chat_id``; never raise for a platform refusal (return it)."""
        ...

"""The adapters one gateway sends through, by (platform, profile), and what each declared.

Every call the runtime makes on an adapter besides ``send`` goes through :class:`AdapterSet`,
which makes it only when the adapter's :class:`~statecore.gateway.adapter.AdapterAbilities`
say it can: connecting, disconnecting within a deadline, handing inbound messages to a
handler, announcing reconnections, priming a chat's route, naming its housekeeping jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, Protocol, cast

from statecore.clock import Deadline
from statecore.gateway.adapter import (
    AdapterAbilities,
    Connecting,
    Disconnecting,
    Editing,
    InboundDelivering,
    InboundLike,
    KeepingHouse,
    LengthLimited,
    MessageLimit,
    ReconnectAnnouncing,
    RoutePriming,
    SendResult,
    ShowingTyping,
    abilities_of,
)
from statecore.policy import ErrorKind

__all__ = ["AdapterSet", "Sendable", "Target"]

log = logging.getLogger("statecore.gateway.runtime")

Target = tuple[str, str]
"""(platform, profile)."""

InboundCallback = Callable[[InboundLike], Awaitable[None]]


class Sendable(Protocol):
    """The one method every adapter has."""

    async def send(
        self, chat_id: str, content: str, metadata: Mapping[str, Any] | None = None
    ) -> SendResult: ...


class AdapterSet:
    """The adapters of one gateway (see the module docs)."""

    def __init__(self) -> None:
        self._adapters: dict[Target, Sendable] = {}
        self._abilities: dict[Target, AdapterAbilities] = {}

    def add(self, target: Target, adapter: Sendable) -> AdapterAbilities:
        """Register ``adapter`` for ``target`` (replacing any) and return its abilities.

        Raises ``TypeError`` (registering nothing) for an object without ``send`` or with an
        ``abilities`` attribute that is not an ``AdapterAbilities``.
        """
        if not callable(getattr(adapter, "send", None)):
            raise TypeError(f"an adapter needs an async send(), {type(adapter).__name__} has none")
        abilities = abilities_of(adapter)
        self._adapters[target] = adapter
        self._abilities[target] = abilities
        return abilities

    def get(self, target: Target) -> Sendable | None:
        """The adapter for ``target``, or None."""
        return self._adapters.get(target)

    def __iter__(self) -> Iterator[Target]:
        return iter(self._adapters)

    def listen(self, target: Target, inbound: InboundCallback | None) -> None:
        """Hand ``target``'s inbound messages to ``inbound`` (None: hold them, acknowledge
        none), when its adapter delivers inbound at all."""
        if self._abilities[target].delivers_inbound:
            cast(InboundDelivering, self._adapters[target]).on_message(inbound)

    def on_reconnect(self, target: Target, callback: Callable[[], None]) -> None:
        """Call ``callback()`` on each (re)connection of ``target``'s adapter, when it
        announces them."""
        if self._abilities[target].announces_reconnects:
            cast(ReconnectAnnouncing, self._adapters[target]).on_reconnect(callback)

    def connected_targets(self) -> set[Target]:
        """Targets whose adapter can send now (one that does not connect always can)."""
        return {
            target
            for target, adapter in self._adapters.items()
            if not self._abilities[target].connects or cast(Connecting, adapter).connected
        }

    async def connect_all(self) -> None:
        """Connect every adapter that connects and is not connected; a failure is logged."""
        for target, adapter in self._adapters.items():
            if not self._abilities[target].connects:
                continue
            connecting = cast(Connecting, adapter)
            if not connecting.connected:
                try:
                    await connecting.connect()
                except Exception:
                    log.warning("adapter %s/%s failed to connect at start", *target, exc_info=True)

    def prime(self, target: Target, origin: Any) -> None:
        """Let ``target``'s adapter learn a chat's route from a persisted ``origin``, when it
        primes routes (a missing adapter is ignored)."""
        if target in self._adapters and self._abilities[target].primes_routes:
            cast(RoutePriming, self._adapters[target]).prime(origin)

    def housekeeping(
        self, target: Target, retention_s: float
    ) -> Mapping[str, Callable[[], Awaitable[int]]]:
        """The housekeeping jobs of ``target``'s adapter for ``retention_s``, when it keeps
        house (else none)."""
        if not self._abilities[target].keeps_house:
            return {}
        return dict(cast(KeepingHouse, self._adapters[target]).housekeeping(retention_s))

    def message_limit(self, target: Target) -> MessageLimit | None:
        """The longest message ``target``'s adapter announced, when it limits length (None:
        unknown, or no such adapter).  A limit that is not a ``MessageLimit`` is ignored."""
        if target not in self._adapters or not self._abilities[target].limits_length:
            return None
        limit = cast(LengthLimited, self._adapters[target]).message_limit
        return limit if isinstance(limit, MessageLimit) else None

    async def typing(
        self, target: Target, chat_id: str, status: str | None, metadata: Mapping[str, Any]
    ) -> SendResult:
        """Show the bot typing in ``chat_id`` through ``target``'s adapter, when it shows
        typing; a definite failure (``PERMANENT``) when it does not or there is none."""
        if target not in self._adapters or not self._abilities[target].shows_typing:
            return _cannot(target, "show typing")
        adapter = cast(ShowingTyping, self._adapters[target])
        return await _guarded(target, "typing", adapter.typing(chat_id, status, metadata))

    async def edit(
        self,
        target: Target,
        chat_id: str,
        message_id: str,
        content: str,
        metadata: Mapping[str, Any],
    ) -> SendResult:
        """Edit the bot's message ``message_id`` through ``target``'s adapter, when it edits;
        a definite failure (``PERMANENT``) when it does not, there is none, or ``content`` is
        longer than its announced limit (an edit cannot be split)."""
        if target not in self._adapters or not self._abilities[target].edits:
            return _cannot(target, "edit messages")
        limit = self.message_limit(target)
        if limit is not None and limit.length(content) > limit.max_length:
            return SendResult.failed(
                f"too long to edit: {limit.length(content)} > {limit.max_length} {limit.unit}",
                kind=ErrorKind.PERMANENT,
            )
        adapter = cast(Editing, self._adapters[target])
        return await _guarded(target, "edit", adapter.edit(chat_id, message_id, content, metadata))

    async def disconnect_all(self, deadline: Deadline) -> None:
        """Disconnect every adapter that disconnects, each within what is left of ``deadline``
        (and no more: the wait is bounded in case one overruns).  Failures are ignored."""
        for target, adapter in self._adapters.items():
            if not self._abilities[target].disconnects:
                continue
            disconnecting = cast(Disconnecting, adapter)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    disconnecting.disconnect(deadline=deadline), max(0.01, deadline.remaining())
                )


def _cannot(target: Target, what: str) -> SendResult:
    return SendResult.failed(
        f"the adapter for {target[0]}/{target[1]} cannot {what}", kind=ErrorKind.PERMANENT
    )


async def _guarded(target: Target, what: str, call: Awaitable[SendResult]) -> SendResult:
    """``await call``, an adapter's raise turned into an ambiguous failure (logged)."""
    try:
        result: object = await call
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning("adapter %s/%s: %s raised", *target, what, exc_info=True)
        return SendResult.failed(f"{what} raised: {exc}", ambiguous=True)
    if not isinstance(result, SendResult):
        return SendResult.failed(f"{what} returned {type(result).__name__}, not a SendResult")
    return result

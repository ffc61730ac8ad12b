"""The gateway's send path once a reply is recorded and held: send, settle, redeliver claims.

:class:`SendPath` owns what the runtime's sends share:

* the *held* ids -- rows this process is sending now, or holds claims of, about to send them;
  the stuck-row sweep never touches one (a count, since two paths may hold one id at once);
* the *flights* (:mod:`statecore.gateway.flights`): each send and the ledger write that records
  its outcome run as one task the asker's cancellation does not reach;
* the settling writes, tried again on a transient store error
  (:func:`statecore.gateway.writes.retried_write`) and shielded once handed to the ledger;
* the redelivery of claims, one after another, labelled when the user may have seen them --
  unless the adapter's platform provably shows the resend at most once (:func:`dedupe_covers`).

The runtime (:class:`~statecore.gateway.runtime.Gateway`) records, marks attempting and claims;
everything after that is here.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any, NamedTuple, TypeVar, cast

from statecore import tracing
from statecore.async_ledger import AsyncLedger
from statecore.clock import Clock
from statecore.gateway.adapter import DedupingSends, SendResult, abilities_of
from statecore.gateway.adapters import Sendable
from statecore.gateway.flights import Flights
from statecore.gateway.writes import retried_write
from statecore.obligation import Claim

__all__ = ["DEDUPE_MARGIN_MIN_S", "DEDUPE_MARGIN_SHARE", "Redelivered", "SendPath", "dedupe_covers"]

log = logging.getLogger("statecore.gateway.runtime")

T = TypeVar("T")

SETTLE_RETRY_DELAYS_S = (0.1, 0.3, 1.0)
"""The default delays before each retry of a send-path write that raised ``StoreError``."""

DEDUPE_MARGIN_SHARE = 0.1
"""The share of an adapter's dedupe window kept as a safety margin (see :func:`dedupe_covers`)."""
DEDUPE_MARGIN_MIN_S = 60.0
"""The least safety margin, in seconds, whatever the window."""


def dedupe_covers(window_s: float | None, created_at: float, now: float) -> bool:
    """Whether a platform that shows a send once per idempotency key for ``window_s`` seconds
    provably does so for every attempt of a reply recorded at ``created_at`` (wall clock), when
    it is resent at ``now``.

    Every attempt was made after the reply was recorded, so it is enough that the reply's age
    is under the window less a margin -- :data:`DEDUPE_MARGIN_SHARE` of it, at least
    :data:`DEDUPE_MARGIN_MIN_S` -- which allows for the resend's own time on the way and for
    the recording host's clock disagreeing with this one's (a reply recorded more than the
    margin in the future is not covered either).  Raises nothing; False for no window.
    """
    if window_s is None:
        return False
    margin = max(DEDUPE_MARGIN_MIN_S, DEDUPE_MARGIN_SHARE * window_s)
    age = now - created_at
    return -margin < age < window_s - margin


def _dedupe_window(adapter: object) -> float | None:
    """The dedupe window ``adapter`` declares (``AdapterAbilities.dedupes_sends``), in seconds:
    None when it declares none, gives None, gives something that is not a positive finite
    number, or raises reading it (every possible repeat is then labelled).  Raises
    ``TypeError`` only for an ``abilities`` attribute that is not an ``AdapterAbilities``."""
    if not abilities_of(adapter).dedupes_sends:
        return None
    try:
        window: object = cast(DedupingSends, adapter).dedupe_window_s
    except Exception:
        log.warning("reading the dedupe window of %s failed", type(adapter).__name__, exc_info=True)
        return None
    if isinstance(window, bool) or not isinstance(window, int | float):
        return None
    return float(window) if 0 < window < float("inf") else None


class Redelivered(NamedTuple):
    """What one redelivery run sent: ``labelled`` counts the resends sent with the
    possible-repeat label, never those the platform deduplicates (see ``SendPath.deduped``)."""

    delivered: int
    labelled: int


class SendPath:
    """The send path of one gateway over its ledger, on its clock (see the module docs)."""

    def __init__(self, ledger: AsyncLedger, clock: Clock) -> None:
        self.ledger = ledger
        self.clock = clock
        self.settle_retry_delays_s: tuple[float, ...] = SETTLE_RETRY_DELAYS_S
        """Delays (clock seconds) before each retry of a write that raised ``StoreError``."""
        self.flights = Flights()
        """The sends in flight, each with its settling write."""
        self.delivered = 0
        """Replies delivered (first sends and redeliveries)."""
        self.redelivered = 0
        """Of those, redeliveries of claimed rows."""
        self.labelled = 0
        """Of those, redeliveries sent with a possible-duplicate label."""
        self.deduped = 0
        """Of the redeliveries, those that may repeat an earlier send but went without a label:
        the adapter's platform shows one send per idempotency key and its window covered every
        attempt (:func:`dedupe_covers`).  Never counted in ``labelled``."""
        self._held: Counter[str] = Counter()
        tracing.refresh()  # a tracer provider configured before the gateway was built

    # -- holding -------------------------------------------------------------------------------

    def hold(self, obligation_ids: Iterable[str]) -> None:
        """Mark rows as being sent by this process: the stuck sweep leaves them alone."""
        self._held.update(obligation_ids)

    def let_go(self, obligation_id: str) -> None:
        """Undo one :meth:`hold` of ``obligation_id``."""
        left = self._held[obligation_id] - 1
        if left > 0:
            self._held[obligation_id] = left
        else:
            self._held.pop(obligation_id, None)

    def held(self) -> frozenset[str]:
        """The ids held now."""
        return frozenset(self._held)

    # -- sending -------------------------------------------------------------------------------

    async def send_and_settle(
        self,
        adapter: Sendable,
        chat_id: str,
        *,
        content: str,
        thread_id: str | None,
        reply_to: str | None,
        obligation_id: str,
    ) -> tuple[SendResult, bool]:
        """Send and record the outcome as one flight: the caller's cancellation never cuts it
        between the platform's answer and the ledger's mark.  Returns the send's result and
        whether the row is now delivered."""
        self.hold((obligation_id,))
        flight = self.flights.launch(
            self._fly(
                adapter,
                chat_id,
                content=content,
                thread_id=thread_id,
                reply_to=reply_to,
                obligation_id=obligation_id,
            ),
            landed=partial(self.let_go, obligation_id),
        )
        return await asyncio.shield(flight)

    async def _fly(
        self,
        adapter: Sendable,
        chat_id: str,
        *,
        content: str,
        thread_id: str | None,
        reply_to: str | None,
        obligation_id: str,
    ) -> tuple[SendResult, bool]:
        metadata: dict[str, Any] = {"idempotency_key": obligation_id}
        if thread_id is not None:
            metadata["thread_id"] = thread_id
        if reply_to is not None:
            metadata["reply_to"] = reply_to
        with (
            tracing.span("obligation deliver", self._attributes(obligation_id, chat_id))
            if tracing.enabled
            else tracing.OFF
        ) as span:
            try:
                result = await adapter.send(chat_id, content, metadata)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("adapter send raised for %s: %s", obligation_id, exc, exc_info=True)
                result = SendResult.failed(f"send raised: {exc}", ambiguous=True)
            if span is not None:
                span.set_attribute("statecore.success", result.success)
                span.set_attribute("statecore.ambiguous", result.ambiguous)
            return result, await self.settle(obligation_id, result)

    def _attributes(self, obligation_id: str, chat_id: str | None = None) -> dict[str, Any]:
        """The attributes of this process's obligation spans (tracing is on)."""
        return {
            "statecore.kind": "obligation",
            "statecore.obligation_id": obligation_id,
            "statecore.chat_id": chat_id,
            "statecore.owner": self.ledger.incarnation.label,
        }

    async def settle(self, obligation_id: str, result: SendResult) -> bool:
        """Write the send's outcome; True when the row is now delivered.  A write that keeps
        failing leaves the row attempting, for the stuck-row recovery.  While tracing is on
        the write is an ``obligation settle`` span."""
        if not tracing.enabled:
            return await self._settle(obligation_id, result)
        attributes = self._attributes(obligation_id)
        attributes["statecore.event"] = "deliver" if result.success else "fail"
        with tracing.span("obligation settle", attributes):
            return await self._settle(obligation_id, result)

    async def _settle(self, obligation_id: str, result: SendResult) -> bool:
        if result.success:
            settled = await self.write(
                "mark_delivered",
                obligation_id,
                lambda: self.ledger.mark_delivered(obligation_id),
                settling=True,
            )
            if settled is None:
                return False
            self.delivered += 1
            return True
        error = result.error or "send failed"
        await self.write(
            "mark_failed",
            obligation_id,
            lambda: self.ledger.mark_failed(
                obligation_id, error, kind=result.kind, ambiguous=result.ambiguous
            ),
            settling=True,
        )
        return False

    async def release(self, obligation_id: str) -> None:
        """Hand back a claim that was never sent (refunded), shielded like a settle."""
        await self.write(
            "release", obligation_id, partial(self.ledger.release, obligation_id), settling=True
        )

    async def write(
        self,
        what: str,
        obligation_id: str,
        write: Callable[[], Awaitable[T]],
        *,
        settling: bool = False,
    ) -> T | None:
        """One send-path ledger write, tried again on ``StoreError`` after each of
        ``settle_retry_delays_s`` (:func:`~statecore.gateway.writes.retried_write`): its
        result, or None once every try failed.  A definite refusal is raised at once."""
        return await retried_write(
            what,
            obligation_id,
            write,
            clock=self.clock,
            delays=self.settle_retry_delays_s,
            settling=settling,
        )

    # -- redelivering claims -------------------------------------------------------------------

    async def redeliver(
        self, claims: list[Claim], adapter_of: Callable[[str, str], Sendable | None]
    ) -> Redelivered:
        """Send each held claim in turn through ``adapter_of(platform, profile)``, letting each
        go once done with it (all of them, even when cancelled: those never sent are then
        released, refunded); returns what was delivered."""
        delivered = labelled = 0
        left = list(reversed(claims))
        try:
            while left:
                claim = left[-1]
                try:
                    sent = await self._redeliver_one(claim, adapter_of)
                    if sent is not None:
                        delivered += 1
                        labelled += int(sent)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # One claim's trouble (a store hiccup settling it) never strands the others.
                    log.warning("redelivery of %s failed", claim.obligation_id, exc_info=True)
                finally:
                    left.pop()
                    self.let_go(claim.obligation_id)
        except asyncio.CancelledError:
            # Stopping: what was never sent is handed back now, not left looking attempted.
            for claim in left:
                self.hold((claim.obligation_id,))
                self.flights.launch(
                    self.release(claim.obligation_id),
                    landed=partial(self.let_go, claim.obligation_id),
                )
            raise
        finally:
            for claim in left:
                self.let_go(claim.obligation_id)
        return Redelivered(delivered, labelled)

    async def _redeliver_one(
        self, claim: Claim, adapter_of: Callable[[str, str], Sendable | None]
    ) -> bool | None:
        """Send one claim, labelled if needed (unless its platform deduplicates it); hand it
        back (refunded) when its adapter is missing.  None if it was not delivered, else
        whether it went labelled.  While tracing is on it is an ``obligation redeliver`` span,
        a child of the span that recorded the row (its creation audit entry keeps that
        ``traceparent``): the same trace, whichever process recorded it."""
        if not tracing.enabled:
            return await self._resend(claim, adapter_of)
        ob = claim.obligation
        attributes = self._attributes(ob.obligation_id, ob.chat_id)
        attributes.update(
            {
                "statecore.fence": ob.fence,
                "statecore.attempts": claim.attempts,
                "statecore.platform": ob.platform,
                "statecore.profile": claim.profile,
                "statecore.reason": claim.reason,
                "statecore.recorded_by": str(ob.owner),
            }
        )
        parent = await self._recorded_trace(ob.obligation_id)
        with tracing.span("obligation redeliver", attributes, parent=parent, source="the ledger"):
            return await self._resend(claim, adapter_of)

    async def _recorded_trace(self, obligation_id: str) -> str | None:
        """The ``traceparent`` the row's creation audit entry keeps, or None (none kept, or the
        history cannot be read now: the redelivery then starts a trace of its own)."""
        try:
            history = await self.ledger.history(obligation_id)
        except Exception:
            log.debug("reading the trace of %s failed", obligation_id, exc_info=True)
            return None
        first = history[0] if history else None
        if first is None or first.event != "record":
            return None
        return tracing.traceparent_of_reason(first.reason)

    async def _resend(
        self, claim: Claim, adapter_of: Callable[[str, str], Sendable | None]
    ) -> bool | None:
        ob = claim.obligation
        oid = ob.obligation_id
        adapter = adapter_of(ob.platform, claim.profile)
        if adapter is None:
            await self.release(oid)  # refund; never strand it
            return None
        # The same idempotency key as every earlier attempt: within the window the platform
        # shows either the first copy (unlabelled) or this one, once.
        deduped = claim.needs_marker and dedupe_covers(
            _dedupe_window(adapter), ob.created_at, self.clock.now()
        )
        _, settled = await self.send_and_settle(
            adapter,
            ob.chat_id,
            content=ob.content if deduped else claim.render(),
            thread_id=ob.thread_id,
            reply_to=ob.reply_to,
            obligation_id=oid,
        )
        if not settled:
            return None
        labelled = claim.needs_marker and not deduped
        self.redelivered += 1
        self.labelled += int(labelled)
        self.deduped += int(deduped)
        if deduped:
            log.debug(
                "redelivered %s without a label: its platform deduplicates it by key",
                oid,
                extra={"obligation_id": oid, "reason": claim.reason, "deduped": True},
            )
        return labelled

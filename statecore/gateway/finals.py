"""A final reply from the handler to the platform: fitted to the adapter's announced limit
(:mod:`statecore.gateway.long_replies`), recorded -- one obligation per part, every part before
the first is sent -- then each part marked attempting, sent and settled, in order.

:class:`Finals` is what :meth:`Gateway.send_final <statecore.gateway.Gateway.send_final>` runs;
the send and its settling write are the send path's (:mod:`statecore.gateway.sending`).
"""

from __future__ import annotations

from statecore import tracing
from statecore.async_ledger import AsyncLedger
from statecore.errors import InvalidTransition, StaleState
from statecore.gateway.adapter import SendResult
from statecore.gateway.adapters import AdapterSet
from statecore.gateway.long_replies import LongReplies, fit_reply, part_ref
from statecore.gateway.sending import SendPath
from statecore.lifecycles import ObligationState
from statecore.obligation import Obligation

__all__ = ["Finals"]


class Finals:
    """The final replies of one gateway (see the module docs)."""

    def __init__(
        self, ledger: AsyncLedger, path: SendPath, adapters: AdapterSet, long_replies: LongReplies
    ) -> None:
        self.ledger = ledger
        self.path = path
        self.adapters = adapters
        self.long_replies = long_replies

    async def send(
        self,
        *,
        session_key: str,
        platform: str,
        chat_id: str,
        content: str,
        message_ref: str | int | None,
        thread_id: str | None,
        reply_to: str | None,
        profile: str,
    ) -> SendResult:
        """``Gateway.send_final``: the last part's result, or that of the first part that did
        not go out (the parts after it stay owed, pending, for the ledger's recovery)."""
        limit = self.adapters.message_limit((platform, profile))
        parts = fit_reply(content, limit, self.long_replies)
        refs = (
            [message_ref]
            if len(parts) == 1
            else [part_ref(message_ref, n, len(parts)) for n in range(1, len(parts) + 1)]
        )
        # Every part is recorded before the first is sent (a crash in between replays the turn,
        # which records the same parts under the same ids); all are held, so the stuck sweep
        # never sends a later part while an earlier one is on its way.  Only the first part
        # replies to the message.
        recorded: list[Obligation] = []
        for number, (part, ref) in enumerate(zip(parts, refs, strict=True)):
            with (
                tracing.span("obligation record", _record_attributes(platform, chat_id, profile))
                if tracing.enabled
                else tracing.OFF
            ) as span:
                # The record keeps this span's traceparent (see statecore.tracing).
                obligation = await self.ledger.record(
                    session_key=session_key,
                    platform=platform,
                    chat_id=chat_id,
                    content=part,
                    message_ref=ref,
                    thread_id=thread_id,
                    reply_to=None if number else reply_to,
                    adapter_profile=profile,
                    trace=None if span is None else tracing.current_traceparent(),
                )
                if span is not None:
                    span.set_attribute("statecore.obligation_id", obligation.obligation_id)
                    span.set_attribute("statecore.fence", obligation.fence)
                    span.set_attribute("statecore.state", obligation.state.value)
                    span.set_attribute("statecore.owner", str(obligation.owner))
            recorded.append(obligation)
        ids = [ob.obligation_id for ob in recorded]
        self.path.hold(ids)
        try:
            result = SendResult.ok()
            for number, obligation in enumerate(recorded):
                result = await self._send_recorded(
                    obligation, chat_id, thread_id, None if number else reply_to
                )
                if not result.success:
                    return result
            return result
        finally:
            for oid in ids:
                self.path.let_go(oid)

    async def _send_recorded(
        self, obligation: Obligation, chat_id: str, thread_id: str | None, reply_to: str | None
    ) -> SendResult:
        """Mark attempting, send and settle one recorded reply (or part) of this process."""
        oid = obligation.obligation_id
        platform, profile = obligation.platform, obligation.adapter_profile
        mine = obligation.owner.token == self.ledger.incarnation.token
        if obligation.state is not ObligationState.PENDING or not mine:
            # Recorded before (a replayed turn): its ledger row, not this call, owns the send.
            if obligation.state is ObligationState.DELIVERED:
                return SendResult.ok()
            return SendResult.failed("already owed; the ledger will deliver it")
        try:
            marked = await self.path.write(
                "mark_attempting", oid, lambda: self.ledger.mark_attempting(oid)
            )
        except (InvalidTransition, StaleState):
            return SendResult.failed("already being sent")
        if marked is None:
            return SendResult.failed("the ledger is unavailable; kept owed, sent later")
        adapter = self.adapters.get((platform, profile))
        if adapter is None:
            # The policy's reconnect error: resent when that adapter connects.
            await self.path.release(oid)
            return SendResult.failed(f"no adapter for {platform}/{profile}; kept owed")
        result, _ = await self.path.send_and_settle(
            adapter,
            chat_id,
            content=obligation.content,
            thread_id=thread_id,
            reply_to=reply_to,
            obligation_id=oid,
        )
        return result


def _record_attributes(platform: str, chat_id: str, profile: str) -> dict[str, str]:
    """The attributes an ``obligation record`` span starts with (tracing is on)."""
    return {
        "statecore.kind": "obligation",
        "statecore.platform": platform,
        "statecore.chat_id": chat_id,
        "statecore.profile": profile,
    }

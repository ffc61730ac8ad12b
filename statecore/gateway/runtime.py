"""The gateway runtime: where a bot is built.

``Gateway`` binds platform adapters (a :class:`~relay.client.adapter.RelayAdapter` per connector
identity, or any object with ``async send(chat_id, content, metadata)``) to the delivery ledger:

* every final reply goes through :meth:`Gateway.send_final`: recorded (pending), marked
  attempting, sent, settled -- all store work off the event loop (``AsyncLedger``);
* at :meth:`~Gateway.start` it claims dead owners' rows for the (platform, profile) pairs that
  are connected now (no attempt is spent on a send that cannot happen), clears each session's
  ``resume_pending`` flag **before** any send, then redelivers in the background -- plainly when
  the send never began, labelled when it may have;
* on an adapter's reconnect and on a timer it retries this incarnation's transient failures,
  scoped to platform and profile; a claim that cannot be sent is released, its attempt refunded;
* a ledger write of the send path that fails on a transient store error (a lock another process
  holds) is retried a few times on the gateway's clock; if it still fails the row is left where
  it is, and the timer re-sends this incarnation's rows stuck in ``pending`` or ``attempting``
  for longer than ``stuck_after_s`` that nothing in this process is sending -- plainly when the
  send never began, labelled when it may have.

The bot's logic is an inbound handler: ``gateway.on_message(handler)``; the handler receives a
:class:`Turn` whose :meth:`Turn.reply` is ``send_final`` for that message.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any, Protocol, TypeVar

from statecore.async_ledger import AsyncLedger
from statecore.clock import Clock, Deadline, SystemClock
from statecore.errors import InvalidTransition, StaleState, StoreError
from statecore.gateway.adapter import InboundLike, SendResult
from statecore.gateway.adapters import AdapterSet, Sendable
from statecore.gateway.completions import deliver_completions
from statecore.gateway.delegations import Delegation, Delegations
from statecore.gateway.routing import Route
from statecore.gateway.sessions import Session, SessionStore
from statecore.gateway.turn import Message, MessageHandler, Turn
from statecore.lifecycles import ObligationState
from statecore.obligation import Claim
from statecore.ownership import Incarnation, ProcessProbe
from statecore.policy import LedgerPolicy
from statecore.store import Store

__all__ = ["Gateway", "SessionFlags"]

log = logging.getLogger(__name__)

_DEFAULT_STOP_BUDGET_S = 10.0
_SETTLE_RETRY_DELAYS_S = (0.1, 0.3, 1.0)

_T = TypeVar("_T")


class SessionFlags(Protocol):
    """What the runtime needs from the session store: clear the flag that would replay a turn."""

    async def clear_resume_pending(self, session_key: str) -> object:
        """Clear ``resume_pending`` for ``session_key`` (may raise if the store is down)."""
        ...


class Gateway:
    """The runtime (see the module docs).

    ``Gateway(store, *, sessions=None, clock=None, teardown_clock=None, incarnation=None,
    probe=None, policy=None, retry_interval_s=15.0, prune_interval_s=3600.0,
    stuck_after_s=30.0)``.  ``sessions`` is any
    object with ``async clear_resume_pending(session_key)``; the default is the persisted
    session store over the same ``store``.  ``retry_interval_s`` is the period of the retry
    timer; ``prune_interval_s`` how often that timer also prunes (0: never);
    ``stuck_after_s`` how long one of this incarnation's own rows may stay ``pending`` or
    ``attempting`` without being sent by this process before the timer re-sends it (see
    :meth:`redeliver_stuck`).  Intervals must be non-negative numbers and the retry interval
    and the stuck grace positive (``ValueError`` otherwise).

    The send path's ledger writes (mark attempting, delivered, failed; release) that raise
    ``StoreError`` are tried again after each delay of ``settle_retry_delays_s`` (default
    ``(0.1, 0.3, 1.0)`` seconds on the gateway's clock); a definite refusal
    (``InvalidTransition``, ``StaleState``) is never retried.

    The class is long because it is the one owner of the send path's invariants (a reply is
    held while this process sends it, settled or left for the stuck sweep, never sent twice by
    two paths); the adapters (:mod:`statecore.gateway.adapters`), turns
    (:mod:`statecore.gateway.turn`) and completions (:mod:`statecore.gateway.completions`)
    live in their own modules.

    ``clock`` drives every timer of the runtime; ``teardown_clock`` (default: the system
    clock) bounds :meth:`stop`, whose waits are on real work (in-flight sends, adapters'
    teardown) and must end in real time even when ``clock`` is a test's fake one.
    """

    def __init__(
        self,
        store: Store,
        *,
        sessions: SessionFlags | None = None,
        clock: Clock | None = None,
        teardown_clock: Clock | None = None,
        incarnation: Incarnation | None = None,
        probe: ProcessProbe | None = None,
        policy: LedgerPolicy | None = None,
        retry_interval_s: float = 15.0,
        prune_interval_s: float = 3600.0,
        stuck_after_s: float = 30.0,
    ) -> None:
        for name, value in (
            ("retry_interval_s", retry_interval_s),
            ("prune_interval_s", prune_interval_s),
            ("stuck_after_s", stuck_after_s),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a non-negative number, not {value!r}")
        if not retry_interval_s:
            raise ValueError("retry_interval_s must be positive")
        if not stuck_after_s or not math.isfinite(stuck_after_s):
            raise ValueError(f"stuck_after_s must be positive and finite, not {stuck_after_s!r}")
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self._teardown_clock: Clock = teardown_clock or SystemClock()
        self.ledger = AsyncLedger(
            store, policy=policy, clock=self.clock, incarnation=incarnation, probe=probe
        )
        self.sessions: SessionFlags = (
            sessions if sessions is not None else _default_sessions(store, self.clock)
        )
        self.retry_interval_s = retry_interval_s
        self.prune_interval_s = prune_interval_s
        """How often the retry timer also prunes settled obligations past the policy's
        retention (0: never; pruning never touches an owed row)."""
        self.stuck_after_s = stuck_after_s
        """Grace after which an own row left pending or attempting, and not being sent by this
        process, is re-sent by the retry timer."""
        self.settle_retry_delays_s: tuple[float, ...] = _SETTLE_RETRY_DELAYS_S
        """Delays (gateway clock seconds) before each retry of a send-path ledger write that
        raised ``StoreError``; one try plus one per delay, then the row is left for
        :meth:`redeliver_stuck`."""
        # Obligation ids this process is sending (or holds a claim of, about to send): the stuck
        # sweep never touches them.  A count, since two paths may hold one id at once.
        self._in_flight: Counter[str] = Counter()
        self._adapters = AdapterSet()
        self._handler: MessageHandler | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._retry_loop: asyncio.Task[None] | None = None
        self._started = False
        self.delivered = 0
        """Replies delivered by this process (first sends and redeliveries)."""
        self.redelivered = 0
        """Of those, redeliveries of claimed rows."""
        self.labelled = 0
        """Of those, redeliveries sent with a possible-duplicate label."""

    # -- wiring --------------------------------------------------------------------------------

    def add_adapter(self, platform: str, adapter: Sendable, *, profile: str = "default") -> None:
        """Send replies for ``(platform, profile)`` through ``adapter``.

        What else the runtime does with it follows the adapter's declared
        :class:`~statecore.gateway.adapter.AdapterAbilities`: one that delivers inbound hands its
        messages to the bot's handler; one that announces reconnects triggers the runtime retry
        on every reconnect.  Raises ``TypeError`` for an adapter without ``send`` or with an
        ``abilities`` attribute that is not an ``AdapterAbilities``.
        """
        target = (platform, profile)
        self._adapters.add(target, adapter)
        self._listen(target)
        self._adapters.on_reconnect(target, self._reconnect_listener(platform, profile))

    def on_message(self, handler: MessageHandler | None) -> None:
        """Run ``await handler(turn)`` for every inbound message (outside the socket reader).

        An exception in the handler is logged and never kills the gateway; a buffered message
        whose handler raised is not acked, so the connector replays it -- replies the handler
        had already sent are not sent twice (their obligations already exist).
        """
        self._handler = handler
        for target in self._adapters:
            self._listen(target)

    def _listen(self, target: tuple[str, str]) -> None:
        """Route the adapter's inbound messages to the handler -- only once there is one, so
        that nothing is acknowledged before a handler has seen it."""
        if self._handler is None:
            self._adapters.listen(target, None)
            return
        profile = target[1]

        async def inbound(event: InboundLike) -> None:
            await self._dispatch(Message.from_event(event, profile=profile))

        self._adapters.listen(target, inbound)

    async def _dispatch(self, message: Message) -> None:
        if self._handler is None:
            return
        await self._handler(Turn(self, message))

    def _reconnect_listener(self, platform: str, profile: str) -> Callable[[], None]:
        def reconnected() -> None:
            # A connection made during start() is covered by start()'s own sweep.
            if self._started:
                self._spawn(self._reconnected(platform, profile))

        return reconnected

    async def _reconnected(self, platform: str, profile: str) -> None:
        """An adapter (re)connected: what a dead process left for it can be sent now (the
        startup path, scoped to this target), and so can this process's own failures."""
        try:
            claims = await self._claim_recoverable({(platform, profile)})
            await self._redeliver(claims)
            await self.redeliver_failed(platform, profile=profile)
        except Exception:
            log.warning("recovery after %s/%s reconnected failed", platform, profile, exc_info=True)

    def adapter(self, platform: str, profile: str = "default") -> Sendable | None:
        """The adapter for ``(platform, profile)``, or None."""
        return self._adapters.get((platform, profile))

    # -- sending -------------------------------------------------------------------------------

    async def send_final(
        self,
        *,
        session_key: str,
        platform: str,
        chat_id: str,
        content: str,
        message_ref: str | int | None,
        thread_id: str | None = None,
        reply_to: str | None = None,
        profile: str = "default",
    ) -> SendResult:
        """Send a bot's final reply durably: record, mark attempting, send, settle.

        The same reply to the same message (same session key, message and text) is recorded
        once: a repeat returns the first one's outcome instead of sending twice.  No adapter for
        ``(platform, profile)`` → the reply is kept owed (released with ``send_path_degraded``)
        and sent when that adapter connects.  A ledger write after the record that keeps
        failing with ``StoreError`` (see ``settle_retry_delays_s``) is logged and the reply kept
        owed: a failed result is returned when the send never began, the platform's result when
        it did, and the retry timer re-sends the row once it is stuck (:meth:`redeliver_stuck`).
        Raises ``TypeError``/``ValueError`` for bad input (nothing is recorded then) and
        ``StoreError`` when the ledger cannot record it (nothing is owed then: retry the call).
        """
        obligation = await self.ledger.record(
            session_key=session_key,
            platform=platform,
            chat_id=chat_id,
            content=content,
            message_ref=message_ref,
            thread_id=thread_id,
            reply_to=reply_to,
            adapter_profile=profile,
        )
        oid = obligation.obligation_id
        mine = obligation.owner.token == self.ledger.incarnation.token
        if obligation.state is not ObligationState.PENDING or not mine:
            # Recorded before (a replayed turn): its ledger row, not this call, owns the send.
            if obligation.state is ObligationState.DELIVERED:
                return SendResult.ok()
            return SendResult.failed("already owed; the ledger will deliver it")
        self._hold((oid,))
        try:
            try:
                marked = await self._ledger_write(
                    "mark_attempting", oid, lambda: self.ledger.mark_attempting(oid)
                )
            except (InvalidTransition, StaleState):
                return SendResult.failed("already being sent")
            if marked is None:
                return SendResult.failed("the ledger is unavailable; kept owed, sent later")
            adapter = self.adapter(platform, profile)
            if adapter is None:
                # The policy's reconnect error: resent when that adapter connects.
                await self._ledger_write("release", oid, lambda: self.ledger.release(oid))
                return SendResult.failed(f"no adapter for {platform}/{profile}; kept owed")
            result = await self._send(
                adapter,
                chat_id,
                content=content,
                thread_id=thread_id,
                reply_to=reply_to,
                obligation_id=oid,
            )
            await self._settle(oid, result)
            return result
        finally:
            self._let_go(oid)

    async def _send(
        self,
        adapter: Sendable,
        chat_id: str,
        *,
        content: str,
        thread_id: str | None,
        reply_to: str | None,
        obligation_id: str,
    ) -> SendResult:
        metadata: dict[str, Any] = {"idempotency_key": obligation_id}
        if thread_id is not None:
            metadata["thread_id"] = thread_id
        if reply_to is not None:
            metadata["reply_to"] = reply_to
        try:
            return await adapter.send(chat_id, content, metadata)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("adapter send raised for %s: %s", obligation_id, exc, exc_info=True)
            return SendResult.failed(f"send raised: {exc}", ambiguous=True)

    async def _settle(self, obligation_id: str, result: SendResult) -> bool:
        """Write the send's outcome; True when the row is now delivered.  A write that keeps
        failing leaves the row attempting, for :meth:`redeliver_stuck`."""
        if result.success:
            settled = await self._ledger_write(
                "mark_delivered", obligation_id, lambda: self.ledger.mark_delivered(obligation_id)
            )
            if settled is None:
                return False
            self.delivered += 1
            return True
        error = result.error or "send failed"
        await self._ledger_write(
            "mark_failed",
            obligation_id,
            lambda: self.ledger.mark_failed(
                obligation_id, error, kind=result.kind, ambiguous=result.ambiguous
            ),
        )
        return False

    async def _ledger_write(
        self, what: str, obligation_id: str, write: Callable[[], Awaitable[_T]]
    ) -> _T | None:
        """Run one send-path ledger write, trying it again after each of
        ``settle_retry_delays_s`` while it raises ``StoreError`` (a lock, a busy disk).

        Returns the write's result, or None once every try failed (logged at WARNING with the
        obligation id; the row stays where it is, for :meth:`redeliver_stuck`).  A definite
        refusal (``InvalidTransition``, ``StaleState``, ``UnknownEntity``) is raised at once.
        """
        delays = self.settle_retry_delays_s
        tried = 0
        while True:
            try:
                return await write()
            except StoreError as exc:
                if tried == len(delays):
                    log.warning(
                        "gave up %s for %s after %d tries (%s); the row is left for the "
                        "stuck-row recovery",
                        what,
                        obligation_id,
                        tried + 1,
                        exc,
                    )
                    return None
                log.info("%s for %s failed (%s); trying again", what, obligation_id, exc)
            await self.clock.sleep(delays[tried])
            tried += 1

    def _hold(self, obligation_ids: Iterable[str]) -> None:
        """Mark rows as being sent by this process: the stuck sweep leaves them alone."""
        self._in_flight.update(obligation_ids)

    def _let_go(self, obligation_id: str) -> None:
        """Undo one :meth:`_hold` of ``obligation_id``."""
        left = self._in_flight[obligation_id] - 1
        if left > 0:
            self._in_flight[obligation_id] = left
        else:
            self._in_flight.pop(obligation_id, None)

    def in_flight(self) -> frozenset[str]:
        """Ids of the obligations this process is sending now (or holds claims of, about to
        send them): :meth:`redeliver_stuck` never touches these."""
        return frozenset(self._in_flight)

    # -- recovery ------------------------------------------------------------------------------

    def connected_targets(self) -> set[tuple[str, str]]:
        """(platform, profile) pairs whose adapter can send now."""
        return self._adapters.connected_targets()

    async def start(self) -> int:
        """Check the ledger's store, connect adapters, claim what dead owners left for
        connected targets, clear their sessions' ``resume_pending`` flags, then redeliver in the
        background; start the retry timer.  Returns how many rows were claimed.

        The store is checked first (a real read and a write transaction begun, see
        ``Ledger.check``): when it is locked past its busy timeout, corrupt or unreadable,
        ``StoreError`` naming the problem is raised before any adapter is connected; fix the
        store (or wait for the lock) and call ``start()`` again.
        """
        await self.ledger.check()
        await self._adapters.connect_all()
        claims = await self._claim_recoverable()
        self._started = True
        if claims:
            self._spawn(self._redeliver(claims))
        if self._retry_loop is None or self._retry_loop.done():
            self._retry_loop = asyncio.create_task(self._retry_timer(), name="gateway-retry")
        return len(claims)

    async def redeliver_pending(self) -> int:
        """The startup path, awaited to the end: claim, clear flags, send; returns how many
        replies were delivered."""
        return await self._redeliver(await self._claim_recoverable())

    async def _claim_recoverable(self, targets: set[tuple[str, str]] | None = None) -> list[Claim]:
        """The startup sweep for ``targets`` (default: the connected ones), then each claim's
        ``resume_pending`` cleared (a failed clear still sends).  Each claim is held in flight
        until :meth:`_redeliver` is done with it."""
        deliverable = self.connected_targets() if targets is None else targets
        claims = await self.ledger.sweep_recoverable(deliverable_targets=deliverable)
        self._hold(claim.obligation_id for claim in claims)
        for claim in claims:
            try:
                # Before any send: a turn whose reply is owed must never also be resumed.
                await self.sessions.clear_resume_pending(claim.obligation.session_key)
            except Exception:
                log.warning(
                    "could not clear resume_pending for %s; sending anyway",
                    claim.obligation.session_key,
                    exc_info=True,
                )
        return claims

    async def redeliver_failed(self, platform: str, *, profile: str | None = None) -> int:
        """The runtime path: re-claim this incarnation's retryable failures on ``platform``
        (and ``profile``) and send them labelled; returns how many were delivered."""
        claims = await self.ledger.sweep_failed_for_runtime(platform, profile=profile)
        self._hold(claim.obligation_id for claim in claims)
        return await self._redeliver(await self._cleared_at_runtime(claims))

    async def redeliver_stuck(self) -> int:
        """Recover this incarnation's own replies stuck on a failed ledger write: rows it owns
        that stayed ``pending`` or ``attempting`` for longer than ``stuck_after_s`` on the
        gateway's clock, that this process is not sending now, for a connected (platform,
        profile).  Each is claimed with one guarded write and sent -- plainly when it was
        pending (the send never began), with the recovered label when it was attempting (it
        may have gone out).  Runs on the retry timer; returns how many were delivered.

        Raises ``StoreError`` when the sweep itself cannot run (nothing was claimed then);
        another owner's rows are never touched.
        """
        claims = await self.ledger.sweep_stuck_own(
            older_than_s=self.stuck_after_s,
            exclude=self.in_flight(),
            deliverable_targets=self.connected_targets(),
        )
        self._hold(claim.obligation_id for claim in claims)
        if claims:
            log.info("re-sending %d stuck obligations of this process", len(claims))
        return await self._redeliver(await self._cleared_at_runtime(claims))

    async def _cleared_at_runtime(self, claims: list[Claim]) -> list[Claim]:
        """Clear each claim's ``resume_pending``; a claim whose clear failed is released
        (refunded) and let go, never sent.  Returns the claims ready to send (still held)."""
        ready: list[Claim] = []
        for claim in claims:
            oid = claim.obligation_id
            try:
                await self.sessions.clear_resume_pending(claim.obligation.session_key)
            except Exception:
                # At runtime a failed clear sends nothing: hand the claim back, refunded.
                log.warning("could not clear resume_pending; releasing %s", oid)
                try:
                    await self._ledger_write("release", oid, partial(self.ledger.release, oid))
                finally:
                    self._let_go(oid)
                continue
            ready.append(claim)
        return ready

    async def _redeliver(self, claims: list[Claim]) -> int:
        """Send each held claim in turn, letting each go once done with it (all of them, even
        when cancelled); returns how many were delivered."""
        delivered = 0
        left = list(reversed(claims))
        try:
            while left:
                claim = left[-1]
                try:
                    delivered += await self._redeliver_one(claim)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # One claim's trouble (a store hiccup settling it) never strands the others.
                    log.warning("redelivery of %s failed", claim.obligation_id, exc_info=True)
                finally:
                    left.pop()
                    self._let_go(claim.obligation_id)
        finally:
            for claim in left:
                self._let_go(claim.obligation_id)
        return delivered

    async def _redeliver_one(self, claim: Claim) -> int:
        """Send one claim, labelled if needed; hand it back (refunded) when its adapter is
        missing.  Returns 1 if it was delivered."""
        ob = claim.obligation
        oid = ob.obligation_id
        adapter = self.adapter(ob.platform, claim.profile)
        if adapter is None:
            # Refund; never strand it.
            await self._ledger_write("release", oid, lambda: self.ledger.release(oid))
            return 0
        result = await self._send(
            adapter,
            ob.chat_id,
            content=claim.render(),
            thread_id=ob.thread_id,
            reply_to=ob.reply_to,
            obligation_id=oid,
        )
        if not await self._settle(oid, result):
            return 0
        self.redelivered += 1
        self.labelled += int(claim.needs_marker)
        return 1

    async def deliver_completions(
        self,
        delegations: Delegations,
        sessions: SessionStore,
        render: Callable[[Delegation], str],
    ) -> list[tuple[Delegation, Route[Session], SendResult | None]]:
        """Route every owed delegation completion with the one resolver and deliver it.

        ``route_completion`` decides (the same function a caller uses before acknowledging a
        completion): *deliver* sends ``render(job)`` through :meth:`send_final` into the route's
        session, after priming the adapter with the persisted routing origin (scope and user
        survive a restart), then marks the job delivered; *terminal* drops it; *retry* defers
        it.  One obligation per job (``message_ref`` ``delegation:<id>``): a crash between the
        send and the mark cannot send it twice.  Returns each job with its route and send result.
        """
        return await deliver_completions(
            delegations, sessions, render, send=self, prime=self._adapters.prime
        )

    async def _retry_timer(self) -> None:
        last_prune = self.clock.monotonic()
        while True:  # until stop() cancels it
            await self.clock.sleep(self.retry_interval_s)
            for platform, profile in sorted(self.connected_targets()):
                try:
                    await self.redeliver_failed(platform, profile=profile)
                except Exception:
                    log.warning("runtime retry for %s/%s failed", platform, profile, exc_info=True)
            try:
                await self.redeliver_stuck()
            except Exception:
                log.warning("recovering stuck obligations failed", exc_info=True)
            if (
                self.prune_interval_s
                and self.clock.monotonic() - last_prune >= self.prune_interval_s
            ):
                last_prune = self.clock.monotonic()
                try:
                    pruned = await self.ledger.prune()  # settled rows past the retention only
                except Exception:
                    log.warning("pruning the ledger failed", exc_info=True)
                else:
                    if pruned:
                        log.info("pruned %d settled obligations past their retention", pruned)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- stopping ------------------------------------------------------------------------------

    async def stop(self, budget_s: float | None = None) -> None:
        """Stop within ``budget_s`` (default 10 s): let in-flight redeliveries finish while the
        budget allows, disconnect adapters with what remains, close the ledger."""
        self._started = False
        deadline = Deadline.after(
            self._teardown_clock, _DEFAULT_STOP_BUDGET_S if budget_s is None else budget_s
        )
        if self._retry_loop is not None:
            self._retry_loop.cancel()
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=deadline.remaining() / 2)
            for task in pending:
                task.cancel()
        await self._adapters.disconnect_all(deadline)
        await self.ledger.aclose()


def _default_sessions(store: Store, clock: Clock) -> SessionFlags:
    sessions: SessionFlags = SessionStore(store, clock=clock)
    return sessions

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
  send never began, labelled when it may have;
* on the same timer it renews its owner lease every ``policy.lease_s / 3`` and, every
  ``recover_interval_s``, claims what dead owners left (a peer gateway SIGKILLed: at once when
  it ran on this host, after its lease when on another), redelivering it as at startup
  (:mod:`statecore.gateway.recovery`); :meth:`~Gateway.stop` ends the lease, so peers may
  reclaim at once what it still owes;
* on the same timer, every ``prune_interval_s``, it runs its housekeeping
  (:mod:`statecore.gateway.housekeeping`): settled rows past their retention are deleted from
  every table that has them -- obligations, ended sessions, settled delegations, and what the
  adapters keep (the relay's handled-replay keys and dismissed undeliverable records) -- each
  prune counted and logged; an owed row is never deleted;
* :meth:`~Gateway.stop` settles what was sent: each send and the write that records its outcome
  run as one task the asker's cancellation does not reach (:mod:`statecore.gateway.flights`),
  and stop waits for them, within its budget, before it closes the ledger.

Every startup or reconnect recovery is logged at INFO, once, with its counts and duration;
``metrics`` (:mod:`statecore.metrics`) is handed to the ledger and gets the housekeeping counts.

The bot's logic is an inbound handler: ``gateway.on_message(handler)``; the handler receives a
:class:`Turn` whose :meth:`Turn.reply` is ``send_final`` for that message.  ``async with
Gateway(...) as gateway:`` starts it and stops it.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from statecore.async_ledger import AsyncLedger
from statecore.clock import Clock, Deadline, SystemClock
from statecore.gateway.adapter import InboundLike, SendResult
from statecore.gateway.adapters import AdapterSet, Sendable
from statecore.gateway.completions import deliver_completions
from statecore.gateway.delegations import Delegation, Delegations
from statecore.gateway.finals import Finals
from statecore.gateway.housekeeping import Housekeeping, HousekeepingJob
from statecore.gateway.live import LiveActions
from statecore.gateway.long_replies import LongReplies
from statecore.gateway.recovery import (
    Cadences,
    RepeatedWarning,
    clear_flags,
    cleared_or_released,
    log_recovery,
    run_timer,
)
from statecore.gateway.routing import Route
from statecore.gateway.sending import Redelivered, SendPath
from statecore.gateway.sessions import Session, SessionStore
from statecore.gateway.turn import Message, MessageHandler, Turn, run_handler
from statecore.metrics import NO_METRICS, Metrics
from statecore.obligation import Claim
from statecore.ownership import Incarnation, ProcessProbe
from statecore.policy import LedgerPolicy
from statecore.store import Store

__all__ = ["Gateway", "SessionFlags"]

log = logging.getLogger(__name__)

_DEFAULT_STOP_BUDGET_S = 10.0
_DEFAULT_RETENTION_S = 604_800.0


class SessionFlags(Protocol):
    """What the runtime needs from the session store: clear the flag that would replay a turn."""

    async def clear_resume_pending(self, session_key: str) -> object:
        """Clear ``resume_pending`` for ``session_key`` (may raise if the store is down)."""
        ...


class Gateway:
    """The runtime (see the module docs).

    ``Gateway(store, *, sessions=None, delegations=None, clock=None, teardown_clock=None,
    incarnation=None, probe=None, policy=None, retry_interval_s=15.0, prune_interval_s=3600.0,
    stuck_after_s=30.0, retention_s=604800.0, recover_interval_s=30.0, metrics=NO_METRICS,
    store_threads=True)``.
    ``sessions`` is any object with ``async clear_resume_pending(session_key)``; the default is
    the persisted session store over the same ``store``.  ``retry_interval_s`` is the period of
    the retry timer; ``prune_interval_s`` how often that timer also runs the housekeeping (0:
    never); ``stuck_after_s`` how long one of this incarnation's own rows may stay ``pending``
    or ``attempting`` without being sent by this process before the timer re-sends it (see
    :meth:`redeliver_stuck`).  ``retention_s`` is how long the housekeeping keeps ended sessions
    (when ``sessions`` is a :class:`SessionStore`), settled ``delegations`` (when given) and
    the adapters' settled rows; obligations keep ``policy.retention``.  ``recover_interval_s``
    is how often the timer claims dead owners' rows (0: at start and on reconnects only, see
    :meth:`recover_dead_owners`).  ``metrics`` gets what the ledger reports and the
    housekeeping counts.  ``long_replies`` says what a reply longer than its adapter's announced
    limit becomes: parts sent in order (``SPLIT``) or one message cut with a visible mark
    (``TRUNCATE``), see :mod:`statecore.gateway.long_replies`.  Intervals must be non-negative
    numbers, the retry interval, the stuck grace and the retention positive (``ValueError``
    otherwise; ``TypeError`` for a ``long_replies`` that is not a ``LongReplies``).

    The send path's ledger writes (mark attempting, delivered, failed; release) that raise
    ``StoreError`` are tried again after each delay of ``settle_retry_delays_s`` (default
    ``(0.1, 0.3, 1.0)`` seconds on the gateway's clock); a definite refusal
    (``InvalidTransition``, ``StaleState``) is never retried.

    The class is long because it is the one owner of the runtime's invariants (a reply is
    recorded before it is sent, held while this process sends it, settled or left for the stuck
    sweep, never sent twice by two paths; a recovery clears resume flags before any send); the
    send path after the record (:mod:`statecore.gateway.sending`, with its flights and retried
    writes), the adapters (:mod:`statecore.gateway.adapters`), turns
    (:mod:`statecore.gateway.turn`), completions (:mod:`statecore.gateway.completions`),
    housekeeping (:mod:`statecore.gateway.housekeeping`) and the timer with the recoveries'
    steps (:mod:`statecore.gateway.recovery`) live in their own modules.

    ``clock`` drives every timer of the runtime; ``teardown_clock`` (default: the system clock)
    bounds :meth:`stop`, whose waits are on real work (in-flight sends, adapters' teardown),
    in real time even with a fake ``clock``.  ``store_threads=False``: ``AsyncLedger(threads=)``.
    """

    def __init__(
        self,
        store: Store,
        *,
        sessions: SessionFlags | None = None,
        delegations: Delegations | None = None,
        clock: Clock | None = None,
        teardown_clock: Clock | None = None,
        incarnation: Incarnation | None = None,
        probe: ProcessProbe | None = None,
        policy: LedgerPolicy | None = None,
        retry_interval_s: float = 15.0,
        prune_interval_s: float = 3600.0,
        stuck_after_s: float = 30.0,
        retention_s: float = _DEFAULT_RETENTION_S,
        recover_interval_s: float = 30.0,
        metrics: Metrics = NO_METRICS,
        store_threads: bool = True,
        long_replies: LongReplies = LongReplies.SPLIT,
    ) -> None:
        for name, value in (
            ("recover_interval_s", recover_interval_s),
            ("retry_interval_s", retry_interval_s),
            ("prune_interval_s", prune_interval_s),
            ("stuck_after_s", stuck_after_s),
            ("retention_s", retention_s),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a non-negative number, not {value!r}")
        if not retry_interval_s:
            raise ValueError("retry_interval_s must be positive")
        if not stuck_after_s or not math.isfinite(stuck_after_s):
            raise ValueError(f"stuck_after_s must be positive and finite, not {stuck_after_s!r}")
        if not retention_s:
            raise ValueError("retention_s must be positive")
        if not isinstance(long_replies, LongReplies):
            raise TypeError(f"long_replies must be a LongReplies, not {long_replies!r}")
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self._teardown_clock: Clock = teardown_clock or SystemClock()
        self.metrics = metrics
        """Where the ledger and the housekeeping report (:mod:`statecore.metrics`)."""
        self.ledger = AsyncLedger(
            store,
            policy=policy,
            clock=self.clock,
            incarnation=incarnation,
            probe=probe,
            metrics=metrics,
            threads=store_threads,
        )
        self.sessions: SessionFlags = (
            sessions if sessions is not None else _default_sessions(store, self.clock)
        )
        self.delegations = delegations
        """The delegations whose settled rows the housekeeping prunes (None: none)."""
        self.retry_interval_s = retry_interval_s
        self.prune_interval_s = prune_interval_s
        """How often the retry timer also runs the housekeeping (0: never; it never deletes an
        owed row)."""
        self.retention_s = retention_s
        """How long the housekeeping keeps settled sessions, delegations and the adapters'
        settled rows (obligations: the policy's retention)."""
        self.stuck_after_s = stuck_after_s
        """Grace after which an own row left pending or attempting, and not being sent by this
        process, is re-sent by the retry timer."""
        self.recover_interval_s = recover_interval_s
        """How often the timer claims and redelivers dead owners' rows (0: never)."""
        self._beating = False  # the owner lease was renewed since start (stop then ends it)
        # The send path after the record: held ids (the stuck sweep never touches them),
        # flights, settling writes, redelivery.
        self._path = SendPath(self.ledger, self.clock)
        # One warning per cause, not one per round, when clearing resume flags keeps failing.
        self._clearing = RepeatedWarning("clearing resume_pending")
        self._housekeeping = self._own_housekeeping()
        self._adapters = AdapterSet()
        self._finals = Finals(self.ledger, self._path, self._adapters, long_replies)
        self.live = LiveActions(self._adapters)
        """Typing and edits, sent once through the adapters that declare them (what a
        :class:`Turn`'s ``typing``, ``keep_typing`` and ``edit`` use)."""
        self._handler: MessageHandler | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._retry_loop: asyncio.Task[None] | None = None
        self._started = False

    # -- wiring --------------------------------------------------------------------------------

    def add_adapter(self, platform: str, adapter: Sendable, *, profile: str = "default") -> None:
        """Send replies for ``(platform, profile)`` through ``adapter``.

        What else the runtime does with it follows the adapter's declared
        :class:`~statecore.gateway.adapter.AdapterAbilities`: one that delivers inbound hands its
        messages to the bot's handler; one that announces reconnects triggers the runtime retry
        on every reconnect; one that keeps house adds its jobs to the housekeeping (for
        ``retention_s``; a job of the same name is run as well, not replaced).  Raises
        ``TypeError`` for an adapter without ``send`` or with an
        ``abilities`` attribute that is not an ``AdapterAbilities``.
        """
        target = (platform, profile)
        self._adapters.add(target, adapter)
        self._listen(target)
        self._adapters.on_reconnect(target, self._reconnect_listener(platform, profile))
        for name, job in self._adapters.housekeeping(target, self.retention_s).items():
            self._housekeeping.merge(name, job)

    def add_housekeeping(self, name: str, job: HousekeepingJob) -> None:
        """Run ``await job()`` in every housekeeping round under ``name``, replacing a job of
        that name (see :mod:`statecore.gateway.housekeeping`): it deletes one table's settled
        rows past their retention, never an owed one, and returns how many it deleted.

        The gateway registers ``obligations`` (past ``policy.retention``), ``owners`` (ended
        owner records, see ``Ledger.prune_owners``), ``sessions`` (ended,
        past ``retention_s``, when its session store is a :class:`SessionStore`),
        ``delegations`` (settled, when given) and what its adapters declare.  Raises
        ``ValueError`` for an empty name and ``TypeError`` for a job that is not callable.
        """
        self._housekeeping.add(name, job)

    def housekeeping_jobs(self) -> list[str]:
        """The names of the housekeeping jobs, in the order a round runs them."""
        return self._housekeeping.names()

    async def housekeep(self) -> dict[str, int]:
        """Run one housekeeping round now (the timer runs one every ``prune_interval_s``):
        every job in turn, each count reported to ``metrics.pruned`` and the round logged at
        INFO.  Returns each job's count (a job that raised is logged and missing)."""
        return await self._housekeeping.run()

    def _own_housekeeping(self) -> Housekeeping:
        """The jobs for the tables this gateway holds itself."""
        housekeeping = Housekeeping(clock=self.clock, metrics=self.metrics)
        housekeeping.add("obligations", self.ledger.prune)
        housekeeping.add("owners", self.ledger.prune_owners)
        sessions = self.sessions
        if isinstance(sessions, SessionStore):
            housekeeping.add("sessions", lambda: sessions.aio.prune(retention=self.retention_s))
        delegations = self.delegations
        if delegations is not None:
            housekeeping.add(
                "delegations", lambda: delegations.aio.prune(retention=self.retention_s)
            )
        return housekeeping

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
        await run_handler(self._handler, Turn(self, message))

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
            began = self.clock.monotonic()
            claims = await self._claim_recoverable({(platform, profile)})
            if claims:
                await self._recover(f"reconnect of {platform}/{profile}", claims, began)
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
        once: a repeat returns the first one's outcome instead of sending twice.  A reply longer
        than the adapter's announced limit is fitted to it first (``long_replies``): split, its
        parts are recorded together and sent in order, each an obligation of its own; the
        result is the last part's, or the first that did not go out (the parts after it stay
        owed and are sent by the ledger's recovery, so they may then arrive after it).  No
        adapter for ``(platform, profile)`` → the reply is kept owed (released with
        ``send_path_degraded``) and sent when that adapter connects.  A ledger write after the
        record that keeps failing with ``StoreError`` (see ``settle_retry_delays_s``) is logged
        and the reply kept owed: a failed result is returned when the send never began, the
        platform's result when it did, and the retry timer re-sends the row once it is stuck
        (:meth:`redeliver_stuck`).
        Once the send began, cancelling the caller does not cut it short: the send and the write
        recording its outcome finish (and :meth:`stop` waits for them).  Raises
        ``TypeError``/``ValueError`` for bad input (nothing is recorded then) and
        ``StoreError`` when the ledger cannot record it (nothing is owed then: retry the call).
        """
        return await self._finals.send(
            session_key=session_key,
            platform=platform,
            chat_id=chat_id,
            content=content,
            message_ref=message_ref,
            thread_id=thread_id,
            reply_to=reply_to,
            profile=profile,
        )

    @property
    def long_replies(self) -> LongReplies:
        """What :meth:`send_final` does with a reply longer than its adapter's announced limit
        (:mod:`statecore.gateway.long_replies`)."""
        return self._finals.long_replies

    def in_flight(self) -> frozenset[str]:
        """Ids of the obligations this process is sending now (or holds claims of, about to
        send them): :meth:`redeliver_stuck` never touches these."""
        return self._path.held()

    @property
    def delivered(self) -> int:
        """Replies delivered by this process (first sends and redeliveries)."""
        return self._path.delivered

    @property
    def redelivered(self) -> int:
        """Of those, redeliveries of claimed rows."""
        return self._path.redelivered

    @property
    def labelled(self) -> int:
        """Of those, redeliveries sent with a possible-duplicate label."""
        return self._path.labelled

    @property
    def deduped(self) -> int:
        """Redeliveries sent without the label: the platform shows one copy per key."""
        return self._path.deduped

    @property
    def settle_retry_delays_s(self) -> tuple[float, ...]:
        """Delays (gateway clock seconds) before each retry of a send-path ledger write that
        raised ``StoreError``; one try plus one per delay, then the row is left for
        :meth:`redeliver_stuck`."""
        return self._path.settle_retry_delays_s

    @settle_retry_delays_s.setter
    def settle_retry_delays_s(self, delays: tuple[float, ...]) -> None:
        self._path.settle_retry_delays_s = tuple(delays)

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
        await self._beat()  # peers on other hosts see this owner alive before it owns a row
        await self._adapters.connect_all()
        began = self.clock.monotonic()
        claims = await self._claim_recoverable()
        self._started = True
        self._spawn(self._recover("startup", claims, began))
        if self._retry_loop is None or self._retry_loop.done():
            self._retry_loop = asyncio.create_task(self._retry_timer(), name="gateway-retry")
        return len(claims)

    async def redeliver_pending(self) -> int:
        """The startup path, awaited to the end: claim, clear flags, send; returns how many
        replies were delivered."""
        return (await self._redeliver(await self._claim_recoverable())).delivered

    async def _recover(self, what: str, claims: list[Claim], began: float) -> None:
        """Redeliver a recovery's claims, then log the recovery once at INFO with its counts
        and duration (on the gateway's clock) -- also when it claimed nothing, and when a stop
        interrupted it."""

        async def redeliver() -> tuple[int, int]:
            return await self._redeliver(claims)

        await log_recovery(self.clock, what, len(claims), began, redeliver)

    async def recover_dead_owners(self) -> int:
        """The recover tick (the timer runs it every ``recover_interval_s``): the startup
        sweep for the connected (platform, profile) pairs -- rows whose owner is dead: on this
        host by the process probe, on another once its lease ran out -- with their sessions'
        ``resume_pending`` cleared, redelivered in the background as at start (labelled when
        they may have been sent).  Returns how many rows were claimed.  Raises ``StoreError``
        when the sweep cannot run (nothing was claimed then)."""
        began = self.clock.monotonic()
        claims = await self._claim_recoverable()
        if claims:
            self._spawn(self._recover("runtime", claims, began))
        return len(claims)

    async def _beat(self) -> None:
        """Renew the owner lease; a failure is logged (the timer beats again well before the
        lease ends)."""
        try:
            await self.ledger.heartbeat()
            self._beating = True
        except Exception:
            log.warning("could not renew this gateway's owner lease", exc_info=True)

    async def _claim_recoverable(self, targets: set[tuple[str, str]] | None = None) -> list[Claim]:
        """The startup sweep for ``targets`` (default: the connected ones), then each claim's
        ``resume_pending`` cleared (a failed clear still sends).  Each claim is held in flight
        until :meth:`_redeliver` is done with it."""
        deliverable = self.connected_targets() if targets is None else targets
        claims = await self.ledger.sweep_recoverable(deliverable_targets=deliverable)
        self._path.hold(claim.obligation_id for claim in claims)
        # Before any send: a turn whose reply is owed must never also be resumed.
        await clear_flags(claims, self.sessions.clear_resume_pending, self._clearing)
        return claims

    async def redeliver_failed(self, platform: str, *, profile: str | None = None) -> int:
        """The runtime path: re-claim this incarnation's retryable failures on ``platform``
        (and ``profile``) and send them labelled; returns how many were delivered."""
        claims = await self.ledger.sweep_failed_for_runtime(platform, profile=profile)
        self._path.hold(claim.obligation_id for claim in claims)
        return (await self._redeliver(await self._cleared_at_runtime(claims))).delivered

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
        self._path.hold(claim.obligation_id for claim in claims)
        if claims:
            log.info(
                "re-sending %d stuck obligations of this process",
                len(claims),
                extra={"claimed": len(claims)},
            )
        return (await self._redeliver(await self._cleared_at_runtime(claims))).delivered

    async def _cleared_at_runtime(self, claims: list[Claim]) -> list[Claim]:
        """The claims ready to send (still held); one whose ``resume_pending`` could not be
        cleared is released (refunded) and let go, never sent."""
        return await cleared_or_released(
            claims, self.sessions.clear_resume_pending, self._path, self._clearing
        )

    async def _redeliver(self, claims: list[Claim]) -> Redelivered:
        """Send the held claims (see :meth:`SendPath.redeliver`)."""
        return await self._path.redeliver(claims, self.adapter)

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
        lease_s = self.ledger.policy.lease_s
        await run_timer(
            self.clock,
            Cadences(self.retry_interval_s, lease_s / 3, self.recover_interval_s),
            beat=self._beat,
            targets=self.connected_targets,
            retry=lambda platform, profile: self.redeliver_failed(platform, profile=profile),
            stuck=self.redeliver_stuck,
            recover=self.recover_dead_owners,
            housekeep=self.housekeep,
            prune_s=self.prune_interval_s,
            store=self.ledger.store,
        )

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- stopping ------------------------------------------------------------------------------

    async def stop(self, budget_s: float | None = None) -> None:
        """Stop within ``budget_s`` (default 10 s), settling what was sent.

        In order: no new recovery starts; in-flight redeliveries may finish while half the
        budget allows (those never sent are then released, refunded); adapters disconnect
        within what remains (a relay adapter drains its requests, which answers or fails every
        send waiting on it); every send in flight, with the ledger write recording its outcome,
        is waited for within the rest of the budget -- a send is never cancelled between the
        platform's answer and the ledger's mark; a send still unanswered when the budget runs
        out is cancelled (its reply stays owed, resent labelled by the next start); the ledger
        closes after finishing every write queued.  Logged at INFO with what it left owed.
        """
        self._started = False
        deadline = Deadline.after(
            self._teardown_clock, _DEFAULT_STOP_BUDGET_S if budget_s is None else budget_s
        )
        unwinding: list[asyncio.Task[Any]] = []
        if self._retry_loop is not None and not self._retry_loop.done():
            self._retry_loop.cancel()  # nothing new starts; what it was sending is in flight
            unwinding.append(self._retry_loop)
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=deadline.remaining() / 2)
            for task in pending:
                task.cancel()
            unwinding.extend(pending)
        if unwinding:
            # Let them unwind: a redelivery cancelled mid-way releases what it never sent.
            await asyncio.wait(unwinding, timeout=max(0.01, min(0.1, deadline.remaining())))
        await self._adapters.disconnect_all(deadline)
        unanswered = await self._path.flights.land(deadline)
        if self._beating:  # what it still owes may be reclaimed by peers at once
            self._beating = False
            try:
                await self.ledger.leave()
            except Exception:
                log.warning("could not end this gateway's owner lease", exc_info=True)
        await self.ledger.aclose()
        log.info(
            "gateway stopped (%d sends unanswered when the budget ran out)",
            unanswered,
            extra={"unanswered": unanswered},
        )

    async def __aenter__(self) -> Gateway:
        """``async with Gateway(...) as gateway:`` starts it (unless started already); a start
        that raises stops it again (adapters disconnected, ledger closed) and the error
        propagates."""
        if not self._started:
            try:
                await self.start()
            except BaseException:
                await self.stop()
                raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Stops it (the default budget) when the block ends, however it ends."""
        await self.stop()


def _default_sessions(store: Store, clock: Clock) -> SessionFlags:
    sessions: SessionFlags = SessionStore(store, clock=clock)
    return sessions

"""The ledger's sweeps: which owed rows to claim for a resend, and which to abandon.

Three sweeps find owed rows nothing is sending any more: :meth:`Sweeper.recoverable` (rows
whose owner is dead, at startup), :meth:`Sweeper.failed_for_runtime` (this incarnation's own
retryable failures, once due) and :meth:`Sweeper.stuck_own` (this incarnation's own sends that
a failed store write left pending or attempting).  Rows past their budget or age are abandoned,
visibly, with the reason in their history.  Every claim and abandonment is one guarded write
under the fence the row was read with, so of several sweepers exactly one wins each row.

Sweepers never queue behind each other: each sweep lists its candidates with a plain read, then
re-reads every chunk inside the chunk's transaction through :func:`statecore.claims.candidates`
-- on a :class:`~statecore.claims.ClaimingStore` (PostgreSQL: ``FOR UPDATE SKIP LOCKED``) the
rows another sweeper holds are skipped rather than waited for -- and drops the rows that changed
since they were listed; the checks and guarded writes apply only to what came back.  On a store
without the capability the listing stands, exactly as before, and the fence guard alone picks
the winner of a race.

Every sweep that claimed or abandoned anything writes one INFO line to the ``statecore.ledger``
logger with its counts and duration, and every abandonment a WARNING naming the obligation, its
chat and platform and the reason; both carry their values as structured fields (``extra=``:
``sweep``, ``claimed``, ``labelled``, ``abandoned``, ``duration_s``; ``obligation_id``,
``chat_id``, ``platform``, ``reason``, ``attempts``), so a JSON formatter gets them as keys.
With metrics, each sweep reports its transitions, each chunk's claim latency and itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

from statecore.batching import chunks, transition_many
from statecore.checks import require_positive, require_text
from statecore.claims import ClaimingStore, candidates
from statecore.clock import Clock
from statecore.errors import StaleState
from statecore.failures import stored_kind
from statecore.leases import OwnerLeases, judged_alive
from statecore.lifecycles import OBLIGATION, ObligationState
from statecore.metrics import Outcome, TransitionMeter
from statecore.obligation import DEFAULT_PROFILE, OBLIGATION_KIND, Claim, Obligation
from statecore.ownership import Incarnation, LivenessCache, ProcessProbe
from statecore.policy import ErrorKind, LedgerPolicy
from statecore.store import Audit, Row, Store, lt, one_of

__all__ = ["Sweeper"]

log = logging.getLogger("statecore.ledger")
"""The ledger's logger: the sweeps are part of the ledger's public face."""

_S = ObligationState
_K = OBLIGATION_KIND
_OWED = frozenset(OBLIGATION.states) - OBLIGATION.terminal
# What a send of this process may be stuck in: recorded but never marked attempting, or marked
# attempting but never settled.
_UNSETTLED_SEND = frozenset({ObligationState.PENDING, ObligationState.ATTEMPTING})


class Sweeper:
    """The sweeps of one ledger, over its collaborators, given explicitly.

    ``Sweeper(store, policy, probe, incarnation, clock, *, owner_label, remember, forget,
    meter=None)``: claims are written under ``incarnation`` (audited as ``owner_label``), other
    owners are probed with ``probe``, budgets and ages come from ``policy`` and the time from
    ``clock`` unless a sweep is given ``now`` (durations are measured on
    ``clock.monotonic()``).  ``remember`` is called with every row claimed and ``forget`` with
    the id of every row abandoned, so the ledger's fence memory follows.  ``meter`` (the
    ledger's, None when it reports no metrics) counts the claims and abandonments, starts a
    send per claim, and gets each chunk's claim latency and each sweep.  Each sweep is
    documented in full on the :class:`~statecore.Ledger` method it implements.

    The class is long because it holds the three sweeps, each a loop of decisions over one
    chunk per transaction, together with what they share: the guarded claim and abandonment
    writes, and the chunk-by-chunk reports (logs and metrics) that must follow each chunk's
    commit.
    """

    __slots__ = (
        "_abandoned",
        "_claiming",
        "_clock",
        "_forget",
        "_incarnation",
        "_label",
        "_meter",
        "_policy",
        "_probe",
        "_remember",
        "_store",
        "_tally",
    )

    def __init__(
        self,
        store: Store,
        policy: LedgerPolicy,
        probe: ProcessProbe,
        incarnation: Incarnation,
        clock: Clock,
        *,
        owner_label: str,
        remember: Callable[[Row[ObligationState]], None],
        forget: Callable[[str], None],
        meter: TransitionMeter | None = None,
    ) -> None:
        self._store = store
        self._policy = policy
        self._probe = probe
        self._incarnation = incarnation
        self._clock = clock
        self._label = owner_label
        self._remember = remember
        self._forget = forget
        self._meter = meter
        # Whether chunks are re-read with locks (claims.ClaimingStore); else the listing stands.
        self._claiming = isinstance(store, ClaimingStore)
        # Rows abandoned by the sweep under way (its chunks that committed).
        self._abandoned = 0
        # Transitions counted inside the chunk under way, reported once it committed: (event,
        # outcome, rows).  None outside a chunk (a claim made alone reports at once).
        self._tally: list[tuple[str, str, int]] | None = None

    # -- the sweeps --------------------------------------------------------------------------

    def recoverable(
        self,
        *,
        deliverable_platforms: Collection[str] | None = None,
        deliverable_targets: Collection[tuple[str, str]] | None = None,
        now: float | None = None,
    ) -> list[Claim]:
        """Claim owed rows whose owner is dead (``Ledger.sweep_recoverable``)."""
        started = self._clock.monotonic()
        when = self._clock.now() if now is None else now
        platforms = None if deliverable_platforms is None else frozenset(deliverable_platforms)
        targets = None if deliverable_targets is None else frozenset(deliverable_targets)
        store = self._store
        liveness = LivenessCache(self._probe)
        leases = OwnerLeases(store)  # owners on other hosts: their heartbeats, read once each
        claims: list[Claim] = []
        self._abandoned = 0
        candidates = store.select(_K, states=_OWED, order_by="created_at")
        for chunk in chunks(candidates, self._policy.sweep_chunk):
            # Owners are judged on the plain listing, before anything is locked: a chunk whose
            # owners all live opens no transaction (on a server, locking rows writes to its log
            # and waits for a flush: a tick that finds nothing to claim must cost a read only).
            # The rows locked below are dropped when their fence moved since the listing, so
            # their owner is the one judged here.
            dead = [
                row
                for row in chunk
                if not judged_alive(row.values, self._incarnation, liveness, leases, when)
            ]
            if not dead:
                continue
            # Rows that differ only in id are claimed by one bulk transition (a crash leaves
            # many rows of one owner at the same fence and attempt count).
            groups: dict[tuple[Any, ...], list[Row[ObligationState]]] = {}
            with self._chunk("startup") as gone:
                for row in self._current(dead, _OWED):
                    if self._over_budget_or_stale(row, when):
                        self._abandon(row, when, gone)
                        continue
                    profile = row["adapter_profile"] or DEFAULT_PROFILE
                    if platforms is not None and row["platform"] not in platforms:
                        continue
                    if targets is not None and (row["platform"], profile) not in targets:
                        continue
                    key = (row["owner_token"], row.fence, row["attempts"], row.state)
                    groups.setdefault(key, []).append(row)
                claimed: dict[str, Claim] = {}
                for (token, fence, attempts, state), rows in groups.items():
                    needs_marker = state is not _S.PENDING or attempts > 0
                    for claim in self._claim_all(
                        rows,
                        token=token,
                        fence=fence,
                        attempts=attempts,
                        now=when,
                        needs_marker=needs_marker,
                        reason="recovered",
                    ):
                        claimed[claim.obligation_id] = claim
            # In the order the rows were found (oldest first), whatever their group.
            claims.extend(claimed[row.id] for row in chunk if row.id in claimed)
        self._sweep_done("startup", started, claims)
        return claims

    def failed_for_runtime(
        self, platform: str, *, profile: str | None = None, now: float | None = None
    ) -> list[Claim]:
        """Re-claim this incarnation's own retryable failures on ``platform``
        (``Ledger.sweep_failed_for_runtime``)."""
        require_text("platform", platform)
        wanted = DEFAULT_PROFILE if profile is None else profile
        me = self._incarnation
        if me.started_at is None:
            return []
        started = self._clock.monotonic()
        when = self._clock.now() if now is None else now
        store = self._store
        claims: list[Claim] = []
        self._abandoned = 0
        rows = store.select(
            _K,
            states=(_S.FAILED,),
            where={
                "platform": platform,
                "adapter_profile": wanted,
                "owner_pid": me.pid,
                "owner_started_at": me.started_at,
            },
            order_by="created_at",
        )
        for chunk in chunks(rows, self._policy.sweep_chunk):
            with self._chunk("runtime") as gone:
                for row in self._current(chunk, (_S.FAILED,)):
                    # pid and start time were matched by the select; the host is checked here.
                    if row["owner_host"] not in (None, me.host):
                        continue
                    if self._over_budget_or_stale(row, when):
                        self._abandon(row, when, gone)
                        continue
                    kind = stored_kind(self._policy, row)
                    if kind is ErrorKind.PERMANENT:
                        continue
                    if kind is not ErrorKind.RECONNECT:
                        due = row["next_attempt_at"]
                        if due is None or due > when:
                            continue
                    reason = "rate_limited" if kind is ErrorKind.RATE_LIMITED else "reconnected"
                    claim = self.claim(row, when, True, reason)
                    if claim is not None:
                        claims.append(claim)
        self._sweep_done("runtime", started, claims)
        return claims

    def stuck_own(
        self,
        *,
        older_than_s: float,
        exclude: Collection[str] = frozenset(),
        deliverable_targets: Collection[tuple[str, str]] | None = None,
        now: float | None = None,
    ) -> list[Claim]:
        """Re-claim this incarnation's own sends that are stuck (``Ledger.sweep_stuck_own``)."""
        require_positive("older_than_s", older_than_s)
        started = self._clock.monotonic()
        when = self._clock.now() if now is None else now
        skip = frozenset(exclude)
        targets = None if deliverable_targets is None else frozenset(deliverable_targets)
        claims: list[Claim] = []
        self._abandoned = 0
        rows = self.stuck_rows(older_than_s, when)
        for chunk in chunks(rows, self._policy.sweep_chunk):
            with self._chunk("stuck") as gone:
                for row in self._current(chunk, _UNSETTLED_SEND):
                    if row.id in skip:
                        continue
                    if self._over_budget_or_stale(row, when):
                        self._abandon(row, when, gone)
                        continue
                    profile = row["adapter_profile"] or DEFAULT_PROFILE
                    if targets is not None and (row["platform"], profile) not in targets:
                        continue
                    needs_marker = row.state is not _S.PENDING or row["attempts"] > 0
                    claim = self.claim(row, when, needs_marker, "stuck", why="stuck")
                    if claim is not None:
                        claims.append(claim)
        self._sweep_done("stuck", started, claims)
        return claims

    def stuck_rows(self, older_than_s: float, now: float) -> list[Row[ObligationState]]:
        """The candidates of :meth:`stuck_own` (a plain read), oldest first: this
        incarnation's pending and attempting rows not updated for ``older_than_s``."""
        me = self._incarnation
        return self._store.select(
            _K,
            states=_UNSETTLED_SEND,
            where={
                "owner_pid": me.pid,
                "owner_token": me.token,
                "updated_at": lt(now - older_than_s),
            },
            order_by="created_at",
        )

    def _current(
        self, chunk: list[Row[ObligationState]], states: Collection[ObligationState]
    ) -> list[Row[ObligationState]]:
        """The rows of ``chunk`` (listed by a plain read) that the chunk may act on, in listing
        order.

        On a :class:`~statecore.claims.ClaimingStore` the chunk is re-read inside the chunk's
        transaction through :func:`~statecore.claims.candidates`: each row returned is locked
        until the transaction ends, a row another sweeper holds is skipped (never waited for),
        and a row that left ``states`` or changed since it was listed (another fence: another
        writer acted on it) is dropped.  On any other store the listing stands, as it always
        did: the fence guard of each write picks the winner of a race.
        """
        if not self._claiming:
            return chunk
        listed = {row.id: row.fence for row in chunk}
        fresh = candidates(self._store, _K, states=states, where={_K.id_field: one_of(*listed)})
        kept = {row.id: row for row in fresh if listed.get(row.id) == row.fence}
        return [kept[row.id] for row in chunk if row.id in kept]

    # -- claims and abandonment --------------------------------------------------------------

    def claim(
        self,
        row: Row[ObligationState],
        now: float,
        needs_marker: bool,
        reason: str | None,
        *,
        why: str = "owner dead",
    ) -> Claim | None:
        """Claim one row under the fence it was read with; None when another sweeper won it
        (exactly one claim per row)."""
        claims = self._claim_all(
            [row],
            token=row["owner_token"],
            fence=row.fence,
            attempts=row["attempts"],
            now=now,
            needs_marker=needs_marker,
            reason=reason or "",
            why=why,
        )
        return claims[0] if claims else None

    def _claim_all(
        self,
        rows: list[Row[ObligationState]],
        *,
        token: str | None,
        fence: int,
        attempts: int,
        now: float,
        needs_marker: bool,
        reason: str,
        why: str = "owner dead",
    ) -> list[Claim]:
        """Claim rows that share their owner token, fence and attempt count in one guarded bulk
        transition: exactly as strict as claiming each under its own fence (a row that changed
        since it was read, or that another sweeper claimed first, is skipped).  The audit entry
        gives the label, or ``why`` for a plain claim."""
        me = self._incarnation
        label = reason if needs_marker else None
        claimed = transition_many(
            self._store,
            _K,
            [row.id for row in rows],
            "claim",
            audit=Audit(now, self._label, attempts + 1, label or why),
            expect={"owner_token": token, "fence": fence, "attempts": attempts},
            changes={
                "updated_at": now,
                "owner_host": me.host,
                "owner_pid": me.pid,
                "owner_started_at": me.started_at,
                "owner_token": me.token,
                "lease_expires_at": now + self._policy.lease_s,
                "next_attempt_at": None,
            },
            increments={"attempts": 1},
        )
        self._count("claim", Outcome.OK, len(claimed))
        # The others changed since they were read: another writer won them.
        self._count("claim", Outcome.STALE, len(rows) - len(claimed))
        meter = self._meter
        claims = []
        for row in claimed:
            self._remember(row)
            if meter is not None:
                meter.began(row.id)  # a resend starts now
            claims.append(
                Claim(
                    Obligation.from_row(row),
                    needs_marker,
                    label,
                    row["attempts"],
                    row["adapter_profile"] or DEFAULT_PROFILE,
                )
            )
        return claims

    def _abandon(
        self,
        row: Row[ObligationState],
        now: float,
        gone: list[tuple[Row[ObligationState], str]],
    ) -> None:
        """Abandon the row under the fence it was read with, saying why in its history, and
        add it with the reason to ``gone`` (reported once its chunk committed); a row that
        changed since (another sweeper got there first) is left alone."""
        policy = self._policy
        over = row["attempts"] >= policy.max_attempts
        reason = (
            f"attempt budget spent ({row['attempts']}/{policy.max_attempts})"
            if over
            else f"stale: older than {policy.stale_after:g} s"
        )
        try:
            self._store.transition(
                _K,
                row.id,
                "abandon",
                audit=Audit(now, self._label, row["attempts"], reason),
                fence=row.fence,
                changes={"updated_at": now},
            )
        except StaleState:
            self._count("abandon", Outcome.STALE, 1)
            return
        self._forget(row.id)
        self._count("abandon", Outcome.OK, 1)
        gone.append((row, reason))

    # -- reports -------------------------------------------------------------------------------

    def _count(self, event: str, outcome: str, rows: int) -> None:
        """Count ``rows`` transitions of ``event`` with ``outcome``: held while a chunk is under
        way (they are reported once it commits), else reported at once."""
        if self._meter is None or not rows:
            return
        if self._tally is None:
            self._meter.count(event, outcome, rows)
        else:
            self._tally.append((event, outcome, rows))

    @contextmanager
    def _chunk(self, sweep: str) -> Iterator[list[tuple[Row[ObligationState], str]]]:
        """One chunk of ``sweep``, in one store transaction; yields the list ``_abandon`` adds
        each abandoned row to, with its reason.

        Once the transaction committed: its counted transitions and claim latency go to the
        metrics, each abandonment to the log (a WARNING) and the sweep's tally.  When it fails,
        nothing of it was written: its claims and abandonments are counted as errors, nothing
        is logged, and the exception propagates.
        """
        gone: list[tuple[Row[ObligationState], str]] = []
        started = self._clock.monotonic()
        self._tally = []
        try:
            with self._store.atomic():
                yield gone
        except BaseException:
            tally, self._tally = self._tally, None
            for event, outcome, rows in tally:
                if outcome == Outcome.OK:
                    self._count(event, Outcome.ERROR, rows)
            raise
        tally, self._tally = self._tally, None
        if self._meter is not None:
            self._meter.metrics.latency("claim", self._clock.monotonic() - started)
            for event, outcome, rows in tally:
                self._meter.count(event, outcome, rows)
        self._abandoned += len(gone)
        for row, reason in gone:
            log.warning(
                "abandoned obligation %s (chat %s on %s): %s",
                row.id,
                row["chat_id"],
                row["platform"],
                reason,
                extra={
                    "sweep": sweep,
                    "obligation_id": row.id,
                    "chat_id": row["chat_id"],
                    "platform": row["platform"],
                    "reason": reason,
                    "attempts": row["attempts"],
                },
            )

    def _sweep_done(self, sweep: str, started: float, claims: list[Claim]) -> None:
        """Report a finished sweep: one INFO line when it claimed or abandoned anything, and
        the sweep itself to the metrics."""
        abandoned = self._abandoned
        seconds = self._clock.monotonic() - started
        if self._meter is not None:
            self._meter.metrics.sweep(sweep, len(claims), abandoned, seconds)
        if claims or abandoned:
            labelled = sum(1 for claim in claims if claim.needs_marker)
            log.info(
                "ledger %s sweep: claimed %d (%d labelled as possible repeats), abandoned %d "
                "in %.3f s",
                sweep,
                len(claims),
                labelled,
                abandoned,
                seconds,
                extra={
                    "sweep": sweep,
                    "claimed": len(claims),
                    "labelled": labelled,
                    "abandoned": abandoned,
                    "duration_s": seconds,
                },
            )

    def _over_budget_or_stale(self, row: Row[ObligationState], now: float) -> bool:
        """Whether the row spent its attempt budget or outlived the policy's age limit."""
        return bool(
            row["attempts"] >= self._policy.max_attempts
            or now - row["created_at"] > self._policy.stale_after
        )

"""The delivery-obligation ledger: a durable outbox for final replies, over any Store.

Contract: **at-least-once with labelled ambiguity.**  An obligation is recorded (pending) before
the send, marked attempting when the send begins and settled (delivered or failed) after.  A
resend that is provably the first send goes out plain; one that may duplicate something the user
already saw is claimed with ``needs_marker`` and a reason, so it can be labelled.  Nothing owed
is silently dropped: rows past their budget or age are *abandoned*, visibly, with an audit entry
saying why.

Every state change is one guarded write through the Store (state in the event's sources, the
row's fence, and the owner where ownership matters), so a zombie process that wakes up after
its rows were re-claimed cannot settle them.

This module holds :class:`Ledger`, the public face of the ledger, and its settle path; the
decisions and writes of the sweeps are :mod:`statecore.sweeps`.

Observability: the ledger logs to the ``statecore.ledger`` logger (one INFO line per sweep that
claimed or abandoned anything, a WARNING per abandonment; see :mod:`statecore.sweeps`) and, given
a :class:`~statecore.metrics.Metrics`, reports every guarded write it makes with its outcome
(batched writes one per row, as single ones), the claim latency of each sweep chunk, the settle
latency of each send and every sweep.  Without one (:data:`~statecore.metrics.NO_METRICS`) the
hot path builds no report at all.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import attrs

from statecore.batch import Creation, Move
from statecore.batching import batched, distinct_runs, insert_each, transition_each
from statecore.checks import require_text
from statecore.clock import Clock, SystemClock
from statecore.errors import StoreError, UnknownEntity
from statecore.failures import chosen_kind, first_reconnect_error, stored_kind
from statecore.leases import OWNER_KIND, Heartbeat, prune_owner_records
from statecore.lifecycles import OBLIGATION, ObligationState
from statecore.metrics import NO_METRICS, Metrics, TransitionMeter
from statecore.obligation import OBLIGATION_KIND, Claim, Obligation
from statecore.ownership import Incarnation, ProcessProbe, PsutilProbe
from statecore.policy import ErrorKind, LedgerPolicy
from statecore.recording import plan_record
from statecore.store import Audit, Row, Store, TransitionRecord, lt
from statecore.sweeps import Sweeper
from statecore.tracing import audit_reason, is_traceparent
from statecore.wakeups import leave_announced

__all__ = ["Ledger"]

_S = ObligationState
# From the declaration: settled = terminal, owed = every other state.
_SETTLED = OBLIGATION.terminal
_OWED = frozenset(OBLIGATION.states) - _SETTLED
_K = OBLIGATION_KIND


class Ledger:
    """The delivery ledger over ``store`` (synchronous; see ``AsyncLedger`` for asyncio).

    ``Ledger(store, *, policy=None, clock=None, incarnation=None, probe=None,
    metrics=NO_METRICS)``.  The incarnation (default: this process's) is recorded as the owner
    of every row this ledger records or claims; the probe answers whether other owners are
    alive; ``metrics`` receives what the ledger does (see the module docs; durations are
    measured on ``clock.monotonic()``).  Safe to use from several threads.

    The class is long because it is the ledger's whole public surface, each method stating its
    full contract, and because the settle path (the guarded move and the fence memory) stays
    inline here, where each mark costs no extra call; what it delegates has a module of its
    own: the sweeps (:mod:`statecore.sweeps`), batching (:mod:`statecore.batching`), the record
    step (:mod:`statecore.recording`) and failure kinds (:mod:`statecore.failures`).
    """

    def __init__(
        self,
        store: Store,
        *,
        policy: LedgerPolicy | None = None,
        clock: Clock | None = None,
        incarnation: Incarnation | None = None,
        probe: ProcessProbe | None = None,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.policy = policy or LedgerPolicy()
        self.clock: Clock = clock or SystemClock()
        self.probe: ProcessProbe = probe or PsutilProbe()
        self.incarnation = incarnation or Incarnation.current()
        self._owner_label = self.incarnation.label
        # (fence, attempts) this ledger last wrote per owed row: its later writes are guarded
        # by that fence, on top of the owner guard.  Forgotten when the row settles.  Threads
        # share it without a lock: every access is one dict operation (a get, a set, a pop, a
        # clear), which the interpreter runs whole, and each entry is a whole tuple.
        self._fences: dict[str, tuple[int, int]] = {}
        # Counts this ledger's writes and times its sends; None when nothing is reported.
        self._meter = (
            None
            if metrics is NO_METRICS
            else TransitionMeter(
                metrics,
                OBLIGATION.name,
                self.clock.monotonic,
                begins=("attempt", "claim"),
                settles=("deliver", "fail"),
            )
        )
        store.register(_K)
        store.register(OWNER_KIND)
        # This ledger's owner record: what peers on other hosts judge its rows' owner by.
        self._heartbeat = Heartbeat(
            store, self.incarnation, lease_s=self.policy.lease_s, label=self._owner_label
        )

    # -- recording and settling --------------------------------------------------------------

    def record(
        self,
        *,
        session_key: str,
        platform: str,
        chat_id: str | int,
        content: str,
        message_ref: str | int | None = None,
        obligation_id: str | None = None,
        thread_id: str | int | None = None,
        reply_to: str | int | None = None,
        adapter_profile: str | None = None,
        trace: str | None = None,
    ) -> Obligation:
        """Record the obligation to deliver ``content`` (pending), before sending it.

        Idempotent: the id defaults to :func:`compute_obligation_id` of (session_key,
        message_ref, content), and re-recording an existing id returns the stored row
        untouched.  Next: :meth:`mark_attempting` when the send begins.  Raises ``TypeError``
        for non-text content or ids and ``ValueError`` for empty session key, platform or chat
        id; nothing is written then.  ``trace`` (a W3C traceparent, see
        :mod:`statecore.tracing`) is kept in the creation audit entry, so that whoever sends it
        later joins the trace that recorded it; a malformed one is not kept.
        """
        creation = plan_record(
            self.clock,
            self.policy,
            self.incarnation,
            self._owner_label,
            session_key=session_key,
            platform=platform,
            chat_id=chat_id,
            content=content,
            message_ref=message_ref,
            obligation_id=obligation_id,
            thread_id=thread_id,
            reply_to=reply_to,
            adapter_profile=adapter_profile,
        )
        if trace is not None:
            creation = _traced(creation, trace)
        if self._meter is None:
            return self._recorded(creation.apply(self.store, _K))
        # Counted in _recorded when created: a repeated record writes nothing.
        return self._meter.write(
            "record", lambda: self._recorded(creation.apply(self.store, _K)), counted=True
        )

    def _plan(self, request: Mapping[str, Any]) -> Creation:
        """:func:`plan_record` of one batched :meth:`record` keyword set (with its ``trace``)."""
        if "trace" not in request:
            return plan_record(
                self.clock, self.policy, self.incarnation, self._owner_label, **request
            )
        kwargs = dict(request)
        trace = kwargs.pop("trace")
        creation = plan_record(
            self.clock, self.policy, self.incarnation, self._owner_label, **kwargs
        )
        return _traced(creation, trace)

    def _record_each(self, requests: Sequence[Mapping[str, Any]]) -> list[Obligation | Exception]:
        """:meth:`record` for each keyword set, in one store batch (group commit); each
        outcome is the obligation or the refusal that record would have raised."""
        store = self.store

        def write() -> list[Obligation | Exception]:
            return batched(
                requests,
                self._plan,
                lambda creations: insert_each(store, _K, creations),
                self._recorded,
            )

        if self._meter is None:
            return write()
        return self._meter.batch(["record"] * len(requests), write, counted=True)

    def _recorded(self, written: tuple[Row[ObligationState], bool]) -> Obligation:
        row, created = written
        if created:
            self._remember(row)
            if self._meter is not None:
                self._meter.count("record")
        return Obligation.from_row(row)

    def mark_attempting(self, obligation_id: str) -> Obligation:
        """The send is beginning: pending -> attempting.  Next: deliver or fail it.

        Raises :class:`InvalidTransition` unless the row is pending, :class:`StaleState` if
        another owner holds it or it changed since this ledger last wrote it,
        :class:`UnknownEntity` for an unknown id.
        """
        if self._meter is None:
            return self._settle(obligation_id, "attempt", {})
        return self._meter.write(
            "attempt", lambda: self._settle(obligation_id, "attempt", {}), obligation_id
        )

    def mark_delivered(self, obligation_id: str) -> Obligation:
        """The platform acknowledged the send: attempting -> delivered (terminal).

        Raises as :meth:`mark_attempting`; a row that is not attempting raises
        :class:`InvalidTransition` and is unchanged.
        """
        if self._meter is None:
            return self._settle(obligation_id, "deliver", {})
        return self._meter.write(
            "deliver", lambda: self._settle(obligation_id, "deliver", {}), obligation_id
        )

    def mark_failed(
        self,
        obligation_id: str,
        error: str,
        *,
        kind: ErrorKind | None = None,
        ambiguous: bool = False,
    ) -> Obligation:
        """The platform rejected the send: attempting -> failed, keeping ``error`` (truncated).

        ``kind`` is what the adapter knows about retrying (a :class:`ErrorKind`, normally
        ``SendResult.kind``); without one, the policy classifies the error text
        (:meth:`LedgerPolicy.classify`, for adapters that do not type their failures).  The kind
        is stored with the row and the sweeps act on it: transient and rate-limit errors are
        retried in-process by :meth:`sweep_failed_for_runtime` after their backoff, reconnect
        errors wait for a reconnect, permanent errors wait for a restart.  ``ambiguous`` says
        the send may have gone out: such a failure is never a reconnect error (the platform
        may have seen it; it is retried as transient) and its history entry says so.

        Raises as :meth:`mark_delivered`, ``TypeError`` for a non-text error or a kind that is
        not an :class:`ErrorKind`.
        """
        if self._meter is None:
            return self._fail(obligation_id, error, kind, ambiguous)
        return self._meter.write(
            "fail", lambda: self._fail(obligation_id, error, kind, ambiguous), obligation_id
        )

    def _fail(
        self, obligation_id: str, error: str, kind: ErrorKind | None, ambiguous: bool
    ) -> Obligation:
        if not isinstance(error, str):
            raise TypeError(f"error must be a str, not {type(error).__name__}")
        kind = chosen_kind(self.policy, error, kind)
        if ambiguous and kind is ErrorKind.RECONNECT:
            kind = ErrorKind.TRANSIENT
        row = self._row(obligation_id)
        stored = self.policy.truncate(error)
        return self._settle(
            obligation_id,
            "fail",
            {
                "last_error": stored,
                "error_kind": kind.value,
                "next_attempt_at": self.policy.next_attempt_at(
                    kind, row["attempts"], self.clock.now()
                ),
            },
            read=row,
            reason=self.policy.truncate(f"may have gone out: {error}") if ambiguous else stored,
        )

    def release(
        self, obligation_id: str, error: str | None = None, *, kind: ErrorKind | None = None
    ) -> Obligation:
        """Hand back a claim that was never sent: attempting -> failed, attempt refunded.

        The row keeps its previous error and kind; one that had none gets ``error`` (with
        ``kind``, else the policy's classification of it) or, by default, the first reconnect
        error (``send_path_degraded``), so the runtime sweep resends it as soon as its adapter
        (re)connects.  Raises as :meth:`mark_failed`.
        """
        if self._meter is None:
            return self._release(obligation_id, error, kind)
        return self._meter.write(
            "release", lambda: self._release(obligation_id, error, kind), obligation_id
        )

    def _release(self, obligation_id: str, error: str | None, kind: ErrorKind | None) -> Obligation:
        if error is not None and not isinstance(error, str):
            raise TypeError(f"error must be a str or None, not {type(error).__name__}")
        row = self._row(obligation_id)
        kept = row["last_error"]
        if kept is None:
            kept = error if error is not None else first_reconnect_error(self.policy)
            found = chosen_kind(
                self.policy, kept, kind if error is not None else ErrorKind.RECONNECT
            )
        else:
            found = stored_kind(self.policy, row)
        attempts = max(0, row["attempts"] - 1)
        return self._settle(
            obligation_id,
            "release",
            {
                "attempts": attempts,
                "last_error": self.policy.truncate(kept),
                "error_kind": found.value,
                "next_attempt_at": self.policy.next_attempt_at(found, attempts, self.clock.now()),
            },
            read=row,
            reason="released unsent",
            attempts=attempts,
        )

    # -- sweeps ------------------------------------------------------------------------------

    def sweep_recoverable(
        self,
        *,
        deliverable_platforms: Collection[str] | None = None,
        deliverable_targets: Collection[tuple[str, str]] | None = None,
        now: float | None = None,
    ) -> list[Claim]:
        """The startup sweep: claim owed rows whose owner is dead, for a resend by this process.

        Rows over budget or stale are abandoned.  Rows whose platform (``deliverable_platforms``)
        or (platform, profile) pair (``deliverable_targets``) this process cannot send to now are
        left untouched, budget intact.  Each claim moves the row to attempting under this
        incarnation with one more attempt; ``needs_marker`` is set when the row was not pending
        or had been claimed before.  Rows of live owners are never touched, so a second sweep
        in the same process claims nothing.  An owner on this host is dead when the probe says
        so; one on another host once no owner record of its incarnation beats
        (:meth:`heartbeat`; at once after :meth:`leave`), or -- when it never beat -- once the
        row's own lease expired.  Next: send each claim, then settle or release it.
        """
        return self._sweeper().recoverable(
            deliverable_platforms=deliverable_platforms,
            deliverable_targets=deliverable_targets,
            now=now,
        )

    def sweep_failed_for_runtime(
        self,
        platform: str,
        *,
        profile: str | None = None,
        now: float | None = None,
    ) -> list[Claim]:
        """The runtime sweep: re-claim this incarnation's own retryable failures on ``platform``.

        Only ``failed`` rows of exactly ``platform`` and ``profile`` (default profile when
        None) owned by exactly this incarnation (pid and start time; if this process cannot
        read its own start time nothing is claimed).  Permanent failures stay failed, budget
        intact; rows over budget or stale are abandoned; reconnect errors are due at once,
        transient and rate-limit errors once their backoff passed.  Claims carry
        ``needs_marker=True`` with reason ``"reconnected"`` or ``"rate_limited"``.
        """
        return self._sweeper().failed_for_runtime(platform, profile=profile, now=now)

    def sweep_stuck_own(
        self,
        *,
        older_than_s: float,
        exclude: Collection[str] = frozenset(),
        deliverable_targets: Collection[tuple[str, str]] | None = None,
        now: float | None = None,
    ) -> list[Claim]:
        """Re-claim this incarnation's own sends that are stuck: rows it recorded or claimed
        that stayed ``pending`` or ``attempting`` for longer than ``older_than_s`` seconds
        (since ``updated_at``), because a store write failed on the way (a lock held by another
        process) and nothing in this process is sending them any more.

        Only rows whose owner token is exactly this incarnation's are considered; rows of any
        other owner, live or dead, are never touched (that is :meth:`sweep_recoverable`'s job).
        Ids in ``exclude`` -- what the caller is sending right now -- are skipped, and so are
        rows whose (platform, profile) is not in ``deliverable_targets`` (when given), budget
        intact.  Rows over budget or stale are abandoned.  Each other row is claimed with one
        guarded write (fence bumped, one more attempt): plainly (``needs_marker=False``) when it
        was pending, since that send provably never began; with ``needs_marker=True`` and
        reason ``"stuck"`` when it was attempting, since it may have gone out.

        Next: send each claim, then settle or release it.  Raises ``ValueError`` for an
        ``older_than_s`` that is not a positive finite number, ``StoreError`` when the store
        fails (nothing of the failed transaction is claimed).
        """
        return self._sweeper().stuck_own(
            older_than_s=older_than_s,
            exclude=exclude,
            deliverable_targets=deliverable_targets,
            now=now,
        )

    def _stuck_rows(self, older_than_s: float, now: float) -> list[Row[ObligationState]]:
        """The candidates of :meth:`sweep_stuck_own` (a plain read), oldest first: this
        incarnation's pending and attempting rows not updated for ``older_than_s``."""
        return self._sweeper().stuck_rows(older_than_s, now)

    def _claim(
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
        return self._sweeper().claim(row, now, needs_marker, reason, why=why)

    def _sweeper(self) -> Sweeper:
        """The sweeps over this ledger's collaborators as they are now; the claims and
        abandonments they write keep this ledger's fence memory in step."""
        return Sweeper(
            self.store,
            self.policy,
            self.probe,
            self.incarnation,
            self.clock,
            owner_label=self._owner_label,
            remember=self._remember,
            forget=self._forget,
            meter=self._meter,
        )

    # -- the owner's lease ----------------------------------------------------------------------

    def heartbeat(self, *, now: float | None = None) -> float:
        """Renew this ledger's owner lease: ``now + policy.lease_s``; returns the new expiry.

        Owners on other hosts are judged by these leases: while a ledger of this incarnation
        beats, peers never reclaim its rows; once the beats stop, they may after the lease.  The
        first beat joins (writes this ledger's owner record); call again every ``lease_s / 3``
        or so, and :meth:`leave` when stopping.  A beat never touches an obligation row (its
        fence is what the settles are guarded by).  Raises ``StoreError`` when the store fails:
        the lease is then unchanged, so try again before it expires.
        """
        return self._heartbeat.beat(self.clock.now() if now is None else now)

    def leave(self, *, now: float | None = None) -> bool:
        """End this ledger's owner record on a clean stop, so that peers on other hosts may
        reclaim what its incarnation still owes at once (unless another ledger of the
        incarnation still beats).  Returns whether a record was ended (False: it never beat).
        Next: nothing -- a later :meth:`heartbeat` joins again.  Raises ``StoreError`` when the
        store fails (the record then ends with its lease).  On a notifying store, when the
        incarnation still owes rows, peers are woken in the same transaction
        (:func:`statecore.wakeups.leave_announced`).
        """
        when = self.clock.now() if now is None else now
        return leave_announced(
            self.store, lambda: self._heartbeat.leave(when), self.incarnation.token
        )

    def prune_owners(self, *, now: float | None = None) -> int:
        """Housekeeping of the owner records: records whose lease ended more than
        ``policy.retention`` ago are ended, ended ones older than that deleted; returns how many
        were deleted.  Never touches an obligation.  Raises ``StoreError`` when the store
        fails."""
        when = self.clock.now() if now is None else now
        return prune_owner_records(
            self.store, now=when, retention=self.policy.retention, label=self._owner_label
        )

    def prune(self, *, now: float | None = None) -> int:
        """Delete delivered and abandoned rows older than the retention; return how many.

        Owed rows (pending, attempting, failed) are never deleted, whatever their age.
        """
        when = self.clock.now() if now is None else now
        return self.store.prune(_K, "prune", where={"updated_at": lt(when - self.policy.retention)})

    # -- checks and reads ----------------------------------------------------------------------

    def check(self) -> None:
        """Prove the store usable before anything depends on it: one real read of the owed
        rows, then a write transaction begun and committed (it writes nothing).

        Returns None when both work.  Raises :class:`StoreError` naming the problem -- the
        store cannot be read (a corrupt or unreadable file) or no write transaction can be
        begun (another process holds the write lock past the busy timeout) -- with the
        store's error chained; fix the store (or wait for the lock) and check again.
        """
        try:
            self.store.select(_K, states=_OWED, order_by="created_at", limit=1)
        except StoreError as exc:
            raise StoreError(f"the ledger cannot read its store: {exc}") from exc
        try:
            with self.store.atomic():
                pass
        except StoreError as exc:
            raise StoreError(f"the ledger cannot begin a write transaction: {exc}") from exc

    def get(self, obligation_id: str) -> Obligation | None:
        """The obligation, or None if it was never recorded (or was pruned)."""
        row = self.store.get(_K, obligation_id)
        return None if row is None else Obligation.from_row(row)

    def history(self, obligation_id: str) -> list[TransitionRecord]:
        """Every transition of the obligation, oldest first: why it is where it is."""
        return self.store.history(_K, obligation_id)

    def owed(self, *, limit: int | None = None) -> list[Obligation]:
        """Obligations not yet settled (pending, attempting, failed), oldest first."""
        rows = self.store.select(_K, states=_OWED, order_by="created_at", limit=limit)
        return [Obligation.from_row(r) for r in rows]

    def abandoned(self, *, limit: int | None = None) -> list[Obligation]:
        """Abandoned obligations, oldest first: what the ledger gave up on, and (in
        :meth:`history`) why."""
        rows = self.store.select(_K, states=(_S.ABANDONED,), order_by="created_at", limit=limit)
        return [Obligation.from_row(r) for r in rows]

    # -- internals ---------------------------------------------------------------------------

    def forget_fences(self) -> None:
        """Drop the remembered fences (after a transaction this ledger wrote in was rolled
        back); later writes are then guarded by ownership alone."""
        self._fences.clear()

    def _row(self, obligation_id: str) -> Row[ObligationState]:
        require_text("obligation_id", obligation_id)
        row = self.store.get(_K, obligation_id)
        if row is None:
            raise UnknownEntity(_K.name, obligation_id)
        return row

    def _settle(
        self,
        obligation_id: str,
        event: str,
        changes: dict[str, Any],
        *,
        read: Row[ObligationState] | None = None,
        reason: str | None = None,
        attempts: int | None = None,
    ) -> Obligation:
        """One owner-guarded transition, fenced by the fence this ledger last wrote or,
        failing that, the fence of the row the changes were computed from."""
        fence, audit, expect = self._guard(obligation_id, changes, read, reason, attempts)
        # What _move builds, handed to the store without a Move: one object less on every mark.
        row = self.store.transition(
            _K, obligation_id, event, audit=audit, fence=fence, expect=expect, changes=changes
        )
        return self._settled(row)

    def _settled(self, row: Row[ObligationState]) -> Obligation:
        self._remember(row)
        return Obligation.from_row(row)

    def _move(self, obligation_id: str, event: str) -> Move:
        """A batched mark's guarded store write, as :meth:`_settle` makes it (raises for a bad
        id, writing nothing)."""
        changes: dict[str, Any] = {}
        fence, audit, expect = self._guard(obligation_id, changes, None, None, None)
        return Move(obligation_id, event, audit, fence=fence, expect=expect, changes=changes)

    def _guard(
        self,
        obligation_id: str,
        changes: dict[str, Any],
        read: Row[ObligationState] | None,
        reason: str | None,
        attempts: int | None,
    ) -> tuple[int | None, Audit, dict[str, object]]:
        """What a mark of ``obligation_id`` is guarded by: the fence this ledger last wrote or,
        failing that, the one of the row the changes were computed from (None: ownership
        alone), its audit, and the owner it expects; sets ``changes["updated_at"]``.  Raises
        for a bad id."""
        require_text("obligation_id", obligation_id)
        now = self.clock.now()
        known = self._fences.get(obligation_id)
        if known is None and read is not None:
            known = (read.fence, read["attempts"])
        fence = None if known is None else known[0]
        if attempts is None and known is not None:
            attempts = known[1]
        changes["updated_at"] = now
        # The token is random per incarnation: it alone identifies the owner.
        expect: dict[str, object] = {"owner_token": self.incarnation.token}
        return fence, Audit(now, self._owner_label, attempts, reason), expect

    def _settle_each(self, requests: Sequence[tuple[str, str]]) -> list[Obligation | Exception]:
        """``(obligation_id, event)`` settles without changes (attempt, deliver) in one store
        batch; each outcome is the obligation or the refusal the single call would raise.

        Each run of distinct ids is planned after the previous run was written, so a repeated
        id is fenced by what its earlier write left, exactly as one call after the other.
        """
        outcomes: list[Obligation | Exception] = []
        for run in distinct_runs(requests, lambda request: request[0]):
            outcomes.extend(self._settle_run(run))
        return outcomes

    def _settle_run(self, requests: Sequence[tuple[str, str]]) -> list[Obligation | Exception]:
        store = self.store

        def write() -> list[Obligation | Exception]:
            return batched(
                requests,
                lambda r: self._move(r[0], r[1]),
                lambda moves: transition_each(store, _K, moves),
                self._settled,
            )

        if self._meter is None:
            return write()
        return self._meter.batch(
            [event for _, event in requests], write, [oid for oid, _ in requests]
        )

    def _remember(self, row: Row[ObligationState]) -> None:
        if row.state in _SETTLED:
            self._fences.pop(row.id, None)
        else:
            self._fences[row.id] = (row.fence, row.values["attempts"])

    def _forget(self, obligation_id: str) -> None:
        """Drop the fence remembered for one row (it was abandoned)."""
        self._fences.pop(obligation_id, None)
        if self._meter is not None:
            self._meter.forget(obligation_id)


def _traced(creation: Creation, trace: str | None) -> Creation:
    """``creation`` whose audit entry keeps ``trace`` (when it is a well-formed traceparent)."""
    if trace is None or not is_traceparent(trace):
        return creation
    return attrs.evolve(creation, audit=attrs.evolve(creation.audit, reason=audit_reason(trace)))

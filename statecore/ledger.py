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
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from statecore.batch import (
    REFUSALS,
    BatchStore,
    Creation,
    Move,
    insert_each_sequentially,
    transition_each_sequentially,
)
from statecore.checks import platform_id, require_positive, require_text
from statecore.clock import Clock, SystemClock
from statecore.errors import StaleState, StoreError, UnknownEntity
from statecore.ids import compute_obligation_id
from statecore.lifecycles import OBLIGATION, ObligationState
from statecore.obligation import (
    DEFAULT_PROFILE,
    OBLIGATION_KIND,
    Claim,
    Obligation,
)
from statecore.ownership import (
    Incarnation,
    LivenessCache,
    ProcessProbe,
    PsutilProbe,
    recorded_owner_alive,
)
from statecore.policy import ErrorKind, LedgerPolicy
from statecore.store import Audit, Row, Store, TransitionRecord, lt

__all__ = ["Ledger"]

_S = ObligationState
# From the declaration: settled = terminal, owed = every other state.
_SETTLED = OBLIGATION.terminal
_OWED = frozenset(OBLIGATION.states) - _SETTLED
# What a send of this process may be stuck in: recorded but never marked attempting, or marked
# attempting but never settled.
_UNSETTLED_SEND = frozenset({ObligationState.PENDING, ObligationState.ATTEMPTING})
_K = OBLIGATION_KIND


class Ledger:
    """The delivery ledger over ``store`` (synchronous; see ``AsyncLedger`` for asyncio).

    ``Ledger(store, *, policy=None, clock=None, incarnation=None, probe=None)``.  The
    incarnation (default: this process's) is recorded as the owner of every row this ledger
    records or claims; the probe answers whether other owners are alive.  Safe to use from
    several threads.
    """

    def __init__(
        self,
        store: Store,
        *,
        policy: LedgerPolicy | None = None,
        clock: Clock | None = None,
        incarnation: Incarnation | None = None,
        probe: ProcessProbe | None = None,
    ) -> None:
        self.store = store
        self.policy = policy or LedgerPolicy()
        self.clock: Clock = clock or SystemClock()
        self.probe: ProcessProbe = probe or PsutilProbe()
        self.incarnation = incarnation or Incarnation.current()
        self._owner_label = self.incarnation.label
        # (fence, attempts) this ledger last wrote per owed row: its later writes are guarded
        # by that fence, on top of the owner guard.  Forgotten when the row settles.
        self._fences: dict[str, tuple[int, int]] = {}
        self._fence_lock = threading.Lock()
        store.register(_K)

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
    ) -> Obligation:
        """Record the obligation to deliver ``content`` (pending), before sending it.

        Idempotent: the id defaults to :func:`compute_obligation_id` of (session_key,
        message_ref, content), and re-recording an existing id returns the stored row
        untouched.  Next: :meth:`mark_attempting` when the send begins.  Raises ``TypeError``
        for non-text content or ids and ``ValueError`` for empty session key, platform or chat
        id; nothing is written then.
        """
        creation = self._creation(
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
        return self._recorded(creation.apply(self.store, _K))

    def _creation(
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
    ) -> Creation:
        """Check :meth:`record`'s arguments and build the store creation (raises as record)."""
        require_text("session_key", session_key)
        require_text("platform", platform)
        chat = platform_id("chat_id", chat_id, required=True)
        if not isinstance(content, str):
            raise TypeError(f"content must be a str, not {type(content).__name__}")
        profile = DEFAULT_PROFILE if adapter_profile is None else adapter_profile
        require_text("adapter_profile", profile)
        if obligation_id is None:
            obligation_id = compute_obligation_id(session_key, message_ref, content)
        else:
            require_text("obligation_id", obligation_id)
        now = self.clock.now()
        me = self.incarnation
        values = {
            "session_key": session_key,
            "platform": platform,
            "chat_id": chat,
            "thread_id": platform_id("thread_id", thread_id),
            "reply_to": platform_id("reply_to", reply_to),
            "content": content,
            "attempts": 0,
            "created_at": now,
            "updated_at": now,
            "owner_host": me.host,
            "owner_pid": me.pid,
            "owner_started_at": me.started_at,
            "owner_token": me.token,
            "lease_expires_at": now + self.policy.lease_s,
            "adapter_profile": profile,
        }
        return Creation(obligation_id, values, "record", Audit(now, self._owner_label, 0))

    def _record_each(self, requests: Sequence[Mapping[str, Any]]) -> list[Obligation | Exception]:
        """:meth:`record` for each keyword set, in one store batch (group commit); each
        outcome is the obligation or the refusal that record would have raised."""
        store = self.store

        def write(creations: list[Creation]) -> list[tuple[Row[ObligationState], bool] | Exception]:
            if isinstance(store, BatchStore):
                return store.insert_each(_K, creations)
            return insert_each_sequentially(store, _K, creations)

        return _batched(requests, lambda request: self._creation(**request), write, self._recorded)

    def _recorded(self, written: tuple[Row[ObligationState], bool]) -> Obligation:
        row, created = written
        if created:
            self._remember(row)
        return Obligation.from_row(row)

    def mark_attempting(self, obligation_id: str) -> Obligation:
        """The send is beginning: pending -> attempting.  Next: deliver or fail it.

        Raises :class:`InvalidTransition` unless the row is pending, :class:`StaleState` if
        another owner holds it or it changed since this ledger last wrote it,
        :class:`UnknownEntity` for an unknown id.
        """
        return self._settle(obligation_id, "attempt", {})

    def mark_delivered(self, obligation_id: str) -> Obligation:
        """The platform acknowledged the send: attempting -> delivered (terminal).

        Raises as :meth:`mark_attempting`; a row that is not attempting raises
        :class:`InvalidTransition` and is unchanged.
        """
        return self._settle(obligation_id, "deliver", {})

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
        if not isinstance(error, str):
            raise TypeError(f"error must be a str, not {type(error).__name__}")
        kind = self._kind(error, kind)
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
        if error is not None and not isinstance(error, str):
            raise TypeError(f"error must be a str or None, not {type(error).__name__}")
        row = self._row(obligation_id)
        kept = row["last_error"]
        if kept is None:
            kept = error if error is not None else _first(self.policy.reconnect_errors)
            found = self._kind(kept, kind if error is not None else ErrorKind.RECONNECT)
        else:
            found = self._stored_kind(row)
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

    def _kind(self, error: str, kind: ErrorKind | None) -> ErrorKind:
        """The adapter's kind when it gave one, else the policy's reading of the text."""
        if kind is None:
            return self.policy.classify(error)
        if not isinstance(kind, ErrorKind):
            raise TypeError(f"kind must be an ErrorKind or None, not {type(kind).__name__}")
        return kind

    def _stored_kind(self, row: Row[ObligationState]) -> ErrorKind:
        """The kind stored with a failed row; rows written without one (older rows, rows
        failed by other writers) are classified from their error text."""
        stored = row["error_kind"]
        if stored is not None:
            try:
                return ErrorKind(stored)
            except ValueError:
                pass  # an unknown kind: read the text instead
        return self.policy.classify(row["last_error"])

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
        in the same process claims nothing.  Next: send each claim, then settle or release it.
        """
        when = self.clock.now() if now is None else now
        platforms = None if deliverable_platforms is None else frozenset(deliverable_platforms)
        targets = None if deliverable_targets is None else frozenset(deliverable_targets)
        liveness = LivenessCache(self.probe)
        claims: list[Claim] = []
        candidates = self.store.select(_K, states=_OWED, order_by="created_at")
        for chunk in _chunks(candidates, self.policy.sweep_chunk):
            # Rows that differ only in id are claimed by one bulk transition (a crash leaves
            # many rows of one owner at the same fence and attempt count).
            groups: dict[tuple[Any, ...], list[Row[ObligationState]]] = {}
            with self.store.atomic():
                for row in chunk:
                    if self._owner_alive(row, liveness, when):
                        continue
                    if self._over_budget_or_stale(row, when):
                        self._abandon(row, when)
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
        return claims

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
        require_text("platform", platform)
        wanted = DEFAULT_PROFILE if profile is None else profile
        me = self.incarnation
        if me.started_at is None:
            return []
        when = self.clock.now() if now is None else now
        claims: list[Claim] = []
        rows = self.store.select(
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
        for chunk in _chunks(rows, self.policy.sweep_chunk):
            with self.store.atomic():
                for row in chunk:
                    # pid and start time were matched by the select; the host is checked here.
                    if row["owner_host"] not in (None, me.host):
                        continue
                    if self._over_budget_or_stale(row, when):
                        self._abandon(row, when)
                        continue
                    kind = self._stored_kind(row)
                    if kind is ErrorKind.PERMANENT:
                        continue
                    if kind is not ErrorKind.RECONNECT:
                        due = row["next_attempt_at"]
                        if due is None or due > when:
                            continue
                    reason = "rate_limited" if kind is ErrorKind.RATE_LIMITED else "reconnected"
                    claim = self._claim(row, when, True, reason)
                    if claim is not None:
                        claims.append(claim)
        return claims

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
        require_positive("older_than_s", older_than_s)
        when = self.clock.now() if now is None else now
        skip = frozenset(exclude)
        targets = None if deliverable_targets is None else frozenset(deliverable_targets)
        claims: list[Claim] = []
        rows = self._stuck_rows(older_than_s, when)
        for chunk in _chunks(rows, self.policy.sweep_chunk):
            with self.store.atomic():
                for row in chunk:
                    if row.id in skip:
                        continue
                    if self._over_budget_or_stale(row, when):
                        self._abandon(row, when)
                        continue
                    profile = row["adapter_profile"] or DEFAULT_PROFILE
                    if targets is not None and (row["platform"], profile) not in targets:
                        continue
                    needs_marker = row.state is not _S.PENDING or row["attempts"] > 0
                    claim = self._claim(row, when, needs_marker, "stuck", why="stuck")
                    if claim is not None:
                        claims.append(claim)
        return claims

    def _stuck_rows(self, older_than_s: float, now: float) -> list[Row[ObligationState]]:
        """The candidates of :meth:`sweep_stuck_own` (a plain read), oldest first: this
        incarnation's pending and attempting rows not updated for ``older_than_s``."""
        me = self.incarnation
        return self.store.select(
            _K,
            states=_UNSETTLED_SEND,
            where={
                "owner_pid": me.pid,
                "owner_token": me.token,
                "updated_at": lt(now - older_than_s),
            },
            order_by="created_at",
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
        with self._fence_lock:
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
        move = self._move(
            obligation_id, event, changes, read=read, reason=reason, attempts=attempts
        )
        return self._settled(move.apply(self.store, _K))

    def _settled(self, row: Row[ObligationState]) -> Obligation:
        self._remember(row)
        return Obligation.from_row(row)

    def _move(
        self,
        obligation_id: str,
        event: str,
        changes: dict[str, Any],
        *,
        read: Row[ObligationState] | None = None,
        reason: str | None = None,
        attempts: int | None = None,
    ) -> Move:
        """The guarded store write of :meth:`_settle` (raises for a bad id, writing nothing)."""
        require_text("obligation_id", obligation_id)
        now = self.clock.now()
        with self._fence_lock:
            known = self._fences.get(obligation_id)
        if known is None and read is not None:
            known = (read.fence, read["attempts"])
        fence = None if known is None else known[0]
        if attempts is None and known is not None:
            attempts = known[1]
        changes["updated_at"] = now
        return Move(
            obligation_id,
            event,
            Audit(now, self._owner_label, attempts, reason),
            fence=fence,
            # The token is random per incarnation: it alone identifies the owner.
            expect={"owner_token": self.incarnation.token},
            changes=changes,
        )

    def _settle_each(self, requests: Sequence[tuple[str, str]]) -> list[Obligation | Exception]:
        """``(obligation_id, event)`` settles without changes (attempt, deliver) in one store
        batch; each outcome is the obligation or the refusal the single call would raise.

        Each run of distinct ids is planned after the previous run was written, so a repeated
        id is fenced by what its earlier write left, exactly as one call after the other.
        """
        outcomes: list[Obligation | Exception] = []
        start = 0
        while start < len(requests):
            seen: set[str] = set()
            end = start
            while end < len(requests) and requests[end][0] not in seen:
                seen.add(requests[end][0])
                end += 1
            outcomes.extend(self._settle_run(requests[start:end]))
            start = end
        return outcomes

    def _settle_run(self, requests: Sequence[tuple[str, str]]) -> list[Obligation | Exception]:
        store = self.store

        def write(moves: list[Move]) -> list[Row[ObligationState] | Exception]:
            if isinstance(store, BatchStore):
                return store.transition_each(_K, moves)
            return transition_each_sequentially(store, _K, moves)

        return _batched(requests, lambda r: self._move(r[0], r[1], {}), write, self._settled)

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
        me = self.incarnation
        label = reason if needs_marker else None
        claimed = self.store.transition_many(
            _K,
            [row.id for row in rows],
            "claim",
            audit=Audit(now, self._owner_label, attempts + 1, label or why),
            expect={"owner_token": token, "fence": fence, "attempts": attempts},
            changes={
                "updated_at": now,
                "owner_host": me.host,
                "owner_pid": me.pid,
                "owner_started_at": me.started_at,
                "owner_token": me.token,
                "lease_expires_at": now + self.policy.lease_s,
                "next_attempt_at": None,
            },
            increments={"attempts": 1},
        )
        claims = []
        for row in claimed:
            self._remember(row)
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

    def _abandon(self, row: Row[ObligationState], now: float) -> None:
        over = row["attempts"] >= self.policy.max_attempts
        reason = (
            f"attempt budget spent ({row['attempts']}/{self.policy.max_attempts})"
            if over
            else f"stale: older than {self.policy.stale_after:g} s"
        )
        try:
            self.store.transition(
                _K,
                row.id,
                "abandon",
                audit=Audit(now, self._owner_label, row["attempts"], reason),
                fence=row.fence,
                changes={"updated_at": now},
            )
        except StaleState:
            return
        with self._fence_lock:
            self._fences.pop(row.id, None)

    def _over_budget_or_stale(self, row: Row[ObligationState], now: float) -> bool:
        return bool(
            row["attempts"] >= self.policy.max_attempts
            or now - row["created_at"] > self.policy.stale_after
        )

    def _owner_alive(self, row: Row[ObligationState], liveness: LivenessCache, now: float) -> bool:
        return recorded_owner_alive(row.values, self.incarnation, liveness, now)

    def _remember(self, row: Row[ObligationState]) -> None:
        with self._fence_lock:
            if row.state in _SETTLED:
                self._fences.pop(row.id, None)
            else:
                self._fences[row.id] = (row.fence, row["attempts"])


_PENDING = StoreError("no outcome yet")
"""Holds a batch item's place until the store's outcome for it is filled in."""

_In = TypeVar("_In")
_Req = TypeVar("_Req")
_Out = TypeVar("_Out")


def _batched(
    requests: Iterable[_In],
    prepare: Callable[[_In], _Req],
    write: Callable[[list[_Req]], Sequence[_Out | Exception]],
    keep: Callable[[_Out], Obligation],
) -> list[Obligation | Exception]:
    """Prepare every request (a refusal is its outcome), write the prepared ones as one store
    batch, and turn each written result into its obligation -- outcomes in request order."""
    outcomes: list[Obligation | Exception] = []
    prepared: list[_Req] = []
    slots: list[int] = []
    for request in requests:
        try:
            item = prepare(request)
        except REFUSALS as exc:
            outcomes.append(exc)
            continue
        slots.append(len(outcomes))
        outcomes.append(_PENDING)
        prepared.append(item)
    for slot, result in zip(slots, write(prepared), strict=True):
        outcomes[slot] = result if isinstance(result, Exception) else keep(result)
    return outcomes


def _first(values: frozenset[str]) -> str:
    return min(values) if values else "send_path_degraded"


def _chunks(rows: list[Row[ObligationState]], size: int) -> Iterable[list[Row[ObligationState]]]:
    step = max(1, size)
    for start in range(0, len(rows), step):
        yield rows[start : start + step]

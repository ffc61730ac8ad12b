"""Durable async work (delegations): dispatched in one turn, completed later, routed then.

A delegation is recorded (``running``) when the work is dispatched, together with its
:class:`~statecore.gateway.routing.RoutingOrigin` -- platform, chat, chat type, thread, user,
user name, tenant scope, session key and the pinned session -- validated *before* anything is
written, so a corrupt origin is refused at dispatch instead of being discovered when the result
arrives.

The owning process completes it (``completed``, with the result).  If the owner dies first, any
later process recovers the row as ``unknown`` (the same dead-owner rule as the delivery ledger;
a live owner's rows are never touched) -- the origin is kept, so the user can still be told.
Either way a completion is then routed by **one** function, :meth:`Delegations.route_completion`
(which asks :func:`~statecore.gateway.routing.resolve_route`), used both before the completion is
acknowledged and inside the delivery pipeline; it ends ``delivered`` or ``dropped`` (terminal
route), each with an audit entry saying where or why.

:class:`Delegations` is synchronous; asyncio code awaits the same methods through its ``aio``
facade (:class:`AsyncDelegations`, see :mod:`statecore.gateway.aio`), which runs each on a worker
thread: ``await delegations.aio.complete(delegation_id, result)``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import attrs

from statecore.checks import require_positive, require_text
from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind, Field, Index
from statecore.errors import InvalidTransition, StaleState, StoreError, UnknownEntity
from statecore.gateway.aio import off_loop
from statecore.gateway.routing import COMPRESSION_END_REASON, Route, RoutingOrigin, resolve_route
from statecore.gateway.sessions import Session, SessionStore
from statecore.leases import OWNER_KIND, OwnerLeases, judged_alive
from statecore.lifecycle import Lifecycle, Transition
from statecore.obligation import Owner
from statecore.ownership import (
    Incarnation,
    LivenessCache,
    ProcessProbe,
    PsutilProbe,
)
from statecore.store import Audit, Row, Store, TransitionRecord, lt

__all__ = [
    "DELEGATION",
    "DELEGATION_KIND",
    "AsyncDelegations",
    "Delegation",
    "DelegationState",
    "Delegations",
]


class DelegationState(StrEnum):
    """One piece of durable async work."""

    RUNNING = "running"
    """Dispatched; its owner is working on it."""
    COMPLETED = "completed"
    """The owner finished it; the result waits to be routed."""
    UNKNOWN = "unknown"
    """The owner died before completing it; the outcome is unknown, the origin kept."""
    DELIVERED = "delivered"
    """Terminal: the completion reached its route."""
    DROPPED = "dropped"
    """Terminal: its route was terminal (user boundary, pinned session gone); the reason kept."""


_D = DelegationState
_OUTCOME = (_D.COMPLETED, _D.UNKNOWN)
_SETTLED = (_D.DELIVERED, _D.DROPPED)

DELEGATION: Lifecycle[DelegationState] = Lifecycle(
    "delegation",
    DelegationState,
    initial=_D.RUNNING,
    terminal=_SETTLED,
    description="Durable async work, from dispatch to its completion delivered or dropped.",
    transitions=(
        Transition("dispatch", None, _D.RUNNING),
        # Only the owner completes (owner-guarded); a zombie finds its row recovered.
        Transition("complete", _D.RUNNING, _D.COMPLETED),
        # The owner is dead: any process may record that the outcome is unknown.
        Transition("recover", _D.RUNNING, _D.UNKNOWN),
        # The route said retry: counted and audited, the completion stays owed.
        Transition("defer", _D.COMPLETED, _D.COMPLETED),
        Transition("defer", _D.UNKNOWN, _D.UNKNOWN),
        Transition("deliver", _OUTCOME, _D.DELIVERED),
        Transition("drop", _OUTCOME, _D.DROPPED),
        Transition("prune", _SETTLED, None),
    ),
)
"""The delegation lifecycle: dispatch -> running -> completed | unknown -> delivered | dropped."""

DELEGATION_KIND: EntityKind[DelegationState] = EntityKind(
    "delegation",
    DELEGATION,
    table="delegations",
    id_field="delegation_id",
    fields=(
        Field("origin_json", str, nullable=False, immutable=True),
        Field("payload_json", str, nullable=False, immutable=True),
        Field("result_json", str),
        Field("session_key", str, immutable=True),
        Field("owner_host", str),
        Field("owner_pid", int),
        Field("owner_started_at", int),
        Field("owner_token", str),
        Field("lease_expires_at", float),
        Field("created_at", float, nullable=False, immutable=True),
        Field("updated_at", float, nullable=False),
        Field("completed_at", float),
        Field("attempts", int, nullable=False, default=0),
        Field("last_reason", str),
        Field("delivered_to", str),
    ),
    indexes=(
        # Recovery: running rows by owner.
        Index(("state", "owner_pid"), states=frozenset({_D.RUNNING})),
        # Routing: owed completions, oldest first.
        Index(("updated_at",), states=frozenset(_OUTCOME)),
        # Pruning: settled rows by age.
        Index(("state", "updated_at"), states=frozenset(_SETTLED)),
    ),
)
"""The persisted shape of :data:`DELEGATION` entities (table ``delegations``)."""


@attrs.frozen
class Delegation:
    """One delegation as stored (a snapshot: re-read it to see later changes)."""

    delegation_id: str
    state: DelegationState
    origin: RoutingOrigin
    payload: Mapping[str, Any]
    result: Any
    created_at: float
    updated_at: float
    completed_at: float | None
    attempts: int
    owner: Owner
    fence: int
    last_reason: str | None
    delivered_to: str | None

    @property
    def status(self) -> str:
        """``"running"``, or the completion's status: ``"completed"`` (a result exists) or
        ``"unknown"`` (the owner died first)."""
        if self.state is _D.RUNNING:
            return "running"
        return "completed" if self.completed_at is not None else "unknown"

    def completion_event(self) -> dict[str, Any]:
        """The completion as a plain, JSON-ready event: every origin field (platform, chat_id,
        chat_type, thread_id, user_id, user_name, scope_id, session_key, parent_session_id)
        plus ``delegation_id``, ``status``, ``result`` (None when unknown), ``payload`` and
        ``type`` (``"delegation"``).  ``RoutingOrigin.from_dict(event)`` rebuilds the origin.

        Raises :class:`InvalidTransition` while the delegation is still running.
        """
        if self.state is _D.RUNNING:
            raise InvalidTransition(
                DELEGATION.name, self.state, "completion_event", "still running: no completion"
            )
        return {
            **self.origin.to_dict(),
            "type": "delegation",
            "delegation_id": self.delegation_id,
            "status": self.status,
            "result": self.result,
            "payload": dict(self.payload),
        }

    @classmethod
    def from_row(cls, row: Row[DelegationState]) -> Delegation:
        """Build the record from a store row of :data:`DELEGATION_KIND`."""
        v: Any = row.values
        result = v["result_json"]
        return cls(
            delegation_id=row.id,
            state=row.state,
            origin=RoutingOrigin.from_dict(json.loads(v["origin_json"])),
            payload=json.loads(v["payload_json"]),
            result=None if result is None else json.loads(result),
            created_at=v["created_at"],
            updated_at=v["updated_at"],
            completed_at=v["completed_at"],
            attempts=v["attempts"],
            owner=Owner(v["owner_host"], v["owner_pid"], v["owner_started_at"], v["owner_token"]),
            fence=row.fence,
            last_reason=v["last_reason"],
            delivered_to=v["delivered_to"],
        )


_K = DELEGATION_KIND


class Delegations:
    """Durable async work over ``store``.

    ``Delegations(store, *, clock=None, incarnation=None, probe=None, lease_s=300.0)``.  The
    incarnation (default: this process's) owns what it dispatches; the probe answers whether
    other owners are alive; ``lease_s`` is how long an owner on *another host* is presumed
    alive.  Safe to use from several threads.  From asyncio code, await the methods through
    :attr:`aio` (``await delegations.aio.dispatch(origin, payload)``): the same calls, each run
    on a worker thread.
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock | None = None,
        incarnation: Incarnation | None = None,
        probe: ProcessProbe | None = None,
        lease_s: float = 300.0,
    ) -> None:
        require_positive("lease_s", lease_s)
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self.probe: ProcessProbe = probe or PsutilProbe()
        self.incarnation = incarnation or Incarnation.current()
        self.lease_s = float(lease_s)
        self._owner_label = self.incarnation.label
        store.register(_K)
        store.register(OWNER_KIND)  # read to judge owners on other hosts
        self.aio = AsyncDelegations(self)
        """The same methods as coroutine functions run on a worker thread."""

    # -- the owner's side --------------------------------------------------------------------

    def dispatch(
        self,
        origin: RoutingOrigin | Mapping[str, object],
        payload: Mapping[str, Any],
        *,
        delegation_id: str | None = None,
    ) -> str:
        """Record a piece of work (running, owned by this incarnation); return its id.

        ``origin`` is a :class:`RoutingOrigin` or a mapping of its fields; either way it is
        validated first, and ``payload`` must be a JSON-serializable mapping.  A corrupt origin
        or payload raises ``TypeError``/``ValueError`` naming the problem and nothing is
        written.  Idempotent for an explicit ``delegation_id`` that exists (the stored row is
        kept as it is).  Next: :meth:`complete` when the work finishes.
        """
        checked = RoutingOrigin.from_dict(
            origin.to_dict() if isinstance(origin, RoutingOrigin) else origin
        )
        if not isinstance(payload, Mapping):
            raise TypeError(f"payload must be a mapping, not {type(payload).__name__}")
        payload_json = _dumps("payload", dict(payload))
        if delegation_id is not None:
            require_text("delegation_id", delegation_id)
        new_id = delegation_id or uuid.uuid4().hex
        now = self.clock.now()
        me = self.incarnation
        self.store.insert(
            _K,
            new_id,
            {
                "origin_json": json.dumps(checked.to_dict(), sort_keys=True),
                "payload_json": payload_json,
                "session_key": checked.session_key,
                "owner_host": me.host,
                "owner_pid": me.pid,
                "owner_started_at": me.started_at,
                "owner_token": me.token,
                "lease_expires_at": now + self.lease_s,
                "created_at": now,
                "updated_at": now,
                "attempts": 0,
            },
            event="dispatch",
            audit=Audit(now, self._owner_label, 0),
        )
        return new_id

    def complete(self, delegation_id: str, result: Any) -> Delegation:
        """The work finished: running -> completed, keeping ``result`` (JSON-serializable).

        Only the owning incarnation may complete it.  Raises :class:`InvalidTransition` if it
        is not running (a recovered row: the owner was presumed dead), :class:`StaleState` if
        another incarnation owns it, :class:`UnknownEntity` for an unknown id, and
        ``TypeError``/``ValueError`` for a result JSON cannot hold (nothing written).  Next:
        route it with :meth:`route_completion`.
        """
        require_text("delegation_id", delegation_id)
        result_json = _dumps("result", result)
        now = self.clock.now()
        row = self.store.transition(
            _K,
            delegation_id,
            "complete",
            audit=Audit(now, self._owner_label),
            # The token is random per incarnation: it alone identifies the owner.
            expect={"owner_token": self.incarnation.token},
            changes={"result_json": result_json, "completed_at": now, "updated_at": now},
        )
        return Delegation.from_row(row)

    # -- recovery ----------------------------------------------------------------------------

    def recover_abandoned(self, *, now: float | None = None) -> list[dict[str, Any]]:
        """Mark running rows whose owner is dead ``unknown``; return their completion events.

        Same rule as the ledger's sweeps: a same-host owner is dead when its pid is gone or now
        belongs to a process with another start time; an owner on another host when it stopped
        renewing its owner lease (the heartbeat of a ledger of its process,
        :mod:`statecore.leases`: a delegation running longer than ``lease_s`` stays its owner's
        while that beats), or -- an owner that never beat -- when the row's own lease expired.
        Each distinct owner is probed once.  This incarnation's own rows and live owners' rows
        are never touched; a row another recoverer took first is skipped.  The origin is kept.
        Next: route each event's delegation with :meth:`route_completion`.
        """
        when = self.clock.now() if now is None else now
        liveness = LivenessCache(self.probe)
        leases = OwnerLeases(self.store)  # owners on other hosts: their heartbeats, once each
        events: list[dict[str, Any]] = []
        candidates = self.store.select(_K, states=(_D.RUNNING,), order_by="created_at")
        for row in candidates:
            if judged_alive(row.values, self.incarnation, liveness, leases, when):
                continue
            try:
                recovered = self.store.transition(
                    _K,
                    row.id,
                    "recover",
                    audit=Audit(when, self._owner_label, row["attempts"], "owner dead"),
                    fence=row.fence,
                    changes={"updated_at": when},
                )
            except (StaleState, InvalidTransition, UnknownEntity):
                continue  # it changed since the select: its owner or another recoverer won
            events.append(Delegation.from_row(recovered).completion_event())
        return events

    # -- routing and settling ----------------------------------------------------------------

    def route_completion(
        self, delegation_id: str, sessions: SessionStore, *, store_available: bool = True
    ) -> Route[Session]:
        """THE route of a delegation's completion, from the sessions as they are now.

        Use this one call both before acknowledging a completion and inside the delivery
        pipeline: it reads the pinned session (``origin.parent_session_id``), the chat's current
        session (``origin.session_key``, else the pinned session's key) and, for a pin ended by
        compression, the end of its successor chain, and hands them to
        :func:`~statecore.gateway.routing.resolve_route`.  A store that cannot be read
        (``store_available`` False, or a :class:`StoreError` while reading) gives ``retry``.
        Writes nothing.  Raises :class:`UnknownEntity` for an unknown delegation.
        """
        if not store_available:
            return resolve_route(None, current=None, store_available=False)
        try:
            origin = self._record(delegation_id).origin
            pinned = (
                None if origin.parent_session_id is None else sessions.get(origin.parent_session_id)
            )
            key = origin.session_key or (None if pinned is None else pinned.session_key)
            current = None if key is None else sessions.current(key)
            successor = None
            if pinned is not None and pinned.end_reason == COMPRESSION_END_REASON:
                successor = sessions.compression_successor(pinned.session_id)
        except StoreError:
            return resolve_route(None, current=None, store_available=False)
        return resolve_route(pinned, current=current, successor=successor)

    def mark_delivered(self, delegation_id: str, *, session_id: str | None = None) -> Delegation:
        """The completion reached its route: completed | unknown -> delivered (terminal).

        ``session_id`` (the route's session) is kept for the audit.  Raises
        :class:`InvalidTransition` from any other state (running, delivered, dropped) and
        :class:`UnknownEntity` for an unknown id; nothing changes then.
        """
        if session_id is not None:
            require_text("session_id", session_id)
        return self._move(
            delegation_id,
            "deliver",
            {"delivered_to": session_id},
            None if session_id is None else f"delivered into {session_id}",
        )

    def mark_dropped(self, delegation_id: str, reason: str) -> Delegation:
        """The completion's route is terminal: completed | unknown -> dropped, with ``reason``
        (the route's reason).  Raises as :meth:`mark_delivered`, and ``TypeError`` /
        ``ValueError`` for a missing reason."""
        require_text("reason", reason)
        return self._move(delegation_id, "drop", {"last_reason": reason}, reason)

    def defer(self, delegation_id: str, reason: str) -> Delegation:
        """The route said retry: count it (``attempts`` + 1) and keep ``reason``; the completion
        stays owed.  Raises as :meth:`mark_dropped`."""
        require_text("reason", reason)
        require_text("delegation_id", delegation_id)
        row = self._row(delegation_id)
        return self._move(
            delegation_id,
            "defer",
            {"last_reason": reason, "attempts": row["attempts"] + 1},
            reason,
            fence=row.fence,
            attempts=row["attempts"] + 1,
        )

    # -- reads -------------------------------------------------------------------------------

    def get(self, delegation_id: str) -> Delegation | None:
        """The delegation, or None if it was never dispatched (or was pruned)."""
        require_text("delegation_id", delegation_id)
        row = self.store.get(_K, delegation_id)
        return None if row is None else Delegation.from_row(row)

    def completion_event(self, delegation_id: str) -> dict[str, Any]:
        """The delegation's completion event (see :meth:`Delegation.completion_event`).

        Raises :class:`UnknownEntity` for an unknown id and :class:`InvalidTransition` while it
        is still running.
        """
        return self._record(delegation_id).completion_event()

    def pending_completions(self, *, limit: int | None = None) -> list[Delegation]:
        """Completions not yet delivered or dropped (completed or unknown), oldest first."""
        rows = self.store.select(_K, states=_OUTCOME, order_by="updated_at", limit=limit)
        return [Delegation.from_row(r) for r in rows]

    def running(self, *, limit: int | None = None) -> list[Delegation]:
        """Delegations still running (any owner), oldest first."""
        rows = self.store.select(_K, states=(_D.RUNNING,), order_by="created_at", limit=limit)
        return [Delegation.from_row(r) for r in rows]

    def history(self, delegation_id: str) -> list[TransitionRecord]:
        """Every transition of the delegation, oldest first: where it went, or why not."""
        return self.store.history(_K, delegation_id)

    def prune(self, *, retention: float = 604_800.0, now: float | None = None) -> int:
        """Delete delivered and dropped delegations older than ``retention`` seconds; return
        how many.  Running and owed completions are never deleted."""
        when = self.clock.now() if now is None else now
        return self.store.prune(_K, "prune", where={"updated_at": lt(when - retention)})

    # -- internals ---------------------------------------------------------------------------

    def _row(self, delegation_id: str) -> Row[DelegationState]:
        require_text("delegation_id", delegation_id)
        row = self.store.get(_K, delegation_id)
        if row is None:
            raise UnknownEntity(_K.name, delegation_id)
        return row

    def _record(self, delegation_id: str) -> Delegation:
        return Delegation.from_row(self._row(delegation_id))

    def _move(
        self,
        delegation_id: str,
        event: str,
        changes: dict[str, Any],
        reason: str | None,
        *,
        fence: int | None = None,
        attempts: int | None = None,
    ) -> Delegation:
        require_text("delegation_id", delegation_id)
        now = self.clock.now()
        changes["updated_at"] = now
        row = self.store.transition(
            _K,
            delegation_id,
            event,
            audit=Audit(now, self._owner_label, attempts, reason),
            fence=fence,
            changes=changes,
        )
        return Delegation.from_row(row)


class AsyncDelegations:
    """:class:`Delegations`' methods for asyncio code: each runs the synchronous method on a
    worker thread, with the same arguments, result and errors (``Delegations.aio``)."""

    def __init__(self, delegations: Delegations) -> None:
        self.delegations = delegations
        """The synchronous API these methods run."""
        self.dispatch = off_loop(delegations.dispatch)
        """:meth:`Delegations.dispatch`, off the event loop."""
        self.complete = off_loop(delegations.complete)
        """:meth:`Delegations.complete`, off the event loop."""
        self.recover_abandoned = off_loop(delegations.recover_abandoned)
        """:meth:`Delegations.recover_abandoned`, off the event loop."""
        self.route_completion = off_loop(delegations.route_completion)
        """:meth:`Delegations.route_completion`, off the event loop."""
        self.mark_delivered = off_loop(delegations.mark_delivered)
        """:meth:`Delegations.mark_delivered`, off the event loop."""
        self.mark_dropped = off_loop(delegations.mark_dropped)
        """:meth:`Delegations.mark_dropped`, off the event loop."""
        self.defer = off_loop(delegations.defer)
        """:meth:`Delegations.defer`, off the event loop."""
        self.get = off_loop(delegations.get)
        """:meth:`Delegations.get`, off the event loop."""
        self.completion_event = off_loop(delegations.completion_event)
        """:meth:`Delegations.completion_event`, off the event loop."""
        self.pending_completions = off_loop(delegations.pending_completions)
        """:meth:`Delegations.pending_completions`, off the event loop."""
        self.running = off_loop(delegations.running)
        """:meth:`Delegations.running`, off the event loop."""
        self.history = off_loop(delegations.history)
        """:meth:`Delegations.history`, off the event loop."""
        self.prune = off_loop(delegations.prune)
        """:meth:`Delegations.prune`, off the event loop."""


def _dumps(name: str, value: object) -> str:
    """JSON text for ``value``, or ``TypeError``/``ValueError`` naming what cannot be stored."""
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name} is not JSON-serializable: {exc}") from None

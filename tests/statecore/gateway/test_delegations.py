"""Tests for statecore.gateway.delegations: durable async work, its routing origin and its routing.

Every store-backed test runs against the in-memory store and the SQLite store (a "restart"
reopens the SQLite file; the in-memory store stands for a store that outlives the process).
Time comes from a FakeClock; process liveness from a scripted probe: a "dead" owner is an
incarnation on this host whose pid the probe does not know.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statecore import (
    FakeClock,
    Incarnation,
    InvalidTransition,
    StaleState,
    Store,
    UnknownEntity,
)
from statecore.gateway.delegations import (
    DELEGATION,
    DELEGATION_KIND,
    Delegation,
    Delegations,
    DelegationState,
)
from statecore.gateway.routing import (
    USER_BOUNDARY_END_REASONS,
    RouteVerdict,
    RoutingOrigin,
    resolve_route,
)
from statecore.gateway.sessions import SESSION_KIND, SessionState, SessionStore
from statecore.leases import Heartbeat
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore

D = DelegationState
V = RouteVerdict
HOST = Incarnation.current().host
LIVE = Incarnation(HOST, 4001, 1_000, "live-token")
"""The process running recovery in most tests (alive according to the probe)."""
OTHER_LIVE = Incarnation(HOST, 4002, 2_000, "other-live-token")
"""Another live gateway process on this host."""
DEAD = Incarnation(HOST, 999_999, 1, "dead-token")
"""A crashed process: the probe does not know its pid."""
KEY = "agent:main:discord:group:C123:U9"
ORIGIN_FIELDS = (
    "platform",
    "chat_id",
    "chat_type",
    "thread_id",
    "user_id",
    "user_name",
    "scope_id",
    "session_key",
    "parent_session_id",
)


class FakeProbe:
    """A scripted ProcessProbe: ``procs`` maps a live pid to its start time; calls are counted."""

    def __init__(self, procs: dict[int, int | None] | None = None) -> None:
        self.procs = (
            {LIVE.pid: LIVE.started_at, OTHER_LIVE.pid: OTHER_LIVE.started_at}
            if procs is None
            else procs
        )
        self.start_time_calls: list[int] = []

    def pid_exists(self, pid: int) -> bool:
        return pid in self.procs

    def start_time(self, pid: int) -> int | None:
        self.start_time_calls.append(pid)
        return self.procs.get(pid)


class Stores:
    """The store under test, reopenable to simulate a process restart."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path
        self.store: Store = InMemoryStore() if kind == "memory" else SQLiteStore(path)

    def restart(self) -> Store:
        """The store as a new process would open it."""
        if self.kind == "sqlite":
            self.store.close()
            self.store = SQLiteStore(self.path)
        return self.store


@pytest.fixture(params=["memory", "sqlite"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    """An empty store of each kind, reopenable (closed at teardown)."""
    made = Stores(request.param, tmp_path / "delegations.db")
    yield made
    made.store.close()


@pytest.fixture
def store(stores: Stores) -> Store:
    """The store under test."""
    return stores.store


@pytest.fixture
def clock() -> FakeClock:
    """The only time source."""
    return FakeClock()


@pytest.fixture
def probe() -> FakeProbe:
    """A probe that knows LIVE and OTHER_LIVE as alive, and nobody else."""
    return FakeProbe()


def make(
    store: Store, clock: FakeClock, probe: Any, incarnation: Incarnation = LIVE, **kw: Any
) -> Delegations:
    """Delegations over ``store`` acting as ``incarnation``."""
    return Delegations(store, clock=clock, probe=probe, incarnation=incarnation, **kw)


def origin(**overrides: Any) -> RoutingOrigin:
    """The scoped group-chat origin of the seed's restart scenario."""
    values: dict[str, Any] = {
        "platform": "discord",
        "chat_id": "C123",
        "chat_type": "group",
        "user_id": "U9",
        "user_name": "Ada",
        "scope_id": "G777",
        "session_key": KEY,
        "parent_session_id": "sess-p",
    }
    values.update(overrides)
    return RoutingOrigin(**values)


def stored(delegations: Delegations, delegation_id: str) -> Delegation:
    """The stored delegation (asserted to exist)."""
    found = delegations.get(delegation_id)
    assert found is not None
    return found


# -- the declaration ---------------------------------------------------------------------------


def test_delegation_lifecycle_declaration() -> None:
    """Dispatch creates running work; completion or recovery lead to delivered or dropped."""
    assert DELEGATION.initial is D.RUNNING
    assert DELEGATION.terminal == frozenset({D.DELIVERED, D.DROPPED})
    assert DELEGATION.events == (
        "dispatch",
        "complete",
        "recover",
        "defer",
        "deliver",
        "drop",
        "prune",
    )
    assert DELEGATION.creates("dispatch")
    assert DELEGATION.target(D.RUNNING, "complete") is D.COMPLETED
    assert DELEGATION.target(D.RUNNING, "recover") is D.UNKNOWN
    for owed in (D.COMPLETED, D.UNKNOWN):
        assert DELEGATION.target(owed, "deliver") is D.DELIVERED
        assert DELEGATION.target(owed, "drop") is D.DROPPED
        assert DELEGATION.target(owed, "defer") is owed
    assert DELEGATION.sources("prune") == frozenset({D.DELIVERED, D.DROPPED})
    with pytest.raises(InvalidTransition):
        DELEGATION.target(D.RUNNING, "deliver")
    with pytest.raises(InvalidTransition):
        DELEGATION.target(D.UNKNOWN, "complete")


def test_delegation_kind_schema() -> None:
    """Delegations live in table delegations keyed by delegation_id, origin kept as JSON."""
    assert (DELEGATION_KIND.table, DELEGATION_KIND.id_field) == ("delegations", "delegation_id")
    names = {f.name for f in DELEGATION_KIND.fields}
    assert {
        "origin_json",
        "payload_json",
        "result_json",
        "owner_host",
        "owner_pid",
        "owner_started_at",
        "owner_token",
        "created_at",
        "updated_at",
        "completed_at",
        "attempts",
    } <= names
    assert DELEGATION_KIND.field("origin_json").immutable


# -- dispatch ----------------------------------------------------------------------------------


def test_dispatch_persists_origin_with_scope_and_user(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """The dispatched row is running, owned by this incarnation, with the full origin stored."""
    delegations = make(store, clock, probe)
    did = delegations.dispatch(origin(), {"goal": "scoped goal"}, delegation_id="d-scope-1")
    assert did == "d-scope-1"
    d = stored(delegations, did)
    assert d.state is D.RUNNING
    assert d.status == "running"
    assert d.origin == origin()
    assert (d.origin.scope_id, d.origin.user_id) == ("G777", "U9")
    assert d.payload == {"goal": "scoped goal"}
    assert (d.result, d.completed_at, d.attempts) == (None, None, 0)
    assert d.created_at == d.updated_at == clock.now()
    assert (d.owner.host, d.owner.pid, d.owner.started_at, d.owner.token) == (
        LIVE.host,
        LIVE.pid,
        LIVE.started_at,
        LIVE.token,
    )
    row = store.get(DELEGATION_KIND, did)
    assert row is not None
    assert json.loads(row["origin_json"]) == origin().to_dict()
    assert [(r.event, r.to_state) for r in delegations.history(did)] == [("dispatch", D.RUNNING)]


def test_dispatch_generates_distinct_ids(store: Store, clock: FakeClock, probe: FakeProbe) -> None:
    """Without an explicit id each dispatch gets a new one."""
    delegations = make(store, clock, probe)
    assert delegations.dispatch(origin(), {}) != delegations.dispatch(origin(), {})


def test_dispatch_accepts_an_origin_mapping(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A mapping of origin fields is validated and stored like a RoutingOrigin."""
    delegations = make(store, clock, probe)
    did = delegations.dispatch({**origin().to_dict(), "chat_id": 123}, {"goal": "g"})
    assert stored(delegations, did).origin == origin(chat_id="123")


def test_dispatch_existing_id_is_idempotent(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Dispatching an existing id keeps the stored row as it is."""
    delegations = make(store, clock, probe)
    delegations.dispatch(origin(), {"goal": "first"}, delegation_id="d1")
    delegations.dispatch(origin(scope_id="other"), {"goal": "second"}, delegation_id="d1")
    d = stored(delegations, "d1")
    assert (d.payload, d.origin.scope_id) == ({"goal": "first"}, "G777")
    assert len(delegations.history("d1")) == 1


@pytest.mark.parametrize(
    "case",
    [
        (None, TypeError, "mapping"),
        ("discord:C123", TypeError, "mapping"),
        ({"platform": "discord", "chat_type": "group"}, ValueError, "'chat_id'"),
        ({"platform": "discord", "chat_id": "C1"}, ValueError, "'chat_type'"),
        ({"chat_id": "C1", "chat_type": "dm"}, ValueError, "'platform'"),
        ({"platform": "discord", "chat_id": "C1", "chat_type": "room"}, ValueError, "'chat_type'"),
        ({"platform": "discord", "chat_id": ["C1"], "chat_type": "dm"}, TypeError, "'chat_id'"),
        (
            {"platform": "discord", "chat_id": "C1", "chat_type": "dm", "scope_id": 1.5},
            TypeError,
            "'scope_id'",
        ),
        (
            {"platform": "discord", "chat_id": "C1", "chat_type": "dm", "user_id": True},
            TypeError,
            "'user_id'",
        ),
    ],
)
def test_corrupt_origin_is_refused_at_dispatch_writing_nothing(
    store: Store, clock: FakeClock, probe: FakeProbe, case: tuple[Any, type, str]
) -> None:
    """A corrupt routing origin raises a clear error at dispatch and nothing is written."""
    corrupt, error, names = case
    delegations = make(store, clock, probe)
    with pytest.raises(error, match=names):
        delegations.dispatch(corrupt, {"goal": "g"}, delegation_id="bad")
    assert store.count(DELEGATION_KIND) == 0
    assert delegations.history("bad") == []


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (["not", "a", "mapping"], TypeError),
        ({"x": object()}, TypeError),
        ({"x": float("nan")}, ValueError),
    ],
)
def test_payload_that_json_cannot_hold_is_refused(
    store: Store, clock: FakeClock, probe: FakeProbe, payload: Any, error: type
) -> None:
    """A payload that is not a JSON-serializable mapping is refused before anything is written."""
    delegations = make(store, clock, probe)
    with pytest.raises(error):
        delegations.dispatch(origin(), payload)
    assert store.count(DELEGATION_KIND) == 0


# -- complete ----------------------------------------------------------------------------------


def test_complete_keeps_result_and_the_live_event_carries_the_origin(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """The owner's completion is kept, and its event carries every origin field."""
    delegations = make(store, clock, probe)
    did = delegations.dispatch(origin(thread_id="T5"), {"goal": "g"}, delegation_id="d-live-1")
    clock.advance(1)
    done = delegations.complete(did, {"summary": "ok"})
    assert (done.state, done.result, done.completed_at) == (
        D.COMPLETED,
        {"summary": "ok"},
        clock.now(),
    )
    event = delegations.completion_event(did)
    expected_origin = origin(thread_id="T5").to_dict()
    assert {name: event[name] for name in ORIGIN_FIELDS} == expected_origin
    assert (event["scope_id"], event["user_id"]) == ("G777", "U9")
    assert event["delegation_id"] == did
    assert event["status"] == "completed"
    assert event["result"] == {"summary": "ok"}
    assert json.loads(json.dumps(event)) == event
    assert RoutingOrigin.from_dict(event) == origin(thread_id="T5")


def test_complete_twice_is_invalid(store: Store, clock: FakeClock, probe: FakeProbe) -> None:
    """A completed delegation cannot complete again; the first result stays."""
    delegations = make(store, clock, probe)
    did = delegations.dispatch(origin(), {})
    delegations.complete(did, 1)
    with pytest.raises(InvalidTransition):
        delegations.complete(did, 2)
    assert stored(delegations, did).result == 1


def test_only_the_owner_completes(store: Store, clock: FakeClock, probe: FakeProbe) -> None:
    """Another incarnation's completion is refused as stale and the row stays running."""
    did = make(store, clock, probe).dispatch(origin(), {})
    with pytest.raises(StaleState):
        make(store, clock, probe, OTHER_LIVE).complete(did, "x")
    assert stored(make(store, clock, probe), did).state is D.RUNNING


def test_complete_refuses_unserializable_result(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A result JSON cannot hold is refused and the row stays running."""
    delegations = make(store, clock, probe)
    did = delegations.dispatch(origin(), {})
    with pytest.raises(TypeError, match="result"):
        delegations.complete(did, {1, 2})
    assert stored(delegations, did).state is D.RUNNING


def test_complete_unknown_id(store: Store, clock: FakeClock, probe: FakeProbe) -> None:
    """Completing a delegation that was never dispatched raises UnknownEntity."""
    with pytest.raises(UnknownEntity):
        make(store, clock, probe).complete("ghost", None)


def test_completion_event_of_running_work_is_refused(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """There is no completion event while the work runs, nor for an unknown id."""
    delegations = make(store, clock, probe)
    did = delegations.dispatch(origin(), {})
    with pytest.raises(InvalidTransition, match="still running"):
        delegations.completion_event(did)
    with pytest.raises(UnknownEntity):
        delegations.completion_event("ghost")


# -- recovery ----------------------------------------------------------------------------------


def test_scope_id_survives_dispatch_restart_recovery(
    stores: Stores, clock: FakeClock, probe: FakeProbe
) -> None:
    """A dead owner's running work is recovered as unknown after a restart, and the recovered
    completion event (and the origin rebuilt from it) carries scope_id and user_id."""
    dead = make(stores.store, clock, probe, DEAD)
    did = dead.dispatch(origin(), {"goal": "scoped goal"}, delegation_id="d-scope-1")
    restarted = make(stores.restart(), clock, probe, LIVE)
    events = restarted.recover_abandoned()
    assert [e["delegation_id"] for e in events] == [did]
    (event,) = events
    assert (event["scope_id"], event["user_id"]) == ("G777", "U9")
    assert event["status"] == "unknown"
    assert event["result"] is None
    rebuilt = RoutingOrigin.from_dict(event)
    assert (rebuilt.scope_id, rebuilt.user_id) == ("G777", "U9")
    d = stored(restarted, did)
    assert d.state is D.UNKNOWN
    assert d.origin == origin()
    assert restarted.completion_event(did) == event
    last = restarted.history(did)[-1]
    assert (last.event, last.from_state, last.to_state, last.reason) == (
        "recover",
        D.RUNNING,
        D.UNKNOWN,
        "owner dead",
    )


def test_recovery_never_touches_live_owners_or_own_rows(store: Store, clock: FakeClock) -> None:
    """Running rows of a live owner and of this very incarnation are left running."""
    probe = FakeProbe({OTHER_LIVE.pid: OTHER_LIVE.started_at})  # LIVE unknown to the probe
    other = make(store, clock, probe, OTHER_LIVE).dispatch(origin(), {}, delegation_id="other")
    me = make(store, clock, probe, LIVE)
    mine = me.dispatch(origin(), {}, delegation_id="mine")
    assert me.recover_abandoned() == []
    assert stored(me, other).state is D.RUNNING
    assert stored(me, mine).state is D.RUNNING


def test_recovery_treats_a_reused_pid_as_dead(store: Store, clock: FakeClock) -> None:
    """An owner whose pid now belongs to a process with another start time is dead."""
    reused = Incarnation(HOST, OTHER_LIVE.pid, 1, "old-token")
    did = make(store, clock, FakeProbe(), reused).dispatch(origin(), {})
    assert [e["delegation_id"] for e in make(store, clock, FakeProbe()).recover_abandoned()] == [
        did
    ]


def test_recovery_probes_each_owner_once(store: Store, clock: FakeClock) -> None:
    """Many rows of one dead owner cost one probe."""
    probe = FakeProbe()
    dead = make(store, clock, probe, DEAD)
    for n in range(5):
        dead.dispatch(origin(), {}, delegation_id=f"d{n}")
    probe.start_time_calls.clear()
    assert len(make(store, clock, probe).recover_abandoned()) == 5
    assert probe.start_time_calls == [DEAD.pid]


def test_recovery_of_other_host_waits_for_the_lease(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """An owner on another host is presumed alive until its lease expires."""
    remote = Incarnation("elsewhere", 4001, 1_000, "remote-token")
    did = make(store, clock, probe, remote, lease_s=60).dispatch(origin(), {})
    local = make(store, clock, probe)
    assert local.recover_abandoned() == []
    clock.advance(61)
    assert [e["delegation_id"] for e in local.recover_abandoned()] == [did]


def test_a_remote_owner_that_still_beats_keeps_a_long_delegation(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A delegation running longer than its row's lease on another host stays its owner's
    while that owner's heartbeat (its ledger's owner record) is renewed; once the beats stop
    and the owner lease runs out, it is recovered."""
    remote = Incarnation("elsewhere", 4001, 1_000, "remote-token")
    did = make(store, clock, probe, remote, lease_s=60).dispatch(origin(), {})
    local = make(store, clock, probe)
    heartbeat = Heartbeat(store, remote, lease_s=60, label=remote.label)
    for _ in range(5):  # five minutes of beats, every 20 s: far past the row's own lease
        heartbeat.beat(clock.now())
        clock.advance(20)
        assert local.recover_abandoned() == []
    clock.advance(41)  # no beat for 61 s: the owner lease is over
    assert [e["delegation_id"] for e in local.recover_abandoned()] == [did]


def test_recovery_leaves_completed_work_alone(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Only running rows are recovered: a dead owner's finished work keeps its result."""
    dead = make(store, clock, probe, DEAD)
    did = dead.dispatch(origin(), {})
    dead.complete(did, "done")
    assert make(store, clock, probe).recover_abandoned() == []
    assert stored(dead, did).state is D.COMPLETED


def test_zombie_owner_cannot_complete_recovered_work(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """An owner presumed dead that wakes up finds its work recovered: its completion is refused."""
    zombie = make(store, clock, probe, DEAD)
    did = zombie.dispatch(origin(), {})
    make(store, clock, probe).recover_abandoned()
    with pytest.raises(InvalidTransition):
        zombie.complete(did, "late")
    assert stored(zombie, did).state is D.UNKNOWN


def test_second_recovery_finds_nothing(store: Store, clock: FakeClock, probe: FakeProbe) -> None:
    """A row is recovered once."""
    make(store, clock, probe, DEAD).dispatch(origin(), {})
    recoverer = make(store, clock, probe)
    assert len(recoverer.recover_abandoned()) == 1
    assert recoverer.recover_abandoned() == []


# -- settling ----------------------------------------------------------------------------------


def test_mark_delivered_and_dropped_are_strict(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Running work cannot be delivered or dropped; a settled one cannot move again."""
    delegations = make(store, clock, probe)
    did = delegations.dispatch(origin(), {})
    with pytest.raises(InvalidTransition):
        delegations.mark_delivered(did)
    with pytest.raises(InvalidTransition):
        delegations.mark_dropped(did, "pinned_missing")
    delegations.complete(did, "r")
    delivered = delegations.mark_delivered(did, session_id="sess-p")
    assert (delivered.state, delivered.delivered_to) == (D.DELIVERED, "sess-p")
    with pytest.raises(InvalidTransition):
        delegations.mark_dropped(did, "late")
    with pytest.raises(InvalidTransition):
        delegations.mark_delivered(did)
    with pytest.raises(UnknownEntity):
        delegations.mark_delivered("ghost")
    assert stored(delegations, did).state is D.DELIVERED


def test_mark_dropped_keeps_the_reason(store: Store, clock: FakeClock, probe: FakeProbe) -> None:
    """A dropped completion records why, on the row and in its history."""
    delegations = make(store, clock, probe, DEAD)
    did = delegations.dispatch(origin(), {})
    make(store, clock, probe).recover_abandoned()
    dropped = delegations.mark_dropped(did, "user_boundary:session_reset")
    assert (dropped.state, dropped.last_reason) == (D.DROPPED, "user_boundary:session_reset")
    assert delegations.history(did)[-1].reason == "user_boundary:session_reset"
    with pytest.raises(ValueError, match="reason"):
        delegations.mark_dropped(did, "")


def test_defer_counts_retries_and_keeps_it_owed(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A retry verdict is counted and audited; the completion stays pending."""
    delegations = make(store, clock, probe)
    did = delegations.dispatch(origin(), {})
    delegations.complete(did, "r")
    delegations.defer(did, "no_live_current_session")
    again = delegations.defer(did, "no_live_current_session")
    assert (again.state, again.attempts, again.last_reason) == (
        D.COMPLETED,
        2,
        "no_live_current_session",
    )
    assert [p.delegation_id for p in delegations.pending_completions()] == [did]
    with pytest.raises(InvalidTransition):
        delegations.defer(delegations.dispatch(origin(), {}), "x")


def test_pending_completions_lists_only_owed_completions(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Completed and unknown work is pending; running, delivered and dropped work is not."""
    mine = make(store, clock, probe)
    dead = make(store, clock, probe, DEAD)
    mine.dispatch(origin(), {}, delegation_id="running")
    mine.dispatch(origin(), {}, delegation_id="completed")
    mine.complete("completed", 1)
    dead.dispatch(origin(), {}, delegation_id="unknown")
    for name in ("delivered", "dropped"):
        mine.dispatch(origin(), {}, delegation_id=name)
        mine.complete(name, 1)
    mine.mark_delivered("delivered")
    mine.mark_dropped("dropped", "pinned_missing")
    clock.advance(1)
    mine.recover_abandoned()
    assert [p.delegation_id for p in mine.pending_completions()] == ["completed", "unknown"]
    assert [p.status for p in mine.pending_completions()] == ["completed", "unknown"]
    assert [r.delegation_id for r in mine.running()] == ["running"]


def test_prune_removes_only_old_settled_work(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Pruning deletes delivered and dropped work past the retention; owed work never."""
    delegations = make(store, clock, probe)
    for name in ("delivered", "dropped", "owed"):
        delegations.dispatch(origin(), {}, delegation_id=name)
        delegations.complete(name, 1)
    delegations.dispatch(origin(), {}, delegation_id="running")
    delegations.mark_delivered("delivered")
    delegations.mark_dropped("dropped", "x")
    clock.advance(1_000)
    assert delegations.prune(retention=2_000) == 0
    assert delegations.prune(retention=500) == 2
    assert sorted(r.id for r in store.select(DELEGATION_KIND)) == ["owed", "running"]


# -- routing -----------------------------------------------------------------------------------


def _pinned_world(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> tuple[Delegations, SessionStore, str]:
    """A completed delegation pinned to the live session sess-p of KEY."""
    sessions = SessionStore(store, clock=clock)
    sessions.start(KEY, session_id="sess-p")
    delegations = make(store, clock, probe)
    did = delegations.dispatch(origin(), {"goal": "g"})
    delegations.complete(did, "r")
    return delegations, sessions, did


def test_route_completion_delivers_into_live_pin(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A completion pinned to a live session goes there."""
    delegations, sessions, did = _pinned_world(store, clock, probe)
    route = delegations.route_completion(did, sessions)
    assert (route.verdict, route.session_id, route.reason) == (V.DELIVER, "sess-p", "pinned_live")


@pytest.mark.parametrize(
    "reason", ["idle", "idle_timeout", "timeout", "agent_close", "cron_complete"]
)
def test_route_completion_retargets_non_boundary_end_to_current(
    store: Store, clock: FakeClock, probe: FakeProbe, reason: str
) -> None:
    """A pin ended for a non-boundary reason routes to the chat's current session, or retries
    while the chat has none."""
    delegations, sessions, did = _pinned_world(store, clock, probe)
    sessions.end("sess-p", reason)
    assert delegations.route_completion(did, sessions).verdict is V.RETRY
    current = sessions.start(KEY, session_id="sess-now")
    route = delegations.route_completion(did, sessions)
    assert (route.verdict, route.session) == (V.DELIVER, current)


@pytest.mark.parametrize("reason", sorted(USER_BOUNDARY_END_REASONS - {"new_session"}))
def test_route_completion_drops_on_user_boundary(
    store: Store, clock: FakeClock, probe: FakeProbe, reason: str
) -> None:
    """A pin the user closed makes the completion terminal, even with a live current session."""
    delegations, sessions, did = _pinned_world(store, clock, probe)
    sessions.end("sess-p", reason)
    sessions.start(KEY)
    route = delegations.route_completion(did, sessions)
    assert (route.verdict, route.session, route.reason) == (
        V.TERMINAL,
        None,
        f"user_boundary:{reason}",
    )


def test_route_completion_drops_after_new_session(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Starting a new session for the chat ends the pin with new_session: terminal."""
    delegations, sessions, did = _pinned_world(store, clock, probe)
    sessions.start(KEY)
    route = delegations.route_completion(did, sessions)
    assert (route.verdict, route.reason) == (V.TERMINAL, "user_boundary:new_session")


def test_route_completion_follows_compression(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A compressed pin delivers into the end of its successor chain."""
    delegations, sessions, did = _pinned_world(store, clock, probe)
    first = sessions.compress("sess-p")
    second = sessions.compress(first.session_id)
    route = delegations.route_completion(did, sessions)
    assert (route.verdict, route.session) == (V.DELIVER, second)


def test_route_completion_retries_while_successor_missing(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A compressed pin whose successor cannot be found retries."""
    delegations, sessions, did = _pinned_world(store, clock, probe)
    successor = sessions.compress("sess-p")
    sessions.end(successor.session_id, "idle")
    store.prune(SESSION_KIND, "prune", where={"session_id": successor.session_id})
    route = delegations.route_completion(did, sessions)
    assert (route.verdict, route.reason) == (V.RETRY, "compression_successor_missing")


def test_route_completion_terminal_when_pin_is_gone(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A pin that was pruned (or never existed) makes the completion terminal."""
    delegations, sessions, did = _pinned_world(store, clock, probe)
    sessions.end("sess-p", "idle")
    clock.advance(10)
    assert sessions.prune(retention=1) == 1
    route = delegations.route_completion(did, sessions)
    assert (route.verdict, route.reason) == (V.TERMINAL, "pinned_missing")
    unpinned = delegations.dispatch(origin(parent_session_id=None), {})
    assert delegations.route_completion(unpinned, sessions).verdict is V.TERMINAL


def test_route_completion_retries_when_store_unavailable(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """An unavailable session store gives retry: declared, or discovered while reading."""
    delegations, sessions, did = _pinned_world(store, clock, probe)
    assert delegations.route_completion(did, sessions, store_available=False).verdict is V.RETRY
    broken_store = InMemoryStore()
    broken = SessionStore(broken_store, clock=clock)
    broken_store.close()
    route = delegations.route_completion(did, broken)
    assert (route.verdict, route.reason) == (V.RETRY, "store_unavailable")


def test_route_completion_of_unknown_delegation_raises(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Routing a delegation that does not exist is a caller error."""
    delegations, sessions, _ = _pinned_world(store, clock, probe)
    with pytest.raises(UnknownEntity):
        delegations.route_completion("ghost", sessions)


def test_recovered_completion_routes_like_a_live_one(
    stores: Stores, clock: FakeClock, probe: FakeProbe
) -> None:
    """After the owner's death and a restart, the unknown completion finds the chat's current
    session through the same resolver, and delivery settles it."""
    sessions = SessionStore(stores.store, clock=clock)
    sessions.start(KEY, session_id="sess-p")
    did = make(stores.store, clock, probe, DEAD).dispatch(origin(), {"goal": "g"})
    store = stores.restart()
    sessions = SessionStore(store, clock=clock)
    sessions.end("sess-p", "idle")
    current = sessions.start(KEY)
    recovering = make(store, clock, probe)
    (event,) = recovering.recover_abandoned()
    assert event["delegation_id"] == did
    before_ack = recovering.route_completion(event["delegation_id"], sessions)
    in_pipeline = recovering.route_completion(event["delegation_id"], sessions)
    assert before_ack == in_pipeline
    assert (before_ack.verdict, before_ack.session) == (V.DELIVER, current)
    recovering.mark_delivered(event["delegation_id"], session_id=before_ack.session_id)
    assert recovering.pending_completions() == []


# -- the property: before acknowledging == inside the pipeline ---------------------------------

_KEYS = (KEY, "agent:main:discord:group:C123:U7")
_END_REASONS = st.sampled_from(
    ["idle", "idle_timeout", "timeout", "agent_close", "cron_complete", "crash", "session_reset"]
)
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.integers(0, 1)),
        st.tuples(st.just("end"), st.integers(0, 1), _END_REASONS),
        st.tuples(
            st.just("end"), st.integers(0, 1), st.sampled_from(sorted(USER_BOUNDARY_END_REASONS))
        ),
        st.tuples(st.just("compress"), st.integers(0, 1)),
        st.tuples(st.just("prune"), st.integers(3, 30)),
    ),
    max_size=10,
)


@attrs.frozen
class Scenario:
    """A random session graph and one completion to route through it."""

    ops: list[tuple[Any, ...]]
    """start / end(reason) / compress a key's current session, or prune old ended ones."""
    pin: int
    """-2: no pinned session; -1: a pin that never existed; else an index into the sessions."""
    key_choice: int
    """The origin's session key: one of the two keys, or (2) none."""
    store_available: bool
    recovered: bool
    """True: the owner died and the completion was recovered as unknown."""


_SCENARIOS = st.builds(
    Scenario,
    # Both keys start with a live session; the random operations then reshape the graph.
    ops=_OPS.map(lambda ops: [("start", 0), ("start", 1), *ops]),
    pin=st.one_of(st.integers(0, 12), st.integers(0, 12), st.integers(0, 12), st.integers(-2, -1)),
    key_choice=st.sampled_from([0, 0, 1, 2]),
    store_available=st.sampled_from([True, True, True, False]),
    recovered=st.booleans(),
)


def _build_sessions(
    sessions: SessionStore, clock: FakeClock, ops: list[tuple[Any, ...]]
) -> list[str]:
    """Apply ``ops`` to ``sessions``; return every session id created, in order."""
    created: list[str] = []
    for op in ops:
        clock.advance(1)
        if op[0] == "prune":
            sessions.prune(retention=op[1])
            continue
        key = _KEYS[op[1]]
        current = sessions.current(key)
        if op[0] == "start":
            created.append(sessions.start(key, session_id=f"s{len(created)}").session_id)
        elif op[0] == "end" and current is not None:
            sessions.end(current.session_id, op[2])
        elif op[0] == "compress" and current is not None:
            successor = sessions.compress(current.session_id, successor_id=f"s{len(created)}")
            created.append(successor.session_id)
    return created


def _dispatch_completion(
    store: Store, clock: FakeClock, scenario: Scenario, created: list[str]
) -> tuple[str, RoutingOrigin]:
    """Dispatch the scenario's delegation and complete (or recover) it; return id and origin."""
    probe = FakeProbe()
    if scenario.pin == -2:
        parent = None
    elif scenario.pin == -1 or not created:
        parent = "ghost"
    else:
        parent = created[scenario.pin % len(created)]
    key = None if scenario.key_choice == 2 else _KEYS[scenario.key_choice]
    o = origin(parent_session_id=parent, session_key=key)
    if scenario.recovered:
        did = make(store, clock, probe, DEAD).dispatch(o, {"goal": "g"})
        make(store, clock, probe).recover_abandoned()
    else:
        owner = make(store, clock, probe)
        did = owner.dispatch(o, {"goal": "g"})
        owner.complete(did, {"ok": True})
    return did, o


def _check_routes_agree(store: Store, scenario: Scenario) -> None:
    """Build the scenario, route its completion twice and check every invariant."""
    clock = FakeClock()
    sessions = SessionStore(store, clock=clock)
    created = _build_sessions(sessions, clock, scenario.ops)
    did, o = _dispatch_completion(store, clock, scenario, created)
    delegations = make(store, clock, FakeProbe())
    audit_before = len(delegations.history(did))
    available = scenario.store_available

    before_ack = delegations.route_completion(did, sessions, store_available=available)
    in_pipeline = delegations.route_completion(did, sessions, store_available=available)

    assert before_ack == in_pipeline
    assert len(delegations.history(did)) == audit_before  # routing writes nothing
    if before_ack.verdict is V.DELIVER:
        assert before_ack.session_id is not None
        target = sessions.get(before_ack.session_id)
        assert target is not None
        assert target.state is SessionState.ACTIVE
    else:
        assert before_ack.session is None
    # The single resolver, asked directly about the same records, agrees.
    pinned = None if o.parent_session_id is None else sessions.get(o.parent_session_id)
    key = o.session_key or (None if pinned is None else pinned.session_key)
    compressed = pinned is not None and pinned.end_reason == "compression"
    expected = resolve_route(
        pinned,
        current=None if key is None else sessions.current(key),
        successor=sessions.compression_successor(pinned.session_id)
        if pinned is not None and compressed
        else None,
        store_available=available,
    )
    assert expected == before_ack
    # The pipeline acts on the verdict it was given; the store accepts exactly that move.
    if before_ack.verdict is V.DELIVER:
        settled = delegations.mark_delivered(did, session_id=before_ack.session_id)
        assert settled.state is D.DELIVERED
    elif before_ack.verdict is V.TERMINAL:
        assert delegations.mark_dropped(did, before_ack.reason).state is D.DROPPED
    else:
        assert delegations.defer(did, before_ack.reason).state in (D.COMPLETED, D.UNKNOWN)


@settings(max_examples=150, deadline=None)
@given(scenario=_SCENARIOS)
def test_route_before_ack_and_in_pipeline_never_disagree_memory(scenario: Scenario) -> None:
    """Over random session graphs (in-memory store) the two routing uses agree, deliver names a
    live session, terminal and retry name none, and the resolver agrees with route_completion."""
    store = InMemoryStore()
    try:
        _check_routes_agree(store, scenario)
    finally:
        store.close()


@settings(max_examples=25, deadline=None)
@given(scenario=_SCENARIOS)
def test_route_before_ack_and_in_pipeline_never_disagree_sqlite(scenario: Scenario) -> None:
    """The same property over SQLite-persisted session graphs."""
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "prop.db")
        try:
            _check_routes_agree(store, scenario)
        finally:
            store.close()


@pytest.mark.parametrize("lease_s", [0, -1.0, math.inf, math.nan, True, "60"])
def test_lease_must_be_a_positive_finite_number(store: Store, lease_s: Any) -> None:
    """A lease that is not a positive, finite number is refused at construction, as the ledger
    policy refuses one."""
    with pytest.raises(ValueError, match="lease_s"):
        Delegations(store, lease_s=lease_s)

"""Tests for statecore.gateway.sessions: the persisted session lifecycle, over every store.

Every store-backed test runs against the in-memory store and the SQLite store; time comes from
a FakeClock.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from statecore import FakeClock, InvalidTransition, StaleState, Store, UnknownEntity
from statecore.gateway.routing import USER_BOUNDARY_END_REASONS, RouteVerdict, resolve_route
from statecore.gateway.sessions import (
    SESSION,
    SESSION_KIND,
    Session,
    SessionState,
    SessionStore,
)
from statecore.store import Audit
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore

A, E = SessionState.ACTIVE, SessionState.ENDED
KEY = "agent:main:slack:dm:U1"


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty store of each kind (closed at teardown)."""
    made: Store = (
        InMemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "sessions.db")
    )
    yield made
    made.close()


@pytest.fixture
def clock() -> FakeClock:
    """The only time source of the session store."""
    return FakeClock()


@pytest.fixture
def sessions(store: Store, clock: FakeClock) -> SessionStore:
    """A session store over ``store``."""
    return SessionStore(store, clock=clock)


def rows(store: Store) -> list[tuple[str, SessionState, str | None]]:
    """Every stored session as (id, state, end reason), for nothing-changed checks."""
    return [(r.id, r.state, r["end_reason"]) for r in store.select(SESSION_KIND)]


def stored(sessions: SessionStore, session_id: str) -> Session:
    """The stored session (asserted to exist)."""
    found = sessions.get(session_id)
    assert found is not None
    return found


# -- the declaration ---------------------------------------------------------------------------


def test_session_lifecycle_declaration() -> None:
    """Sessions start active, end (with a reason) in the terminal ended state, and only ended
    sessions can be pruned."""
    assert SESSION.initial is A
    assert SESSION.terminal == frozenset({E})
    assert SESSION.events == ("start", "flag", "end", "prune")
    assert SESSION.creates("start")
    assert SESSION.target(A, "end") is E
    assert SESSION.target(A, "flag") is A
    assert SESSION.removes("prune")
    assert SESSION.sources("prune") == frozenset({E})
    with pytest.raises(InvalidTransition):
        SESSION.target(E, "end")
    with pytest.raises(InvalidTransition):
        SESSION.target(E, "flag")


def test_session_kind_schema() -> None:
    """Sessions are stored in gateway_sessions keyed by session_id with the declared fields."""
    assert (SESSION_KIND.table, SESSION_KIND.id_field) == ("gateway_sessions", "session_id")
    assert SESSION_KIND.lifecycle is SESSION
    assert [f.name for f in SESSION_KIND.fields] == [
        "session_key",
        "started_at",
        "ended_at",
        "end_reason",
        "successor_id",
        "resume_pending",
        "platform",
        "chat_id",
    ]
    assert SESSION_KIND.field("resume_pending").type is bool


def test_is_user_boundary_matches_routing() -> None:
    """The session store's boundary test is the routing module's one."""
    for reason in USER_BOUNDARY_END_REASONS:
        assert SessionStore.is_user_boundary(reason)
    for other in ("idle", "compression", None, ""):
        assert not SessionStore.is_user_boundary(other)


# -- start / current / get ---------------------------------------------------------------------


def test_start_creates_the_current_active_session(sessions: SessionStore, clock: FakeClock) -> None:
    """A started session is active, is the key's current session and reads back equal."""
    s = sessions.start(KEY, platform="slack", chat_id=42)
    assert s.state is A
    assert not s.ended
    assert (s.session_key, s.started_at, s.platform, s.chat_id) == (
        KEY,
        clock.now(),
        "slack",
        "42",
    )
    assert (s.ended_at, s.end_reason, s.successor_id, s.resume_pending) == (None, None, None, False)
    assert sessions.current(KEY) == s
    assert sessions.get(s.session_id) == s


def test_current_is_none_for_unknown_key_and_get_none_for_unknown_id(
    sessions: SessionStore,
) -> None:
    """An unknown key has no current session and an unknown id no session."""
    assert sessions.current("nobody") is None
    assert sessions.get("nope") is None


def test_new_session_for_a_key_ends_the_old_with_new_session(
    sessions: SessionStore, clock: FakeClock
) -> None:
    """Starting a session for a key whose session is active ends the old one (new_session)."""
    old = sessions.start(KEY, session_id="old")
    clock.advance(5)
    new = sessions.start(KEY, session_id="new")
    before = stored(sessions, "old")
    assert (before.state, before.end_reason, before.ended_at) == (E, "new_session", clock.now())
    assert sessions.current(KEY) == new
    assert old.session_id != new.session_id
    assert [r.event for r in sessions.history("old")] == ["start", "end"]
    assert sessions.history("old")[-1].reason == "new_session"


def test_start_keeps_other_keys_sessions(sessions: SessionStore) -> None:
    """A new session for one key leaves other keys' sessions alone."""
    other = sessions.start("other-key")
    sessions.start(KEY)
    sessions.start(KEY)
    assert sessions.current("other-key") == other


def test_a_key_never_has_two_active_sessions(sessions: SessionStore, store: Store) -> None:
    """However many sessions a key starts, exactly one is active."""
    for _ in range(5):
        sessions.start(KEY)
    assert store.count(SESSION_KIND, states=(A,), where={"session_key": KEY}) == 1
    assert store.count(SESSION_KIND, states=(E,), where={"session_key": KEY}) == 4


def test_start_with_existing_id_is_idempotent(sessions: SessionStore, store: Store) -> None:
    """Re-starting an existing id returns it and ends nothing."""
    first = sessions.start(KEY, session_id="s1")
    assert sessions.start(KEY, session_id="s1") == first
    assert rows(store) == [("s1", A, None)]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"session_key": ""}, ValueError),
        ({"session_key": 5}, TypeError),
        ({"session_key": KEY, "session_id": ""}, ValueError),
        ({"session_key": KEY, "platform": 3}, TypeError),
        ({"session_key": KEY, "chat_id": True}, TypeError),
    ],
)
def test_start_refuses_bad_input_writing_nothing(
    sessions: SessionStore, store: Store, kwargs: dict[str, object], error: type
) -> None:
    """Bad keys, ids, platforms or chat ids are refused and nothing is written."""
    sessions.start(KEY, session_id="keep")
    rest = dict(kwargs)
    key = rest.pop("session_key")
    with pytest.raises(error):
        sessions.start(key, **rest)  # type: ignore[arg-type]
    assert rows(store) == [("keep", A, None)]


# -- end ---------------------------------------------------------------------------------------


def test_end_records_reason_and_time(sessions: SessionStore, clock: FakeClock) -> None:
    """end() moves an active session to ended with its reason, time and resume flag cleared."""
    s = sessions.start(KEY)
    sessions.set_resume_pending(KEY, True)
    clock.advance(30)
    done = sessions.end(s.session_id, "idle_timeout")
    assert (done.state, done.end_reason, done.ended_at) == (E, "idle_timeout", clock.now())
    assert done.ended
    assert done.resume_pending is False
    assert sessions.current(KEY) is None


def test_end_twice_is_an_invalid_transition(sessions: SessionStore) -> None:
    """An ended session cannot end again; the first reason stays."""
    s = sessions.start(KEY)
    sessions.end(s.session_id, "user_exit")
    with pytest.raises(InvalidTransition):
        sessions.end(s.session_id, "idle")
    assert stored(sessions, s.session_id).end_reason == "user_exit"


def test_end_unknown_session_raises_unknown_entity(sessions: SessionStore) -> None:
    """Ending a session that does not exist raises UnknownEntity."""
    with pytest.raises(UnknownEntity):
        sessions.end("ghost", "idle")


@pytest.mark.parametrize(("reason", "error"), [("", ValueError), (None, TypeError)])
def test_end_needs_a_reason(
    sessions: SessionStore, store: Store, reason: object, error: type
) -> None:
    """A missing reason is refused and the session stays active."""
    s = sessions.start(KEY)
    with pytest.raises(error):
        sessions.end(s.session_id, reason)  # type: ignore[arg-type]
    assert rows(store) == [(s.session_id, A, None)]


def test_end_refuses_compression_reason(sessions: SessionStore, store: Store) -> None:
    """Compression ends only through compress(), which links a successor."""
    s = sessions.start(KEY)
    with pytest.raises(ValueError, match="compress"):
        sessions.end(s.session_id, "compression")
    assert rows(store) == [(s.session_id, A, None)]


# -- compress ----------------------------------------------------------------------------------


def test_compress_links_a_live_successor(sessions: SessionStore, clock: FakeClock) -> None:
    """Compression ends the session with reason compression and starts its linked successor."""
    s = sessions.start(KEY, platform="slack", chat_id="D1")
    sessions.set_resume_pending(KEY, True)
    clock.advance(2)
    successor = sessions.compress(s.session_id)
    old = stored(sessions, s.session_id)
    assert (old.state, old.end_reason, old.successor_id) == (E, "compression", successor.session_id)
    assert old.resume_pending is False
    assert successor.state is A
    assert (successor.session_key, successor.platform, successor.chat_id) == (KEY, "slack", "D1")
    assert successor.resume_pending is True
    assert successor.started_at == clock.now()
    assert sessions.current(KEY) == successor
    assert sessions.history(successor.session_id)[0].reason == f"compression of {s.session_id}"


def test_compress_with_explicit_successor_id(sessions: SessionStore) -> None:
    """The successor id may be chosen by the caller."""
    s = sessions.start(KEY)
    assert sessions.compress(s.session_id, successor_id="next").session_id == "next"
    assert stored(sessions, s.session_id).successor_id == "next"


def test_compress_ended_session_is_refused_writing_nothing(
    sessions: SessionStore, store: Store
) -> None:
    """An ended session cannot be compressed and no successor appears."""
    s = sessions.start(KEY)
    sessions.end(s.session_id, "idle")
    before = rows(store)
    with pytest.raises(InvalidTransition):
        sessions.compress(s.session_id)
    assert rows(store) == before


def test_compress_unknown_session_raises(sessions: SessionStore) -> None:
    """Compressing an unknown session raises UnknownEntity."""
    with pytest.raises(UnknownEntity):
        sessions.compress("ghost")


def test_compress_onto_taken_id_rolls_back(sessions: SessionStore, store: Store) -> None:
    """A successor id that is taken refuses the compression and the session stays active."""
    sessions.start("other", session_id="taken")
    s = sessions.start(KEY, session_id="s")
    before = rows(store)
    with pytest.raises(ValueError, match="taken"):
        sessions.compress(s.session_id, successor_id="taken")
    assert rows(store) == before
    assert sessions.current(KEY) == s


def test_compression_successor_follows_the_chain(sessions: SessionStore) -> None:
    """compression_successor walks compressed successors to the session the talk is in now."""
    s0 = sessions.start(KEY, session_id="s0")
    s1 = sessions.compress(s0.session_id, successor_id="s1")
    s2 = sessions.compress(s1.session_id, successor_id="s2")
    assert sessions.compression_successor("s0") == s2
    assert sessions.compression_successor("s1") == s2
    sessions.end("s2", "idle")
    assert sessions.compression_successor("s0") == stored(sessions, "s2")


def test_compression_successor_none_when_not_compressed(sessions: SessionStore) -> None:
    """A live or otherwise-ended session, or an unknown id, has no compression successor."""
    s = sessions.start(KEY)
    assert sessions.compression_successor(s.session_id) is None
    sessions.end(s.session_id, "idle")
    assert sessions.compression_successor(s.session_id) is None
    assert sessions.compression_successor("ghost") is None


def test_compression_successor_none_when_link_pruned(sessions: SessionStore, store: Store) -> None:
    """A pruned successor breaks the chain: no successor is found."""
    s0 = sessions.start(KEY, session_id="s0")
    sessions.compress(s0.session_id, successor_id="s1")
    sessions.end("s1", "idle")
    assert store.prune(SESSION_KIND, "prune", where={"session_id": "s1"}) == 1
    assert stored(sessions, "s0").successor_id == "s1"
    assert sessions.compression_successor("s0") is None


def test_compression_successor_retry_for_compressed_session_without_link(
    sessions: SessionStore, store: Store, clock: FakeClock
) -> None:
    """A compressed session whose successor link is missing yields no successor (retry)."""
    store.insert(
        SESSION_KIND,
        "legacy",
        {"session_key": KEY, "started_at": clock.now()},
        event="start",
        audit=Audit(clock.now()),
    )
    store.transition(
        SESSION_KIND,
        "legacy",
        "end",
        audit=Audit(clock.now()),
        changes={"end_reason": "compression", "ended_at": clock.now()},
    )
    pinned = stored(sessions, "legacy")
    assert sessions.compression_successor("legacy") is None
    route = resolve_route(pinned, current=None, successor=None)
    assert route.verdict is RouteVerdict.RETRY


# -- resume_pending ----------------------------------------------------------------------------


def test_set_and_clear_resume_pending(sessions: SessionStore) -> None:
    """The flag is set and cleared on the key's current session, each change audited."""
    s = sessions.start(KEY)
    flagged = sessions.set_resume_pending(KEY, True)
    assert flagged is not None
    assert flagged.resume_pending is True
    assert stored(sessions, s.session_id).resume_pending is True
    cleared = sessions.set_resume_pending(KEY, False)
    assert cleared is not None
    assert cleared.resume_pending is False
    history = sessions.history(s.session_id)
    assert [(r.event, r.from_state, r.to_state, r.reason) for r in history] == [
        ("start", None, A, None),
        ("flag", A, A, "resume pending"),
        ("flag", A, A, "resume cleared"),
    ]


def test_resume_flag_unchanged_writes_nothing(sessions: SessionStore) -> None:
    """Setting the flag to the value it has writes no transition."""
    s = sessions.start(KEY)
    assert sessions.set_resume_pending(KEY, False) == s
    assert len(sessions.history(s.session_id)) == 1


def test_resume_flag_without_active_session_is_a_noop(sessions: SessionStore, store: Store) -> None:
    """A key with no active session has no flag to change: None, nothing written."""
    s = sessions.start(KEY)
    sessions.end(s.session_id, "idle")
    before = rows(store)
    assert sessions.set_resume_pending(KEY, True) is None
    assert sessions.set_resume_pending("unknown-key", True) is None
    assert rows(store) == before


def test_resume_flag_must_be_bool(sessions: SessionStore) -> None:
    """A non-bool flag is refused."""
    sessions.start(KEY)
    with pytest.raises(TypeError, match="bool"):
        sessions.set_resume_pending(KEY, 1)  # type: ignore[arg-type]


def test_new_session_starts_without_resume_flag(sessions: SessionStore) -> None:
    """A session replacing a flagged one starts unflagged; the old one is cleared."""
    old = sessions.start(KEY)
    sessions.set_resume_pending(KEY, True)
    new = sessions.start(KEY)
    assert new.resume_pending is False
    assert stored(sessions, old.session_id).resume_pending is False


@pytest.mark.asyncio
async def test_clear_resume_pending_runs_off_the_event_loop(store: Store, clock: FakeClock) -> None:
    """The async clear does its store work on another thread and clears the flag."""
    seen: list[int] = []

    class Recording(SessionStore):
        def set_resume_pending(self, session_key: str, flag: bool) -> Session | None:
            seen.append(threading.get_ident())
            return super().set_resume_pending(session_key, flag)

    sessions = Recording(store, clock=clock)
    s = sessions.start(KEY)
    sessions.set_resume_pending(KEY, True)
    seen.clear()
    cleared = await asyncio.wait_for(sessions.clear_resume_pending(KEY), 10)
    assert cleared is not None
    assert cleared.resume_pending is False
    assert stored(sessions, s.session_id).resume_pending is False
    assert seen
    assert threading.get_ident() not in seen
    assert await sessions.clear_resume_pending("no-such-key") is None


# -- guards, history, pruning ------------------------------------------------------------------


def test_every_write_is_guarded_by_state_and_fence(sessions: SessionStore, store: Store) -> None:
    """A stale fence is refused by the store for session rows, like any guarded write."""
    s = sessions.start(KEY)
    sessions.set_resume_pending(KEY, True)
    with pytest.raises(StaleState):
        store.transition(
            SESSION_KIND,
            s.session_id,
            "flag",
            audit=Audit(0.0),
            fence=s.fence,
            changes={"resume_pending": False},
        )
    assert stored(sessions, s.session_id).resume_pending is True


def test_history_tells_the_whole_story(sessions: SessionStore, clock: FakeClock) -> None:
    """start, compress and end all leave audit entries with their reasons and times."""
    s = sessions.start(KEY, session_id="a")
    clock.advance(1)
    nxt = sessions.compress(s.session_id, successor_id="b")
    clock.advance(1)
    sessions.end(nxt.session_id, "session_reset")
    first = sessions.history("a")
    second = sessions.history("b")
    assert [(r.event, r.to_state, r.reason) for r in first] == [
        ("start", A, None),
        ("end", E, "compression"),
    ]
    assert [(r.event, r.to_state, r.reason) for r in second] == [
        ("start", A, "compression of a"),
        ("end", E, "session_reset"),
    ]
    assert second[-1].at == clock.now()


def test_prune_removes_only_old_ended_sessions(
    sessions: SessionStore, store: Store, clock: FakeClock
) -> None:
    """Pruning deletes sessions ended before the retention window; active ones never."""
    old = sessions.start("k1")
    sessions.end(old.session_id, "idle")
    clock.advance(1_000)
    recent = sessions.start("k2")
    sessions.end(recent.session_id, "idle")
    active = sessions.start("k3")
    clock.advance(10_000)
    assert sessions.prune(retention=10_500) == 1
    assert sessions.get(old.session_id) is None
    assert sessions.history(old.session_id) == []
    assert sessions.get(recent.session_id) is not None
    assert sessions.prune(retention=0) == 1
    assert rows(store) == [(active.session_id, A, None)]


def test_sessions_survive_a_reopened_sqlite_store(tmp_path: Path, clock: FakeClock) -> None:
    """Sessions persisted in SQLite are there, unchanged, after the store is reopened."""
    path = tmp_path / "restart.db"
    first = SQLiteStore(path)
    s = SessionStore(first, clock=clock).start(KEY, platform="slack")
    SessionStore(first, clock=clock).set_resume_pending(KEY, True)
    first.close()
    second = SQLiteStore(path)
    try:
        again = SessionStore(second, clock=clock)
        found = again.current(KEY)
        assert found is not None
        assert (found.session_id, found.resume_pending, found.platform) == (
            s.session_id,
            True,
            "slack",
        )
    finally:
        second.close()

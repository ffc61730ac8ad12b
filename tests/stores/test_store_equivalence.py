"""Model-based equivalence of the ledger over InMemoryStore and SQLiteStore, and PostgresStore.

A Hypothesis state machine drives random ledger operations against two worlds side by side: one
over an :class:`InMemoryStore`, one over a :class:`SQLiteStore` on a fresh temp file.  Both worlds
share one :class:`FakeClock` and the same injected incarnations, and each has its own fake probe
scripted identically, so every observable result -- return values, exceptions, rows and audit
histories -- must be exactly equal.  Three owners act in each world: ``a`` and ``b`` (gateways on
this host; a rule switches each between alive, gone and pid-reused) and ``remote`` (a gateway on
another host, dead once its lease has expired).  Each example uses the default policy or a
smaller attempt budget, so the budget edge is reached within a few steps.

Separate tests pin what was once a divergence: text with a lone surrogate (which InMemoryStore
could hold and SQLiteStore could not encode) is now handled identically by both stores.

The same machine runs again with a :class:`PostgresStore` on a real server as its second world (a
fresh schema of the session's database per example, fewer examples so the run stays short).
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from statecore import (
    Claim,
    FakeClock,
    Incarnation,
    Ledger,
    LedgerPolicy,
    ObligationState,
    StatecoreError,
    Store,
)
from stores.memory import InMemoryStore
from stores.postgres import PostgresStore
from stores.sqlite import SQLiteStore

T = TypeVar("T")
S = ObligationState

HOST = Incarnation.current().host
OWNERS = {
    "a": Incarnation(HOST, 4101, 1_000, "token-a"),
    "b": Incarnation(HOST, 4102, 2_000, "token-b"),
    "remote": Incarnation("remote-host.invalid", 4103, 3_000, "token-remote"),
}
"""The incarnations acting in both worlds (the same objects on both sides)."""
ACTORS = tuple(OWNERS)
LOCAL_OWNERS = ("a", "b")
"""The owners on this host, whose liveness the fake probes answer."""
SITUATIONS = ("alive", "gone", "reused")
SETTLERS = ("owner", "owner", "owner", "owner", "owner", *ACTORS)
"""Who settles a row: mostly its current owner (resolved at run time), sometimes anyone."""
POLICIES = (LedgerPolicy(), LedgerPolicy(max_attempts=2), LedgerPolicy(max_attempts=1))
"""The default policy, and smaller attempt budgets so the budget edge is reached often."""
OWED = frozenset({S.PENDING, S.ATTEMPTING, S.FAILED})

RECORDED_IDS = tuple(f"ob-{n}" for n in range(8))
"""The id pool records draw from: small, so re-records and collisions happen."""
GHOST = "ghost-never-recorded"
ALL_IDS = (*RECORDED_IDS, GHOST)
"""Every id the invariants inspect, including one that is never recorded."""

PLATFORMS = ("slack", "telegram")
PROFILES = (None, "reviewer")
ERRORS = (
    "send_path_degraded",
    "connection reset",
    "429 Too Many Requests",
    "Forbidden: bot was blocked",
)
CONTENTS = ("the final answer", "a different answer")
STEPS = (0.5, 1.0, 29.0, 31.0, 119.0, 121.0, 299.0, 301.0, 3_600.0, 86_401.0, 604_801.0)
"""Clock advances around the backoffs (30, 120), the lease (300), stale_after and retention."""

Outcome = tuple[str, Any, Any]


class ToggleProbe:
    """A scripted ProcessProbe: each same-host owner is alive, gone, or its pid was reused."""

    def __init__(self) -> None:
        self.procs: dict[int, int] = {}
        for who in LOCAL_OWNERS:
            self.set(who, "alive")

    def set(self, who: str, situation: str) -> None:
        owner = OWNERS[who]
        assert owner.started_at is not None
        if situation == "alive":
            self.procs[owner.pid] = owner.started_at
        elif situation == "reused":  # same pid, another process: the old owner is dead
            self.procs[owner.pid] = owner.started_at + 500
        else:
            self.procs.pop(owner.pid, None)

    def pid_exists(self, pid: int) -> bool:
        return pid in self.procs

    def start_time(self, pid: int) -> int | None:
        return self.procs.get(pid)


def _outcome(call: Callable[[], T]) -> Outcome:
    """The call's result, or the statecore error it raised (type and message)."""
    try:
        return ("ok", call(), None)
    except StatecoreError as exc:
        return ("raised", type(exc), str(exc))


class LedgerEquivalence(RuleBasedStateMachine):
    """Drives identical operations on an in-memory world and a SQLite world and compares them."""

    def __init__(self) -> None:
        super().__init__()
        self.tmpdir = tempfile.mkdtemp(prefix="statecore-equiv-")
        self.clock = FakeClock()
        self.mem_store = InMemoryStore()
        self.sql_store = self.open_store()
        self.probes = (ToggleProbe(), ToggleProbe())
        self.policy = POLICIES[0]
        self.worlds = self._worlds()
        """(in-memory, SQLite): each maps an actor to its ledger over that world's store."""
        self.delivered: set[str] = set()
        """Ids whose current row reached delivered (forgotten once pruned)."""
        self.owed: set[str] = set()
        """Ids whose row was owed at the last check: they must still exist."""

    def open_store(self) -> Store:
        """The store compared with the in-memory one (a subclass may compare another)."""
        return SQLiteStore(Path(self.tmpdir) / "ledger.db")

    def _worlds(self) -> tuple[dict[str, Ledger], dict[str, Ledger]]:
        def world(store: Store, probe: ToggleProbe) -> dict[str, Ledger]:
            return {
                actor: Ledger(
                    store, policy=self.policy, clock=self.clock, incarnation=inc, probe=probe
                )
                for actor, inc in OWNERS.items()
            }

        return world(self.mem_store, self.probes[0]), world(self.sql_store, self.probes[1])

    def teardown(self) -> None:
        self.mem_store.close()
        self.sql_store.close()
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------------------------

    def both(self, label: str, actor: str, op: Callable[[Ledger], T]) -> Outcome:
        """Run ``op`` on ``actor``'s ledger in both worlds; the outcomes must be identical."""
        mem, sql = (_outcome(partial(op, world[actor])) for world in self.worlds)
        assert mem == sql, f"in-memory {mem!r} != sqlite {sql!r}"
        event(f"{label}: {mem[1].__name__ if mem[0] == 'raised' else 'ok'}")
        return mem

    def ids_in(self, *states: S) -> list[str]:
        """Ids whose row exists now and is in one of ``states`` (any state when none given)."""
        ledger = self.worlds[0]["a"]
        return [
            oid
            for oid in RECORDED_IDS
            if (row := ledger.get(oid)) is not None and (not states or row.state in states)
        ]

    def has_rows(self) -> bool:
        return bool(self.ids_in())

    def pick(self, data: st.DataObject, state: S) -> str:
        """An existing id: usually one whose row is in ``state`` now, otherwise any."""
        aimed = self.ids_in(state)
        if aimed and data.draw(st.integers(0, 3), label="aimed") > 0:
            return data.draw(st.sampled_from(aimed), label="oid")
        return data.draw(st.sampled_from(self.ids_in()), label="oid")

    def settler(self, actor: str, oid: str) -> str:
        """``actor``, or for ``"owner"`` the actor owning ``oid`` now (``a`` if none does)."""
        if actor != "owner":
            return actor
        row = self.worlds[0]["a"].get(oid)
        owner = None if row is None else row.owner.token
        return next((name for name, inc in OWNERS.items() if inc.token == owner), "a")

    def check_claims(self, outcome: Outcome) -> None:
        assert outcome[0] == "ok", f"a sweep raised: {outcome}"
        claims: list[Claim] = outcome[1]
        event(f"claims returned: {min(len(claims), 3)}{'+' if len(claims) >= 3 else ''}")
        for claim in claims:
            assert claim.obligation_id not in self.delivered, f"delivered row re-claimed: {claim}"
            assert claim.attempts <= self.policy.max_attempts, f"claim over budget: {claim}"
            assert claim.obligation.attempts == claim.attempts
            assert claim.obligation.state is S.ATTEMPTING

    def runtime_sweep(self, actor: str, platform: str, profile: str | None) -> None:
        outcome = self.both(
            "sweep_failed_for_runtime",
            actor,
            lambda ledger: ledger.sweep_failed_for_runtime(platform, profile=profile),
        )
        self.check_claims(outcome)
        for claim in outcome[1]:
            assert claim.needs_marker
            assert claim.reason in ("reconnected", "rate_limited")
            assert claim.obligation.owner.token == OWNERS[actor].token

    # -- rules -----------------------------------------------------------------------------------

    @initialize(b_situation=st.sampled_from(SITUATIONS), policy=st.sampled_from(POLICIES))
    def start(self, b_situation: str, policy: LedgerPolicy) -> None:
        for probe in self.probes:
            probe.set("b", b_situation)
        self.policy = policy
        self.worlds = self._worlds()  # nothing was recorded yet: fresh ledgers, same stores

    @rule(
        actor=st.sampled_from(ACTORS),
        oid=st.sampled_from(RECORDED_IDS),
        platform=st.sampled_from(PLATFORMS),
        profile=st.sampled_from(PROFILES),
        content=st.sampled_from(CONTENTS),
        thread_id=st.none() | st.just("171.001") | st.just(171),
    )
    def record(
        self,
        *,
        actor: str,
        oid: str,
        platform: str,
        profile: str | None,
        content: str,
        thread_id: str | int | None,
    ) -> None:
        outcome = self.both(
            "record",
            actor,
            lambda ledger: ledger.record(
                session_key=f"agent:main:{platform}:{oid}",
                platform=platform,
                chat_id="C1",
                content=content,
                obligation_id=oid,
                thread_id=thread_id,
                adapter_profile=profile,
            ),
        )
        assert outcome[0] == "ok", f"record raised: {outcome}"
        assert outcome[1].obligation_id == oid

    @rule(
        actor=st.sampled_from(ACTORS),
        oid=st.sampled_from(RECORDED_IDS),
        platform=st.sampled_from(PLATFORMS),
        profile=st.sampled_from(PROFILES),
    )
    def begin_send(self, *, actor: str, oid: str, platform: str, profile: str | None) -> None:
        """The gateway's normal path: record the reply, then mark the send as begun."""
        self.record(
            actor=actor,
            oid=oid,
            platform=platform,
            profile=profile,
            content=CONTENTS[0],
            thread_id=None,
        )
        self.both("mark_attempting", actor, lambda ledger: ledger.mark_attempting(oid))

    @precondition(has_rows)
    @rule(actor=st.sampled_from(SETTLERS), data=st.data())
    def mark_attempting(self, actor: str, data: st.DataObject) -> None:
        oid = self.pick(data, S.PENDING)
        who = self.settler(actor, oid)
        self.both("mark_attempting", who, lambda ledger: ledger.mark_attempting(oid))

    @precondition(has_rows)
    @rule(actor=st.sampled_from(SETTLERS), data=st.data())
    def mark_delivered(self, actor: str, data: st.DataObject) -> None:
        oid = self.pick(data, S.ATTEMPTING)
        who = self.settler(actor, oid)
        self.both("mark_delivered", who, lambda ledger: ledger.mark_delivered(oid))

    @precondition(has_rows)
    @rule(actor=st.sampled_from(SETTLERS), error=st.sampled_from(ERRORS), data=st.data())
    def mark_failed(self, actor: str, error: str, data: st.DataObject) -> None:
        oid = self.pick(data, S.ATTEMPTING)
        who = self.settler(actor, oid)
        self.both("mark_failed", who, lambda ledger: ledger.mark_failed(oid, error))

    @precondition(has_rows)
    @rule(
        actor=st.sampled_from(SETTLERS),
        error=st.none() | st.sampled_from(ERRORS),
        data=st.data(),
    )
    def release(self, actor: str, error: str | None, data: st.DataObject) -> None:
        oid = self.pick(data, S.ATTEMPTING)
        who = self.settler(actor, oid)
        self.both("release", who, lambda ledger: ledger.release(oid, error))

    @rule(
        actor=st.sampled_from(ACTORS),
        oid=st.sampled_from((GHOST, *RECORDED_IDS)),
        op=st.sampled_from(("mark_attempting", "mark_delivered", "mark_failed", "release")),
    )
    def settle_any(self, actor: str, oid: str, op: str) -> None:
        """Any settling call by anyone on any id, including one never recorded."""

        def call(ledger: Ledger) -> object:
            if op == "mark_failed":
                return ledger.mark_failed(oid, ERRORS[1])
            return getattr(ledger, op)(oid)

        self.both(op, actor, call)

    @rule(
        actor=st.sampled_from(ACTORS),
        platforms=st.none() | st.frozensets(st.sampled_from(PLATFORMS)),
        pairs=st.none()
        | st.frozensets(
            st.tuples(st.sampled_from(PLATFORMS), st.sampled_from(("default", "reviewer")))
        ),
    )
    def sweep_recoverable(
        self,
        actor: str,
        platforms: frozenset[str] | None,
        pairs: frozenset[tuple[str, str]] | None,
    ) -> None:
        outcome = self.both(
            "sweep_recoverable",
            actor,
            lambda ledger: ledger.sweep_recoverable(
                deliverable_platforms=platforms, deliverable_targets=pairs
            ),
        )
        self.check_claims(outcome)

    @rule(
        actor=st.sampled_from(ACTORS),
        platform=st.sampled_from(PLATFORMS),
        profile=st.sampled_from(PROFILES),
        data=st.data(),
    )
    def sweep_failed_for_runtime(
        self, actor: str, platform: str, profile: str | None, data: st.DataObject
    ) -> None:
        ledger = self.worlds[0]["a"]
        failed = [row for oid in RECORDED_IDS if (row := ledger.get(oid)) and row.state is S.FAILED]
        if failed and data.draw(st.integers(0, 3), label="aimed") > 0:
            # Usually the sweep of the failed row's own owner, platform and profile.
            row = data.draw(st.sampled_from(failed), label="failed row")
            actor = self.settler("owner", row.obligation_id)
            platform = row.platform
            profile = None if row.adapter_profile == "default" else row.adapter_profile
        self.runtime_sweep(actor, platform, profile)

    @precondition(lambda self: bool(self.ids_in(S.ATTEMPTING)))
    @rule(error=st.sampled_from(ERRORS), data=st.data())
    def fail_then_retry(self, error: str, data: st.DataObject) -> None:
        """The in-process retry loop: a send fails, then its owner's runtime sweep runs."""
        oid = data.draw(st.sampled_from(self.ids_in(S.ATTEMPTING)), label="oid")
        who = self.settler("owner", oid)
        self.both("mark_failed", who, lambda ledger: ledger.mark_failed(oid, error))
        row = self.worlds[0]["a"].get(oid)
        assert row is not None
        profile = None if row.adapter_profile == "default" else row.adapter_profile
        self.runtime_sweep(who, row.platform, profile)

    @rule(actor=st.sampled_from(ACTORS))
    def prune(self, actor: str) -> None:
        before = {oid: self.worlds[0]["a"].get(oid) for oid in RECORDED_IDS}
        outcome = self.both("prune", actor, lambda ledger: ledger.prune())
        for oid, row in before.items():
            if row is not None and row.state in OWED:
                assert self.worlds[0]["a"].get(oid) == row, f"prune touched owed row {oid}"
                assert self.worlds[1]["a"].get(oid) == row, f"prune touched owed row {oid}"
        assert outcome[0] == "ok", f"prune raised: {outcome}"
        gone = [oid for oid, row in before.items() if row and self.worlds[0]["a"].get(oid) is None]
        assert outcome[1] == len(gone)

    @rule(step=st.sampled_from(STEPS) | st.floats(0, 400, allow_nan=False))
    def advance_clock(self, step: float) -> None:
        self.clock.advance(step)

    @rule(who=st.sampled_from(LOCAL_OWNERS), situation=st.sampled_from(SITUATIONS))
    def switch_liveness(self, who: str, situation: str) -> None:
        """A same-host owner dies, its pid is reused, or it is (again) alive."""
        for probe in self.probes:
            probe.set(who, situation)

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def worlds_identical(self) -> None:
        mem, sql = (world["a"] for world in self.worlds)
        for oid in ALL_IDS:
            assert mem.get(oid) == sql.get(oid), f"get({oid!r}) differs"
            assert mem.history(oid) == sql.history(oid), f"history({oid!r}) differs"

    @invariant()
    def ledger_rules_hold(self) -> None:
        ledger = self.worlds[1]["a"]  # both worlds are identical (checked above)
        rows = {oid: ledger.get(oid) for oid in ALL_IDS}
        for oid in self.owed:
            assert rows[oid] is not None, f"owed row {oid} disappeared"
        for oid in list(self.delivered):
            row = rows[oid]
            if row is None:
                self.delivered.discard(oid)  # pruned: the id may be recorded afresh
            else:
                assert row.state is S.DELIVERED, f"delivered row {oid} left delivered"
        self.owed = set()
        for oid, row in rows.items():
            if row is None:
                assert ledger.history(oid) == []
                continue
            assert 0 <= row.attempts <= self.policy.max_attempts, f"over budget: {row}"
            if row.state is S.DELIVERED:
                self.delivered.add(oid)
            elif row.state in OWED:
                self.owed.add(oid)


class TestLedgerStoreEquivalence(LedgerEquivalence.TestCase):  # type: ignore[misc,valid-type]
    """Random ledger operations give identical results over InMemoryStore and SQLiteStore."""

    settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def _both_stores(call: Callable[[Ledger], object]) -> list[tuple[object, object, object]]:
    """Run ``call`` on a fresh ledger over each store; (outcome, row, history) per store."""
    results: list[tuple[object, object, object]] = []
    tmpdir = tempfile.mkdtemp(prefix="statecore-equiv-")
    try:
        for store in (InMemoryStore(), SQLiteStore(Path(tmpdir) / "ledger.db")):
            ledger = Ledger(store, clock=FakeClock(), incarnation=OWNERS["a"], probe=ToggleProbe())
            ledger.record(
                session_key="s", platform="slack", chat_id="C1", content="hi", obligation_id="ob-0"
            )
            ledger.mark_attempting("ob-0")
            try:
                outcome: object = ("ok", call(ledger))
            except Exception as exc:  # any exception type is an observable result here
                outcome = ("raised", type(exc))
            results.append((outcome, ledger.get("ob-0"), ledger.history("ob-0")))
            store.close()
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return results


UNENCODABLE = "HTTP 502: undecodable byte \udcff"
"""Text with a lone surrogate, as ``surrogateescape`` decoding of platform output produces."""


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda ledger: ledger.mark_failed("ob-0", UNENCODABLE), id="mark_failed"),
        pytest.param(
            lambda ledger: ledger.record(
                session_key="s2", platform="slack", chat_id="C1", content=UNENCODABLE
            ),
            id="record",
        ),
    ],
)
def test_unencodable_text_gives_the_same_result_on_both_stores(
    call: Callable[[Ledger], object],
) -> None:
    """Text that cannot be encoded as UTF-8 is handled identically by both stores."""
    memory, sqlite = _both_stores(call)
    assert memory == sqlite


def test_unencodable_error_text_is_stored_with_replacements() -> None:
    """A platform error with undecodable bytes still settles the row, the bytes replaced."""
    memory, sqlite = _both_stores(lambda ledger: ledger.mark_failed("ob-0", UNENCODABLE))
    assert memory == sqlite
    assert "\udcff" not in repr(memory)


def test_unencodable_content_is_refused_at_record_on_both_stores() -> None:
    """Reply content that has no UTF-8 form is refused at record with a ValueError."""
    memory, sqlite = _both_stores(
        lambda ledger: ledger.record(
            session_key="s2", platform="slack", chat_id="C1", content=UNENCODABLE
        )
    )
    assert memory == sqlite
    assert "ValueError" in repr(memory)


# -- the same machine over PostgreSQL ---------------------------------------------------------


class PostgresLedgerEquivalence(LedgerEquivalence):
    """The equivalence machine with PostgresStore as its second world."""

    url = ""
    """The session database's URL, set by the test class's fixture before any example runs."""

    def open_store(self) -> Store:
        assert self.url, "the postgres_url fixture did not run"
        return PostgresStore(self.url, schema=f"eq_{uuid.uuid4().hex[:16]}", pool_size=2)


class TestLedgerPostgresEquivalence(PostgresLedgerEquivalence.TestCase):  # type: ignore[misc,valid-type]
    """Random ledger operations give identical results over InMemoryStore and PostgresStore."""

    settings = settings(max_examples=25, stateful_step_count=30, deadline=None)

    @pytest.fixture(autouse=True)
    def _database(self, postgres_url: str) -> None:
        PostgresLedgerEquivalence.url = postgres_url


def _memory_and_postgres(
    postgres_url: str, call: Callable[[Ledger], object]
) -> list[tuple[object, ...]]:
    """Run ``call`` on a fresh ledger over each store; (outcome, row, history) per store."""
    results: list[tuple[object, ...]] = []
    stores: list[Store] = [
        InMemoryStore(),
        PostgresStore(postgres_url, schema=f"eq_{uuid.uuid4().hex[:16]}", pool_size=2),
    ]
    for store in stores:
        try:
            ledger = Ledger(store, clock=FakeClock(), incarnation=OWNERS["a"], probe=ToggleProbe())
            ledger.record(
                session_key="s", platform="slack", chat_id="C1", content="hi", obligation_id="ob-0"
            )
            ledger.mark_attempting("ob-0")
            try:
                outcome: object = ("ok", call(ledger))
            except Exception as exc:  # any exception type is an observable result here
                outcome = ("raised", type(exc))
            results.append((outcome, ledger.get("ob-0"), ledger.history("ob-0")))
        finally:
            store.close()
    return results


def test_unencodable_error_text_is_stored_alike_on_postgres(postgres_url: str) -> None:
    """A platform error with undecodable bytes settles the row alike, the bytes replaced."""
    memory, postgres = _memory_and_postgres(
        postgres_url, lambda ledger: ledger.mark_failed("ob-0", UNENCODABLE)
    )
    assert memory == postgres
    assert "\\udcff" not in repr(memory)


def test_unencodable_content_is_refused_alike_on_postgres(postgres_url: str) -> None:
    """Reply content that has no UTF-8 form is refused at record with a ValueError on both."""
    memory, postgres = _memory_and_postgres(
        postgres_url,
        lambda ledger: ledger.record(
            session_key="s2", platform="slack", chat_id="C1", content=UNENCODABLE
        ),
    )
    assert memory == postgres
    assert "ValueError" in repr(memory)

"""PostgresStore's optional capabilities (``statecore.claims``) on a real server: claims that
never queue behind each other (``FOR UPDATE SKIP LOCKED``) and LISTEN/NOTIFY wake-ups."""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from statecore.batch import Creation
from statecore.claims import (
    MAX_PAYLOAD_BYTES,
    ClaimingStore,
    NotifyingStore,
    NoTransaction,
    candidates,
)
from statecore.errors import StaleState, StoreError
from statecore.lifecycles import OBLIGATION
from statecore.obligation import OBLIGATION_KIND
from statecore.store import Audit, Row, normalize_where
from stores._postgres_sql import claim_sql
from stores.memory import InMemoryStore
from stores.postgres import PostgresStore
from stores.testing import TICKET_KIND
from stores.testing._kit import TS, file_ticket

SWEEPERS = 8
ROWS = 2_000
CHUNK = 25
RUN_BOUND_S = 60.0
"""The whole concurrent run must end well within this (it takes about a second)."""
WAKE_BOUND_S = 5.0
"""A committed notification reaches a listener within this."""


def fresh_schema() -> str:
    """A schema name no other store of the session uses."""
    return f"c_{uuid.uuid4().hex[:16]}"


def fresh_channel() -> str:
    """A channel name no other test uses (channels are per database, not per schema)."""
    return f"ch_{uuid.uuid4().hex[:16]}"


def _admin(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True, connect_timeout=5)


@pytest.fixture
def pg(postgres_url: str) -> Iterator[PostgresStore]:
    """A fresh store (a schema of its own, a pool for every sweeper) with tickets registered."""
    store = PostgresStore(postgres_url, schema=fresh_schema(), pool_size=SWEEPERS + 2)
    store.register(TICKET_KIND)
    yield store
    store.close()


def _file_many(store: PostgresStore, count: int) -> list[str]:
    ids = [f"t{i:05d}" for i in range(count)]
    for start in range(0, count, 500):
        creations = [
            Creation(i, {"title": i}, "file", Audit(1.0, "seed")) for i in ids[start : start + 500]
        ]
        outcomes = store.insert_each(TICKET_KIND, creations)
        assert all(isinstance(o, tuple) and o[1] for o in outcomes)
    return ids


# -- claims ---------------------------------------------------------------------------------------


def test_the_store_offers_both_capabilities(pg: PostgresStore) -> None:
    """PostgresStore is a ClaimingStore and a NotifyingStore; the in-memory store is neither."""
    assert isinstance(pg, ClaimingStore)
    assert isinstance(pg, NotifyingStore)
    memory = InMemoryStore()
    assert not isinstance(memory, ClaimingStore)
    assert not isinstance(memory, NotifyingStore)
    memory.close()


def test_claiming_outside_a_block_raises_a_clear_error(pg: PostgresStore) -> None:
    """Outside atomic() the locks would end with the statement: NoTransaction, naming atomic()."""
    file_ticket(pg, "t1")
    with pytest.raises(NoTransaction, match=r"inside store\.atomic\(\)"):
        pg.claim_candidates(TICKET_KIND, states=[TS.OPEN])
    with pytest.raises(NoTransaction):
        candidates(pg, TICKET_KIND, states=[TS.OPEN])
    with pg.atomic():  # inside one it works, as select would
        assert [r.id for r in pg.claim_candidates(TICKET_KIND, states=[TS.OPEN])] == ["t1"]


def test_bad_input_is_refused_as_select_refuses_it(pg: PostgresStore) -> None:
    """An unknown column, a bad limit or an unregistered kind: the errors select raises."""
    with pg.atomic():
        with pytest.raises(KeyError):
            pg.claim_candidates(TICKET_KIND, where={"nope": 1})
        with pytest.raises(ValueError, match="limit"):
            pg.claim_candidates(TICKET_KIND, limit=-1)
        with pytest.raises(KeyError):
            pg.claim_candidates(TICKET_KIND, order_by="nope")


def test_candidates_falls_back_to_select_on_a_store_without_locks() -> None:
    """``candidates`` reads with ``select`` where the store has no claim capability."""
    memory = InMemoryStore()
    memory.register(TICKET_KIND)
    file_ticket(memory, "t1")
    file_ticket(memory, "t2")
    with memory.atomic():
        found = candidates(memory, TICKET_KIND, states=[TS.OPEN], limit=1)
    assert [r.id for r in found] == ["t1"]
    memory.close()


def test_a_claimer_skips_rows_another_holds_without_waiting(pg: PostgresStore) -> None:
    """While one block holds the first rows, another block's claim returns the next rows
    without waiting (it returns while the holder's block is still open); a plain select still
    sees every row; when the holder's block ends without moving them, they can be claimed
    again."""
    for i in range(10):
        file_ticket(pg, f"t{i}")
    held = threading.Event()
    release = threading.Event()
    ended = threading.Event()
    got: list[str] = []

    def holder() -> None:
        with pg.atomic():
            got.extend(r.id for r in pg.claim_candidates(TICKET_KIND, limit=5))
            held.set()
            release.wait(RUN_BOUND_S)  # released by the test (the bound: if it never is)
        ended.set()

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    try:
        assert held.wait(RUN_BOUND_S)
        assert got == ["t0", "t1", "t2", "t3", "t4"]
        with pg.atomic():
            mine = [r.id for r in pg.claim_candidates(TICKET_KIND, states=[TS.OPEN], limit=5)]
        # A claim that waited for the holder's rows could only have returned after its block.
        assert not ended.is_set()
        assert mine == ["t5", "t6", "t7", "t8", "t9"]
        assert len(pg.select(TICKET_KIND, states=[TS.OPEN])) == 10
    finally:
        release.set()
        thread.join(RUN_BOUND_S)
    assert not thread.is_alive()
    with pg.atomic():
        again = [r.id for r in pg.claim_candidates(TICKET_KIND, states=[TS.OPEN], limit=5)]
    assert again == ["t0", "t1", "t2", "t3", "t4"]


def test_a_row_moved_by_the_holder_is_not_returned_after_it_commits(pg: PostgresStore) -> None:
    """A row claimed and moved by another block is skipped while locked and, once committed,
    no longer matches: it is never handed out twice."""
    file_ticket(pg, "t1")
    file_ticket(pg, "t2")
    with pg.atomic():
        (row,) = pg.claim_candidates(TICKET_KIND, states=[TS.OPEN], limit=1)
        pg.transition(TICKET_KIND, row.id, "hold", audit=Audit(2.0, "a"), fence=row.fence)
        seen: list[list[str]] = []
        other = threading.Thread(target=lambda: seen.append(_claim_ids(pg, [TS.OPEN])), daemon=True)
        other.start()
        other.join(RUN_BOUND_S)
    assert seen == [["t2"]]
    with pg.atomic():
        assert [r.id for r in pg.claim_candidates(TICKET_KIND, states=[TS.OPEN])] == ["t2"]


def _claim_ids(store: PostgresStore, states: list[TS]) -> list[str]:
    with store.atomic():
        return [r.id for r in store.claim_candidates(TICKET_KIND, states=states)]


def _sweep(
    pg: PostgresStore, k: int, claimed: list[list[str]], stale: list[str], limit: int
) -> list[Row[TS]]:
    """One sweeper's claim of up to ``limit`` open rows, each moved under its fence (a row lost
    to another sweeper lands in ``stale``, a row moved in ``claimed[k]``); call it inside a
    block.  Returns the rows claimed."""
    rows: list[Row[TS]] = pg.claim_candidates(
        TICKET_KIND, states=[TS.OPEN], order_by="due_at", limit=limit
    )
    audit = Audit(2.0, f"sweeper-{k}")
    for row in rows:
        try:
            pg.transition(TICKET_KIND, row.id, "hold", audit=audit, fence=row.fence)
        except StaleState:
            stale.append(row.id)
            continue
        claimed[k].append(row.id)
    return rows


def _run_sweepers(target: Callable[[int], None]) -> None:
    """``target(k)`` for k in 0..SWEEPERS-1, each on a thread of its own; every thread must end
    within RUN_BOUND_S (a liveness bound: the run takes about a second)."""
    threads = [threading.Thread(target=target, args=(k,), daemon=True) for k in range(SWEEPERS)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, RUN_BOUND_S - (time.monotonic() - started)))
    elapsed = time.monotonic() - started
    assert not [t for t in threads if t.is_alive()], f"sweepers still running after {elapsed:.1f} s"


ROUNDS = ROWS // (SWEEPERS * CHUNK)
"""The lock-step rounds that claim every row (each sweeper takes CHUNK rows a round)."""


def test_concurrent_sweepers_never_wait_for_rows_another_holds(
    pg: PostgresStore, postgres_url: str
) -> None:
    """8 sweepers in lock-step rounds over 2,000 rows, each claiming 25 rows and moving them in
    a block it keeps open until all 8 have claimed and moved theirs: every claim returns its
    full 25 with no row another holds, so no claim or move ever waited for another sweeper's
    row lock (one that did could never return: the others end their blocks only after it)."""
    assert ROUNDS * SWEEPERS * CHUNK == ROWS
    ids = _file_many(pg, ROWS)
    claimed: list[list[str]] = [[] for _ in range(SWEEPERS)]
    stale: list[str] = []
    sizes: list[list[int]] = [[] for _ in range(SWEEPERS)]
    errors: list[BaseException] = []
    # Every party holds its block's locks while it waits here: a sweeper that waited for
    # another's rows would keep the others waiting until the bound, and all would fail.
    barrier = threading.Barrier(SWEEPERS, timeout=RUN_BOUND_S)

    def sweeper(k: int) -> None:
        try:
            for _ in range(ROUNDS + 1):  # the last round finds nothing left
                with pg.atomic():
                    sizes[k].append(len(_sweep(pg, k, claimed, stale, CHUNK)))
                    barrier.wait()  # all 8 hold what they claimed and moved, uncommitted
                barrier.wait()  # all 8 committed: the next claims race no commit
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    _run_sweepers(sweeper)
    assert errors == []
    assert stale == []
    assert sizes == [[CHUNK] * ROUNDS + [0]] * SWEEPERS  # each got a full share every round
    _check_claimed_once(pg, postgres_url, claimed, ids)


def test_concurrent_sweepers_claim_every_row_exactly_once(
    pg: PostgresStore, postgres_url: str
) -> None:
    """8 threads, each ``atomic(): claim_candidates(limit); transition each under its fence``
    until nothing is left, over 2,000 rows, their claims racing each other's commits: every
    row claimed exactly once, no claim lost to another sweeper (no StaleState: a row another
    moved and committed after the claim's snapshot is re-checked and skipped), all within a
    bound."""
    ids = _file_many(pg, ROWS)
    claimed: list[list[str]] = [[] for _ in range(SWEEPERS)]
    stale: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(SWEEPERS, timeout=RUN_BOUND_S)

    def sweeper(k: int) -> None:
        try:
            barrier.wait()
            while True:
                with pg.atomic():
                    rows = _sweep(pg, k, claimed, stale, CHUNK)
                if not rows:
                    return
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    _run_sweepers(sweeper)
    assert errors == []
    assert stale == []
    _check_claimed_once(pg, postgres_url, claimed, ids)


def _check_claimed_once(
    pg: PostgresStore, postgres_url: str, claimed: list[list[str]], ids: list[str]
) -> None:
    """What the sweepers got back, the rows and their audit entries all say: every row was
    claimed exactly once, by one sweeper."""
    every = [i for got in claimed for i in got]
    assert [i for i, n in Counter(every).items() if n > 1] == []  # 0 double claims
    assert sorted(every) == ids  # every row claimed exactly once
    assert pg.count(TICKET_KIND, states=[TS.OPEN]) == 0
    assert pg.count(TICKET_KIND, states=[TS.HELD], where={"fence": 1}) == ROWS
    with _admin(postgres_url) as conn:
        conn.execute(f"SET search_path = {pg.schema}")
        twice = conn.execute(
            "SELECT count(*) FROM (SELECT entity_id FROM statecore_audit WHERE event = 'hold' "
            "GROUP BY entity_id HAVING count(*) <> 1) AS odd"
        ).fetchone()
        holds = conn.execute("SELECT count(*) FROM statecore_audit WHERE event = 'hold'").fetchone()
    assert twice == (0,)
    assert holds == (ROWS,)


CLAIMED = 9_000
OWNED = 10_000
DEAD_PID = 900_000


def _claim_plan(pg: PostgresStore, url: str) -> dict[str, Any]:
    """The executed plan (EXPLAIN ANALYZE, JSON) of the store's claim of one dead-owner row,
    after checking that the store itself finds that row."""
    states = [s for s in OBLIGATION_KIND.lifecycle.states if s not in OBLIGATION.terminal]
    dead = {"owner_pid": DEAD_PID, "owner_token": "dead"}
    with pg.atomic():
        assert len(pg.claim_candidates(OBLIGATION_KIND, states=states, where=dead, limit=1)) == 1
    where = normalize_where(OBLIGATION_KIND, dead)
    text, params = claim_sql(OBLIGATION_KIND, frozenset(states), where, None, 1)
    with _admin(url) as conn, conn.transaction():
        conn.execute(f"SET LOCAL search_path = {pg.schema}")
        row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + text, params).fetchone()
    assert row is not None
    plan: dict[str, Any] = row[0][0]["Plan"]
    return plan


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def test_a_claim_reads_only_the_unclaimed_rows_of_the_owner(postgres_url: str) -> None:
    """After 9,000 of an owner's 10,000 owed rows were claimed (they changed owner), claiming
    one more reads by the owner's partial index in id order: it never walks (and filters out)
    the claimed rows, as a walk of the primary key in id order would."""
    store = PostgresStore(postgres_url, schema=fresh_schema())
    try:
        store.register(OBLIGATION_KIND)
        fields = [f.name for f in OBLIGATION_KIND.fields]
        columns = ", ".join(["obligation_id", "state", "fence", *fields])
        values = {
            "session_key": "s", "platform": "p", "chat_id": "c", "thread_id": None,
            "reply_to": None, "content": "x", "attempts": 0, "created_at": 1.0,
            "updated_at": 1.0, "owner_host": "h", "owner_pid": DEAD_PID,
            "owner_started_at": 1, "owner_token": "dead", "lease_expires_at": None,
            "last_error": None, "error_kind": None, "next_attempt_at": None,
            "adapter_profile": "default",
        }  # fmt: skip
        with _admin(postgres_url) as conn:
            conn.execute(f"SET search_path = {store.schema}")
            with (
                conn.cursor() as cur,
                cur.copy(f"COPY delivery_obligations ({columns}) FROM STDIN") as copy,
            ):
                for i in range(OWNED):
                    copy.write_row([f"ob-{i:08d}", "pending", 0, *(values[f] for f in fields)])
            conn.execute("ANALYZE delivery_obligations")
            # The lowest ids claimed by a live sweeper (as a sweep's claim moves them).
            conn.execute(
                "UPDATE delivery_obligations SET state = 'attempting', fence = fence + 1, "
                "owner_pid = 4242, owner_token = 'live' WHERE obligation_id < %s",
                (f"ob-{CLAIMED:08d}",),
            )
            conn.execute("ANALYZE delivery_obligations")  # as autovacuum would
        plan = _claim_plan(store, postgres_url)
        scans = [n for n in _nodes(plan) if "Scan" in n["Node Type"]]
        assert scans, plan
        assert all(n.get("Index Name") != "delivery_obligations_pkey" for n in scans), plan
        assert sum(n.get("Rows Removed by Filter", 0) for n in _nodes(plan)) <= 10, plan
        assert sum(n.get("Actual Rows", 0) for n in scans) <= 10, plan
    finally:
        store.close()


def test_registering_adds_a_missing_index_to_an_existing_table(postgres_url: str) -> None:
    """A database made before the owner/id claim index was declared gets it when the kind is
    registered again (CREATE INDEX IF NOT EXISTS on every registration)."""
    schema = fresh_schema()
    store = PostgresStore(postgres_url, schema=schema)
    store.register(OBLIGATION_KIND)
    store.close()
    query = (
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s "
        "AND indexname LIKE 'delivery_obligations_owner_pid_obligation_id%%'"
    )
    with _admin(postgres_url) as conn:
        (name,) = conn.execute(query, (schema,)).fetchone() or (None,)
        assert name is not None
        conn.execute(f'DROP INDEX "{schema}"."{name}"')
    store = PostgresStore(postgres_url, schema=schema)
    try:
        store.register(OBLIGATION_KIND)
    finally:
        store.close()
    with _admin(postgres_url) as conn:
        assert conn.execute(query, (schema,)).fetchall() == [(name,)]


# -- notifications ----------------------------------------------------------------------------


class _Inbox:
    """A callback collecting payloads, and a bounded wait for the next one."""

    def __init__(self) -> None:
        self.payloads: queue.Queue[str] = queue.Queue()

    def __call__(self, payload: str) -> None:
        self.payloads.put(payload)

    def next(self, timeout: float = WAKE_BOUND_S) -> str:
        return self.payloads.get(timeout=timeout)

    def empty_for(self, seconds: float) -> bool:
        try:
            self.payloads.get(timeout=seconds)
        except queue.Empty:
            return True
        return False


def _listener_threads(channel: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"statecore-listen-{channel}"]


def _until(check: Callable[[], bool], bound_s: float = WAKE_BOUND_S) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def test_a_committed_notify_wakes_a_listener_in_another_store(
    pg: PostgresStore, postgres_url: str
) -> None:
    """A notify sent in a committed block, by another store on the same database (another
    process, as far as the server knows), reaches the listener within the bound; so does one
    sent outside a block."""
    channel, inbox = fresh_channel(), _Inbox()
    unsubscribe = pg.listen(channel, inbox)
    try:
        with PostgresStore(postgres_url, schema=fresh_schema()) as other:
            other.register(TICKET_KIND)
            started = time.monotonic()
            with other.atomic():
                file_ticket(other, "t1")
                other.notify(channel, "t1 filed")
            assert inbox.next() == "t1 filed"
            assert time.monotonic() - started < WAKE_BOUND_S
            other.notify(channel)
            assert inbox.next() == ""
    finally:
        unsubscribe()


def test_a_notify_is_sent_on_commit_never_on_rollback(pg: PostgresStore) -> None:
    """Inside a block nothing is sent before the commit; a rolled-back block sends nothing (the
    marker sent after it arrives, and nothing before it)."""
    channel, inbox = fresh_channel(), _Inbox()
    unsubscribe = pg.listen(channel, inbox)
    try:
        with pg.atomic():
            pg.notify(channel, "on commit")
            assert inbox.empty_for(0.3)  # not yet: the block has not committed
        assert inbox.next() == "on commit"
        with pytest.raises(RuntimeError, match="undo"):
            _notify_then_fail(pg, channel, "rolled back")
        with pg.atomic(), pytest.raises(RuntimeError, match="undo"):  # an inner block undone
            _notify_then_fail(pg, channel, "rolled back inner")
        pg.notify(channel, "marker")
        assert inbox.next() == "marker"  # sent after the rolled-back ones: they never came
        assert inbox.empty_for(0.3)
    finally:
        unsubscribe()


def _notify_then_fail(store: PostgresStore, channel: str, payload: str) -> None:
    """Notify in a block (a savepoint when inside one) that then fails: it is rolled back."""
    with store.atomic():
        store.notify(channel, payload)
        raise RuntimeError("undo")


def test_unsubscribe_stops_delivery_and_the_thread(pg: PostgresStore) -> None:
    """After unsubscribe (idempotent) no more payloads arrive and its thread is gone; another
    listener of the channel still gets them."""
    channel, first, second = fresh_channel(), _Inbox(), _Inbox()
    unsubscribe = pg.listen(channel, first)
    keep = pg.listen(channel, second)
    try:
        pg.notify(channel, "one")
        assert first.next() == "one"
        assert second.next() == "one"
        assert len(_listener_threads(channel)) == 2
        started = time.monotonic()
        unsubscribe()
        assert time.monotonic() - started < 2.0
        unsubscribe()
        assert len(_listener_threads(channel)) == 1
        pg.notify(channel, "two")
        assert second.next() == "two"
        assert first.empty_for(0.3)
    finally:
        keep()


def test_a_callback_may_unsubscribe_itself_and_its_errors_are_logged(
    pg: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A callback that raises is logged and delivery goes on; one that unsubscribes itself
    stops its listener without hanging."""
    channel, inbox = fresh_channel(), _Inbox()
    stops: list[Callable[[], None]] = []

    def callback(payload: str) -> None:
        inbox(payload)
        if payload == "boom":
            raise ValueError("callback failed")
        if payload == "stop":
            stops[0]()

    stops.append(pg.listen(channel, callback))
    with caplog.at_level(logging.ERROR, logger="stores._postgres_listen"):
        pg.notify(channel, "boom")
        assert inbox.next() == "boom"
        pg.notify(channel, "stop")
        assert inbox.next() == "stop"
    assert _until(lambda: not _listener_threads(channel))
    pg.notify(channel, "after")
    assert inbox.empty_for(0.3)
    assert "callback failed" in caplog.text


def test_closing_the_store_stops_its_listeners(postgres_url: str) -> None:
    """close() stops every listener thread and closes their connections, bounded; listening or
    notifying on a closed store raises StoreError."""
    store = PostgresStore(postgres_url, schema=fresh_schema())
    channels = [fresh_channel(), fresh_channel()]
    unsubscribes = [store.listen(c, _Inbox()) for c in channels]
    with _admin(postgres_url) as conn:
        listening = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'statecore-listen'"
        ).fetchone()
        assert listening is not None
        assert listening[0] >= 2
        started = time.monotonic()
        store.close()
        assert time.monotonic() - started < 5.0
        assert all(not _listener_threads(c) for c in channels)
        assert _until(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name = 'statecore-listen'"
                ).fetchone()
                == (0,)
            )
        )
    for unsubscribe in unsubscribes:
        unsubscribe()  # harmless after close
    with pytest.raises(StoreError, match="closed"):
        store.listen(fresh_channel(), _Inbox())
    with pytest.raises(StoreError, match="closed"):
        store.notify(channels[0], "late")


def test_a_listener_whose_connection_is_killed_listens_again(
    pg: PostgresStore, postgres_url: str
) -> None:
    """The server terminates the listening connection: the listener reconnects by itself and
    later notifications arrive again."""
    channel, inbox = fresh_channel(), _Inbox()
    unsubscribe = pg.listen(channel, inbox)
    try:
        with _admin(postgres_url) as conn:
            killed = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'statecore-listen' AND query LIKE %s",
                (f"%{channel}%",),
            ).fetchall()
        assert killed == [(True,)]

        def delivered() -> bool:
            pg.notify(channel, "again")
            try:
                return inbox.next(timeout=0.2) == "again"
            except queue.Empty:
                return False

        assert _until(delivered, bound_s=10.0)
    finally:
        unsubscribe()


def test_bad_channels_and_payloads_are_refused(pg: PostgresStore) -> None:
    """A channel that is not a lower-case identifier, a payload over the limit, a callback that
    is not callable: ValueError/TypeError, nothing sent or subscribed."""
    for channel in ("Upper", "has space", "1st", "x" * 64, ""):
        with pytest.raises(ValueError, match="channel"):
            pg.notify(channel)
        with pytest.raises(ValueError, match="channel"):
            pg.listen(channel, _Inbox())
    with pytest.raises(ValueError, match="payload"):
        pg.notify("ok_channel", "x" * (MAX_PAYLOAD_BYTES + 1))
    with pytest.raises(TypeError, match="payload"):
        pg.notify("ok_channel", 42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callback"):
        pg.listen("ok_channel", "not callable")  # type: ignore[arg-type]
    pg.notify("ok_channel", "x" * MAX_PAYLOAD_BYTES)  # the limit itself is fine

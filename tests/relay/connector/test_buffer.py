"""Tests for relay.connector.buffer.InboundBuffer, the connector's durable inbound buffer.

Every test runs over the in-memory store and the SQLite store.  Time comes from a FakeClock, so
retention and pruning are exercised without sleeping.
"""

from __future__ import annotations

import ast
import itertools
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import pytest

import relay.connector.buffer as buffer_module
from relay.connector.buffer import BUFFER_KIND, BufferEntry, BufferState, InboundBuffer
from relay.wire.frames import EventSource, InboundEvent
from statecore.clock import FakeClock
from statecore.store import Store
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore

B = BufferState
GW = "gw-a"
OTHER = "gw-b"


def make_event(n: int, *, chat_id: str = "c1", scope_id: str | None = None) -> InboundEvent:
    """A distinct inbound event numbered ``n``."""
    return InboundEvent(
        text=f"message {n} \N{SNOWMAN}",
        message_id=f"m{n}",
        source=EventSource(
            platform="loopback",
            chat_id=chat_id,
            chat_type="dm",
            user_id="u1",
            user_name="Ann",
            thread_id=None if n % 2 else f"t{n}",
            scope_id=scope_id,
        ),
    )


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty store of each kind, closed afterwards."""
    db: Store = (
        InMemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "buffer.db")
    )
    try:
        yield db
    finally:
        db.close()


@pytest.fixture
def clock() -> FakeClock:
    """The buffer's clock."""
    return FakeClock()


@pytest.fixture
def buffer(store: Store, clock: FakeClock) -> InboundBuffer:
    """A buffer with a one-hour retention over the store."""
    return InboundBuffer(store, retention_s=3600, clock=clock)


def state_of(store: Store, buffer_id: str) -> BufferState | None:
    """The stored state of one entry (None once pruned)."""
    row = store.get(BUFFER_KIND, buffer_id)
    return None if row is None else row.state


def ids(entries: list[BufferEntry]) -> list[str]:
    return [e.buffer_id for e in entries]


def test_append_buffers_and_backlog_is_in_seq_order(store: Store, buffer: InboundBuffer) -> None:
    """Appended events are stored as buffered and come back from the backlog in append order."""
    events = [make_event(n) for n in range(6)]
    appended = [buffer.append(GW, "loopback", e) for e in events]
    assert len(set(appended)) == 6
    assert all(state_of(store, b) is B.BUFFERED for b in appended)
    backlog = buffer.backlog(GW)
    assert ids(backlog) == appended
    assert [e.event for e in backlog] == events
    seqs = [e.seq for e in backlog]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == 6
    assert all(e.gateway_id == GW and e.platform == "loopback" for e in backlog)
    assert all(e.replays == 0 for e in backlog)
    assert buffer.count(GW) == 6


def test_backlog_cursor_and_limit(buffer: InboundBuffer) -> None:
    """``after_seq`` resumes strictly after a cursor and ``limit`` bounds each chunk."""
    appended = [buffer.append(GW, "loopback", make_event(n)) for n in range(5)]
    first = buffer.backlog(GW, limit=2)
    assert ids(first) == appended[:2]
    rest = buffer.backlog(GW, after_seq=first[-1].seq)
    assert ids(rest) == appended[2:]
    middle = buffer.backlog(GW, after_seq=first[-1].seq, limit=2)
    assert ids(middle) == appended[2:4]
    assert buffer.backlog(GW, after_seq=rest[-1].seq) == []


def test_backlog_and_count_are_per_gateway(buffer: InboundBuffer) -> None:
    """One gateway's backlog never contains another gateway's entries."""
    mine = [buffer.append(GW, "loopback", make_event(n)) for n in range(3)]
    theirs = [buffer.append(OTHER, "loopback", make_event(n)) for n in range(10, 12)]
    assert ids(buffer.backlog(GW)) == mine
    assert ids(buffer.backlog(OTHER)) == theirs
    assert (buffer.count(GW), buffer.count(OTHER), buffer.count("nobody")) == (3, 2, 0)


def test_mark_sent_moves_to_sent_counts_replays_and_keeps_replaying(
    store: Store, buffer: InboundBuffer
) -> None:
    """A replayed entry is ``sent`` with its replay count bumped, and stays in the backlog."""
    appended = [buffer.append(GW, "loopback", make_event(n)) for n in range(3)]
    buffer.mark_sent(buffer.backlog(GW, limit=2))
    assert [state_of(store, b) for b in appended] == [B.SENT, B.SENT, B.BUFFERED]
    backlog = buffer.backlog(GW)
    assert ids(backlog) == appended  # sent but unacked: replayed again next time
    assert [e.replays for e in backlog] == [1, 1, 0]
    buffer.mark_sent(backlog)
    assert [e.replays for e in buffer.backlog(GW)] == [2, 2, 1]
    assert buffer.count(GW) == 3


def test_mark_sent_skips_entries_settled_meanwhile(store: Store, buffer: InboundBuffer) -> None:
    """An entry acked between the backlog read and mark_sent stays acked (no error)."""
    appended = [buffer.append(GW, "loopback", make_event(n)) for n in range(2)]
    stale = buffer.backlog(GW)
    assert buffer.ack(GW, [appended[0]]) == 1
    buffer.mark_sent(stale)
    assert [state_of(store, b) for b in appended] == [B.ACKED, B.SENT]


def test_ack_retires_only_the_owners_unacked_entries(
    store: Store, buffer: InboundBuffer, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the owner's ack retires an entry; foreign, unknown and repeated acks change nothing."""
    mine = [buffer.append(GW, "loopback", make_event(n)) for n in range(3)]
    theirs = buffer.append(OTHER, "loopback", make_event(9))
    buffer.mark_sent(buffer.backlog(GW, limit=1))  # mine[0] sent, mine[1:] still buffered
    with caplog.at_level(logging.DEBUG):
        assert buffer.ack(GW, [mine[0], mine[1]]) == 2  # from sent and from buffered
        assert buffer.ack(GW, [theirs]) == 0  # a foreign entry
        assert buffer.ack(OTHER, [mine[2]]) == 0  # someone else's ack of mine
        assert buffer.ack(GW, ["no-such-id"]) == 0
        assert buffer.ack(GW, [mine[0]]) == 0  # already acked
        assert buffer.ack(GW, [mine[0], "nope", mine[2], theirs]) == 1
    assert [state_of(store, b) for b in mine] == [B.ACKED, B.ACKED, B.ACKED]
    assert state_of(store, theirs) is B.BUFFERED
    assert buffer.backlog(GW) == []
    assert ids(buffer.backlog(OTHER)) == [theirs]
    assert not [r for r in caplog.records if r.levelno > logging.WARNING]


def test_refused_ack_leaves_no_audit_trace(store: Store, buffer: InboundBuffer) -> None:
    """A refused ack writes nothing; an entry's history is append, send, ack."""
    entry = buffer.append(GW, "loopback", make_event(1))
    buffer.ack(OTHER, [entry])
    assert [h.event for h in store.history(BUFFER_KIND, entry)] == ["append"]
    buffer.mark_sent(buffer.backlog(GW))
    buffer.ack(GW, [entry])
    history = store.history(BUFFER_KIND, entry)
    assert [h.event for h in history] == ["append", "send", "ack"]
    assert history[-1].owner == GW


def test_entries_past_retention_expire_visibly(
    store: Store, buffer: InboundBuffer, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Unacked entries older than the retention expire: counted, logged at WARNING, stored as
    expired and gone from the backlog; younger ones and acked ones are untouched."""
    old = [buffer.append(GW, "loopback", make_event(n)) for n in range(3)]
    buffer.mark_sent(buffer.backlog(GW, limit=1))  # a sent entry expires too
    assert buffer.ack(GW, [old[2]]) == 1
    clock.advance(1800)
    young = buffer.append(GW, "loopback", make_event(3))
    assert buffer.expire() == 0
    clock.advance(1801)
    with caplog.at_level(logging.WARNING, logger="relay.connector.buffer"):
        assert buffer.expire() == 2
    assert buffer.expired_total == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "2" in warnings[0].getMessage()
    assert [state_of(store, b) for b in old] == [B.EXPIRED, B.EXPIRED, B.ACKED]
    assert ids(buffer.backlog(GW)) == [young]
    assert buffer.count(GW) == 1
    assert buffer.expire() == 0  # nothing is expired twice
    assert buffer.expired_total == 2


def test_backlog_expires_stale_entries_of_that_gateway_only(
    store: Store, buffer: InboundBuffer, clock: FakeClock
) -> None:
    """A replay's first backlog read expires that gateway's stale entries, not another's."""
    mine = buffer.append(GW, "loopback", make_event(1))
    theirs = buffer.append(OTHER, "loopback", make_event(2))
    clock.advance(3601)
    assert buffer.backlog(GW, after_seq=0) != []  # a cursor read does not expire
    assert buffer.backlog(GW) == []
    assert state_of(store, mine) is B.EXPIRED
    assert state_of(store, theirs) is B.BUFFERED
    assert buffer.expired_total == 1
    assert buffer.expire(OTHER) == 1
    assert buffer.expired_total == 2


def test_an_expired_entry_cannot_be_acked(
    store: Store, buffer: InboundBuffer, clock: FakeClock
) -> None:
    """An ack that arrives after its entry expired retires nothing."""
    entry = buffer.append(GW, "loopback", make_event(1))
    clock.advance(3601)
    buffer.expire()
    assert buffer.ack(GW, [entry]) == 0
    assert state_of(store, entry) is B.EXPIRED


def test_prune_removes_only_settled_entries(
    store: Store, buffer: InboundBuffer, clock: FakeClock
) -> None:
    """Pruning deletes acked and expired entries settled long enough ago, never unacked ones."""
    acked = buffer.append(GW, "loopback", make_event(1))
    buffer.ack(GW, [acked])
    expired = buffer.append(GW, "loopback", make_event(2))
    clock.advance(3601)
    assert buffer.expire() == 1
    sent = buffer.append(GW, "loopback", make_event(3))
    buffered = buffer.append(GW, "loopback", make_event(4))
    buffer.mark_sent([e for e in buffer.backlog(GW) if e.buffer_id == sent])
    assert buffer.prune(older_than_s=60) == 1  # the acked one; the expiry is too recent
    assert state_of(store, acked) is None
    assert store.history(BUFFER_KIND, acked) == []
    assert state_of(store, expired) is B.EXPIRED
    clock.advance(61)
    assert buffer.prune(older_than_s=60) == 1
    assert state_of(store, expired) is None
    assert buffer.prune(older_than_s=0) == 0  # unacked entries are never pruned
    assert (state_of(store, sent), state_of(store, buffered)) == (B.SENT, B.BUFFERED)
    assert ids(buffer.backlog(GW)) == [sent, buffered]


@pytest.mark.parametrize("retention", [0, -1.0, float("nan")])
def test_retention_must_be_positive(store: Store, retention: float) -> None:
    """A zero, negative or NaN retention is refused at construction."""
    with pytest.raises(ValueError, match="retention_s"):
        InboundBuffer(store, retention_s=retention)


def test_buffer_survives_a_store_reopen(tmp_path: Path) -> None:
    """Entries, their states and replay counts survive closing and reopening the SQLite file, and
    a new buffer appends after the old entries."""
    path = tmp_path / "connector.db"
    first_store = SQLiteStore(path)
    try:
        first = InboundBuffer(first_store)
        appended = [first.append(GW, "loopback", make_event(n)) for n in range(4)]
        first.mark_sent(first.backlog(GW, limit=2))
        first.ack(GW, [appended[1]])
    finally:
        first_store.close()
    second_store = SQLiteStore(path)
    try:
        second = InboundBuffer(second_store)
        backlog = second.backlog(GW)
        assert ids(backlog) == [appended[0], appended[2], appended[3]]
        assert [e.replays for e in backlog] == [1, 0, 0]
        assert [e.event for e in backlog] == [make_event(0), make_event(2), make_event(3)]
        newer = second.append(GW, "loopback", make_event(4))
        assert ids(second.backlog(GW))[-1] == newer
        assert second.count(GW) == 4
        assert state_of(second_store, appended[1]) is B.ACKED
    finally:
        second_store.close()


# -- seq order across a restart, whichever way the clock moved --------------------------------

Appender = Literal["append", "append_many"]


def append_events(buf: InboundBuffer, numbers: range, via: Appender) -> list[str]:
    """Append ``make_event(n)`` for each ``n`` to ``GW`` one by one or as one batch; the ids."""
    if via == "append":
        return [buf.append(GW, "loopback", make_event(n)) for n in numbers]
    return [b for b, _, _ in buf.append_many([(GW, "loopback", make_event(n)) for n in numbers])]


def clock_ns(clock: FakeClock) -> int:
    """The clock's wall time in nanoseconds, as a seq floor."""
    return int(clock.now() * 1e9)


def assert_replays_in_append_order(buf: InboundBuffer, appended: list[str]) -> list[int]:
    """Every replay path returns ``appended`` in append order, with strictly increasing seqs;
    return those seqs."""
    backlog = buf.backlog(GW)
    assert ids(backlog) == appended
    seqs = [e.seq for e in backlog]
    assert all(a < b for a, b in itertools.pairwise(seqs)), seqs
    lines = buf.replay_lines(GW, limit=len(appended) + 1)
    assert [(b, seq) for b, seq, _ in lines] == list(zip(appended, seqs, strict=True))
    chunked: list[str] = []
    cursor: int | None = None
    while chunk := buf.backlog(GW, limit=2, after_seq=cursor):
        chunked += ids(chunk)
        cursor = chunk[-1].seq
    assert chunked == appended
    return seqs


@pytest.mark.parametrize("via", ["append", "append_many"])
def test_restart_with_a_clock_standing_still_appends_after_the_old_entries(
    store: Store, buffer: InboundBuffer, clock: FakeClock, via: Appender
) -> None:
    """A buffer reopened on the same store while the clock stands still gives its entries seqs
    above every earlier one, so the replay returns all entries in append order."""
    before = append_events(buffer, range(3), via)
    last_before = buffer.backlog(GW)[-1].seq
    restarted = InboundBuffer(store, retention_s=3600, clock=clock)
    after = append_events(restarted, range(3, 6), via)
    seqs = assert_replays_in_append_order(restarted, before + after)
    assert min(seqs[3:]) > last_before
    # A cursor at the old connector's last entry resumes exactly at the restarted one's.
    assert ids(restarted.backlog(GW, after_seq=last_before)) == after
    assert [e.event for e in restarted.backlog(GW)] == [make_event(n) for n in range(6)]


@pytest.mark.parametrize("via", ["append", "append_many"])
def test_restart_with_the_clock_moved_back_an_hour_keeps_append_order(
    store: Store, buffer: InboundBuffer, clock: FakeClock, via: Appender
) -> None:
    """A buffer reopened after the wall clock went back an hour still numbers its entries above
    the earlier ones (not by the clock), and the replay stays in append order."""
    before = append_events(buffer, range(3), via)
    last_before = buffer.backlog(GW)[-1].seq
    clock.set_wall(clock.now() - 3600)
    assert clock_ns(clock) < last_before  # the clock alone would order them first
    restarted = InboundBuffer(store, retention_s=3600, clock=clock)
    after = append_events(restarted, range(3, 6), via)
    seqs = assert_replays_in_append_order(restarted, before + after)
    assert min(seqs[3:]) > last_before
    assert ids(restarted.backlog(GW, after_seq=last_before)) == after
    # The old buffer object, still alive, does not go back either.
    also = buffer.append(OTHER, "loopback", make_event(9))
    assert buffer.backlog(OTHER)[0].buffer_id == also
    assert buffer.backlog(OTHER)[0].seq > last_before


@pytest.mark.parametrize("via", ["append", "append_many"])
def test_seqs_follow_a_clock_moved_forward_and_keep_append_order(
    store: Store, buffer: InboundBuffer, clock: FakeClock, via: Appender
) -> None:
    """When the clock moves forward, new seqs are taken from it (at or above its time, so above
    every earlier seq) by the same buffer and by a restarted one, and append order holds."""
    first = append_events(buffer, range(2), via)
    last_first = buffer.backlog(GW)[-1].seq
    clock.advance(60)
    floor = clock_ns(clock)
    assert floor > last_first
    second = append_events(buffer, range(2, 4), via)
    clock.advance(3600)
    later_floor = clock_ns(clock)
    restarted = InboundBuffer(store, retention_s=7200, clock=clock)
    third = append_events(restarted, range(4, 6), via)
    seqs = assert_replays_in_append_order(restarted, first + second + third)
    # Taken from the clock: at its time, not merely one past the previous seq.
    assert floor <= seqs[2] < floor + 1_000_000
    assert later_floor <= seqs[4] < later_floor + 1_000_000


def test_no_buffer_code_reads_the_time_module(
    store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The buffer takes every time, seqs included, from its injected clock: its module neither
    imports nor calls the ``time`` module, and its seqs sit at the fake clock's time even when
    that is decades away from the real one."""
    tree = ast.parse(Path(buffer_module.__file__).read_text(encoding="utf-8"))
    imported = [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    ] + [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert "time" not in imported
    bound = [
        name
        for name, value in vars(buffer_module).items()
        if value is time or getattr(value, "__module__", None) == "time"
    ]
    assert bound == []

    calls: list[str] = []

    def watched(name: str, real: Callable[[], float]) -> Callable[[], float]:
        def call() -> float:
            if sys._getframe(1).f_globals.get("__name__") == buffer_module.__name__:
                calls.append(name)
            return real()

        return call

    for name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns"):
        monkeypatch.setattr(time, name, watched(name, getattr(time, name)))

    fake = FakeClock(start=1_000_000_000.0)  # 2001: far from the real clock
    assert abs(time.time() - fake.now()) > 365 * 86_400
    buf = InboundBuffer(store, retention_s=3600, clock=fake)
    appended = [buf.append(GW, "loopback", make_event(0))]
    appended += [b for b, _, _ in buf.append_many([(GW, "loopback", make_event(1))])]
    fake.set_wall(fake.now() - 3600)
    restarted = InboundBuffer(store, retention_s=3600, clock=fake)
    appended.append(restarted.append(GW, "loopback", make_event(2)))
    seqs = assert_replays_in_append_order(restarted, appended)
    restarted.mark_sent(restarted.backlog(GW))
    restarted.ack(GW, appended)
    restarted.expire()
    restarted.prune(older_than_s=0)
    assert calls == []
    start_ns = 1_000_000_000 * 10**9
    assert all(start_ns <= seq < start_ns + 1_000_000 for seq in seqs), seqs


def test_an_origin_names_the_buffer_ids_and_bad_ones_are_refused() -> None:
    """A given origin prefixes every bufferId (a replayed simulation needs the same ids); one
    that is not ASCII letters and digits is refused at construction."""
    buffer = InboundBuffer(InMemoryStore(), origin="node7")
    assert buffer.origin == "node7"
    event = InboundEvent(
        text="hi",
        message_id="m1",
        source=EventSource(platform="loopback", chat_id="c1", chat_type="dm", user_id="u"),
    )
    assert buffer.append("gw", "loopback", event).startswith("node7-")
    for bad in ("", "a-b", "ü", "a b"):
        with pytest.raises(ValueError, match="origin"):
            InboundBuffer(InMemoryStore(), origin=bad)


def test_foreign_lines_reads_past_a_page_of_own_entries() -> None:
    """A cluster node asks for the entries OTHER buffers on the store appended: its own
    ``buffered`` entries are skipped however many there are (more than one read's page), the
    others come in seq order, and ``sent`` or acked entries are not offered again."""
    store = InMemoryStore()
    clock = FakeClock(1_000.0)
    mine = InboundBuffer(store, clock=clock, origin="mine")
    other = InboundBuffer(store, clock=clock, origin="peer")

    def event(n: int) -> InboundEvent:
        return InboundEvent(
            text=f"e{n}",
            message_id=f"m{n}",
            source=EventSource(platform="loopback", chat_id="c1", chat_type="dm", user_id="u"),
        )

    mine.append_many([("gw", "loopback", event(n)) for n in range(buffer_module._FOREIGN_PAGE + 5)])
    first = other.append("gw", "loopback", event(-1))
    sent = other.append("gw", "loopback", event(-2))
    acked = other.append("gw", "loopback", event(-3))
    last = other.append("gw", "loopback", event(-4))
    other.mark_sent_ids("gw", [sent])
    other.ack("gw", [acked])
    assert [bid for bid, _, _ in mine.foreign_lines("gw", limit=10)] == [first, last]
    assert [bid for bid, _, _ in mine.foreign_lines("gw", limit=1)] == [first]
    assert mine.foreign_lines("another-gateway", limit=10) == []
    assert all(bid.startswith("mine-") for bid, _, _ in other.foreign_lines("gw", limit=3))

"""Tests for relay.connector.buffer.InboundBuffer, the connector's durable inbound buffer.

Every test runs over the in-memory store and the SQLite store.  Time comes from a FakeClock, so
retention and pruning are exercised without sleeping.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

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

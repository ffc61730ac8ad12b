"""Round trips of the PostgreSQL store's writes, counted by a small TCP proxy in front of the
real server: a turn is the client sending and then the server answering, so statements the
client sends together (a pipeline) are one turn.  The counts asserted are what the store sends
today -- a regression (a statement split again, a BEGIN on its own) changes them.

* A ledger step (record, mark_attempting, mark_delivered): BEGIN, the transaction id and the
  guarded write with its audit entry in one turn, then COMMIT: 2 turns, 6 an obligation.
* A refusal: one more turn (the read of the row that decides which error), nothing written.
* ``transition_each`` / ``insert_each`` of like moves or creations, ``transition_many``: one
  statement however many there are, so 2 turns.
"""

from __future__ import annotations

import selectors
import socket
import threading
import uuid
from collections.abc import Iterator

import pytest

import stores._postgres_conn as conn_module
from statecore import Ledger
from statecore.batch import Creation, Move
from statecore.errors import InvalidTransition, StaleState
from statecore.obligation import OBLIGATION_KIND
from statecore.store import Audit
from stores.postgres import PostgresStore
from stores.testing import TICKET_KIND
from stores.testing._kit import TS, file_ticket
from tests.stores.postgres_faults import proxied, upstream_of

BOUND_S = 10.0
"""Every wait of these tests ends within this."""
PAYLOAD = {"session_key": "s", "platform": "matrix", "chat_id": "c", "content": "x" * 100}


class TurnCounter:
    """A TCP proxy on 127.0.0.1 counting turns (client bytes, then server bytes) over all its
    connections; :meth:`close` stops it and its threads (bounded)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.turns = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = socket.create_connection(self.upstream, timeout=BOUND_S)
            pump = threading.Thread(target=self._pump, args=(client, server), daemon=True)
            self._threads.append(pump)
            pump.start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, server)
        sel.register(server, selectors.EVENT_READ, client)
        asked = False  # the client sent bytes the server has not answered yet
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.1):
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = source.recv(65536)
                    if not data:
                        return
                    # Counted before forwarding: the client cannot go on before the count.
                    if source is client:
                        asked = True
                    elif asked:
                        asked = False
                        with self._lock:
                            self.turns += 1
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            sel.close()
            client.close()
            server.close()

    def count(self) -> int:
        """The turns so far."""
        with self._lock:
            return self.turns

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        for thread in self._threads:
            thread.join(BOUND_S)


@pytest.fixture
def counter(postgres_url: str) -> Iterator[TurnCounter]:
    made = TurnCounter(upstream_of(postgres_url))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def store(postgres_url: str, counter: TurnCounter) -> Iterator[PostgresStore]:
    """A one-connection store through the counting proxy, tickets registered."""
    opened = PostgresStore(
        proxied(postgres_url, counter.port), schema=f"rt_{uuid.uuid4().hex[:12]}", pool_size=1
    )
    try:
        opened.register(TICKET_KIND)
        yield opened
    finally:
        opened.close()


def _turns(counter: TurnCounter, call: object) -> int:
    before = counter.count()
    assert callable(call)
    call()
    return counter.count() - before


def test_a_ledger_step_is_two_round_trips_six_an_obligation(
    store: PostgresStore, counter: TurnCounter
) -> None:
    ledger = Ledger(store)
    file_ticket(store, "warm")  # the pool's connection is open and its statements known
    ob = ledger.record(**PAYLOAD, message_ref="m0")
    ledger.mark_attempting(ob.obligation_id)
    ledger.mark_delivered(ob.obligation_id)
    steps = []
    for i in range(1, 4):
        before = counter.count()
        ob = ledger.record(**PAYLOAD, message_ref=f"m{i}")
        steps.append(counter.count() - before)
        obligation_id = ob.obligation_id
        steps.append(_turns(counter, lambda: ledger.mark_attempting(obligation_id)))  # noqa: B023
        steps.append(_turns(counter, lambda: ledger.mark_delivered(obligation_id)))  # noqa: B023
    assert steps == [2] * 9
    history = store.history(OBLIGATION_KIND, ob.obligation_id)
    assert [h.event for h in history] == ["record", "attempt", "deliver"]


def test_a_refusal_reads_the_row_once_more_and_writes_nothing(
    store: PostgresStore, counter: TurnCounter
) -> None:
    file_ticket(store, "t1")
    hold, resume = Audit(1.0), Audit(2.0)
    assert _turns(counter, lambda: store.transition(TICKET_KIND, "t1", "hold", audit=hold)) == 2
    assert _turns(counter, lambda: store.transition(TICKET_KIND, "t1", "resume", audit=resume)) == 2
    before = counter.count()
    with pytest.raises(InvalidTransition):
        store.transition(TICKET_KIND, "t1", "resume", audit=Audit(3.0))
    assert counter.count() - before == 3
    assert [h.event for h in store.history(TICKET_KIND, "t1")] == ["file", "hold", "resume"]
    row = store.get(TICKET_KIND, "t1")
    assert row is not None
    assert (row.state, row.fence) == (TS.OPEN, 2)


def test_like_batches_are_one_statement_however_long(
    store: PostgresStore, counter: TurnCounter
) -> None:
    file_ticket(store, "warm")
    for size in (5, 40):
        ids = [f"b{size}-{i}" for i in range(size)]
        creations = [
            Creation(i, {"title": i}, event="file", audit=Audit(1.0, owner="o")) for i in ids
        ]
        before = counter.count()
        made = store.insert_each(TICKET_KIND, creations)
        assert counter.count() - before == 2
        assert all(not isinstance(m, Exception) and m[1] for m in made)
        moves = [
            Move(i, "hold", audit=Audit(2.0 + n, attempts=n), fence=0) for n, i in enumerate(ids)
        ]
        before = counter.count()
        moved = store.transition_each(TICKET_KIND, moves)
        assert counter.count() - before == 2
        assert [getattr(m, "state", m) for m in moved] == [TS.HELD] * size
        history = store.history(TICKET_KIND, ids[-1])
        assert [(h.event, h.at, h.attempts) for h in history] == [
            ("file", 1.0, None),
            ("hold", 2.0 + size - 1, size - 1),
        ]


def test_transition_many_is_one_statement(store: PostgresStore, counter: TurnCounter) -> None:
    ids = [f"m{i}" for i in range(12)]
    store.insert_each(TICKET_KIND, [Creation(i, {"title": i}, "file", Audit(1.0)) for i in ids])
    before = counter.count()
    moved = store.transition_many(TICKET_KIND, ids, "hold", audit=Audit(2.0, reason="r"))
    assert counter.count() - before == 2
    assert [r.state for r in moved] == [TS.HELD] * len(ids)
    history = store.history(TICKET_KIND, "m7")
    assert [(h.event, h.from_state, h.reason) for h in history] == [
        ("file", None, None),
        ("hold", TS.OPEN, "r"),
    ]


def test_without_pipeline_mode_a_step_is_four_round_trips_with_the_same_outcome(
    store: PostgresStore, counter: TurnCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A libpq without pipeline mode (before 14): each statement a round trip of its own."""
    monkeypatch.setattr(conn_module, "_PIPELINES", False)
    file_ticket(store, "t1")
    assert _turns(counter, lambda: file_ticket(store, "t2")) == 4
    hold, resume = Audit(1.0), Audit(2.0)
    assert _turns(counter, lambda: store.transition(TICKET_KIND, "t2", "hold", audit=hold)) == 4
    assert _turns(counter, lambda: store.transition(TICKET_KIND, "t2", "resume", audit=resume)) == 4
    # (Not counted: a statement run a fifth time is prepared, outside a pipeline a turn more.)
    with pytest.raises(InvalidTransition):
        store.transition(TICKET_KIND, "t2", "resume", audit=Audit(3.0))
    assert [h.event for h in store.history(TICKET_KIND, "t2")] == ["file", "hold", "resume"]


def test_moves_changing_different_values_are_still_one_statement(
    store: PostgresStore, counter: TurnCounter
) -> None:
    """As the ledger's marks are: every move sets its own time (here: its own assignee)."""
    ids = [f"v{i}" for i in range(8)]
    store.insert_each(TICKET_KIND, [Creation(i, {"title": i}, "file", Audit(1.0)) for i in ids])
    moves = [
        Move(i, "hold", audit=Audit(2.0), fence=0, changes={"assignee": f"a{n}", "score": n / 2})
        for n, i in enumerate(ids)
    ]
    moves.append(Move("v3", "resume", audit=Audit(3.0), fence=0))  # stale: refused, typed
    before = counter.count()
    moved = store.transition_each(TICKET_KIND, moves)
    assert counter.count() - before == 4  # the run, the resume, its refusal's read, COMMIT
    assert isinstance(moved[-1], StaleState)
    rows = [m for m in moved[:-1] if not isinstance(m, Exception)]
    assert [(r.values["assignee"], r.values["score"]) for r in rows] == [
        (f"a{n}", n / 2) for n in range(len(ids))
    ]
    assert [h.event for h in store.history(TICKET_KIND, "v3")] == ["file", "hold"]

"""A write whose ``COMMIT`` is lost in flight, on a real server behind a small TCP proxy that
can swallow the server's answer to the next ``COMMIT``, or drop that ``COMMIT`` before the
server sees it: the store asks the server what became of the transaction and never guesses --
committed, the write's row is returned (written once); rolled back, the write runs again
(written once); when the server cannot be asked, ``StoreOutcomeUnknown``, and the caller is
told to re-read.  The proxy also stands for another cluster answering at the same address."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from statecore.errors import StoreOutcomeUnknown
from statecore.store import Audit
from stores.postgres import PostgresStore
from stores.testing import TICKET_KIND
from stores.testing._kit import TS, file_ticket
from tests.stores.postgres_faults import Proxy, proxied, upstream_of

BOUND_S = 20.0
"""Every wait of these tests ends within this."""
FAST = {"connect_timeout_s": 1.0, "connect_retries": 2, "retry_backoff_s": 0.05}


@pytest.fixture
def proxy(postgres_url: str) -> Iterator[Proxy]:
    """A proxy in front of the session's server; closed afterwards."""
    made = Proxy(upstream_of(postgres_url))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def store(postgres_url: str, proxy: Proxy) -> Iterator[PostgresStore]:
    """A one-connection store through the proxy, tickets registered, ticket t1 filed."""
    opened = PostgresStore(
        proxied(postgres_url, proxy.port), schema=f"l_{uuid.uuid4().hex[:12]}", pool_size=1, **FAST
    )
    try:
        opened.register(TICKET_KIND)
        file_ticket(opened, "t1")
        yield opened
    finally:
        opened.close()


def _holds(url: str, schema: str | None, entity_id: str) -> int:
    """How many ``hold`` audit entries ``entity_id`` has (read directly, not through the proxy)."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {schema}.statecore_audit "
            "WHERE entity_id = %s AND event = 'hold'",
            (entity_id,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _hold(store: PostgresStore) -> Any:
    return store.transition(TICKET_KIND, "t1", "hold", audit=Audit(2.0, "w"), fence=0)


def test_a_commit_whose_answer_is_lost_is_found_committed(
    store: PostgresStore, proxy: Proxy, postgres_url: str
) -> None:
    """The server commits, its answer never arrives: the store asks, learns it committed, and
    returns the row -- written once, not retried, not reported as failed."""
    proxy.arm("swallow")
    row = _hold(store)
    assert proxy.fired.is_set()  # the cut happened
    assert (row.state, row.fence) == (TS.HELD, 1)
    assert _holds(postgres_url, store.schema, "t1") == 1


def test_a_commit_lost_before_the_server_saw_it_is_run_again_once(
    store: PostgresStore, proxy: Proxy, postgres_url: str
) -> None:
    """The connection drops before the server got the COMMIT: the server rolled it back, the
    store learns so, and runs the write again -- written once."""
    proxy.arm("drop")
    row = _hold(store)
    assert proxy.fired.is_set()
    assert (row.state, row.fence) == (TS.HELD, 1)
    assert _holds(postgres_url, store.schema, "t1") == 1


def test_a_commit_that_cannot_be_resolved_is_reported_unknown_never_as_failed(
    store: PostgresStore, proxy: Proxy, postgres_url: str
) -> None:
    """The answer is lost and the server cannot be asked (the proxy refuses new connections):
    StoreOutcomeUnknown telling the caller to re-read -- and the write did commit, so a caller
    that took it for a failure and wrote again would have been wrong."""
    proxy.arm("swallow")
    proxy.refuse = True
    with pytest.raises(StoreOutcomeUnknown, match="re-read the entity") as info:
        _hold(store)
    assert proxy.fired.is_set()
    assert info.value.what.endswith("transition")
    proxy.refuse = False
    _eventually_held(store, postgres_url)  # it had committed


def test_a_block_whose_commit_is_lost_is_reported_unknown(
    store: PostgresStore, proxy: Proxy, postgres_url: str
) -> None:
    """An atomic() block has no transaction id to ask about: a lost COMMIT raises
    StoreOutcomeUnknown (never a plain failure)."""
    proxy.arm("swallow")
    with pytest.raises(StoreOutcomeUnknown, match="re-read"), store.atomic():
        _hold(store)
    _eventually_held(store, postgres_url)


def _eventually_held(store: PostgresStore, postgres_url: str) -> None:
    """The server got the COMMIT: it commits, maybe after the store stopped asking; re-read
    (what the caller of an unknown outcome must do) shows the write, once."""
    deadline = time.monotonic() + BOUND_S
    while _holds(postgres_url, store.schema, "t1") == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert _holds(postgres_url, store.schema, "t1") == 1
    row = store.get(TICKET_KIND, "t1")
    assert row is not None
    assert (row.state, row.fence) == (TS.HELD, 1)

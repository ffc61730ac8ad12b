"""The pool's connection attempts make the store's bounded tries themselves: a server that is
not reachable yet (restarting) is tried again after each short wait, ahead of the pool's own
one-second-doubling backoff; a refusal for good is raised at once.  The driver's connect is
replaced by a script here; tests/stores/test_postgres_bad_servers.py restarts real servers."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from stores import PostgresStore
from stores._postgres_faults import retrying_connections


class Script:
    """Stands in for the driver's connect: raises the scripted errors in turn, then returns."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.calls.append((args, kwargs))
        if self.errors:
            raise self.errors.pop(0)
        return "connected"


def refused_now() -> psycopg.OperationalError:
    return psycopg.OperationalError('connection to server at "127.0.0.1", port 5 failed: refused')


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> Script:
    script = Script()
    monkeypatch.setattr(
        psycopg.Connection, "connect", classmethod(lambda cls, *a, **k: script(*a, **k))
    )
    return script


def test_a_server_not_reachable_yet_is_tried_again_after_each_wait(driver: Script) -> None:
    driver.errors = [refused_now(), refused_now()]
    waited: list[float] = []
    connection_class = retrying_connections([0.2, 0.4], sleep=waited.append)
    assert connection_class.connect("dbname=x", connect_timeout=5) == "connected"
    assert waited == [0.2, 0.4]
    assert driver.calls == [(("dbname=x",), {"connect_timeout": 5})] * 3


def test_after_the_last_wait_the_error_is_the_pools_to_handle(driver: Script) -> None:
    driver.errors = [refused_now(), refused_now(), refused_now()]
    waited: list[float] = []
    connection_class = retrying_connections([0.2, 0.4], sleep=waited.append)
    with pytest.raises(psycopg.OperationalError, match="refused"):
        connection_class.connect("dbname=x")
    assert waited == [0.2, 0.4]
    assert len(driver.calls) == 3


def test_a_refusal_for_good_is_not_tried_again(driver: Script) -> None:
    driver.errors = [psycopg.OperationalError('FATAL:  password authentication failed for "u"')]
    waited: list[float] = []
    connection_class = retrying_connections([0.2, 0.4], sleep=waited.append)
    with pytest.raises(psycopg.OperationalError, match="password"):
        connection_class.connect("dbname=x")
    assert waited == []
    assert len(driver.calls) == 1


def test_the_pool_is_given_the_retrying_class(postgres_url: str) -> None:
    """A store's pool connects through the class (its connections are instances of it)."""
    store = PostgresStore(postgres_url)
    try:
        with store.atomic():
            assert type(store.connection()).__name__ == "RetryingConnection"
    finally:
        store.close()

"""Fixtures for the Matrix tests: one throwaway homeserver for the whole session (Synapse from
its wheel, ``relay.matrix.testing``) and fresh users on it for each test."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from relay.matrix.testing import Homeserver, HomeserverUnavailable, MatrixAccount, start_homeserver

NewAccount = Callable[..., MatrixAccount]
"""``new_account(prefix="user", *, admin=False)``: a user no other test has, logged in."""


@pytest.fixture(scope="session")
def homeserver() -> Iterator[Homeserver]:
    """The session's homeserver, started by the tests themselves; stopped (its directory
    removed) afterwards.  Never skipped: when no server can be had, every test using it FAILS,
    saying why (the server log's tail included)."""
    try:
        server = start_homeserver()
    except HomeserverUnavailable as exc:
        pytest.fail(f"no Matrix homeserver for the Matrix tests: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def new_account(homeserver: Homeserver) -> NewAccount:
    """Registers a new user on the session's homeserver at each call (a name unique to this
    call, starting with ``prefix``) and returns the account."""

    def register(prefix: str = "user", *, admin: bool = False) -> MatrixAccount:
        return homeserver.register(f"{prefix}-{uuid.uuid4().hex[:10]}", admin=admin)

    return register

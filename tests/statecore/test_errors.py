"""Tests for statecore.errors: the hierarchy, the messages and the attributes."""

from __future__ import annotations

import sqlite3
from enum import Enum, IntEnum

import pytest

import statecore
from relay.client.lifecycle import TransportState
from statecore.errors import (
    DeclarationError,
    InvalidTransition,
    StaleState,
    StatecoreError,
    StoreError,
)
from statecore.lifecycles import ObligationState


class Light(IntEnum):
    RED = 1
    GREEN = 2


class Odd(Enum):
    PAIR = (1, 2)


# -- hierarchy -----------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [InvalidTransition, DeclarationError])
def test_misuse_errors_are_statecore_and_value_errors(cls: type[Exception]) -> None:
    """InvalidTransition and DeclarationError are both StatecoreError and ValueError."""
    assert issubclass(cls, StatecoreError)
    assert issubclass(cls, ValueError)


@pytest.mark.parametrize("cls", [StaleState, StoreError])
def test_runtime_errors_are_statecore_but_not_value_errors(cls: type[Exception]) -> None:
    """StaleState and StoreError are StatecoreError but not ValueError (not the caller's value)."""
    assert issubclass(cls, StatecoreError)
    assert not issubclass(cls, ValueError)


def test_statecore_error_is_a_plain_exception() -> None:
    """StatecoreError derives from Exception (not BaseException only) and is exported."""
    assert issubclass(StatecoreError, Exception)
    assert statecore.StatecoreError is StatecoreError


def test_value_error_handlers_catch_invalid_transition() -> None:
    """A caller that only knows ValueError still catches an InvalidTransition."""
    with pytest.raises(ValueError, match="not allowed"):
        raise InvalidTransition("obligation", ObligationState.PENDING, "deliver")


# -- InvalidTransition ----------------------------------------------------------------------------


def test_invalid_transition_message_shows_enum_by_value() -> None:
    """InvalidTransition names the lifecycle, the event and the state by its value ('pending')."""
    err = InvalidTransition("obligation", ObligationState.PENDING, "deliver")
    assert str(err) == "obligation: event 'deliver' is not allowed from state 'pending'"
    assert "ObligationState" not in str(err)


def test_invalid_transition_attributes_keep_originals() -> None:
    """InvalidTransition keeps .lifecycle, .state and .event as passed (the enum member itself)."""
    err = InvalidTransition("transport", TransportState.CLOSED, "dial")
    assert err.lifecycle == "transport"
    assert err.state is TransportState.CLOSED
    assert err.event == "dial"
    assert "'closed'" in str(err)
    assert "'dial'" in str(err)


def test_invalid_transition_from_no_state_shows_none() -> None:
    """InvalidTransition for an entity that does not exist shows its state as '(none)'."""
    err = InvalidTransition("obligation", None, "attempt")
    assert err.state is None
    assert str(err) == "obligation: event 'attempt' is not allowed from state (none)"


def test_invalid_transition_detail_is_appended() -> None:
    """A detail string is appended to the InvalidTransition message in parentheses."""
    err = InvalidTransition("obligation", ObligationState.DELIVERED, "fail", "already delivered")
    assert str(err) == (
        "obligation: event 'fail' is not allowed from state 'delivered' (already delivered)"
    )


def test_invalid_transition_int_enum_and_plain_values() -> None:
    """Int-valued enum members show their value; plain strings show as themselves."""
    assert "state 1" in str(InvalidTransition("light", Light.RED, "go"))
    assert "state 'raw'" in str(InvalidTransition("x", "raw", "go"))
    event_enum = InvalidTransition("x", "raw", ObligationState.PENDING)
    assert "event 'pending'" in str(event_enum)


def test_invalid_transition_non_scalar_enum_value_shows_member() -> None:
    """An enum whose value is not str/int is shown by the member's repr, not lost."""
    err = InvalidTransition("x", Odd.PAIR, "go")
    assert repr(Odd.PAIR) in str(err)


# -- StaleState -----------------------------------------------------------------------------------


def test_stale_state_message_and_attributes() -> None:
    """StaleState names the entity, what was expected and what was found."""
    err = StaleState("ob-1", "state pending, fence 3", "state attempting, fence 4")
    assert err.entity_id == "ob-1"
    assert err.expected == "state pending, fence 3"
    assert err.actual == "state attempting, fence 4"
    assert str(err) == (
        "ob-1: expected state pending, fence 3, found state attempting, fence 4"
        " (a concurrent writer won)"
    )


def test_stale_state_without_actual() -> None:
    """StaleState without an actual value omits the 'found' clause."""
    err = StaleState("ob-1", "fence 3")
    assert err.actual == ""
    assert str(err) == "ob-1: expected fence 3 (a concurrent writer won)"


# -- DeclarationError ----------------------------------------------------------------------------


def test_declaration_error_message_and_attributes() -> None:
    """DeclarationError names the lifecycle and the problem."""
    err = DeclarationError("obligation", "state 'lost' is unreachable")
    assert err.lifecycle == "obligation"
    assert err.problem == "state 'lost' is unreachable"
    assert str(err) == "lifecycle 'obligation': state 'lost' is unreachable"


# -- StoreError -----------------------------------------------------------------------------------


def _store_write(driver_error: Exception) -> None:
    """Play a store operation whose driver fails, wrapping the failure the documented way."""
    try:
        raise driver_error
    except sqlite3.Error as exc:
        raise StoreError("could not record ob-1") from exc


def test_store_error_chains_its_cause() -> None:
    """StoreError raised with 'from' keeps the driver error as __cause__."""
    driver_error = sqlite3.OperationalError("database is locked")
    with pytest.raises(StoreError, match="could not record") as caught:
        _store_write(driver_error)
    assert caught.value.__cause__ is driver_error
    assert caught.value.__suppress_context__ is True


def test_store_error_caught_as_statecore_error() -> None:
    """A handler for StatecoreError catches StoreError and StaleState alike."""
    for err in (StoreError("boom"), StaleState("e", "x")):
        with pytest.raises(StatecoreError):
            raise err

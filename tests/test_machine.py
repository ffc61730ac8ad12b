"""Live machines attached to in-memory objects."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from relay.client.lifecycle import TRANSPORT, TransportState
from statecore import InvalidTransition, StateMachine

T = TransportState


@pytest.fixture(params=["transitions", "table"])
def engine(request: pytest.FixtureRequest) -> str:
    """Every test runs on a real transitions machine (attach) and on the table alone (track)."""
    return str(request.param)


def machine_of(engine: str, **kwargs: Any) -> StateMachine[TransportState]:
    """TRANSPORT.attach(**kwargs) or TRANSPORT.track(**kwargs)."""
    make = TRANSPORT.attach if engine == "transitions" else TRANSPORT.track
    return make(**kwargs)


def test_attached_machine_starts_in_the_initial_state(engine: str) -> None:
    """A machine attached without an explicit start is in the lifecycle's initial state."""
    machine = machine_of(engine)
    assert machine.state is T.NEW
    assert not machine.finished
    assert machine.lifecycle is TRANSPORT


def test_fire_moves_and_reports_each_change(engine: str) -> None:
    """fire() moves along declared events and notifies the listener after each change."""
    seen: list[tuple[T, T, str]] = []
    machine = machine_of(engine, on_change=lambda a, b, e: seen.append((a, b, e)))
    assert machine.fire("dial") is T.CONNECTING
    machine.fire("open")
    machine.fire("establish")
    assert machine.state is T.CONNECTED
    assert seen == [
        (T.NEW, T.CONNECTING, "dial"),
        (T.CONNECTING, T.HANDSHAKING, "open"),
        (T.HANDSHAKING, T.CONNECTED, "establish"),
    ]


def test_illegal_event_raises_and_changes_nothing(engine: str) -> None:
    """An event the lifecycle forbids now raises InvalidTransition and leaves the state."""
    seen: list[object] = []
    machine = machine_of(engine, on_change=lambda *a: seen.append(a))
    with pytest.raises(InvalidTransition, match="'establish' is not allowed from state 'new'"):
        machine.fire("establish")
    with pytest.raises(InvalidTransition, match="undeclared event"):
        machine.fire("explode")
    assert machine.state is T.NEW
    assert seen == []


def test_terminal_state_is_final(engine: str) -> None:
    """Once closed, no event moves the machine again."""
    machine = machine_of(engine)
    machine.fire("close")
    machine.fire("finish")
    assert machine.finished
    for event in TRANSPORT.events:
        assert not machine.can(event)
        with pytest.raises(InvalidTransition):
            machine.fire(event)
    assert machine.state is T.CLOSED


def test_attach_at_a_given_state(engine: str) -> None:
    """A machine can start in any declared state; an undeclared one is refused."""
    machine = machine_of(engine, initial=T.DORMANT)
    assert machine.state is T.DORMANT
    assert machine.can("dial")
    with pytest.raises(InvalidTransition, match="undeclared initial state"):
        machine_of(engine, initial="dormant")  # type: ignore[arg-type]


def test_machines_are_independent(engine: str) -> None:
    """Two attached machines never share state."""
    a, b = machine_of(engine), machine_of(engine)
    a.fire("dial")
    assert a.state is T.CONNECTING
    assert b.state is T.NEW


def test_a_failing_listener_never_undoes_the_change(
    engine: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A listener's exception is logged; the change stands and later listeners still run."""
    later: list[str] = []

    def broken(_a: T, _b: T, _e: str) -> None:
        raise RuntimeError("listener bug")

    machine = machine_of(engine, on_change=broken)
    machine.subscribe(lambda _a, _b, e: later.append(e))
    with caplog.at_level(logging.ERROR):
        assert machine.fire("dial") is T.CONNECTING
    assert machine.state is T.CONNECTING
    assert later == ["dial"]
    assert "listener failed" in caplog.text


def test_unsubscribe_stops_notifications(engine: str) -> None:
    """An unsubscribed listener is not called again; unsubscribing twice is safe."""
    seen: list[str] = []
    machine = machine_of(engine)
    stop = machine.subscribe(lambda _a, _b, e: seen.append(e))
    machine.fire("dial")
    stop()
    stop()
    machine.fire("open")
    assert seen == ["dial"]


def test_listener_may_fire_the_next_event(engine: str) -> None:
    """A listener reacting to a change can fire a follow-up event on the same machine."""
    machine = machine_of(engine)

    def auto_open(_a: T, b: T, _e: str) -> None:
        if b is T.CONNECTING:
            machine.fire("open")

    machine.subscribe(auto_open)
    machine.fire("dial")
    assert machine.state is T.HANDSHAKING


def test_generated_methods_do_not_leak(engine: str) -> None:
    """The machine wrapper exposes no transitions-generated attributes."""
    machine = machine_of(engine)
    for name in ("trigger", "to_connected", "may_dial", "is_NEW", "dial"):
        assert not hasattr(machine, name)


def test_every_declared_move_works_on_a_live_machine(engine: str) -> None:
    """The live machine and the compiled table agree on every declared move."""
    for (state, event), target in TRANSPORT.table.items():
        machine = machine_of(engine, initial=state)
        assert machine.fire(event) is target

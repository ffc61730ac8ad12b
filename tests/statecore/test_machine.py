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


def test_enter_and_exit_callbacks_run_inside_the_move_before_listeners(engine: str) -> None:
    """on_exit of the old state, then on_enter of the new one, then the listeners: each with
    (from, to, event), on both engines."""
    order: list[tuple[str, T, T, str]] = []
    machine = machine_of(
        engine,
        on_change=lambda a, b, e: order.append(("change", a, b, e)),
        on_enter={T.CONNECTED: lambda a, b, e: order.append(("enter", a, b, e))},
        on_exit={T.HANDSHAKING: lambda a, b, e: order.append(("exit", a, b, e))},
    )
    machine.fire("dial")
    machine.fire("open")
    order.clear()
    machine.fire("establish")
    move = (T.HANDSHAKING, T.CONNECTED, "establish")
    assert order == [("exit", *move), ("enter", *move), ("change", *move)]


def test_a_refused_event_runs_no_callback(engine: str) -> None:
    """An illegal event raises before anything runs: no enter, exit or listener call."""
    calls: list[object] = []
    machine = machine_of(
        engine,
        on_change=lambda *a: calls.append(a),
        on_enter={T.CONNECTED: lambda *a: calls.append(a)},
        on_exit={T.NEW: lambda *a: calls.append(a)},
    )
    with pytest.raises(InvalidTransition):
        machine.fire("establish")
    assert (machine.state, calls) == (T.NEW, [])


def test_an_enter_callback_that_raises_propagates_after_the_change(engine: str) -> None:
    """The owner's own enter code failing is the owner's error: it propagates, and the state
    has changed (the move happened)."""

    def boom(*_: object) -> None:
        raise RuntimeError("owner code failed")

    machine = machine_of(engine, on_enter={T.CONNECTING: boom})
    with pytest.raises(RuntimeError, match="owner code failed"):
        machine.fire("dial")
    assert machine.state is T.CONNECTING


@pytest.mark.parametrize("where", ["on_enter", "on_exit"])
def test_callbacks_for_undeclared_states_are_refused(engine: str, where: str) -> None:
    """A callback keyed by something that is not a state of the lifecycle is refused when
    the machine is made."""
    with pytest.raises(InvalidTransition, match="undeclared state"):
        machine_of(engine, **{where: {"connected": lambda *a: None}})
    with pytest.raises(TypeError, match="callable"):
        machine_of(engine, **{where: {T.CONNECTED: "not a function"}})


def test_an_attached_machine_is_moved_by_its_transitions_model_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One engine per machine: an attached machine's fire() never consults the compiled
    table on the way to a legal move -- the transitions model decides and moves it."""
    machine = TRANSPORT.attach()

    def table_consulted(*_: object) -> None:
        raise AssertionError("the compiled table was consulted")

    monkeypatch.setattr(type(TRANSPORT), "target", table_consulted)
    assert machine.fire("dial") is T.CONNECTING
    assert machine.state is T.CONNECTING

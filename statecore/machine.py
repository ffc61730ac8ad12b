"""A live state machine attached to one long-lived in-memory object.

Obtained from :meth:`statecore.Lifecycle.attach` (a real ``transitions`` machine) or
:meth:`statecore.Lifecycle.track` (the compiled table alone, for objects that are many).  Each
machine has exactly one engine: an attached machine is moved only by its ``transitions``
model (which also runs the owner's enter/exit callbacks and the listeners), a tracked one only
by the compiled table.  Both are built from the same declaration, so the two cannot disagree;
the ``transitions`` model is private, so its generated methods (``to_*``, ``may_*``,
``trigger``) never leak into the owner's public API.

This module does not import :mod:`statecore.lifecycle`: it reads the declaration through the
small :class:`Declaration` protocol, so the two modules depend one way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar

from transitions import EventData, Machine, MachineError

from statecore.errors import InvalidTransition

__all__ = ["Declaration", "Listener", "StateMachine"]

S = TypeVar("S", bound=Enum)
S_co = TypeVar("S_co", bound=Enum, covariant=True)

log = logging.getLogger(__name__)

# transitions reports every state entry and exit at INFO; a transport changes state often and
# those lines drown an application's own INFO logs.  Quiet it unless the application has
# configured that logger itself.
_transitions_log = logging.getLogger("transitions")
if _transitions_log.level == logging.NOTSET:
    _transitions_log.setLevel(logging.WARNING)

Listener = Callable[[S, S, str], None]
"""``listener(from_state, to_state, event)``."""


class Declaration(Protocol[S]):
    """What a live machine reads of its lifecycle (a :class:`statecore.Lifecycle` is one)."""

    @property
    def name(self) -> str:
        """The lifecycle's name, for errors."""
        ...

    @property
    def state_type(self) -> type[S]:
        """The enum of its states."""
        ...

    def can(self, state: S, event: str) -> bool:
        """True when ``event`` is legal from ``state``."""
        ...

    def target(self, state: S, event: str) -> S:
        """The state ``event`` leads to from ``state``; raises :class:`InvalidTransition`."""
        ...

    def is_terminal(self, state: S) -> bool:
        """True for a state no move leaves."""
        ...


class _DeclaredMove(Protocol[S_co]):
    """One declared move as the ``transitions`` engine needs it."""

    @property
    def event(self) -> str: ...
    @property
    def sources(self) -> tuple[S_co, ...]: ...
    @property
    def target(self) -> S_co | None: ...


_NO_CALLBACKS: Mapping[Any, Any] = MappingProxyType({})
"""The callbacks of a machine given none (shared: read-only)."""
_NO_LISTENERS: tuple[()] = ()
"""The listeners of a machine nobody subscribed to yet (shared: replaced by a list)."""


class _Model:
    """The private object ``transitions`` decorates with its generated attributes."""

    # Annotations only: transitions binds the real attributes and skips any that exist.
    state: Any
    trigger: Callable[[str], bool]


class StateMachine(Generic[S]):
    """The state of one in-memory object, changed only through declared events.

    The owner calls :meth:`fire` at its single state-changing chokepoint.  What must happen on
    entering or leaving a state (``on_enter`` / ``on_exit``, given when the machine is made)
    runs inside the move, after the state changed, in that order: exit callbacks of the old
    state, enter callbacks of the new one, then the listeners.  An enter or exit callback that
    raises propagates out of :meth:`fire` (the change stands: it is the owner's own code);
    a listener that raises is logged and never undoes the change or stops the other listeners.
    """

    # A tracked machine (Lifecycle.track) is one of many: it keeps its state in a slot, shares
    # one empty mapping for absent callbacks and one empty tuple until a listener subscribes.
    __slots__ = ("_declaration", "_enter", "_exit", "_listeners", "_machine", "_model", "_state")

    def __init__(
        self,
        declaration: Declaration[S],
        moves: Sequence[_DeclaredMove[S]] | None,
        initial: S,
        *,
        on_change: Listener[S] | None,
        on_enter: Mapping[S, Listener[S]] | None = None,
        on_exit: Mapping[S, Listener[S]] | None = None,
    ) -> None:
        self._declaration = declaration
        self._listeners: list[Listener[S]] | tuple[()] = (
            _NO_LISTENERS if on_change is None else [on_change]
        )
        self._enter = _checked(declaration, "on_enter", on_enter)
        self._exit = _checked(declaration, "on_exit", on_exit)
        self._state = initial
        if moves is None:
            # Table-driven (Lifecycle.track): fire() moves the state itself; no model.
            self._machine: Machine | None = None
            self._model: _Model | None = None
            return
        self._model = _Model()
        states: list[dict[str, Any]] = []
        for state in declaration.state_type:
            spec: dict[str, Any] = {"name": state}
            if state in self._exit:
                spec["on_exit"] = [_callback(self._exit[state])]
            if state in self._enter:
                spec["on_enter"] = [_callback(self._enter[state])]
            states.append(spec)
        self._machine = Machine(
            model=self._model,
            states=states,
            transitions=[
                {"trigger": t.event, "source": list(t.sources), "dest": t.target} for t in moves
            ],
            initial=initial,
            auto_transitions=False,
            ignore_invalid_triggers=False,
            send_event=True,
            after_state_change=[self._notify],
        )

    @property
    def lifecycle(self) -> Declaration[S]:
        """The declaration (the :class:`~statecore.Lifecycle`) this machine was built from."""
        return self._declaration

    @property
    def state(self) -> S:
        """The current state."""
        model = self._model
        if model is None:
            return self._state
        state: S = model.state
        return state

    @property
    def finished(self) -> bool:
        """True once a terminal state has been reached (no move can leave it)."""
        return self._declaration.is_terminal(self.state)

    def can(self, event: str) -> bool:
        """True when ``event`` is legal from the current state; never raises."""
        return self._declaration.can(self.state, event)

    def fire(self, event: str) -> S:
        """Move to the state ``event`` leads to from the current one and return it.

        Raises :class:`InvalidTransition` (the state is unchanged, no callback ran) when the
        lifecycle does not allow ``event`` now; an ``on_enter`` / ``on_exit`` callback's
        exception propagates after the change.  Listeners run after the change.
        """
        machine = self._machine
        if machine is None:
            before = self._state
            after = self._declaration.target(before, event)  # the descriptive refusal
            self._state = after
            if self._exit:
                self._run(self._exit, before, before, after, event)
            if self._enter:
                self._run(self._enter, after, before, after, event)
            if self._listeners:
                self._notify_all(before, after, event)
            return after
        if event not in machine.events:
            self._declaration.target(self.state, event)  # raises the descriptive refusal
        assert self._model is not None  # an attached machine has its model
        try:
            self._model.trigger(event)
        except MachineError:
            # Only the engine decided; the declaration words the refusal for the caller.
            self._declaration.target(self.state, event)
            raise InvalidTransition(self._declaration.name, self.state, event) from None
        return self.state

    @staticmethod
    def _run(callbacks: Mapping[S, Listener[S]], state: S, before: S, after: S, event: str) -> None:
        callback = callbacks.get(state)
        if callback is not None:
            callback(before, after, event)

    def _notify(self, data: EventData) -> None:
        """The engine's after-state-change hook: hand the move to the listeners."""
        self._notify_all(*_moved(data))

    def _notify_all(self, before: S, after: S, event: str) -> None:
        for listener in tuple(self._listeners):
            try:
                listener(before, after, event)
            except Exception:
                log.exception(
                    "%s listener failed on %s -> %s (%s); the change stands",
                    self._declaration.name,
                    before.value,
                    after.value,
                    event,
                )

    def subscribe(self, listener: Listener[S]) -> Callable[[], None]:
        """Call ``listener(from_state, to_state, event)`` after every change.

        Returns a function that unsubscribes it (safe to call twice).
        """
        listeners = self._listeners
        if not isinstance(listeners, list):  # the shared empty tuple: a list of its own now
            listeners = self._listeners = []
        listeners.append(listener)

        def unsubscribe() -> None:
            if listener in listeners:
                listeners.remove(listener)

        return unsubscribe

    def __repr__(self) -> str:
        return f"<StateMachine {self._declaration.name}: {self.state.value}>"


def _checked(
    declaration: Declaration[S], what: str, callbacks: Mapping[S, Listener[S]] | None
) -> Mapping[S, Listener[S]]:
    """The callbacks by state, refusing keys that are not states of the lifecycle (none: the
    one shared empty mapping)."""
    if callbacks is None or (isinstance(callbacks, Mapping) and not callbacks):
        return _NO_CALLBACKS
    for state, callback in callbacks.items():
        if not isinstance(state, declaration.state_type):
            raise InvalidTransition(declaration.name, state, what, "undeclared state")
        if not callable(callback):
            raise TypeError(f"{what}[{state.value!r}] must be callable")
    return dict(callbacks)


def _moved(data: EventData) -> tuple[Any, Any, str]:
    """The (from, to, event) of a move, read from the engine's event data (it names states by
    enum member name; its states hold the members)."""
    transition, event = data.transition, data.event
    assert transition is not None
    assert transition.dest is not None
    assert event is not None
    machine = data.machine
    return (
        machine.get_state(transition.source).value,
        machine.get_state(transition.dest).value,
        event.name,
    )


def _callback(callback: Listener[Any]) -> Callable[[EventData], None]:
    """Adapt an owner's ``(from, to, event)`` callback to the engine's event data."""

    def run(data: EventData) -> None:
        callback(*_moved(data))

    return run

"""A live state machine attached to one long-lived in-memory object.

Obtained from :meth:`statecore.Lifecycle.attach` (a real ``transitions`` machine) or
:meth:`statecore.Lifecycle.track` (the compiled table alone, for objects that are many).  An
attached machine is built from the same declaration as the compiled table, so the two cannot
disagree; the ``transitions`` model is private, so its generated methods (``to_*``, ``may_*``,
``trigger``) never leak into the owner's public API.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from transitions import Machine, MachineError

from statecore.errors import InvalidTransition

if TYPE_CHECKING:
    from statecore.lifecycle import Lifecycle, Transition

__all__ = ["StateMachine"]

S = TypeVar("S", bound=Enum)

log = logging.getLogger(__name__)

# transitions reports every state entry and exit at INFO; a transport changes state often and
# those lines drown an application's own INFO logs.  Quiet it unless the application has
# configured that logger itself.
_transitions_log = logging.getLogger("transitions")
if _transitions_log.level == logging.NOTSET:
    _transitions_log.setLevel(logging.WARNING)

Listener = Callable[[S, S, str], None]


class _Model:
    """The private object ``transitions`` decorates with its generated attributes."""

    # Annotations only: transitions binds the real attributes and skips any that exist.
    state: Any
    trigger: Callable[[str], bool]


class StateMachine(Generic[S]):
    """The state of one in-memory object, changed only through declared events.

    The owner calls :meth:`fire` at its single state-changing chokepoint.  Listeners observe
    every change after it happened; a listener that raises is logged and never undoes the change
    or stops the other listeners.
    """

    __slots__ = ("_lifecycle", "_listeners", "_machine", "_model")

    def __init__(
        self,
        lifecycle: Lifecycle[S],
        moves: Sequence[Transition[S]] | None,
        initial: S,
        on_change: Listener[S] | None,
    ) -> None:
        self._lifecycle = lifecycle
        self._model = _Model()
        self._listeners: list[Listener[S]] = [] if on_change is None else [on_change]
        if moves is None:
            # Table-driven (Lifecycle.track): fire() moves the model itself.
            self._machine: Machine | None = None
            self._model.state = initial
            return
        self._machine = Machine(
            model=self._model,
            states=lifecycle.state_type,
            transitions=[
                {"trigger": t.event, "source": list(t.sources), "dest": t.target} for t in moves
            ],
            initial=initial,
            auto_transitions=False,
            ignore_invalid_triggers=False,
        )

    @property
    def lifecycle(self) -> Lifecycle[S]:
        """The declaration this machine was built from."""
        return self._lifecycle

    @property
    def state(self) -> S:
        """The current state."""
        state: S = self._model.state
        return state

    @property
    def finished(self) -> bool:
        """True once a terminal state has been reached (no move can leave it)."""
        return self._lifecycle.is_terminal(self.state)

    def can(self, event: str) -> bool:
        """True when ``event`` is legal from the current state; never raises."""
        return self._lifecycle.can(self.state, event)

    def fire(self, event: str) -> S:
        """Move to the state ``event`` leads to from the current one and return it.

        Raises :class:`InvalidTransition` (the state is unchanged) when the lifecycle does not
        allow ``event`` now.  Listeners run after the change.
        """
        before = self.state
        target = self._lifecycle.target(before, event)  # raises the descriptive InvalidTransition
        if self._machine is None:
            self._model.state = target
        else:
            try:
                self._model.trigger(event)
            except MachineError as exc:  # pragma: no cover - the table and machine share a source
                raise InvalidTransition(self._lifecycle.name, before, event) from exc
        after = self.state
        for listener in tuple(self._listeners):
            try:
                listener(before, after, event)
            except Exception:
                log.exception(
                    "%s listener failed on %s -> %s (%s); the change stands",
                    self._lifecycle.name,
                    before.value,
                    after.value,
                    event,
                )
        return after

    def subscribe(self, listener: Listener[S]) -> Callable[[], None]:
        """Call ``listener(from_state, to_state, event)`` after every change.

        Returns a function that unsubscribes it (safe to call twice).
        """
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def __repr__(self) -> str:
        return f"<StateMachine {self._lifecycle.name}: {self.state.value}>"

"""The error hierarchy: every error statecore raises says who is to blame.

* :class:`InvalidTransition` -- the caller asked for a move its lifecycle forbids.
* :class:`StaleState` -- the caller lost a compare-and-set to a concurrent writer.
* :class:`StoreError` -- the storage driver failed (the cause is chained with ``from``).
* :class:`DeclarationError` -- a lifecycle declaration is inconsistent (a programming error,
  raised at import time, never at run time).

Errors that are also a misuse of a value subclass the fitting builtin (``ValueError``) so that
callers who do not know statecore still catch them sensibly.
"""

from __future__ import annotations

__all__ = [
    "DeclarationError",
    "InvalidTransition",
    "StaleState",
    "StatecoreError",
    "StoreError",
    "UnknownEntity",
]


class StatecoreError(Exception):
    """Base class of every error raised by statecore, its stores and its relay."""


class DeclarationError(StatecoreError, ValueError):
    """A lifecycle declaration is invalid; the message names the offending state or event."""

    def __init__(self, lifecycle: str, problem: str) -> None:
        self.lifecycle = lifecycle
        self.problem = problem
        super().__init__(f"lifecycle {lifecycle!r}: {problem}")

    def __reduce__(self) -> tuple[type[DeclarationError], tuple[str, str]]:
        return (type(self), (self.lifecycle, self.problem))


class InvalidTransition(StatecoreError, ValueError):
    """The lifecycle does not allow ``event`` from ``state``; nothing was changed.

    ``state`` is the state the entity was in (``None`` for an entity that does not exist yet),
    ``event`` the event that was refused.  Fix the caller: retrying the same move cannot succeed.
    """

    def __init__(
        self,
        lifecycle: str,
        state: object,
        event: object,
        detail: str = "",
    ) -> None:
        self.lifecycle = lifecycle
        self.state = state
        self.event = event
        shown_state = "(none)" if state is None else repr(_plain(state))
        message = f"{lifecycle}: event {_plain(event)!r} is not allowed from state {shown_state}"
        if detail:
            message = f"{message} ({detail})"
        self.detail = detail
        super().__init__(message)

    def __reduce__(self) -> tuple[type[InvalidTransition], tuple[str, object, object, str]]:
        return (type(self), (self.lifecycle, self.state, self.event, self.detail))


class StaleState(StatecoreError):
    """A guarded write matched nothing because a concurrent writer changed the entity first.

    The caller's view is out of date: re-read the entity and decide again.  ``entity_id`` names
    the entity, ``expected`` what the caller believed (state and/or fence).
    """

    def __init__(self, entity_id: str, expected: str, actual: str = "") -> None:
        self.entity_id = entity_id
        self.expected = expected
        self.actual = actual
        message = f"{entity_id}: expected {expected}"
        if actual:
            message = f"{message}, found {actual}"
        super().__init__(f"{message} (a concurrent writer won)")

    def __reduce__(self) -> tuple[type[StaleState], tuple[str, str, str]]:
        return (type(self), (self.entity_id, self.expected, self.actual))


class UnknownEntity(StatecoreError, LookupError):
    """No entity with this id exists (never created, or already pruned); nothing was changed."""

    def __init__(self, kind: str, entity_id: object) -> None:
        self.kind = kind
        self.entity_id = entity_id
        super().__init__(f"{kind} {entity_id!r} does not exist")

    def __reduce__(self) -> tuple[type[UnknownEntity], tuple[str, object]]:
        return (type(self), (self.kind, self.entity_id))


class StoreError(StatecoreError):
    """The store's driver failed (I/O, corruption, lock timeout); the cause is ``__cause__``.

    Nothing was committed by the operation that raised it.
    """


def _plain(value: object) -> object:
    """Show an Enum member by its value so messages read ``'pending'``, not ``<S.PENDING: ...>``."""
    inner = getattr(value, "value", value)
    return inner if isinstance(inner, str | int) else value

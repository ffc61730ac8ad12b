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
    "MigrationError",
    "StaleState",
    "StaleVersion",
    "StatecoreError",
    "StoreError",
    "StoreIdentityChanged",
    "StoreOutcomeUnknown",
    "StoreTimeout",
    "StoreUnreachable",
    "UnknownEntity",
    "UnknownKind",
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

    Nothing was committed by the operation that raised it (except for
    :class:`StoreOutcomeUnknown`, which says so).
    """


class StoreUnreachable(StoreError):
    """The store's server could not be reached (nothing listening, shutting down, refusing
    connections) within the store's bounded retries; nothing was written.  The store keeps
    trying to reconnect: call again later, no restart needed."""


class StoreTimeout(StoreError):
    """The server did not finish the statement within the store's bound (its statement or
    lock timeout); the server cancelled it and the transaction was rolled back: nothing was
    written.  Call again later, or raise the bound."""


class StoreOutcomeUnknown(StoreError):
    """The connection was lost while a transaction was being committed, and the store could
    not learn from the server whether it committed.  The write may or may not have been kept:
    do not repeat it as if it had failed -- re-read the entity (its state and fence say which)
    and decide again.  ``what`` names the operation."""

    def __init__(self, what: str, detail: str = "") -> None:
        self.what = what
        self.detail = detail
        message = f"{what}: the commit's outcome is unknown (the connection was lost during it)"
        super().__init__(f"{message}; {detail}" if detail else message)

    def __reduce__(self) -> tuple[type[StoreOutcomeUnknown], tuple[str, str]]:
        return (type(self), (self.what, self.detail))


class StoreIdentityChanged(StoreError):
    """The server at the store's address is not the database cluster the store's data was
    written on: its ``system_identifier`` (``pg_control_system()``) is ``found``, the store
    recorded ``recorded`` (a backup restored, a new cluster at the same address, a failover to
    an unrelated server).  The store refuses every write from then on, so that nothing is
    re-sent as if still owed.  An operator must check which server is right; if the data was
    really restored from a backup of this store, reopen it with
    ``PostgresStore(..., adopt_system_identifier=found)`` to record the new identifier."""

    def __init__(self, where: str, recorded: int, found: int) -> None:
        self.where = where
        self.recorded = recorded
        self.found = found
        super().__init__(
            f"{where}: the server's system identifier is {found}, but this store's data was "
            f"written on the cluster with system identifier {recorded}: refusing every write. "
            "Check that the store points at the right server; if its data was restored from a "
            f"backup, reopen it with adopt_system_identifier={found} to record the new one"
        )

    def __reduce__(self) -> tuple[type[StoreIdentityChanged], tuple[str, int, int]]:
        return (type(self), (self.where, self.recorded, self.found))


def _plain(value: object) -> object:
    """Show an Enum member by its value so messages read ``'pending'``, not ``<S.PENDING: ...>``."""
    inner = getattr(value, "value", value)
    return inner if isinstance(inner, str | int) else value


class MigrationError(StatecoreError, ValueError):
    """A store holds rows of an older version of a lifecycle that the registered version cannot
    map: ``states`` (persisted values) are neither states of ``to_version`` nor mapped by its
    migration from ``from_version``.  Nothing was written; declare where those states go."""

    def __init__(
        self, lifecycle: str, from_version: int, to_version: int, states: tuple[str, ...], why: str
    ) -> None:
        self.lifecycle = lifecycle
        self.from_version = from_version
        self.to_version = to_version
        self.states = states
        self.why = why
        shown = ", ".join(repr(s) for s in states)
        super().__init__(
            f"lifecycle {lifecycle!r}: cannot migrate version {from_version} to {to_version}: "
            f"states {shown} are not states of version {to_version} and {why}"
        )

    def __reduce__(
        self,
    ) -> tuple[type[MigrationError], tuple[str, int, int, tuple[str, ...], str]]:
        return (
            type(self),
            (self.lifecycle, self.from_version, self.to_version, self.states, self.why),
        )


class StaleVersion(StoreError):
    """The store holds a newer version of a lifecycle than this process declares (another
    process registered it and migrated the rows): this process must not write states the new
    version does not know.  Nothing was written; run the new declaration."""

    def __init__(self, lifecycle: str, ours: int, stored: int, detail: str = "") -> None:
        self.lifecycle = lifecycle
        self.ours = ours
        self.stored = stored
        self.detail = detail
        message = (
            f"lifecycle {lifecycle!r}: this process declares version {ours}, the store holds "
            f"version {stored}"
        )
        super().__init__(f"{message} ({detail})" if detail else message)

    def __reduce__(self) -> tuple[type[StaleVersion], tuple[str, int, int, str]]:
        return (type(self), (self.lifecycle, self.ours, self.stored, self.detail))


class UnknownKind(StatecoreError, LookupError):
    """No entity kind of this name is declared where it was looked for (the installed
    packages' ``statecore.kinds`` entry points, or a store's catalog); nothing was changed."""

    def __init__(self, name: object, known: tuple[str, ...] = ()) -> None:
        self.name = name
        self.known = known
        shown = f"; known: {', '.join(known)}" if known else ""
        super().__init__(f"no entity kind named {name!r} is declared{shown}")

    def __reduce__(self) -> tuple[type[UnknownKind], tuple[object, tuple[str, ...]]]:
        return (type(self), (self.name, self.known))

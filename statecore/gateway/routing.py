"""Routing of late results: where a completion that outlived its turn must be delivered.

Durable async work (a delegation) captures a :class:`RoutingOrigin` when it is dispatched: the
platform, chat, thread, user and tenant scope it came from, the chat's session key and the
session that was live at the time (the *pinned* session).  When the work completes -- possibly
after a restart, possibly hours later -- :func:`resolve_route` decides, from the sessions as they
are *now*, whether the completion is delivered and into which session.

There is exactly **one** resolver.  The gateway asks it before acknowledging a completion and
again inside the delivery pipeline; because both questions go through the same function over the
same state, the two answers cannot drift apart (a completion acknowledged as deliverable and then
silently dropped by the pipeline is the bug this module exists to make impossible).

The decision, in order:

1. the store cannot be read -> ``retry``;
2. the pinned session is missing -> ``terminal``;
3. the pinned session is live -> ``deliver`` into it;
4. it ended at a user boundary (:data:`USER_BOUNDARY_END_REASONS`) -> ``terminal``: the user
   closed that conversation on purpose;
5. it ended by compression -> judge its compression successor the same way (a live successor
   receives the completion); ``retry`` while the successor cannot be found;
6. it ended for any other reason (idle, timeout, agent close, none recorded, ...) -> ``deliver``
   into the chat's current session, ``retry`` while the chat has no live session.

Every rule that decides a route lives in this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import attrs

__all__ = [
    "CHAT_TYPES",
    "COMPRESSION_END_REASON",
    "USER_BOUNDARY_END_REASONS",
    "Route",
    "RouteVerdict",
    "RoutingOrigin",
    "SessionLike",
    "is_user_boundary",
    "resolve_route",
]

USER_BOUNDARY_END_REASONS: frozenset[str] = frozenset(
    {"session_reset", "user_exit", "session_switch", "new_session"}
)
"""End reasons that mean the *user* closed the conversation: late results for it are dropped."""

COMPRESSION_END_REASON = "compression"
"""The end reason of a session whose conversation continues in a compression successor."""

CHAT_TYPES: frozenset[str] = frozenset({"dm", "group", "channel", "thread"})
"""The chat types a routing origin may name."""

_FIELDS = (
    "session_key",
    "parent_session_id",
    "platform",
    "chat_id",
    "chat_type",
    "thread_id",
    "user_id",
    "user_name",
    "scope_id",
)
_REQUIRED = ("platform", "chat_id", "chat_type")


def is_user_boundary(reason: object) -> bool:
    """True when ``reason`` is a user-boundary end reason (reset, exit, switch, new session).

    None, ``""`` and any other value are not: a session that ended on its own (idle, timeout,
    agent close) or without a recorded reason does not close the user's conversation.
    """
    return isinstance(reason, str) and reason in USER_BOUNDARY_END_REASONS


# -- the routing origin ------------------------------------------------------------------------


def _required(name: str, value: object, *, platform_id: bool = False) -> str:
    if platform_id and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        expected = "a str or an int" if platform_id else "a str"
        raise TypeError(
            f"routing origin field {name!r} must be {expected}, not {type(value).__name__}"
        )
    if not value:
        raise ValueError(f"routing origin field {name!r} must not be empty")
    return value


def _optional(name: str, value: object, *, platform_id: bool = False) -> str | None:
    # An empty string carries no route (an empty thread id is no thread): it is stored as None.
    if value is None or value == "":
        return None
    return _required(name, value, platform_id=platform_id)


@attrs.frozen(init=False)
class RoutingOrigin:
    """Where a piece of durable work came from, captured at dispatch and persisted with it.

    ``RoutingOrigin(platform=..., chat_id=..., chat_type=..., session_key=None,
    parent_session_id=None, thread_id=None, user_id=None, user_name=None, scope_id=None)``
    (keywords only).  ``platform``, ``chat_id`` and ``chat_type`` are required; ``chat_type``
    is one of :data:`CHAT_TYPES`.  Platform ids (``chat_id``, ``thread_id``, ``user_id``,
    ``scope_id``) may be given as ints and are kept as text; an empty optional field is None.
    Raises ``TypeError`` (wrong type) or ``ValueError`` (empty or unknown value) naming the
    field, so a corrupt origin is refused when it is built, never discovered at delivery.
    """

    session_key: str | None
    parent_session_id: str | None
    platform: str
    chat_id: str
    chat_type: str
    thread_id: str | None
    user_id: str | None
    user_name: str | None
    scope_id: str | None

    def __init__(
        self,
        *,
        platform: str,
        chat_id: str | int,
        chat_type: str,
        session_key: str | None = None,
        parent_session_id: str | None = None,
        thread_id: str | int | None = None,
        user_id: str | int | None = None,
        user_name: str | None = None,
        scope_id: str | int | None = None,
    ) -> None:
        kind = _required("chat_type", chat_type)
        if kind not in CHAT_TYPES:
            allowed = ", ".join(sorted(CHAT_TYPES))
            raise ValueError(
                f"routing origin field 'chat_type' must be one of {allowed}, not {kind!r}"
            )
        self.__attrs_init__(
            _optional("session_key", session_key),
            _optional("parent_session_id", parent_session_id),
            _required("platform", platform),
            _required("chat_id", chat_id, platform_id=True),
            kind,
            _optional("thread_id", thread_id, platform_id=True),
            _optional("user_id", user_id, platform_id=True),
            _optional("user_name", user_name),
            _optional("scope_id", scope_id, platform_id=True),
        )

    def to_dict(self) -> dict[str, str | None]:
        """Every field by name (None included): the persisted and wire form."""
        return {name: getattr(self, name) for name in _FIELDS}

    @classmethod
    def from_dict(cls, data: object) -> RoutingOrigin:
        """Rebuild an origin from :meth:`to_dict` output or any mapping carrying its fields
        (a completion event, for instance: keys that are not fields are ignored).

        Raises ``TypeError`` for a non-mapping or a field of the wrong type and ``ValueError``
        for a missing required field or an invalid value, each naming the field.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"a routing origin must be a mapping, not {type(data).__name__}")
        for name in _REQUIRED:
            if data.get(name) is None:
                raise ValueError(f"routing origin is missing required field {name!r}")
        values: dict[str, Any] = {name: data.get(name) for name in _FIELDS}
        return cls(**values)


# -- the resolver ------------------------------------------------------------------------------


@runtime_checkable
class SessionLike(Protocol):
    """What the resolver reads of a session: a ``Session`` record, or any object alike."""

    @property
    def session_id(self) -> str:
        """The session's id."""
        ...

    @property
    def ended(self) -> bool:
        """True once the session has ended."""
        ...

    @property
    def end_reason(self) -> str | None:
        """Why it ended (None while live, or when no reason was recorded)."""
        ...


_T = TypeVar("_T", bound=SessionLike)


class RouteVerdict(StrEnum):
    """What to do with a completion now."""

    DELIVER = "deliver"
    """Deliver into :attr:`Route.session`, then acknowledge."""
    TERMINAL = "terminal"
    """Never deliverable: acknowledge it as dropped, with the route's reason."""
    RETRY = "retry"
    """Not deliverable yet: keep it and ask again later."""


@attrs.frozen
class Route(Generic[_T]):
    """The resolver's answer: a verdict, the session to deliver into, and why.

    ``session`` is a live session exactly when the verdict is ``deliver``, and None otherwise
    (construction refuses anything else with ``ValueError``).  ``reason`` is a short,
    stable code (``pinned_live``, ``user_boundary:session_reset``, ``store_unavailable``, ...)
    fit for an audit entry.
    """

    verdict: RouteVerdict
    session: _T | None
    reason: str

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.verdict, RouteVerdict):
            raise TypeError(f"verdict must be a RouteVerdict, not {self.verdict!r}")
        if (self.verdict is RouteVerdict.DELIVER) != (self.session is not None):
            raise ValueError(
                f"a {self.verdict.value!r} route must "
                + ("name a session" if self.verdict is RouteVerdict.DELIVER else "not name one")
            )

    @property
    def session_id(self) -> str | None:
        """The id of the session to deliver into (None unless the verdict is deliver)."""
        return None if self.session is None else self.session.session_id


def resolve_route(
    pinned: _T | None,
    *,
    current: _T | None,
    successor: _T | None = None,
    store_available: bool = True,
) -> Route[_T]:
    """THE resolver: where a completion pinned to ``pinned`` goes now (see the module docs).

    ``pinned`` is the session the work was dispatched from as it is now (None when it no longer
    exists), ``current`` the chat's current session (None when there is none), ``successor``
    the session a compression-ended pin continues in (the end of its compression chain; None
    while it cannot be found).  Pure: reads only its arguments and never raises for any
    combination of them.  Next: deliver into ``route.session`` and acknowledge; drop and
    acknowledge on ``terminal``; keep the completion and ask again on ``retry``.
    """
    if not store_available:
        return Route(RouteVerdict.RETRY, None, "store_unavailable")
    if pinned is None:
        return Route(RouteVerdict.TERMINAL, None, "pinned_missing")
    if not pinned.ended:
        return Route(RouteVerdict.DELIVER, pinned, "pinned_live")
    return _after_end(pinned, current, successor)


def _after_end(ended: _T, current: _T | None, successor: _T | None) -> Route[_T]:
    """Route a completion whose session ``ended``; a compression successor is judged exactly
    as the pin would be (live: deliver there; ended: by its own end reason)."""
    reason = ended.end_reason
    if is_user_boundary(reason):
        return Route(RouteVerdict.TERMINAL, None, f"user_boundary:{reason}")
    if reason == COMPRESSION_END_REASON:
        if successor is None or successor.session_id == ended.session_id:
            return Route(RouteVerdict.RETRY, None, "compression_successor_missing")
        if not successor.ended:
            return Route(RouteVerdict.DELIVER, successor, "compression_successor")
        # The successor has ended as well; its own successor is not known here.
        return _after_end(successor, current, None)
    if current is None or current.ended:
        return Route(RouteVerdict.RETRY, None, "no_live_current_session")
    return Route(RouteVerdict.DELIVER, current, "retargeted_to_current")

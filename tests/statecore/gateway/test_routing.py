"""Tests for statecore.gateway.routing: the routing origin and THE one resolver of late results.

Pure tests: sessions are small stand-ins with the attributes the resolver reads.  The
store-backed uses of the resolver (sessions and delegations persisted in both stores) are pinned
in test_sessions.py and test_delegations.py.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statecore.gateway.routing import (
    CHAT_TYPES,
    COMPRESSION_END_REASON,
    USER_BOUNDARY_END_REASONS,
    Route,
    RouteVerdict,
    RoutingOrigin,
    SessionLike,
    is_user_boundary,
    resolve_route,
)

V = RouteVerdict
NON_BOUNDARY_REASONS = ["idle", "idle_timeout", "timeout", None, "", "agent_close", "cron_complete"]


@attrs.frozen
class FakeSession:
    """A session as the resolver sees it."""

    session_id: str
    ended: bool = False
    end_reason: str | None = None


def live(sid: str) -> FakeSession:
    """A live session."""
    return FakeSession(sid)


def ended(sid: str, reason: str | None) -> FakeSession:
    """A session that ended with ``reason``."""
    return FakeSession(sid, True, reason)


def full_origin(**overrides: Any) -> RoutingOrigin:
    """A scoped group-chat origin with every field set."""
    values: dict[str, Any] = {
        "session_key": "agent:main:discord:group:C123:U9",
        "parent_session_id": "sess-p",
        "platform": "discord",
        "chat_id": "C123",
        "chat_type": "group",
        "thread_id": "T5",
        "user_id": "U9",
        "user_name": "Ada",
        "scope_id": "G777",
    }
    values.update(overrides)
    return RoutingOrigin(**values)


# -- constants ---------------------------------------------------------------------------------


def test_user_boundary_reasons_are_exactly_the_four_user_actions() -> None:
    """The user-boundary set is reset, exit, switch and new session, nothing else."""
    assert frozenset({"session_reset", "user_exit", "session_switch", "new_session"}) == (
        USER_BOUNDARY_END_REASONS
    )
    assert COMPRESSION_END_REASON not in USER_BOUNDARY_END_REASONS
    assert frozenset({"dm", "group", "channel", "thread"}) == CHAT_TYPES


@pytest.mark.parametrize("reason", sorted(USER_BOUNDARY_END_REASONS))
def test_is_user_boundary_true_for_each_boundary_reason(reason: str) -> None:
    """Each user-boundary reason is recognised as one."""
    assert is_user_boundary(reason)


@pytest.mark.parametrize("reason", [*NON_BOUNDARY_REASONS, COMPRESSION_END_REASON, 7, b"user_exit"])
def test_is_user_boundary_false_for_everything_else(reason: object) -> None:
    """Idle-like, missing, compression and non-text reasons are not user boundaries."""
    assert not is_user_boundary(reason)


# -- RoutingOrigin -----------------------------------------------------------------------------


def test_origin_keeps_every_field() -> None:
    """An origin built with every field keeps each one as given."""
    origin = full_origin()
    assert origin.to_dict() == {
        "session_key": "agent:main:discord:group:C123:U9",
        "parent_session_id": "sess-p",
        "platform": "discord",
        "chat_id": "C123",
        "chat_type": "group",
        "thread_id": "T5",
        "user_id": "U9",
        "user_name": "Ada",
        "scope_id": "G777",
    }


def test_origin_needs_only_platform_chat_and_chat_type() -> None:
    """Optional fields default to None."""
    origin = RoutingOrigin(platform="slack", chat_id="D42", chat_type="dm")
    assert origin.to_dict() == {
        "session_key": None,
        "parent_session_id": None,
        "platform": "slack",
        "chat_id": "D42",
        "chat_type": "dm",
        "thread_id": None,
        "user_id": None,
        "user_name": None,
        "scope_id": None,
    }


def test_origin_platform_ids_given_as_int_become_text() -> None:
    """chat_id, thread_id, user_id and scope_id given as ints are kept as their decimal text."""
    origin = RoutingOrigin(
        platform="telegram", chat_id=-1001, chat_type="group", thread_id=7, user_id=42, scope_id=9
    )
    assert (origin.chat_id, origin.thread_id, origin.user_id, origin.scope_id) == (
        "-1001",
        "7",
        "42",
        "9",
    )


def test_origin_empty_optional_field_is_none() -> None:
    """An empty optional field carries no route and is stored as None."""
    origin = RoutingOrigin(platform="slack", chat_id="C1", chat_type="channel", thread_id="")
    assert origin.thread_id is None


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("platform", "", ValueError),
        ("platform", 5, TypeError),
        ("chat_id", "", ValueError),
        ("chat_id", True, TypeError),
        ("chat_id", 1.5, TypeError),
        ("chat_type", "DM", ValueError),
        ("chat_type", "supergroup", ValueError),
        ("chat_type", 1, TypeError),
        ("thread_id", ["T"], TypeError),
        ("user_id", False, TypeError),
        ("user_name", 3, TypeError),
        ("scope_id", {"id": 1}, TypeError),
        ("session_key", 12, TypeError),
        ("parent_session_id", 12, TypeError),
    ],
)
def test_origin_refuses_bad_field_naming_it(field: str, value: object, error: type) -> None:
    """A field of the wrong type or value is refused with an error naming the field."""
    with pytest.raises(error, match=repr(field)):
        full_origin(**{field: value})


def test_origin_is_frozen() -> None:
    """An origin cannot be changed after construction."""
    origin = full_origin()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        origin.chat_id = "other"  # type: ignore[misc]


def test_from_dict_round_trips_to_dict() -> None:
    """from_dict(to_dict(o)) == o for a fully populated origin."""
    origin = full_origin()
    assert RoutingOrigin.from_dict(origin.to_dict()) == origin


@pytest.mark.parametrize("data", [None, "platform=slack", ["slack", "C1", "dm"], 42])
def test_from_dict_refuses_non_mapping(data: object) -> None:
    """Anything but a mapping is refused with TypeError."""
    with pytest.raises(TypeError, match="must be a mapping"):
        RoutingOrigin.from_dict(data)


@pytest.mark.parametrize("missing", ["platform", "chat_id", "chat_type"])
def test_from_dict_refuses_missing_required_field_naming_it(missing: str) -> None:
    """A mapping without (or with a None) required field is refused, naming the field."""
    data = full_origin().to_dict()
    del data[missing]
    with pytest.raises(ValueError, match=f"missing required field {missing!r}"):
        RoutingOrigin.from_dict(data)
    data[missing] = None
    with pytest.raises(ValueError, match=repr(missing)):
        RoutingOrigin.from_dict(data)


def test_from_dict_refuses_wrong_type_naming_field() -> None:
    """A wrongly typed field in a mapping is refused, naming the field."""
    data: dict[str, object] = {**full_origin().to_dict(), "user_id": ["U9"]}
    with pytest.raises(TypeError, match="'user_id'"):
        RoutingOrigin.from_dict(data)


def test_from_dict_ignores_unknown_keys() -> None:
    """Keys that are not origin fields (an event's type, result, ...) are ignored."""
    data = {**full_origin().to_dict(), "type": "delegation", "result": {"ok": True}}
    assert RoutingOrigin.from_dict(data) == full_origin()


def test_fallback_reconstruction_from_event_carries_scope_and_user() -> None:
    """An origin rebuilt from a bare completion event keeps scope_id and user_id."""
    event = {
        "session_key": "agent:main:discord:group:C123:U9",
        "platform": "discord",
        "chat_type": "group",
        "chat_id": "C123",
        "user_id": "U9",
        "scope_id": "G777",
        "type": "async_delegation",
    }
    origin = RoutingOrigin.from_dict(event)
    assert (origin.scope_id, origin.user_id) == ("G777", "U9")


def test_fallback_reconstruction_without_scope_still_routes() -> None:
    """An event without scope_id still rebuilds an origin (scope None, user kept)."""
    event = {
        "session_key": "agent:main:slack:dm:D42",
        "platform": "slack",
        "chat_type": "dm",
        "chat_id": "D42",
        "user_id": "U1",
        "type": "async_delegation",
    }
    origin = RoutingOrigin.from_dict(event)
    assert origin.scope_id is None
    assert origin.user_id == "U1"


_text = st.text(min_size=1, max_size=12)
_ident = st.one_of(_text, st.integers(-(10**12), 10**12))


@settings(max_examples=150, deadline=None)
@given(
    platform=_text,
    chat_id=_ident,
    chat_type=st.sampled_from(sorted(CHAT_TYPES)),
    optional=st.fixed_dictionaries(
        {},
        optional={
            "session_key": st.one_of(st.none(), _text),
            "parent_session_id": st.one_of(st.none(), _text),
            "thread_id": st.one_of(st.none(), _ident),
            "user_id": st.one_of(st.none(), _ident),
            "user_name": st.one_of(st.none(), st.text(max_size=12)),
            "scope_id": st.one_of(st.none(), _ident),
        },
    ),
)
def test_from_dict_round_trip_property(
    platform: str, chat_id: str | int, chat_type: str, optional: dict[str, Any]
) -> None:
    """Every valid origin survives to_dict/from_dict unchanged, and to_dict is idempotent."""
    origin = RoutingOrigin(platform=platform, chat_id=chat_id, chat_type=chat_type, **optional)
    again = RoutingOrigin.from_dict(origin.to_dict())
    assert again == origin
    assert again.to_dict() == origin.to_dict()


# -- Route -------------------------------------------------------------------------------------


def test_route_deliver_needs_a_session() -> None:
    """A deliver route without a session cannot be built."""
    with pytest.raises(ValueError, match="name a session"):
        Route(V.DELIVER, None, "x")


@pytest.mark.parametrize("verdict", [V.TERMINAL, V.RETRY])
def test_route_terminal_and_retry_name_no_session(verdict: RouteVerdict) -> None:
    """Terminal and retry routes never carry a session."""
    with pytest.raises(ValueError, match="not name one"):
        Route(verdict, live("s"), "x")


def test_route_refuses_a_plain_string_verdict() -> None:
    """The verdict is the enum, never a bare string."""
    with pytest.raises(TypeError, match="RouteVerdict"):
        Route("deliver", live("s"), "x")  # type: ignore[arg-type]


def test_fake_session_satisfies_the_session_protocol() -> None:
    """Any object with session_id, ended and end_reason is a SessionLike."""
    assert isinstance(live("s"), SessionLike)


# -- resolve_route: every case -----------------------------------------------------------------


def test_pinned_live_delivers_into_pinned() -> None:
    """A live pinned session receives the completion, whatever the current session is."""
    pinned = live("p")
    route = resolve_route(pinned, current=live("c"))
    assert (route.verdict, route.session, route.reason) == (V.DELIVER, pinned, "pinned_live")
    assert route.session_id == "p"


def test_pinned_missing_is_terminal() -> None:
    """A pinned session that no longer exists makes the completion terminal."""
    route = resolve_route(None, current=live("c"))
    assert (route.verdict, route.session, route.reason) == (V.TERMINAL, None, "pinned_missing")
    assert route.session_id is None


@pytest.mark.parametrize("reason", NON_BOUNDARY_REASONS)
def test_non_boundary_end_retargets_to_current(reason: str | None) -> None:
    """A pin ended for a non-boundary reason (idle, timeout, none, ...) delivers into current."""
    current = live("c")
    route = resolve_route(ended("p", reason), current=current)
    assert route.verdict is V.DELIVER
    assert route.session is current
    assert route.reason == "retargeted_to_current"


@pytest.mark.parametrize("reason", NON_BOUNDARY_REASONS)
def test_non_boundary_end_without_live_current_retries(reason: str | None) -> None:
    """With no live current session to retarget to, the completion waits (retry)."""
    for current in (None, ended("c", "idle")):
        route = resolve_route(ended("p", reason), current=current)
        assert (route.verdict, route.session) == (V.RETRY, None)
        assert route.reason == "no_live_current_session"


@pytest.mark.parametrize("reason", sorted(USER_BOUNDARY_END_REASONS))
def test_user_boundary_end_is_terminal(reason: str) -> None:
    """A pin the user closed (reset, exit, switch, new session) drops the completion."""
    route = resolve_route(ended("p", reason), current=live("c"), successor=live("s"))
    assert (route.verdict, route.session) == (V.TERMINAL, None)
    assert route.reason == f"user_boundary:{reason}"


def test_compression_delivers_into_live_successor() -> None:
    """A pin ended by compression delivers into its live successor, not the current session."""
    successor = live("s")
    route = resolve_route(ended("p", "compression"), current=live("c"), successor=successor)
    assert (route.verdict, route.session) == (V.DELIVER, successor)
    assert route.reason == "compression_successor"


def test_compression_without_successor_retries() -> None:
    """While the compression successor cannot be found the completion waits (retry)."""
    route = resolve_route(ended("p", "compression"), current=live("c"))
    assert (route.verdict, route.session) == (V.RETRY, None)
    assert route.reason == "compression_successor_missing"


def test_compression_successor_that_is_the_pin_itself_retries() -> None:
    """A successor link pointing back at the pin is no successor (retry, no loop)."""
    pin = ended("p", "compression")
    route = resolve_route(pin, current=live("c"), successor=pin)
    assert route.verdict is V.RETRY


@pytest.mark.parametrize("reason", sorted(USER_BOUNDARY_END_REASONS))
def test_compression_successor_closed_by_user_is_terminal(reason: str) -> None:
    """A successor the user closed is judged as the pin would be: terminal."""
    route = resolve_route(
        ended("p", "compression"), current=live("c"), successor=ended("s", reason)
    )
    assert (route.verdict, route.session) == (V.TERMINAL, None)


@pytest.mark.parametrize("reason", NON_BOUNDARY_REASONS)
def test_compression_successor_ended_idle_retargets_to_current(reason: str | None) -> None:
    """A successor that ended on its own hands the completion to the current session."""
    current = live("c")
    route = resolve_route(ended("p", "compression"), current=current, successor=ended("s", reason))
    assert (route.verdict, route.session) == (V.DELIVER, current)


def test_compression_successor_itself_compressed_without_link_retries() -> None:
    """A compressed successor whose own successor is unknown means retry."""
    route = resolve_route(
        ended("p", "compression"), current=live("c"), successor=ended("s", "compression")
    )
    assert route.verdict is V.RETRY


@pytest.mark.parametrize(
    "pinned",
    [None, live("p"), ended("p", "idle"), ended("p", "user_exit"), ended("p", "compression")],
)
def test_store_unavailable_always_retries(pinned: FakeSession | None) -> None:
    """When the store cannot be read the verdict is retry, whatever the sessions look like."""
    route = resolve_route(pinned, current=live("c"), successor=live("s"), store_available=False)
    assert (route.verdict, route.session, route.reason) == (V.RETRY, None, "store_unavailable")


# -- resolve_route: properties -----------------------------------------------------------------

_REASONS = st.sampled_from(
    [*NON_BOUNDARY_REASONS, *sorted(USER_BOUNDARY_END_REASONS), "compression", "crashed"]
)


def _session(sid: str) -> st.SearchStrategy[FakeSession | None]:
    return st.one_of(
        st.none(),
        st.just(live(sid)),
        _REASONS.map(lambda reason: ended(sid, reason)),
    )


@settings(max_examples=400, deadline=None)
@given(
    pinned=_session("p"),
    current=_session("c"),
    successor=_session("s"),
    store_available=st.booleans(),
)
def test_resolver_verdicts_are_coherent(
    pinned: FakeSession | None,
    current: FakeSession | None,
    successor: FakeSession | None,
    store_available: bool,
) -> None:
    """Deliver always names a live session among the candidates; terminal only ever comes from
    a missing pin or a user boundary; asking twice gives the same answer."""
    kwargs: dict[str, Any] = {
        "current": current,
        "successor": successor,
        "store_available": store_available,
    }
    route = resolve_route(pinned, **kwargs)
    assert resolve_route(pinned, **kwargs) == route  # before acknowledging == in the pipeline
    if route.verdict is V.DELIVER:
        assert route.session is not None
        assert not route.session.ended
        assert route.session in (pinned, current, successor)
    else:
        assert route.session is None
    if not store_available:
        assert route.verdict is V.RETRY
    if route.verdict is V.TERMINAL:
        boundary_in_chain = pinned is not None and (
            is_user_boundary(pinned.end_reason)
            or (
                pinned.end_reason == "compression"
                and successor is not None
                and successor.ended
                and is_user_boundary(successor.end_reason)
            )
        )
        assert pinned is None or boundary_in_chain
    if pinned is not None and store_available and pinned.ended:
        reason = pinned.end_reason
        if reason not in USER_BOUNDARY_END_REASONS and reason != "compression":
            # The seed's invariant: a non-boundary end never drops the completion.
            assert route.verdict is not V.TERMINAL

"""Lifecycle declarations: validation at definition time and the compiled table."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

import pytest
import transitions

from relay.client.lifecycle import TRANSPORT, TransportState
from statecore import (
    OBLIGATION,
    DeclarationError,
    InvalidTransition,
    Lifecycle,
    ObligationState,
    Transition,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


class Door(enum.StrEnum):
    OPEN = "open"
    SHUT = "shut"
    LOCKED = "locked"
    GONE = "gone"


class Other(enum.StrEnum):
    OPEN = "open"


def door(**overrides: Any) -> Lifecycle[Door]:
    """Build a small valid lifecycle, with any argument overridden."""
    args: dict[str, Any] = {
        "initial": Door.OPEN,
        "terminal": (Door.GONE,),
        "transitions": (
            Transition("build", None, Door.OPEN),
            Transition("shut", Door.OPEN, Door.SHUT),
            Transition("lift", Door.SHUT, Door.OPEN),
            Transition("lock", Door.SHUT, Door.LOCKED),
            Transition("unlock", Door.LOCKED, Door.SHUT),
            Transition("demolish", (Door.OPEN, Door.SHUT, Door.LOCKED), Door.GONE),
            Transition("sweep", Door.GONE, None),
        ),
    }
    args.update(overrides)
    return Lifecycle("door", Door, **args)


def with_transitions(*extra: Transition[Any], drop: str | None = None) -> tuple[Any, ...]:
    base = [t for t in door().transitions if t.event != drop]
    return (*base, *extra)


# -- the valid declaration --------------------------------------------------------------------


def test_valid_declaration_exposes_its_parts() -> None:
    """A valid declaration reports its states, initial, terminal set and events in order."""
    lc = door()
    assert lc.name == "door"
    assert lc.states == (Door.OPEN, Door.SHUT, Door.LOCKED, Door.GONE)
    assert lc.initial is Door.OPEN
    assert lc.terminal == frozenset({Door.GONE})
    assert lc.events == ("build", "shut", "lift", "lock", "unlock", "demolish", "sweep")
    assert lc.state_type is Door


def test_target_follows_the_table() -> None:
    """target() returns the declared destination for every legal (state, event)."""
    lc = door()
    assert lc.target(Door.OPEN, "shut") is Door.SHUT
    assert lc.target(Door.LOCKED, "demolish") is Door.GONE
    assert lc.target(None, "build") is Door.OPEN
    assert lc.table[(Door.SHUT, "lock")] is Door.LOCKED
    assert (Door.GONE, "sweep") not in lc.table


def test_sources_lists_every_allowed_state() -> None:
    """sources(event) is the guard set a store puts in its conditional write."""
    lc = door()
    assert lc.sources("demolish") == frozenset({Door.OPEN, Door.SHUT, Door.LOCKED})
    assert lc.sources("build") == frozenset()
    assert lc.sources("sweep") == frozenset({Door.GONE})


def test_target_refuses_a_forbidden_move_naming_state_and_event() -> None:
    """A move the lifecycle forbids raises InvalidTransition naming the state and the event."""
    with pytest.raises(InvalidTransition) as info:
        door().target(Door.OPEN, "lock")
    err = info.value
    assert err.state is Door.OPEN
    assert err.event == "lock"
    assert "'lock'" in str(err)
    assert "'open'" in str(err)
    assert "allowed from: shut" in str(err)
    assert isinstance(err, ValueError)


@pytest.mark.parametrize(
    ("state", "event", "detail"),
    [
        (Door.OPEN, "fly", "undeclared event"),
        ("ajar", "shut", "undeclared state"),
        (Door.GONE, "sweep", "removes the entity"),
        (Door.OPEN, "build", "creation events start from none"),
        (None, "shut", "allowed from"),
        (["unhashable"], "shut", "undeclared state"),
        (Door.OPEN, ["unhashable"], "undeclared event"),
        (Door.OPEN, None, "undeclared event"),
    ],
)
def test_target_never_raises_key_error(state: Any, event: Any, detail: str) -> None:
    """Unknown or unhashable states and events give InvalidTransition, never KeyError."""
    with pytest.raises(InvalidTransition, match=detail):
        door().target(state, event)


def test_target_accepts_a_state_value_and_returns_the_member() -> None:
    """A persisted state value is looked up like its member; the answer is always the member."""
    lc = door()
    assert lc.target("shut", "lock") is Door.LOCKED  # type: ignore[arg-type]
    assert lc.can("open", "shut")  # type: ignore[arg-type]
    # A refused persisted value is explained like its member, not as an undeclared state.
    with pytest.raises(InvalidTransition, match="allowed from: shut"):
        lc.target("open", "lock")  # type: ignore[arg-type]


def test_can_and_allowed_events_never_raise() -> None:
    """can() and allowed_events() answer for any input without raising."""
    lc = door()
    assert lc.can(Door.SHUT, "lock")
    assert not lc.can(Door.OPEN, "lock")
    assert not lc.can(Door.GONE, "sweep")
    assert not lc.can(["x"], "lock")  # type: ignore[arg-type]
    assert lc.allowed_events(Door.SHUT) == ("lift", "lock", "demolish")
    assert lc.allowed_events(None) == ("build",)
    assert lc.allowed_events(Door.GONE) == ()
    assert lc.allowed_events(["x"]) == ()  # type: ignore[arg-type]


def test_removal_checks() -> None:
    """Removal events are recognised and only allowed from their terminal sources."""
    lc = door()
    assert lc.removes("sweep")
    assert not lc.removes("shut")
    assert lc.creates("build")
    assert not lc.creates("shut")
    lc.check_removal(Door.GONE, "sweep")
    with pytest.raises(InvalidTransition):
        lc.check_removal(Door.OPEN, "sweep")
    with pytest.raises(InvalidTransition):
        lc.check_removal(Door.GONE, "shut")


def test_declaration_builds_no_transitions_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Declaring a lifecycle and using its table never creates a transitions model."""
    created: list[object] = []
    original = transitions.Machine.add_model

    def counting(self: transitions.Machine, model: Any, initial: Any = None) -> None:
        created.append(model)
        original(self, model, initial)

    monkeypatch.setattr(transitions.Machine, "add_model", counting)
    lc = door()
    for _ in range(1000):
        lc.target(Door.OPEN, "shut")
        lc.sources("demolish")
    assert created == []
    lc.attach()
    assert len(created) == 1


# -- validation failures ----------------------------------------------------------------------


def _fails(match: str, **overrides: Any) -> DeclarationError:
    with pytest.raises(DeclarationError, match=match) as info:
        door(**overrides)
    assert info.value.lifecycle == "door"
    return info.value


def test_rejects_non_enum_states() -> None:
    """States must be an Enum class."""
    with pytest.raises(DeclarationError, match="must be an Enum class"):
        Lifecycle("x", dict, initial=Door.OPEN, terminal=(), transitions=())  # type: ignore[type-var]


def test_rejects_an_empty_enum() -> None:
    """An Enum with no members declares no states."""

    class Empty(enum.Enum):
        pass

    with pytest.raises(DeclarationError, match="declares no states"):
        Lifecycle("x", Empty, initial=None, terminal=(), transitions=())  # type: ignore[arg-type]


def test_rejects_non_identifier_state_values() -> None:
    """State values must be identifier strings: they are persisted and drawn."""

    class Bad(enum.Enum):
        A = 1
        B = "b"

    with pytest.raises(DeclarationError, match="identifier string value"):
        Lifecycle("x", Bad, initial=Bad.A, terminal=(Bad.B,), transitions=())


def test_rejects_a_bad_name() -> None:
    """The lifecycle name must be an identifier."""
    with pytest.raises(DeclarationError, match="valid identifier"):
        Lifecycle("two words", Door, initial=Door.OPEN, terminal=(Door.GONE,), transitions=())


def test_rejects_an_undeclared_initial_state() -> None:
    """The initial state must be a member of the states Enum."""
    _fails("initial state 'open' is not a declared state", initial=Other.OPEN)


def test_rejects_an_undeclared_terminal_state() -> None:
    """Terminal states must be members of the states Enum."""
    _fails("terminal state 'open' is not a declared state", terminal=(Other.OPEN,))


def test_rejects_no_terminal_state() -> None:
    """At least one terminal state must be declared."""
    _fails("at least one terminal state", terminal=())


def test_rejects_a_terminal_initial_state() -> None:
    """The initial state cannot be terminal."""
    _fails("cannot also be terminal", terminal=(Door.OPEN, Door.GONE))


def test_rejects_an_undeclared_state_in_a_transition() -> None:
    """A transition naming a state outside the Enum names that state."""
    _fails(
        "event 'slam' uses undeclared state 'open'",
        transitions=with_transitions(Transition("slam", Other.OPEN, Door.SHUT)),
    )


@pytest.mark.parametrize("event", ["two words", "1st", "", "class", "to_open", "is_x", "may_go"])
def test_rejects_invalid_event_names(event: str) -> None:
    """Event names must be identifiers, not keywords, not shadowing generated attributes."""
    _fails("event name", transitions=with_transitions(Transition(event, Door.OPEN, Door.SHUT)))


@pytest.mark.parametrize("event", ["trigger", "state", "_private"])
def test_rejects_reserved_event_names(event: str) -> None:
    """Names the machine's model uses itself are reserved."""
    _fails("reserved", transitions=with_transitions(Transition(event, Door.OPEN, Door.SHUT)))


def test_rejects_a_duplicate_transition() -> None:
    """The same (source, event) declared twice is a duplicate."""
    _fails(
        "duplicate transition: event 'shut' from 'open' is declared twice",
        transitions=with_transitions(Transition("shut", Door.OPEN, Door.SHUT)),
    )


def test_rejects_an_ambiguous_transition() -> None:
    """The same (source, event) with two targets is ambiguous."""
    _fails(
        "ambiguous transition",
        transitions=with_transitions(Transition("shut", Door.OPEN, Door.LOCKED)),
    )


def test_rejects_a_duplicate_creation() -> None:
    """A creation event declared twice is a duplicate."""
    _fails(
        "duplicate transition: event 'build' from \\(new\\)",
        transitions=with_transitions(Transition("build", None, Door.OPEN)),
    )


def test_rejects_a_second_initial_state() -> None:
    """A creation into a state other than the initial one is a second initial state."""
    _fails(
        "a second initial state",
        transitions=with_transitions(Transition("spawn", None, Door.SHUT)),
    )


def test_rejects_a_terminal_state_with_an_outgoing_transition() -> None:
    """No move may leave a terminal state."""
    _fails(
        "terminal state 'gone' has an outgoing transition 'rebuild'",
        transitions=with_transitions(Transition("rebuild", Door.GONE, Door.OPEN)),
    )


def test_rejects_removal_of_an_unfinished_entity() -> None:
    """A removal from a non-terminal state could drop owed work: refused."""
    _fails(
        "removes entities in non-terminal state 'shut'",
        transitions=with_transitions(Transition("sweep", Door.SHUT, None), drop="sweep"),
    )


def test_rejects_an_event_of_mixed_kinds() -> None:
    """One event cannot be both a move and a removal."""
    _fails(
        "declared both as a move and a remove",
        transitions=with_transitions(Transition("shut", Door.GONE, None)),
    )


def test_rejects_a_transition_with_neither_source_nor_target() -> None:
    """A transition from nothing to nothing is meaningless."""
    _fails("neither source nor target", transitions=(Transition("noop", None, None),))


def test_rejects_no_transitions() -> None:
    """A lifecycle needs transitions."""
    _fails("no transitions declared", transitions=())


def test_rejects_non_transition_items() -> None:
    """Only Transition values are accepted."""
    _fails("is not a Transition", transitions=(("shut", Door.OPEN, Door.SHUT),))


def test_rejects_an_unreachable_state() -> None:
    """Every declared state must be reachable from the initial state."""
    _fails(
        "unreachable from the initial state 'open': 'locked'",
        transitions=with_transitions(drop="lock"),
    )


def test_rejects_a_state_with_no_path_to_a_terminal_state() -> None:
    """Every non-terminal state must be able to finish."""
    trapped = (
        Transition("shut", Door.OPEN, Door.SHUT),
        Transition("lock", Door.SHUT, Door.LOCKED),
        Transition("demolish", Door.OPEN, Door.GONE),
    )
    _fails("no path to a terminal state from: 'shut', 'locked'", transitions=trapped)


def test_transition_rejects_a_string_source() -> None:
    """A plain string source is refused instead of being read as a list of letters."""
    with pytest.raises(TypeError, match="source must be a state"):
        Transition("shut", "open", Door.SHUT)  # type: ignore[arg-type]


def test_transition_rejects_an_empty_source_list() -> None:
    """An empty source list is refused; creations say source=None."""
    with pytest.raises(TypeError, match="empty sources"):
        Transition("shut", (), Door.SHUT)


def test_transition_is_frozen_data() -> None:
    """Transitions are immutable values that compare by content."""
    a = Transition("go", [Door.OPEN, Door.SHUT, Door.OPEN], Door.GONE)
    assert a.sources == (Door.OPEN, Door.SHUT)
    assert a == Transition("go", (Door.OPEN, Door.SHUT), Door.GONE)
    assert not a.creates
    assert not a.removes
    with pytest.raises(AttributeError):
        a.event = "other"  # type: ignore[misc]


# -- the declared lifecycles ------------------------------------------------------------------


def test_obligation_matches_the_ledger_design() -> None:
    """OBLIGATION declares exactly the states and moves of the delivery ledger."""
    o = ObligationState
    assert [s.value for s in o] == ["pending", "attempting", "failed", "delivered", "abandoned"]
    assert OBLIGATION.initial is o.PENDING
    assert OBLIGATION.terminal == {o.DELIVERED, o.ABANDONED}
    assert OBLIGATION.events == (
        "record",
        "attempt",
        "deliver",
        "fail",
        "release",
        "claim",
        "abandon",
        "prune",
    )
    owed = {o.PENDING, o.ATTEMPTING, o.FAILED}
    assert OBLIGATION.sources("claim") == owed
    assert OBLIGATION.sources("abandon") == owed
    assert OBLIGATION.sources("prune") == {o.DELIVERED, o.ABANDONED}
    assert OBLIGATION.target(None, "record") is o.PENDING
    assert OBLIGATION.target(o.PENDING, "attempt") is o.ATTEMPTING
    assert OBLIGATION.target(o.ATTEMPTING, "release") is o.FAILED
    # The strict lifecycle: a send that began is marked attempting first.
    for event in ("deliver", "fail", "release"):
        assert OBLIGATION.sources(event) == {o.ATTEMPTING}
    # Nothing owed can be pruned; nothing settled can be claimed.
    for state in owed:
        assert not OBLIGATION.can(state, "prune")
    assert not OBLIGATION.can(o.DELIVERED, "claim")


def test_transport_matches_the_transport_design() -> None:
    """TRANSPORT declares the transport's ten states with closed and revoked terminal."""
    t = TransportState
    assert [s.value for s in t] == [
        "new",
        "connecting",
        "handshaking",
        "connected",
        "going_idle",
        "dormant",
        "reconnecting",
        "closing",
        "closed",
        "revoked",
    ]
    assert TRANSPORT.initial is t.NEW
    assert TRANSPORT.terminal == {t.CLOSED, t.REVOKED}
    # A deliberate close is possible from every non-terminal state except closing itself.
    assert TRANSPORT.sources("close") == set(t) - {t.CLOSING, t.CLOSED, t.REVOKED}
    # Dormancy is not the terminal path: a dormant transport re-dials.
    assert TRANSPORT.target(t.DORMANT, "dial") is t.CONNECTING
    assert TRANSPORT.target(t.GOING_IDLE, "resume") is t.CONNECTED
    assert not TRANSPORT.can(t.CLOSING, "dial")
    assert not TRANSPORT.can(t.REVOKED, "dial")


@pytest.mark.parametrize("lifecycle", [OBLIGATION, TRANSPORT], ids=lambda lc: lc.name)
def test_mermaid_is_pinned(lifecycle: Lifecycle[Any]) -> None:
    """The Mermaid diagram generated from each declaration matches its golden file."""
    assert lifecycle.to_mermaid() == (GOLDEN / f"{lifecycle.name}.mmd").read_text()


@pytest.mark.parametrize("lifecycle", [OBLIGATION, TRANSPORT], ids=lambda lc: lc.name)
def test_dot_is_pinned(lifecycle: Lifecycle[Any]) -> None:
    """The DOT diagram generated from each declaration matches its golden file."""
    assert lifecycle.to_dot() == (GOLDEN / f"{lifecycle.name}.dot").read_text()


@pytest.mark.parametrize("lifecycle", [OBLIGATION, TRANSPORT], ids=lambda lc: lc.name)
def test_diagrams_draw_every_declared_move(lifecycle: Lifecycle[Any]) -> None:
    """Every (source, event) of the table appears as an edge in Mermaid and DOT."""
    mermaid, dot = lifecycle.to_mermaid(), lifecycle.to_dot()
    for (state, event), target in lifecycle.table.items():
        assert f"    {state.value} --> {target.value} : {event}\n" in mermaid
        assert f'"{state.value}" -> "{target.value}" [label="{event}"]' in dot


def test_mermaid_without_creation_event_starts_at_initial() -> None:
    """A lifecycle with no creation event draws the start arrow into its initial state."""
    text = TRANSPORT.to_mermaid()
    assert text.startswith("stateDiagram-v2\n    [*] --> new\n")
    assert "    closed --> [*]\n" in text
    assert "    revoked --> [*]\n" in text


def test_describe_lists_every_transition() -> None:
    """The text table has one row per declared transition."""
    text = door().describe()
    assert text.splitlines()[0] == "door: initial open; terminal gone"
    assert "build     (new)" in text
    assert "(removed)" in text
    assert len(text.splitlines()) == 3 + len(door().transitions)

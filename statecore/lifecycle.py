"""Lifecycle declarations: one declaration per lifecycle, every other use derived from it.

A :class:`Lifecycle` is declared once, from an ``Enum`` of states and a sequence of
:class:`Transition` values.  From that single declaration statecore derives:

1. the **compiled table** (:meth:`Lifecycle.sources`, :meth:`Lifecycle.target`) that stores use
   to guard every persisted transition with one compare-and-set -- a dict lookup, no
   per-entity objects;
2. a live ``transitions`` machine for a long-lived in-memory object (:meth:`Lifecycle.attach`),
   e.g. a relay transport;
3. the diagrams (:meth:`Lifecycle.to_mermaid`, :meth:`Lifecycle.to_dot`) and the transition
   table (:meth:`Lifecycle.describe`);
4. validation at definition time: a bad declaration raises :class:`DeclarationError` when the
   module that declares it is imported, never later at run time.

Three kinds of transition exist.  A *creation* (no source) brings an entity into the initial
state, e.g. ``record``.  A *move* takes it from one of its source states to its target.  A
*removal* (no target) deletes an entity that has reached a terminal state, e.g. ``prune``;
removal from a non-terminal state is refused at declaration, so no lifecycle can declare a way to
silently drop an entity whose work is still owed.

Every rule that decides whether a move is legal lives in this module.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum
from types import MappingProxyType
from typing import Any, Generic, TypeVar

import attrs

from statecore.errors import DeclarationError, InvalidTransition
from statecore.machine import Listener, StateMachine
from statecore.timer import Timer, declared_timers
from statecore.versions import (
    Migration,
    declared_migrations,
    decode_state,
    migration_moves,
)

__all__ = ["Lifecycle", "Migration", "Timer", "Transition"]

S = TypeVar("S", bound=Enum)

# transitions generates these attributes on a model; an event of the same shape would shadow
# one of them on the machine's model.
_RESERVED_EVENTS = frozenset({"trigger", "state", "migrate"})  # migrate: migrations' entries
_RESERVED_PREFIXES = ("to_", "is_", "may_", "_")


@attrs.frozen(init=False)
class Transition(Generic[S]):
    """One declared transition, as data.

    ``Transition(event, source, target)`` with ``source`` a state or an iterable of states.
    ``source=None`` declares a *creation* (the entity comes into existence in ``target``, which
    must be the lifecycle's initial state); ``target=None`` declares a *removal* (the entity is
    deleted; every source must be terminal).  Transitions are validated by the
    :class:`Lifecycle` that receives them.

    ``after`` makes the move a *timer* (:mod:`statecore.timers`): it fires by itself once an
    entity has been in a source state that long since a write last put it there -- positive
    seconds, or the name of a numeric field holding them per row (None: no timer).
    """

    event: str
    sources: tuple[S, ...]
    target: S | None
    after: float | str | None = None

    def __init__(
        self,
        event: str,
        source: S | Iterable[S] | None,
        target: S | None,
        *,
        after: float | str | None = None,
    ) -> None:
        sources: tuple[S, ...] = _as_sources(event, source)
        self.__attrs_init__(event, sources, target, after)

    @property
    def creates(self) -> bool:
        """True for a creation (no source state)."""
        return not self.sources

    @property
    def removes(self) -> bool:
        """True for a removal (no target state)."""
        return self.target is None


class Lifecycle(Generic[S]):
    """A validated lifecycle declaration and everything derived from it.

    ``Lifecycle(name, states, initial=..., terminal=..., transitions=...)`` raises
    :class:`DeclarationError` naming the problem when the declaration is inconsistent:
    undeclared states, invalid or duplicate events, a second initial state, a terminal state with
    an outgoing move, an unreachable state, or a state with no path to a terminal state.

    Instances are immutable and cheap to query from any thread.

    The class is long because it is the one declaration everything else derives from: its
    checks at construction, the compiled table the stores and live machines consult, the live
    machines it attaches, and the diagrams drawn from it must never disagree, so they are
    computed in one place from the same validated fields.
    """

    __slots__ = (
        "_by_event",
        "_creations",
        "_events",
        "_initial",
        "_migrations",
        "_moves",
        "_name",
        "_next",
        "_removals",
        "_sources",
        "_state_type",
        "_states",
        "_table",
        "_terminal",
        "_timers",
        "_transitions",
        "_version",
        "description",
    )

    def __init__(
        self,
        name: str,
        states: type[S],
        *,
        initial: S,
        terminal: Iterable[S],
        transitions: Sequence[Transition[S]],
        description: str = "",
        version: int = 1,
        migrations: Iterable[Migration[S]] = (),
    ) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise DeclarationError(str(name), "the name must be a valid identifier")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise DeclarationError(name, f"the version must be an int >= 1, not {version!r}")
        self._version = version
        self._name = name
        self.description = description
        self._state_type = states
        self._states: tuple[S, ...] = _declared_states(name, states)
        self._initial = _member(name, states, initial, "initial state")
        self._terminal = frozenset(_member(name, states, s, "terminal state") for s in terminal)
        if not self._terminal:
            raise DeclarationError(name, "at least one terminal state must be declared")
        if self._initial in self._terminal:
            raise DeclarationError(
                name, f"the initial state {self._initial.value!r} cannot also be terminal"
            )
        self._transitions = tuple(transitions)
        kinds = self._check_transitions()
        self._events = tuple(kinds)
        self._next: dict[S | None, dict[str, S]] = {state: {} for state in self._states}
        self._next[None] = {}
        self._sources: dict[str, frozenset[S]] = {}
        self._creations: frozenset[str] = frozenset(e for e, k in kinds.items() if k == "create")
        self._removals: frozenset[str] = frozenset(e for e, k in kinds.items() if k == "remove")
        self._by_event: dict[str, tuple[Transition[S], ...]] = {}
        for t in self._transitions:
            self._by_event[t.event] = (*self._by_event.get(t.event, ()), t)
            self._sources[t.event] = self._sources.get(t.event, frozenset()) | set(t.sources)
            if t.target is None:
                continue
            for source in t.sources or (None,):
                self._next[source][t.event] = t.target
        self._table: Mapping[tuple[S, str], S] = MappingProxyType(
            {
                (state, event): target
                for state, moves in self._next.items()
                if state is not None
                for event, target in moves.items()
            }
        )
        self._moves: dict[str, Mapping[S, S]] = {
            event: MappingProxyType(
                {s: self._next[s][event] for s in self._sources[event] if event in self._next[s]}
            )
            for event in self._events
        }
        self._check_graph()
        self._timers: tuple[Timer[S], ...] = declared_timers(name, self._transitions)
        self._migrations: Mapping[int, Migration[S]] = declared_migrations(
            name, version, states, self._states, migrations
        )

    # -- the declaration ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The lifecycle's name (an identifier), used in messages, audit rows and diagrams."""
        return self._name

    @property
    def state_type(self) -> type[S]:
        """The ``Enum`` class of the states."""
        return self._state_type

    @property
    def states(self) -> tuple[S, ...]:
        """Every state, in the Enum's declaration order."""
        return self._states

    @property
    def initial(self) -> S:
        """The one state every entity starts in."""
        return self._initial

    @property
    def terminal(self) -> frozenset[S]:
        """States no move leaves."""
        return self._terminal

    @property
    def events(self) -> tuple[str, ...]:
        """Every event name, in declaration order."""
        return self._events

    @property
    def transitions(self) -> tuple[Transition[S], ...]:
        """The declared transitions, in declaration order."""
        return self._transitions

    @property
    def version(self) -> int:
        """The declaration's version (1 unless declared); see :attr:`migrations`."""
        return self._version

    @property
    def migrations(self) -> Mapping[int, Migration[S]]:
        """The declared migrations, by the version they migrate from (read-only)."""
        return self._migrations

    @property
    def timers(self) -> tuple[Timer[S], ...]:
        """Every declared timer, one per (source state, event), in declaration order."""
        return self._timers

    def timers_from(self, state: S) -> tuple[Timer[S], ...]:
        """The timers that run while an entity is in ``state``."""
        return tuple(t for t in self._timers if t.source is state)

    def decode(self, value: object) -> S:
        """The state a persisted value names: one of this version's, or the one an older
        version's value maps to through :attr:`migrations`; ``ValueError`` otherwise."""
        return decode_state(self, value)

    def migration_from(self, version: int, states: Iterable[str]) -> dict[str, S]:
        """Old value -> new state for each of ``states`` (of ``version``) that is not a state
        of this version.  Raises :class:`~statecore.errors.MigrationError` naming the states
        nothing maps, :class:`~statecore.errors.StaleVersion` for a newer ``version``."""
        return migration_moves(self, version, states)

    @property
    def table(self) -> Mapping[tuple[S, str], S]:
        """The compiled move table, ``(state, event) -> target`` (read-only)."""
        return self._table

    def __repr__(self) -> str:
        return f"<Lifecycle {self._name}: {len(self._states)} states, {len(self._events)} events>"

    # -- the compiled table ------------------------------------------------------------------

    def target(self, state: S | None, event: str) -> S:
        """Return the state ``event`` moves an entity in ``state`` to.

        ``state=None`` asks about a creation event (the entity does not exist yet).  For a
        ``str``-valued state type (a ``StrEnum``, whose members equal their values) a state's
        persisted value (``"pending"``) is accepted like the member; the answer is always the
        member.  Raises
        :class:`InvalidTransition` -- never ``KeyError`` -- when the lifecycle does not allow
        the move, when the state or event is undeclared, and for a removal event (a removal has
        no target state: check it with :meth:`removes` and :meth:`sources`).
        """
        try:
            return self._next[state][event]
        except (KeyError, TypeError):
            raise self._refusal(state, event) from None

    def sources(self, event: str) -> frozenset[S]:
        """Return the states ``event`` may start from (empty for a creation event).

        A store guards a persisted transition with ``state IN sources(event)``.  Raises
        :class:`InvalidTransition` for an undeclared event.
        """
        try:
            return self._sources[event]
        except (KeyError, TypeError):
            raise self._refusal(None, event) from None

    def moves(self, event: str) -> Mapping[S, S]:
        """``source -> target`` for every state ``event`` moves (empty for creations and
        removals).  Raises :class:`InvalidTransition` for an undeclared event."""
        try:
            return self._moves[event]
        except (KeyError, TypeError):
            raise self._refusal(None, event) from None

    def can(self, state: S | None, event: str) -> bool:
        """True when ``event`` is a legal move or creation from ``state``; never raises."""
        try:
            return event in self._next[state]
        except (KeyError, TypeError):
            return False

    def allowed_events(self, state: S | None) -> tuple[str, ...]:
        """The move (or, for ``None``, creation) events legal from ``state``, declaration order."""
        try:
            moves = self._next[state]
        except (KeyError, TypeError):
            return ()
        return tuple(moves)

    def creates(self, event: str) -> bool:
        """True when ``event`` is a creation event."""
        return event in self._creations

    def removes(self, event: str) -> bool:
        """True when ``event`` is a removal event (its sources are terminal states)."""
        return event in self._removals

    def is_terminal(self, state: S) -> bool:
        """True when no move leaves ``state``."""
        return state in self._terminal

    def check_removal(self, state: S, event: str) -> None:
        """Raise :class:`InvalidTransition` unless ``event`` may remove an entity in ``state``."""
        if event not in self._removals or state not in self._sources[event]:
            raise self._refusal(state, event)

    # -- the live machine --------------------------------------------------------------------

    def attach(
        self,
        *,
        initial: S | None = None,
        on_change: Listener[S] | None = None,
        on_enter: Mapping[S, Listener[S]] | None = None,
        on_exit: Mapping[S, Listener[S]] | None = None,
    ) -> StateMachine[S]:
        """Attach a real ``transitions`` machine for one long-lived in-memory object.

        The owner keeps the returned :class:`StateMachine` and drives it with
        :meth:`StateMachine.fire`; the ``transitions`` model is its only engine.
        ``on_enter[state]`` / ``on_exit[state]`` (``callback(from_state, to_state, event)``)
        hang what entering or leaving a state must do on the machine itself;
        ``on_change(from_state, to_state, event)`` runs after every change.  Never use this
        per persisted row (a machine is costly to build); rows use :meth:`target` instead.
        Raises :class:`InvalidTransition` when ``initial`` or a callback's key is not a
        declared state, ``TypeError`` for a callback that is not callable.
        """
        start = self._initial if initial is None else initial
        if not isinstance(start, self._state_type):
            raise InvalidTransition(self._name, start, "attach", "undeclared initial state")
        moves = [t for t in self._transitions if t.sources and t.target is not None]
        return StateMachine(
            self, moves, start, on_change=on_change, on_enter=on_enter, on_exit=on_exit
        )

    def track(
        self,
        *,
        initial: S | None = None,
        on_change: Listener[S] | None = None,
        on_enter: Mapping[S, Listener[S]] | None = None,
        on_exit: Mapping[S, Listener[S]] | None = None,
    ) -> StateMachine[S]:
        """A :class:`StateMachine` driven by the compiled table alone, for in-memory objects
        that come in large numbers (a server's connections).

        The same API and the same guarantees as :meth:`attach` -- only declared events move
        it, an illegal one raises :class:`InvalidTransition` and changes nothing, enter and
        exit callbacks and listeners run after each change -- without building a
        ``transitions`` model (see benchmarks/README.md for what that saves).  Raises as
        :meth:`attach`.
        """
        start = self._initial if initial is None else initial
        if not isinstance(start, self._state_type):
            raise InvalidTransition(self._name, start, "track", "undeclared initial state")
        return StateMachine(
            self, None, start, on_change=on_change, on_enter=on_enter, on_exit=on_exit
        )

    # -- derived text ------------------------------------------------------------------------

    def to_mermaid(self) -> str:
        """Return the lifecycle as a Mermaid ``stateDiagram-v2`` (deterministic, golden-tested).

        Creations are drawn from ``[*]``; removals, and terminal states without one, to ``[*]``.
        """
        lines = ["stateDiagram-v2"]
        if not self._creations:
            lines.append(f"    [*] --> {self._initial.value}")
        for t in self._transitions:
            if t.creates:
                lines.append(f"    [*] --> {_value(t.target)} : {t.event}")
            for source in t.sources:
                lines.append(f"    {source.value} --> {_end(t.target)} : {t.event}")
        removed = {s for e in self._removals for s in self._sources[e]}
        lines.extend(
            f"    {s.value} --> [*]" for s in self._states if s in self._terminal - removed
        )
        return "\n".join(lines) + "\n"

    def to_dot(self) -> str:
        """Return the lifecycle as Graphviz DOT text (terminal states drawn double-bordered)."""
        lines = [
            f"digraph {self._name} {{",
            "    rankdir=LR;",
            '    node [shape=box, style=rounded, fontname="Helvetica"];',
            '    "[*]" [shape=point];',
        ]
        if self._removals:
            lines.append('    "[removed]" [shape=doublecircle, label="", width=0.15];')
        for state in self._states:
            extra = ", peripheries=2" if state in self._terminal else ""
            lines.append(f'    "{state.value}" [label="{state.value}"{extra}];')
        if not self._creations:
            lines.append(f'    "[*]" -> "{self._initial.value}";')
        for t in self._transitions:
            target = "[removed]" if t.target is None else t.target.value
            for source in t.sources or (None,):
                start = "[*]" if source is None else source.value
                lines.append(f'    "{start}" -> "{target}" [label="{t.event}"];')
        lines.append("}")
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        """Return a plain-text table of every transition (event, from, to), declaration order."""
        rows = [
            (
                t.event,
                ", ".join(s.value for s in t.sources) if t.sources else "(new)",
                "(removed)" if t.target is None else t.target.value,
            )
            for t in self._transitions
        ]
        header = ("event", "from", "to")
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
        terminal = ", ".join(s.value for s in self._states if s in self._terminal)
        out = [f"{self._name}: initial {self._initial.value}; terminal {terminal}"]
        for row in [header, tuple("-" * w for w in widths), *rows]:
            out.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
        return "\n".join(line.rstrip() for line in out) + "\n"

    # -- validation --------------------------------------------------------------------------

    def _refusal(self, state: object, event: object) -> InvalidTransition:
        """Build the most helpful InvalidTransition for a refused (state, event)."""
        if not isinstance(event, str) or event not in self._sources:
            return InvalidTransition(self._name, state, event, "undeclared event")
        if state is not None and not self._knows(state):
            return InvalidTransition(self._name, state, event, "undeclared state")
        if event in self._removals:
            return InvalidTransition(
                self._name, state, event, f"{event!r} removes the entity; it has no target state"
            )
        if event in self._creations:
            return InvalidTransition(self._name, state, event, "creation events start from none")
        allowed = ", ".join(s.value for s in self._states if s in self._sources[event])
        return InvalidTransition(self._name, state, event, f"allowed from: {allowed}")

    def _knows(self, state: object) -> bool:
        """Whether :meth:`target` looks ``state`` up as a declared state (the same test)."""
        try:
            return state in self._next
        except TypeError:  # unhashable: never a state
            return False

    def _check_transitions(self) -> dict[str, str]:
        """Validate each transition; return every event's kind, in declaration order."""
        name, states = self._name, self._state_type
        kinds: dict[str, str] = {}
        seen: dict[tuple[S | None, str], S | None] = {}
        for t in self._transitions:
            if not isinstance(t, Transition):
                raise DeclarationError(name, f"{t!r} is not a Transition")
            _check_event_name(name, t.event)
            for state in (*t.sources, t.target):
                if state is not None and not _is_state(state, states):
                    raise DeclarationError(
                        name, f"event {t.event!r} uses undeclared state {_show(state)}"
                    )
            kind = "create" if t.creates else "remove" if t.removes else "move"
            if kind == "create" and t.removes:
                raise DeclarationError(name, f"event {t.event!r} has neither source nor target")
            if kinds.setdefault(t.event, kind) != kind:
                raise DeclarationError(
                    name, f"event {t.event!r} is declared both as a {kinds[t.event]} and a {kind}"
                )
            if kind == "create" and t.target is not self._initial:
                raise DeclarationError(
                    name,
                    f"event {t.event!r} creates entities in {_show(t.target)}, a second initial "
                    f"state (the initial state is {self._initial.value!r})",
                )
            for source in t.sources or (None,):
                if source is not None and source in self._terminal and t.after is not None:
                    raise DeclarationError(
                        name,
                        f"timer {t.event!r} on terminal state {source.value!r}: nothing "
                        "leaves a terminal state, so no timer can run there",
                    )
                if source is not None and source in self._terminal and kind == "move":
                    raise DeclarationError(
                        name,
                        f"terminal state {source.value!r} has an outgoing transition {t.event!r}",
                    )
                if source is not None and source not in self._terminal and kind == "remove":
                    raise DeclarationError(
                        name,
                        f"event {t.event!r} removes entities in non-terminal state "
                        f"{source.value!r}; only finished entities may be removed",
                    )
                key = (source, t.event)
                if key in seen:
                    where = "(new)" if source is None else repr(source.value)
                    problem = (
                        "duplicate transition"
                        if seen[key] is t.target
                        else f"ambiguous transition (to {_show(seen[key])} and {_show(t.target)})"
                    )
                    raise DeclarationError(
                        name, f"{problem}: event {t.event!r} from {where} is declared twice"
                    )
                seen[key] = t.target
        if not kinds:
            raise DeclarationError(name, "no transitions declared")
        return kinds

    def _check_graph(self) -> None:
        """Every state reachable from the initial one; every non-terminal one can finish."""
        reachable = _closure({self._initial}, lambda s: self._next[s].values())
        missing = [s.value for s in self._states if s not in reachable]
        if missing:
            raise DeclarationError(
                self._name,
                f"unreachable from the initial state {self._initial.value!r}: "
                + ", ".join(repr(m) for m in missing),
            )
        predecessors: dict[S, set[S]] = {s: set() for s in self._states}
        for source, moves in self._next.items():
            for target in moves.values():
                if source is not None:
                    predecessors[target].add(source)
        finishing = _closure(set(self._terminal), lambda s: predecessors[s])
        stuck = [s.value for s in self._states if s not in finishing]
        if stuck:
            raise DeclarationError(
                self._name,
                "no path to a terminal state from: " + ", ".join(repr(s) for s in stuck),
            )


def _as_sources(event: str, source: object) -> tuple[Any, ...]:
    if source is None:
        return ()
    if isinstance(source, Enum):
        return (source,)
    if isinstance(source, str) or not isinstance(source, Iterable):
        # A plain string is iterable; never read 'pending' as seven one-letter states.
        raise TypeError(f"transition {event!r}: source must be a state or states, not {source!r}")
    sources = tuple(dict.fromkeys(source))
    if not sources:
        raise TypeError(f"transition {event!r}: empty sources; use source=None for a creation")
    return sources


def _declared_states(name: str, states: object) -> tuple[S, ...]:
    if not (isinstance(states, type) and issubclass(states, Enum)):
        raise DeclarationError(name, f"states must be an Enum class, not {states!r}")
    members: tuple[S, ...] = tuple(states)
    if not members:
        raise DeclarationError(name, f"{states.__name__} declares no states")
    for member in members:
        if not isinstance(member.value, str) or not member.value.isidentifier():
            raise DeclarationError(
                name,
                f"state {member.name} must have an identifier string value (it is persisted "
                f"and drawn), not {member.value!r}",
            )
    return members


def _member(name: str, states: type[S], value: object, role: str) -> S:
    if not isinstance(value, states):
        raise DeclarationError(name, f"{role} {_show(value)} is not a declared state")
    return value


def _is_state(value: object, states: type[Enum]) -> bool:
    # Identity through the Enum type: a str-valued member of another Enum, or the raw string
    # 'pending', compares equal to a state but is not one.
    return isinstance(value, states)


def _check_event_name(name: str, event: object) -> None:
    if not isinstance(event, str) or not event.isidentifier() or keyword.iskeyword(event):
        raise DeclarationError(name, f"event name {event!r} is not a valid identifier")
    if event in _RESERVED_EVENTS or event.startswith(_RESERVED_PREFIXES):
        raise DeclarationError(
            name,
            f"event name {event!r} is reserved (it would shadow a generated machine attribute)",
        )


def _closure(start: set[S], step: Callable[[S], Iterable[S]]) -> set[S]:
    seen = set(start)
    todo = list(start)
    while todo:
        for nxt in step(todo.pop()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _show(state: object) -> str:
    return repr(state.value) if isinstance(state, Enum) else repr(state)


def _value(state: Enum | None) -> str:
    assert state is not None
    return str(state.value)


def _end(state: Enum | None) -> str:
    return "[*]" if state is None else str(state.value)

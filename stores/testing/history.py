"""A checker of the audit log any store keeps, for any entity kind: was every row's history a
legal one?

Point it at a quiesced store (nothing writing while it reads) and a kind registered there::

    from stores.testing.history import OBLIGATION_OWNERSHIP, check_store
    report = check_store(store, OBLIGATION_KIND, ownership=OBLIGATION_OWNERSHIP)
    assert report.ok, "\\n".join(report.problems)

Each row is read (a page at a time, by id) with its audit entries (``store.history``), and
:func:`check_walk` checks them against the kind's declaration:

* **walk** (``bad_walks``): the first entry is a creation (no source, a creation event of the
  lifecycle, into the state that event creates); every later entry starts where the previous one
  ended, its event is declared from that source and leads to the recorded target; nothing but a
  ``migrate`` entry follows a terminal state; the last entry ends in the row's current state.
  A ``migrate`` entry (a newer lifecycle version moving the row, ``statecore.versions``) may
  move any state, a terminal one too, to any state.  Entries written before a row's last
  ``migrate`` entry were written under an older declaration the checker does not hold: of them
  only the chaining (each source the previous target) and the creation are checked.
* **fence** (``bad_fences``): every write of a row -- its creation (fence 0), each transition,
  each bulk move, each migration -- bumps its fence by exactly one and appends exactly one
  audit entry, in one transaction.  The audit does not record fences, so "fences strictly
  increasing" is checked in the only form the audit can show it: entry *k* (0-based) is the
  write that set fence *k*, and the row's current fence is its number of entries minus one.  A
  write without its entry, an entry without its write, or an entry lost all break it.  (A table
  from before the store kept fences, upgraded in place, starts every old row at fence 0 with
  an older audit: such rows fail this check and are not the checker's subject.)
* **settle** (``double_settles``): a row enters a terminal state at most once -- for the
  obligation, ``deliver`` into delivered or ``abandon`` into abandoned, never both, never
  twice.  A second entry into a terminal state after one is counted here (not as a bad walk).
* **fenced-off owner** (``fenced_writes``, only with an :class:`Ownership` rule): the audit
  records who wrote each entry (``Audit.owner``).  The row's *holder* is the owner of its
  latest creation or takeover entry (``Ownership.takeovers``: for the obligation, ``claim``).
  An entry of a fenced event (``Ownership.fenced``: for the obligation, ``attempt``,
  ``deliver``, ``fail`` and ``release``) must be written by the holder: after a claim by B, a
  write of A is accepted only once A has claimed again.  Events in neither set (the
  obligation's ``abandon``, decided by any sweep entitled to, and ``migrate``) are not
  constrained and do not change the holder.  Owners compare as recorded strings; None (no
  owner recorded) is a value like any other.

:func:`check_catalog` checks every kind a store's catalog lists, each as declared there.
Counts are exact; the problem texts kept are bounded (``max_problems``), and memory is bounded
by one page of rows plus one row's history, so a store of many rows may be checked.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from enum import Enum
from typing import Any, Literal

import attrs

from statecore.catalog import declaration_json, kind_from_declaration
from statecore.entity import EntityKind
from statecore.kinds import known_kinds
from statecore.store import KindCatalog, Row, Store, TransitionRecord, gt

__all__ = [
    "MIGRATE_EVENT",
    "OBLIGATION_OWNERSHIP",
    "HistoryReport",
    "Ownership",
    "Problem",
    "ProblemKind",
    "check_catalog",
    "check_histories",
    "check_store",
    "check_walk",
    "rows_with_histories",
]

MIGRATE_EVENT = "migrate"
"""The event of a migration's audit entries (``stores._versions.MIGRATE_EVENT``)."""

ProblemKind = Literal["bad_walk", "bad_fence", "double_settle", "fenced_write"]
"""What a :class:`Problem` breaks (see the module docs)."""


def _events(events: Iterable[str]) -> frozenset[str]:
    if isinstance(events, str):
        raise TypeError(f"events must be a collection of event names, not the str {events!r}")
    return frozenset(events)


@attrs.frozen
class Ownership:
    """Which events change a row's holder and which only the holder may write (see the module
    docs).  Creation events always make their writer the holder."""

    takeovers: frozenset[str] = attrs.field(converter=_events)
    fenced: frozenset[str] = attrs.field(converter=_events)

    def __attrs_post_init__(self) -> None:
        both = self.takeovers & self.fenced
        if both:
            raise ValueError(f"events both take over and are fenced: {sorted(both)}")


OBLIGATION_OWNERSHIP = Ownership(
    takeovers=frozenset({"claim"}),
    fenced=frozenset({"attempt", "deliver", "fail", "release"}),
)
"""The delivery obligation's rule: a sweep's ``claim`` takes the row; the sends and settles
(``attempt``, ``deliver``, ``fail``, ``release``) are fenced to the claimant; ``abandon`` is
decided by whichever sweep (or operator) is entitled to."""


@attrs.frozen
class Problem:
    """One broken rule: which row, which audit entry (0-based, or the row itself: -1)."""

    kind: ProblemKind
    entity_id: str
    index: int
    message: str

    def __str__(self) -> str:
        where = "row" if self.index < 0 else f"entry {self.index}"
        return f"{self.kind}: {self.entity_id} {where}: {self.message}"


@attrs.frozen
class HistoryReport:
    """What :func:`check_histories` found over one kind: exact counts, the first problems."""

    kind: str
    rows: int
    entries: int
    bad_walks: int
    bad_fences: int
    double_settles: int
    fenced_writes: int
    problems: tuple[str, ...]
    """The first ``max_problems`` problems, as text (the counts are exact)."""

    @property
    def ok(self) -> bool:
        """True when no rule was broken."""
        return not (self.bad_walks or self.bad_fences or self.double_settles or self.fenced_writes)


def _show(state: Enum | None) -> str:
    return "(none)" if state is None else str(state.value)


def check_walk(
    kind: EntityKind[Any],
    entity_id: str,
    entries: Sequence[TransitionRecord],
    *,
    row: Row[Any] | None = None,
    ownership: Ownership | None = None,
) -> list[Problem]:
    """The problems of one row's audit ``entries`` (oldest first) against ``kind``; ``row``,
    when given, is the row as stored (its state and fence are checked against the entries).
    An empty list means the history is legal.  Raises nothing for any input."""
    lifecycle = kind.lifecycle
    problems: list[Problem] = []

    def bad(problem: ProblemKind, index: int, message: str) -> None:
        problems.append(Problem(problem, entity_id, index, message))

    if not entries:
        if row is not None:
            bad("bad_walk", -1, f"the row is in {_show(row.state)} with no audit entry")
        return problems
    # Entries before the last migrate were written under an older declaration.
    current_from = max((i for i, e in enumerate(entries) if e.event == MIGRATE_EVENT), default=0)
    holder: str | None = None
    settled = False  # entered a terminal state already (migrations keep it settled)
    for index, entry in enumerate(entries):
        source, target, event = entry.from_state, entry.to_state, entry.event
        if index == 0:
            if source is not None or not lifecycle.creates(event):
                bad(
                    "bad_walk",
                    0,
                    f"the first entry is {event!r} from {_show(source)}, not a creation",
                )
            elif index >= current_from and lifecycle.target(None, event) != target:
                bad(
                    "bad_walk", 0, f"{event!r} creates into {_show(target)}, not its declared state"
                )
            holder = entry.owner
            settled = lifecycle.is_terminal(target)
            continue
        previous = entries[index - 1].to_state
        if source != previous:
            bad("bad_walk", index, f"{event!r} starts in {_show(source)}, after {_show(previous)}")
        if event == MIGRATE_EVENT:
            settled = lifecycle.is_terminal(target)  # a migration may move a settled row
            continue
        if settled and lifecycle.is_terminal(target):
            bad("double_settle", index, f"{event!r} into {_show(target)} after it settled")
        elif settled:
            bad("bad_walk", index, f"{event!r} written after the terminal {_show(previous)}")
        elif source is None:
            bad("bad_walk", index, f"{event!r} is a second creation")
        elif index >= current_from:
            if not lifecycle.can(source, event):
                bad("bad_walk", index, f"{event!r} is not declared from {_show(source)}")
            elif lifecycle.target(source, event) != target:
                bad(
                    "bad_walk",
                    index,
                    f"{event!r} from {_show(source)} leads to "
                    f"{_show(lifecycle.target(source, event))}, not {_show(target)}",
                )
        settled = settled or lifecycle.is_terminal(target)
        if ownership is not None:
            if event in ownership.takeovers:
                holder = entry.owner
            elif event in ownership.fenced and entry.owner != holder:
                bad(
                    "fenced_write",
                    index,
                    f"{event!r} by {entry.owner!r} accepted while {holder!r} held the row",
                )
    if row is not None:
        last = entries[-1].to_state
        if row.state != last:
            bad(
                "bad_walk",
                -1,
                f"the row is in {_show(row.state)}, its history ends in {_show(last)}",
            )
        if row.fence != len(entries) - 1:
            bad(
                "bad_fence",
                -1,
                f"fence {row.fence} after {len(entries)} audit entries (expected "
                f"{len(entries) - 1}: every write bumps the fence once and appends one entry)",
            )
    return problems


def check_histories(
    kind: EntityKind[Any],
    histories: Iterable[tuple[str, Row[Any] | None, Sequence[TransitionRecord]]],
    *,
    ownership: Ownership | None = None,
    max_problems: int = 100,
) -> HistoryReport:
    """Check every ``(entity id, row or None, entries)`` of ``histories`` (consumed once, one
    at a time) with :func:`check_walk`; the report counts every problem and keeps the text of
    the first ``max_problems``.  Raises ``ValueError`` for a negative ``max_problems``, and
    whatever iterating ``histories`` raises."""
    if not isinstance(max_problems, int) or max_problems < 0:
        raise ValueError(f"max_problems must be a non-negative int, not {max_problems!r}")
    counts: dict[ProblemKind, int] = {
        "bad_walk": 0,
        "bad_fence": 0,
        "double_settle": 0,
        "fenced_write": 0,
    }
    kept: list[str] = []
    rows = entries = 0
    for entity_id, row, history in histories:
        rows += 1
        entries += len(history)
        for problem in check_walk(kind, entity_id, history, row=row, ownership=ownership):
            counts[problem.kind] += 1
            if len(kept) < max_problems:
                kept.append(f"{kind.name} {problem}")
    return HistoryReport(
        kind.name,
        rows,
        entries,
        counts["bad_walk"],
        counts["bad_fence"],
        counts["double_settle"],
        counts["fenced_write"],
        tuple(kept),
    )


def rows_with_histories(
    store: Store, kind: EntityKind[Any], *, page: int = 500
) -> Iterator[tuple[str, Row[Any], list[TransitionRecord]]]:
    """Every row of ``kind`` in ``store``, by id, with its audit entries: ``page`` rows read at
    a time (keyset by id), one history at a time.  Raises ``ValueError`` for a ``page`` below
    1 and whatever the store raises (``StoreError``, or ``KeyError`` for an unregistered
    kind)."""
    if not isinstance(page, int) or page < 1:
        raise ValueError(f"page must be a positive int, not {page!r}")
    last: str | None = None
    while True:
        where = None if last is None else {kind.id_field: gt(last)}
        rows = store.select(kind, where=where, order_by=kind.id_field, limit=page)
        for row in rows:
            yield row.id, row, store.history(kind, row.id)
        if len(rows) < page:
            return
        last = rows[-1].id


def check_store(
    store: Store,
    kind: EntityKind[Any],
    *,
    ownership: Ownership | None = None,
    page: int = 500,
    max_problems: int = 100,
) -> HistoryReport:
    """Check the audit of every row of ``kind`` in ``store`` (registered there; nothing may
    write meanwhile, or a row read before its history was extended is reported).  Read the
    report's ``ok`` and ``problems``.  Raises what :func:`rows_with_histories` raises."""
    return check_histories(
        kind,
        rows_with_histories(store, kind, page=page),
        ownership=ownership,
        max_problems=max_problems,
    )


def check_catalog(
    store: Store,
    *,
    kinds: Iterable[EntityKind[Any]] = (),
    ownership: Mapping[str, Ownership] | None = None,
    skip: Collection[str] = (),
    page: int = 500,
    max_problems: int = 100,
) -> list[HistoryReport]:
    """Check every kind ``store``'s catalog lists (but those named in ``skip``), each as the
    catalog declares it -- the declaration its rows were written under: the kind of ``kinds``
    or of :func:`statecore.kinds.known_kinds` with that very declaration, else one rebuilt
    from it (:func:`statecore.catalog.kind_from_declaration`), so that a kind this process
    cannot import is checked too -- registered on ``store`` first, as any process opening it
    does.  ``ownership`` maps kind names to their rule (default: the obligation's,
    :data:`OBLIGATION_OWNERSHIP`).  One report per kind, by name.  Raises ``TypeError`` for a
    store without a catalog, what the declarations raise (``DeclarationError``) and what
    :func:`check_store` raises."""
    if not isinstance(store, KindCatalog):
        raise TypeError(f"{type(store).__name__} keeps no catalog of kinds")
    rules = {"obligation": OBLIGATION_OWNERSHIP} if ownership is None else ownership
    declared = {k.name: k for k in known_kinds()}
    declared.update((k.name, k) for k in kinds)
    reports = []
    for record in store.catalog():
        if record.name in skip:
            continue
        kind = declared.get(record.name)
        if kind is None or declaration_json(kind) != record.declaration:
            kind = kind_from_declaration(record.declaration)
        store.register(kind)
        reports.append(
            check_store(
                store, kind, ownership=rules.get(kind.name), page=page, max_problems=max_problems
            )
        )
    return reports

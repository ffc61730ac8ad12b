"""``statecore kinds``: every entity kind a store holds, whatever package declared it.

The kinds come from the store's catalog (:class:`~statecore.store.KindCatalog`), each rebuilt
from its declaration (:func:`statecore.catalog.kind_from_declaration`), so a kind declared by
code this process never imported is listed, counted and drawn all the same.  A store without
a catalog is read for the installed kinds (:func:`statecore.kinds.known_kinds`) instead.

* ``statecore kinds`` -- each kind's name, lifecycle and version, its rows per state and its
  timers with how many rows each has running;
* ``statecore kinds show NAME`` -- the transition table, the Mermaid diagram, the counts per
  state and each timer with its next due time;
* ``statecore kinds rows NAME [--state S] [--limit N]`` -- its rows, by id;
* ``statecore kinds history NAME ID`` -- one row's audit entries, oldest first.

A name the store does not hold, a state its lifecycle does not declare or an id it has never
held is refused (exit status 2) naming what is known.  The reads here are used by the
dashboard too.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from statecore.catalog import declaration_json, kind_from_declaration
from statecore.cli.ledger import history_json
from statecore.cli.output import shorten, table, timestamp
from statecore.cli.plugin import EXIT_OK, CliError, Command, Context, add_leaf
from statecore.entity import EntityKind
from statecore.kinds import known_kinds
from statecore.store import KindCatalog, KindRecord, Row, Store, TimerStore
from statecore.timer import Timer

__all__ = [
    "DUE_COUNTED",
    "KINDS_COMMAND",
    "StoredKind",
    "kind_counts",
    "kind_of_record",
    "kind_summary",
    "rows_json",
    "store_kinds",
    "stored_kind",
    "timer_json",
    "transitions_json",
]

DUE_COUNTED = 1000
"""Due rows counted per timer at most (past it the count is a lower bound)."""
_DEFAULT_ROWS = 50
_CELL = 40


@attrs.frozen
class StoredKind:
    """One kind a store holds: the kind (rebuilt from the catalog's declaration, or the
    installed one), its lifecycle's version as registered and when it was first registered
    (None when the store keeps no catalog)."""

    kind: EntityKind[Any]
    version: int
    registered_at: float | None
    declaration: Mapping[str, Any]

    @property
    def name(self) -> str:
        """The kind's name."""
        return self.kind.name


def store_kinds(store: Store, *, declared: Iterable[EntityKind[Any]] = ()) -> list[StoredKind]:
    """Every kind ``store`` holds, by name, each registered with it (idempotent for the
    declaration it already holds): its catalog's records, each read as the kind ``declared``
    or installed (:func:`~statecore.kinds.known_kinds`) under its name when that has the same
    declaration, else as rebuilt from the record (a store object that was given a kind in
    this process is read only through that kind or an equal one: pass it as ``declared``);
    for a store without ``catalog()``, the ``declared`` and installed kinds, registered.
    Raises ``StoreError`` when the store cannot be read, ``DeclarationError`` for a catalog
    record that does not describe a kind."""
    ours = _ours(declared)
    found = []
    if isinstance(store, KindCatalog):
        for record in store.catalog():
            stored = kind_of_record(record, ours)
            store.register(stored.kind)
            found.append(stored)
    else:
        for kind in ours.values():
            store.register(kind)
            found.append(StoredKind(kind, kind.lifecycle.version, None, declaration_json(kind)))
    return sorted(found, key=lambda k: k.name)


def _ours(declared: Iterable[EntityKind[Any]]) -> dict[str, EntityKind[Any]]:
    ours: dict[str, EntityKind[Any]] = {}
    for kind in (*declared, *known_kinds()):
        ours.setdefault(kind.name, kind)
    return ours


def kind_of_record(
    record: KindRecord, declared: Mapping[str, EntityKind[Any]] | Iterable[EntityKind[Any]] = ()
) -> StoredKind:
    """A catalog ``record`` as a :class:`StoredKind`: the kind of its name among ``declared``
    (a mapping by name, or kinds; the installed ones too) when its declaration is the
    record's, else the kind rebuilt from the record (not registered: the caller registers
    it).  Raises ``DeclarationError`` for a record that does not describe a kind."""
    ours = dict(declared) if isinstance(declared, Mapping) else _ours(declared)
    same = ours.get(record.name)
    if same is None or declaration_json(same) != dict(record.declaration):
        same = kind_from_declaration(record.declaration)
    return StoredKind(same, record.version, record.registered_at, record.declaration)


def stored_kind(store: Store, name: str, *, declared: Iterable[EntityKind[Any]] = ()) -> StoredKind:
    """The kind ``name`` of :func:`store_kinds`; raises :class:`CliError` naming the known
    ones when the store holds none of that name."""
    kinds = store_kinds(store, declared=declared)
    for stored in kinds:
        if stored.name == name:
            return stored
    known = ", ".join(k.name for k in kinds) or "none"
    raise CliError(f"unknown kind {name!r} in this store; known: {known}")


def kind_counts(store: Store, kind: EntityKind[Any]) -> dict[str, int]:
    """Rows per state, every declared state (0 when empty), in declaration order."""
    return {str(s.value): store.count(kind, states=(s,)) for s in kind.lifecycle.states}


def timer_json(
    store: Store, kind: EntityKind[Any], timer: Timer[Any], *, now: float
) -> dict[str, Any]:
    """One timer as shown: its event, source and target states, its duration (seconds or a
    field's name), how many rows have it running (in its source state, with a duration), and
    -- of a store that finds due timers itself -- when the next one falls due and how many are
    due at ``now`` (at most :data:`DUE_COUNTED`; ``due_exact`` false past it)."""
    source = (timer.source,)
    running = store.count(kind, states=source)
    if timer.field is not None:
        running -= store.count(kind, states=source, where={timer.field: None})
    next_due: float | None = None
    due: int | None = None
    if isinstance(store, TimerStore):
        first = store.due_timers(kind, timer, now=None, limit=1)
        next_due = first[0].due_at if first else None
        due = len(store.due_timers(kind, timer, now=now, limit=DUE_COUNTED)) if first else 0
    return {
        "event": timer.event,
        "from": timer.source.value,
        "to": timer.target.value,
        "after": timer.after,
        "running": running,
        "next_due_at": next_due,
        "due": due,
        "due_exact": due is None or due < DUE_COUNTED,
    }


def transitions_json(kind: EntityKind[Any]) -> list[dict[str, Any]]:
    """The lifecycle's transitions: event, source states, target (None: a removal), timer."""
    return [
        {
            "event": t.event,
            "from": [s.value for s in t.sources],
            "to": None if t.target is None else t.target.value,
            "after": t.after,
        }
        for t in kind.lifecycle.transitions
    ]


def kind_summary(store: Store, stored: StoredKind, *, now: float) -> dict[str, Any]:
    """What ``statecore kinds`` shows of one kind: name, lifecycle, version, when registered,
    rows per state and in all, and its timers (:func:`timer_json`)."""
    kind = stored.kind
    counts = kind_counts(store, kind)
    return {
        "name": kind.name,
        "lifecycle": kind.lifecycle.name,
        "version": stored.version,
        "registered_at": stored.registered_at,
        "states": counts,
        "total": sum(counts.values()),
        "timers": [timer_json(store, kind, t, now=now) for t in kind.lifecycle.timers],
    }


def rows_json(rows: list[Row[Any]]) -> list[dict[str, Any]]:
    """Rows as JSON-ready objects: id, state, fence and every field's value."""
    return [
        {"id": r.id, "state": r.state.value, "fence": r.fence, "values": dict(r.values)}
        for r in rows
    ]


# -- the command --------------------------------------------------------------------------


def _list(args: argparse.Namespace, ctx: Context) -> int:
    store = ctx.open_store()
    now = ctx.now()
    shown = [kind_summary(store, k, now=now) for k in store_kinds(store)]

    def text() -> str:
        if not shown:
            return "no kinds registered in this store\n"
        return table(
            ("KIND", "LIFECYCLE", "VERSION", "ROWS", "PER STATE", "TIMERS"),
            (
                (
                    k["name"],
                    k["lifecycle"],
                    k["version"],
                    k["total"],
                    " ".join(f"{s}={n}" for s, n in k["states"].items()),
                    " ".join(f"{t['event']}={t['running']}" for t in k["timers"]) or None,
                )
                for k in shown
            ),
        )

    ctx.emit(shown, text)
    return EXIT_OK


def _show(args: argparse.Namespace, ctx: Context) -> int:
    store = ctx.open_store()
    stored = stored_kind(store, args.name)
    kind = stored.kind
    shown = kind_summary(store, stored, now=ctx.now())
    shown["description"] = kind.lifecycle.description
    shown["transitions"] = transitions_json(kind)
    shown["mermaid"] = kind.lifecycle.to_mermaid()

    def text() -> str:
        lines = [f"== {kind.name} ==  lifecycle {kind.lifecycle.name} v{stored.version}"]
        if kind.lifecycle.description:
            lines.append(kind.lifecycle.description)
        out = "\n".join(lines) + "\n\n" + kind.lifecycle.describe()
        out += f"```mermaid\n{shown['mermaid']}```\n\n"
        out += table(("STATE", "ROWS"), shown["states"].items())
        if shown["timers"]:
            out += "\n" + table(
                ("TIMER", "FROM", "TO", "AFTER", "RUNNING", "DUE NOW", "NEXT DUE"),
                (
                    (
                        t["event"],
                        t["from"],
                        t["to"],
                        t["after"] if isinstance(t["after"], str) else f"{t['after']:g}s",
                        t["running"],
                        t["due"],
                        timestamp(t["next_due_at"]) if t["next_due_at"] is not None else None,
                    )
                    for t in shown["timers"]
                ),
            )
        return out

    ctx.emit(shown, text)
    return EXIT_OK


def _rows(args: argparse.Namespace, ctx: Context) -> int:
    store = ctx.open_store()
    kind = stored_kind(store, args.name).kind
    states = None
    if args.state:
        by_value = {str(s.value): s for s in kind.lifecycle.states}
        unknown = [s for s in args.state if s not in by_value]
        if unknown:
            raise CliError(
                f"unknown state {unknown[0]!r} of {kind.name}; known: {', '.join(by_value)}"
            )
        states = [by_value[s] for s in args.state]
    rows = store.select(kind, states=states, limit=args.limit)
    total = store.count(kind, states=states)
    fields = [f.name for f in kind.fields]

    def text() -> str:
        out = table(
            ("ID", "STATE", "FENCE", *(f.upper() for f in fields)),
            (
                (r.id, r.state.value, r.fence, *(shorten(r.values[f], _CELL) for f in fields))
                for r in rows
            ),
        )
        return out + f"{len(rows)} of {total} shown\n"

    ctx.emit({"kind": kind.name, "total": total, "rows": rows_json(rows)}, text)
    return EXIT_OK


def _history(args: argparse.Namespace, ctx: Context) -> int:
    store = ctx.open_store()
    kind = stored_kind(store, args.name).kind
    row = store.get(kind, args.id)
    records = store.history(kind, args.id)
    if row is None and not records:
        raise CliError(f"unknown {kind.name} id {args.id!r}")
    entries = [history_json(r) for r in records]
    shown = {
        "kind": kind.name,
        "id": args.id,
        "row": None if row is None else rows_json([row])[0],
        "history": entries,
    }

    def text() -> str:
        head = f"{kind.name} {args.id}: " + ("gone" if row is None else str(row.state.value))
        return (
            head
            + "\n"
            + table(
                ("AT", "EVENT", "FROM", "TO", "OWNER", "REASON"),
                (
                    (
                        timestamp(e["at"]),
                        e["event"],
                        e["from"],
                        e["to"],
                        e["owner"],
                        shorten(e["reason"], 60),
                    )
                    for e in entries
                ),
            )
        )

    ctx.emit(shown, text)
    return EXIT_OK


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def _build(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(run=_list)
    commands = parser.add_subparsers(dest="kinds_command", metavar="SUBCOMMAND")
    add_leaf(commands, "ls", "list every kind in the store (the default)", _list)
    show = add_leaf(commands, "show", "one kind's transitions, diagram, counts and timers", _show)
    show.add_argument("name", help="the kind's name")
    rows = add_leaf(commands, "rows", "one kind's rows, by id", _rows)
    rows.add_argument("name", help="the kind's name")
    rows.add_argument(
        "--state", action="append", metavar="STATE", help="only rows in this state (repeatable)"
    )
    rows.add_argument(
        "--limit",
        type=_limit,
        default=_DEFAULT_ROWS,
        metavar="N",
        help=f"at most N rows (default {_DEFAULT_ROWS})",
    )
    history = add_leaf(commands, "history", "one row's audit entries, oldest first", _history)
    history.add_argument("name", help="the kind's name")
    history.add_argument("id", help="the row's id")


KINDS_COMMAND = Command(
    "kinds",
    "list, count and draw every entity kind the store holds, and browse its rows",
    _build,
)

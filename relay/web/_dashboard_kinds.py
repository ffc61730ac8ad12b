"""What the dashboard reads of every kind a store's catalog records (any lifecycle, whatever
package declared it), and the browser's requests for its rows and a row's history.

Each kind is read as :func:`statecore.cli.kinds.store_kinds` reads it for ``statecore kinds``:
its declaration (drawn by :func:`~relay.web.diagrams.lifecycle_svg`), its rows per state, its
timers (per timer: rows running, due now, next due).  What a browser receives is chosen here:
of a row its id, state and fence, and -- only of a kind that is not built in -- its field
values, each cut to :data:`VALUE_CHARS` characters.  The built-in kinds (statecore's, the
gateway's and the relay's own, :func:`builtin_kinds`) keep their fields to themselves here:
their contents, tokens, payloads and raw events are what :mod:`relay.web._dashboard_reads`
withholds or sends only through its own, deliberate shapes.

Every function that reads the store is a plain blocking call for the dashboard's store thread;
none writes, apart from registering a kind (idempotent for the declaration the store holds).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable
from importlib.metadata import entry_points
from typing import Any

import attrs

from relay.web._dashboard_reads import WATCHED
from relay.web._dashboard_requests import BadRequest
from relay.web.diagrams import lifecycle_svg
from statecore.catalog import declaration_json
from statecore.cli.kinds import StoredKind, kind_of_record, timer_json
from statecore.entity import EntityKind
from statecore.errors import StoreError
from statecore.kinds import KINDS_ENTRY_POINT_GROUP, known_kinds
from statecore.leases import OWNER_KIND
from statecore.obligation import OBLIGATION_KIND
from statecore.store import KindCatalog, Row, Store

__all__ = [
    "KIND_REQUESTS",
    "ROWS_LISTED",
    "VALUE_CHARS",
    "BadKindRequest",
    "CatalogKind",
    "CatalogView",
    "KindRequest",
    "builtin_kinds",
    "catalog_counts",
    "catalog_kinds",
    "kind_history",
    "kind_rows",
    "parse_kind_request",
]

log = logging.getLogger("relay.web")

VALUE_CHARS = 200
"""A field value of a kind that is not built in is cut to this many characters."""
ROWS_LISTED = 100
"""Rows of one kind a browser is sent per request, by id."""
KIND_REQUESTS = ("kind_rows", "kind_history")
"""The requests of this module (the others are :mod:`relay.web._dashboard_requests`')."""
_MAX_NAME = 200
_BUILTIN_PACKAGES = ("statecore", "relay", "stores")


@functools.cache
def builtin_kinds() -> frozenset[str]:
    """The names of the built-in kinds, whose field values are never sent from here: the
    kernel's, the watched ones, and those the ``statecore.kinds`` entry points of statecore's,
    the gateway's and the relay's own packages declare."""
    names = {OBLIGATION_KIND.name, OWNER_KIND.name, *(w.kind.name for w in WATCHED)}
    for entry in entry_points(group=KINDS_ENTRY_POINT_GROUP):
        if entry.value.split(".", 1)[0].split(":", 1)[0] not in _BUILTIN_PACKAGES:
            continue
        try:
            names.update(k.name for k in entry.load() if isinstance(k, EntityKind))
        except Exception:  # known_kinds() logs it
            continue
    return frozenset(names)


@attrs.frozen
class CatalogKind:
    """One cataloged kind as the dashboard holds it: the kind, and whether the store can be
    read through it (a store object given a kind in this process reads it only through that
    kind or an equal one)."""

    stored: StoredKind
    readable: bool


def catalog_kinds(
    store: Store, declared: Iterable[EntityKind[Any]] = (), previous: Iterable[CatalogKind] = ()
) -> list[CatalogKind]:
    """Every kind the store holds, by name (:func:`statecore.cli.kinds.store_kinds`'s reading,
    with ``declared`` and the watched kinds preferred), each registered -- but those found in
    ``previous`` with the same declaration, reused as they were; a kind the store refuses to
    register as rebuilt (a store object that was given the kind as another object, in this
    process) is listed unreadable.  Raises ``StoreError`` when the catalog cannot be read."""
    ours: dict[str, EntityKind[Any]] = {}
    for kind in (*declared, *(w.kind for w in WATCHED), *known_kinds()):
        ours.setdefault(kind.name, kind)
    if not isinstance(store, KindCatalog):
        found = [
            StoredKind(k, k.lifecycle.version, None, declaration_json(k)) for k in ours.values()
        ]
    else:
        found = [kind_of_record(record, ours) for record in store.catalog()]
    known = {(r.stored.name, _key(r.stored)): r for r in previous}
    out = []
    for stored in sorted(found, key=lambda k: k.name):
        again = known.get((stored.name, _key(stored)))
        if again is not None:
            out.append(again)
            continue
        try:
            store.register(stored.kind)
        except StoreError as exc:
            log.info("dashboard: kind %r cannot be read here: %s", stored.name, exc)
            out.append(CatalogKind(stored, False))
            continue
        out.append(CatalogKind(stored, True))
    return out


def _key(stored: StoredKind) -> str:
    return json.dumps(stored.declaration, sort_keys=True)


def catalog_counts(
    store: Store, reads: Iterable[CatalogKind], *, now: float, drawn: bool
) -> list[dict[str, Any]]:
    """Per kind: name, lifecycle, version, states, rows per state (None when unreadable), its
    timers (:func:`statecore.cli.kinds.timer_json`: rows running, due now, next due), whether
    its values are withheld (built in) and, with ``drawn``, its diagram (SVG text).  Raises
    ``StoreError`` when the store cannot be read."""
    out = []
    for read in reads:
        kind = read.stored.kind
        lifecycle = kind.lifecycle
        shown: dict[str, Any] = {
            "kind": kind.name,
            "lifecycle": lifecycle.name,
            "version": read.stored.version,
            "states": [str(s.value) for s in lifecycle.states],
            "readable": read.readable,
            "builtin": kind.name in builtin_kinds(),
            "counts": None,
            "timers": [],
        }
        if read.readable:
            shown["counts"] = {
                str(s.value): store.count(kind, states=(s,)) for s in lifecycle.states
            }
            shown["timers"] = [timer_json(store, kind, t, now=now) for t in lifecycle.timers]
        if drawn:
            shown["svg"] = _svg(_key(read.stored), kind)
        out.append(shown)
    return out


_DRAWN: dict[str, str] = {}
_DRAWN_MOST = 256


def _svg(declaration: str, kind: EntityKind[Any]) -> str:
    """The kind's lifecycle drawn, once per declaration (the key; ``kind`` is what it
    describes); at most :data:`_DRAWN_MOST` kept (on the store thread only)."""
    drawn = _DRAWN.get(declaration)
    if drawn is None:
        if len(_DRAWN) >= _DRAWN_MOST:
            _DRAWN.clear()
        drawn = _DRAWN[declaration] = lifecycle_svg(kind.lifecycle)
    return drawn


def _row_json(kind: EntityKind[Any], row: Row[Any]) -> dict[str, Any]:
    """A row as sent: id, state, fence and -- of a kind not built in -- its values, cut."""
    out: dict[str, Any] = {"id": row.id, "state": row.state.value, "fence": row.fence}
    if kind.name in builtin_kinds():
        out["values"] = None
        return out
    values: dict[str, Any] = {}
    cut: list[str] = []
    for name, value in row.values.items():
        long = isinstance(value, str) and len(value) > VALUE_CHARS
        values[name] = value[:VALUE_CHARS] if long else value
        if long:
            cut.append(name)
    out["values"] = values
    out["cut"] = cut
    return out


@attrs.frozen
class KindRequest:
    """A browser's request for one kind's rows (``kind_rows``, optionally of one ``state``)
    or one row's history (``kind_history``, with its ``id``)."""

    type: str
    kind: str
    state: str | None = None
    id: str | None = None


class BadKindRequest(BadRequest):
    """A kind request the dashboard does not understand (the message says why)."""


def parse_kind_request(message: str | bytes) -> KindRequest | None:
    """``message`` as a :class:`KindRequest`, or None when it is not one (left to the other
    requests' parser).  Raises :class:`BadKindRequest` for a kind request with a missing,
    mistyped or overlong field."""
    try:
        data = json.loads(message)
    except (ValueError, RecursionError):  # left to the other parser, which says why
        return None
    if not isinstance(data, dict) or data.get("type") not in KIND_REQUESTS:
        return None
    kind, state, entity_id = data.get("kind"), data.get("state"), data.get("id")
    if not isinstance(kind, str) or not 0 < len(kind) <= _MAX_NAME:
        raise BadKindRequest(f"{data['type']}: kind must be a name")
    if state is not None and (not isinstance(state, str) or len(state) > _MAX_NAME):
        raise BadKindRequest(f"{data['type']}: state must be a name or null")
    if data["type"] == "kind_history":
        if not isinstance(entity_id, str) or not 0 < len(entity_id) <= _MAX_NAME:
            raise BadKindRequest("kind_history: id must be a non-empty string")
        return KindRequest("kind_history", kind, id=entity_id)
    return KindRequest("kind_rows", kind, state=state)


def _find(reads: Iterable[CatalogKind], name: str) -> CatalogKind | None:
    return next((r for r in reads if r.stored.name == name), None)


def kind_rows(store: Store, reads: list[CatalogKind], request: KindRequest) -> dict[str, Any]:
    """The answer to ``kind_rows``: at most :data:`ROWS_LISTED` rows of the kind (of the
    state, when given), by id, with the total; ``found`` false for a kind the store does not
    hold (or cannot be read here) or a state its lifecycle does not declare, naming the known
    ones.  Raises ``StoreError`` when the store cannot be read."""
    answer: dict[str, Any] = {"type": "kind_rows", "kind": request.kind, "state": request.state}
    read = _find(reads, request.kind)
    if read is None or not read.readable:
        known = [r.stored.name for r in reads if r.readable]
        return {**answer, "found": False, "reason": "unknown kind", "known": known, "rows": []}
    kind = read.stored.kind
    states = None
    if request.state is not None:
        by_value = {str(s.value): s for s in kind.lifecycle.states}
        if request.state not in by_value:
            known = list(by_value)
            return {**answer, "found": False, "reason": "unknown state", "known": known, "rows": []}
        states = (by_value[request.state],)
    rows = store.select(kind, states=states, limit=ROWS_LISTED)
    return {
        **answer,
        "found": True,
        "total": store.count(kind, states=states),
        "rows": [_row_json(kind, r) for r in rows],
    }


def kind_history(store: Store, reads: list[CatalogKind], request: KindRequest) -> dict[str, Any]:
    """The answer to ``kind_history``: the row as it is (None once gone) and its audit entries,
    oldest first (event, states, time, owner, attempts; of a built-in kind without the
    reason, which may quote what a user sent); ``found`` false for an unknown kind or id.
    Raises ``StoreError`` when the store cannot be read."""
    assert request.id is not None
    answer: dict[str, Any] = {"type": "kind_history", "kind": request.kind, "id": request.id}
    read = _find(reads, request.kind)
    if read is None or not read.readable:
        return {**answer, "found": False, "row": None, "records": []}
    kind = read.stored.kind
    row = store.get(kind, request.id)
    records = store.history(kind, request.id)
    builtin = kind.name in builtin_kinds()
    return {
        **answer,
        "found": row is not None or bool(records),
        "row": None if row is None else _row_json(kind, row),
        "records": [
            {
                "event": r.event,
                "from": None if r.from_state is None else r.from_state.value,
                "to": r.to_state.value,
                "at": r.at,
                "owner": r.owner,
                "attempts": r.attempts,
                "reason": None if builtin or r.reason is None else r.reason[:VALUE_CHARS],
            }
            for r in records
        ],
    }


class CatalogView:
    """The store's catalog as one dashboard shows it, its kinds read again (cheaply: only a
    changed declaration is registered anew) at every call.  ``CatalogView(store)``; call it
    only on the dashboard's store thread.  Every method raises ``StoreError`` when the store
    cannot be read."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._kinds: list[CatalogKind] = []

    def counts(self, now: float) -> list[dict[str, Any]]:
        """Every cataloged kind drawn and counted (:func:`catalog_counts`)."""
        self._kinds = catalog_kinds(self._store, previous=self._kinds)
        return catalog_counts(self._store, self._kinds, now=now, drawn=True)

    def answer(self, request: KindRequest) -> dict[str, Any]:
        """The answer to a browser's ``kind_rows`` or ``kind_history`` request."""
        self._kinds = catalog_kinds(self._store, previous=self._kinds)
        if request.type == "kind_history":
            return kind_history(self._store, self._kinds, request)
        return kind_rows(self._store, self._kinds, request)

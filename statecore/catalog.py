"""An entity kind as data: what a store's catalog records of every kind registered with it.

:func:`declaration_json` writes a kind -- its table, fields, indexes and its lifecycle's
states, transitions, timers, version and migrations -- as a JSON-ready object;
:func:`kind_from_declaration` builds an equivalent :class:`~statecore.entity.EntityKind` back
from it, with a state ``Enum`` of its own.  A tool that never imported the code that declared
a kind (the CLI, the dashboard) reads the kind from the store's catalog
(:class:`~statecore.store.KindCatalog`), rebuilds it, and counts, lists and draws its rows
through the ordinary Store API.  The two functions round-trip:
``declaration_json(kind_from_declaration(d)) == d``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum, StrEnum
from typing import Any

from statecore.entity import EntityKind, Field, Index
from statecore.errors import DeclarationError
from statecore.lifecycle import Lifecycle, Migration, Transition

__all__ = ["DECLARATION_FORMAT", "declaration_json", "kind_from_declaration"]

DECLARATION_FORMAT = 1
"""The version of the shape :func:`declaration_json` writes (its ``format`` key)."""

_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}


def _value(state: Enum | None) -> Any:
    return None if state is None else state.value


def declaration_json(kind: EntityKind[Any]) -> dict[str, Any]:
    """``kind`` as a JSON-ready object (deterministic: equal kinds give equal objects)."""
    lc = kind.lifecycle
    return {
        "format": DECLARATION_FORMAT,
        "name": kind.name,
        "table": kind.table,
        "id_field": kind.id_field,
        "fields": [
            {
                "name": f.name,
                "type": f.type.__name__,
                "nullable": f.nullable,
                "default": f.default,
                "immutable": f.immutable,
            }
            for f in kind.fields
        ],
        "indexes": [
            {
                "fields": list(i.fields),
                "states": None if i.states is None else sorted(s.value for s in i.states),
            }
            for i in kind.indexes
        ],
        "lifecycle": {
            "name": lc.name,
            "description": lc.description,
            "version": lc.version,
            "states": [s.value for s in lc.states],
            "initial": lc.initial.value,
            "terminal": sorted(s.value for s in lc.terminal),
            "transitions": [
                {
                    "event": t.event,
                    "from": [s.value for s in t.sources],
                    "to": _value(t.target),
                    "after": t.after,
                }
                for t in lc.transitions
            ],
            "migrations": {
                str(v): {old: new.value for old, new in sorted(m.states.items())}
                for v, m in sorted(lc.migrations.items())
            },
        },
    }


def kind_from_declaration(data: Mapping[str, Any]) -> EntityKind[Any]:
    """The kind ``data`` (a :func:`declaration_json` object) describes, its states a new
    ``StrEnum``.  Raises :class:`~statecore.errors.DeclarationError` for a malformed or
    unknown-format object (naming what is wrong) and what the declarations themselves raise."""
    try:
        if data.get("format") != DECLARATION_FORMAT:
            raise DeclarationError(str(data.get("name")), f"unknown format {data.get('format')!r}")
        lcd = data["lifecycle"]
        name = str(lcd["name"])
        states = StrEnum(  # type: ignore[misc]
            f"{name}_states", [(f"S_{v}", str(v)) for v in lcd["states"]]
        )

        def state(value: object) -> Any:
            return None if value is None else states(str(value))

        lifecycle: Lifecycle[Any] = Lifecycle(
            name,
            states,
            initial=states(lcd["initial"]),
            terminal=[states(v) for v in lcd["terminal"]],
            description=str(lcd.get("description", "")),
            version=int(lcd.get("version", 1)),
            transitions=[
                Transition(
                    str(t["event"]),
                    [states(v) for v in t["from"]] or None,
                    state(t["to"]),
                    after=t.get("after"),
                )
                for t in lcd["transitions"]
            ],
            migrations=[
                Migration(int(v), {old: states(new) for old, new in m.items()})
                for v, m in lcd.get("migrations", {}).items()
            ],
        )
        fields = [
            Field(
                str(f["name"]),
                _TYPES[f["type"]],
                nullable=bool(f["nullable"]),
                default=f["default"],
                immutable=bool(f["immutable"]),
            )
            for f in data["fields"]
        ]
        indexes = [
            Index(
                tuple(i["fields"]),
                None if i["states"] is None else frozenset(states(v) for v in i["states"]),
            )
            for i in data["indexes"]
        ]
        return EntityKind(
            str(data["name"]),
            lifecycle,
            table=str(data["table"]),
            id_field=str(data["id_field"]),
            fields=fields,
            indexes=indexes,
        )
    except DeclarationError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DeclarationError(
            str(data.get("name") if isinstance(data, Mapping) else data),
            f"malformed declaration: {exc!r}",
        ) from None

"""Small named notes a platform driver keeps in the connector's store across restarts.

A driver of a real platform must remember a few things of its own: its cursor (a ``/sync``
token, an update offset), its device and credentials.  Each is one note ``(platform, name) ->
value``, at most :data:`MAX_NOTE_BYTES` of UTF-8; a note is ``saved`` (again on every
overwrite, each audited) until it is ``dropped``; dropped notes are deleted by the
housekeeping once dropped longer ago than ``buffer_retention_s``.  A driver reaches them
through ``intake.load`` / ``intake.save`` (:mod:`relay.connector.intake`), which run on the
connector's store thread; ``save`` returns once the write committed.
"""

from __future__ import annotations

from enum import StrEnum

from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind, Field
from statecore.ids import composite_id
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit, Store, lt

__all__ = [
    "MAX_NOTE_BYTES",
    "MAX_NOTE_NAME",
    "NOTE",
    "NOTE_KIND",
    "DriverNotes",
    "NoteState",
]

MAX_NOTE_BYTES = 65_536
"""The largest value a note holds, in bytes of UTF-8 (bigger: ``ValueError``)."""
MAX_NOTE_NAME = 200
"""The longest platform or note name, in characters."""


class NoteState(StrEnum):
    """One named note of a platform's driver."""

    SAVED = "saved"
    """Holds the value saved last."""
    DROPPED = "dropped"
    """Terminal: withdrawn; :meth:`DriverNotes.load` answers None."""


_N = NoteState

NOTE: Lifecycle[NoteState] = Lifecycle(
    "driver_note",
    NoteState,
    initial=_N.SAVED,
    terminal=(_N.DROPPED,),
    description="A named note a platform driver keeps across restarts (its cursor, device).",
    transitions=(
        Transition("save", None, _N.SAVED),
        Transition("overwrite", _N.SAVED, _N.SAVED),
        Transition("drop", _N.SAVED, _N.DROPPED),
        Transition("prune", _N.DROPPED, None),
    ),
)

NOTE_KIND: EntityKind[NoteState] = EntityKind(
    "driver_note",
    NOTE,
    table="relay_driver_notes",
    id_field="note_key",
    fields=(
        Field("platform", str, nullable=False, immutable=True),
        Field("name", str, nullable=False, immutable=True),
        Field("value", str, nullable=False),
        Field("updated_at", float, nullable=False),
    ),
)


def check_note(platform: object, name: object, value: object = "") -> None:
    """Refuse a bad note before anything is written: ``TypeError`` for a value that is not a
    str, ``ValueError`` for an empty or too long platform or name (:data:`MAX_NOTE_NAME`) or
    a value over :data:`MAX_NOTE_BYTES`."""
    for what, text in (("platform", platform), ("name", name), ("value", value)):
        if not isinstance(text, str):
            raise TypeError(f"a note's {what} must be a str, not {type(text).__name__}")
    assert isinstance(platform, str)
    assert isinstance(name, str)
    assert isinstance(value, str)
    for what, text in (("platform", platform), ("name", name)):
        if not 0 < len(text) <= MAX_NOTE_NAME:
            raise ValueError(f"a note's {what} must be 1 to {MAX_NOTE_NAME} characters")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_NOTE_BYTES:
        raise ValueError(f"a note holds at most {MAX_NOTE_BYTES} bytes, not {size}")


class DriverNotes:
    """The notes over any Store (synchronous: the connector calls it on its store thread)."""

    def __init__(self, store: Store, *, clock: Clock | None = None) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        store.register(NOTE_KIND)

    def load(self, platform: str, name: str) -> str | None:
        """The value saved last under ``name`` for ``platform``; None when there is none (or
        it was dropped).  Raises as :func:`check_note`, and ``StoreError``."""
        check_note(platform, name)
        row = self.store.get(NOTE_KIND, composite_id(platform, name))
        if row is None or row.state is not _N.SAVED:
            return None
        value: str = row["value"]
        return value

    def save(self, platform: str, name: str, value: str) -> None:
        """Save ``value`` under ``name`` (a new note, an overwrite, or one dropped before and
        saved again), audited, in one transaction.  Raises as :func:`check_note` before any
        write, and ``StoreError`` when it could not be written."""
        check_note(platform, name, value)
        now = self.clock.now()
        key = composite_id(platform, name)
        changes = {"value": value, "updated_at": now}
        with self.store.atomic():
            row = self.store.get(NOTE_KIND, key)
            if row is not None and row.state is _N.SAVED:
                self.store.transition(
                    NOTE_KIND,
                    key,
                    "overwrite",
                    audit=Audit(now, platform),
                    fence=row.fence,
                    changes=changes,
                )
                return
            if row is not None:  # dropped: it starts over
                self.store.prune(NOTE_KIND, "prune", where={"platform": platform, "name": name})
            self.store.insert(
                NOTE_KIND,
                key,
                {"platform": platform, "name": name, **changes},
                event="save",
                audit=Audit(now, platform),
            )

    def drop(self, platform: str, name: str) -> None:
        """Withdraw a note.  Raises ``UnknownEntity`` / ``InvalidTransition`` when there is
        none to drop."""
        check_note(platform, name)
        now = self.clock.now()
        self.store.transition(
            NOTE_KIND,
            composite_id(platform, name),
            "drop",
            audit=Audit(now, platform),
            changes={"updated_at": now},
        )

    def prune(self, *, older_than_s: float) -> int:
        """Delete notes dropped more than ``older_than_s`` ago; a saved note never is."""
        cutoff = self.clock.now() - older_than_s
        return self.store.prune(NOTE_KIND, "prune", where={"updated_at": lt(cutoff)})

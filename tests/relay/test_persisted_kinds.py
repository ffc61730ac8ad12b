"""The relay's persisted kinds (connector inbound buffer, gateway dedupe) against both stores.

The contract kit proves each store enforces *a* declaration; these tests pin the relay's two
declarations themselves and check that each store's guard refuses every illegal move of them,
changing nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relay.client.dedupe import DEDUPE, DEDUPE_KIND, DedupeState
from relay.connector.buffer import BUFFER, BUFFER_KIND, BufferState
from statecore.entity import EntityKind
from statecore.errors import DeclarationError, InvalidTransition, StaleState
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit, Store
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore

B = BufferState
D = DedupeState
AUDIT = Audit(at=1_000.0, owner="gw-a")


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty store of each kind with both relay kinds registered; closed afterwards."""
    db: Store = InMemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "k.db")
    try:
        db.register(BUFFER_KIND)
        db.register(DEDUPE_KIND)
        yield db
    finally:
        db.close()


def redeclare(lifecycle: Lifecycle[Any], transitions: tuple[Transition[Any], ...]) -> None:
    """Run definition-time validation on ``lifecycle``'s states with ``transitions``."""
    Lifecycle(
        lifecycle.name,
        lifecycle.state_type,
        initial=lifecycle.initial,
        terminal=lifecycle.terminal,
        transitions=transitions,
    )


def test_buffer_declaration_is_valid_and_pinned() -> None:
    """BUFFER passes definition-time validation and declares exactly buffered -> sent -> acked |
    expired, created by append and removed (settled only) by prune."""
    redeclare(BUFFER, BUFFER.transitions)
    assert BUFFER.initial is B.BUFFERED
    assert BUFFER.terminal == {B.ACKED, B.EXPIRED}
    assert dict(BUFFER.table) == {
        (B.BUFFERED, "send"): B.SENT,
        (B.SENT, "send"): B.SENT,
        (B.BUFFERED, "ack"): B.ACKED,
        (B.SENT, "ack"): B.ACKED,
        (B.BUFFERED, "expire"): B.EXPIRED,
        (B.SENT, "expire"): B.EXPIRED,
    }
    assert BUFFER.creates("append")
    assert BUFFER.removes("prune")
    assert BUFFER.sources("prune") == {B.ACKED, B.EXPIRED}
    assert BUFFER_KIND.lifecycle is BUFFER


def test_dedupe_declaration_is_valid_and_pinned() -> None:
    """DEDUPE passes definition-time validation and declares handled -> forgotten -> removed."""
    redeclare(DEDUPE, DEDUPE.transitions)
    assert DEDUPE.initial is D.HANDLED
    assert DEDUPE.terminal == {D.FORGOTTEN}
    assert dict(DEDUPE.table) == {(D.HANDLED, "forget"): D.FORGOTTEN}
    assert DEDUPE.creates("handle")
    assert DEDUPE.sources("prune") == {D.FORGOTTEN}
    assert DEDUPE_KIND.lifecycle is DEDUPE


def test_validation_would_catch_a_buffer_entry_that_can_never_settle() -> None:
    """Without ack and expire no entry could ever settle: the declaration is refused."""
    broken = tuple(t for t in BUFFER.transitions if t.event not in ("ack", "expire"))
    with pytest.raises(DeclarationError, match="unreachable"):
        redeclare(BUFFER, broken)


@pytest.mark.parametrize("kind", [BUFFER_KIND, DEDUPE_KIND], ids=["buffer", "dedupe"])
def test_kinds_redeclare_cleanly(kind: EntityKind[Any]) -> None:
    """Each kind's fields and partial indexes pass EntityKind's declaration checks."""
    again = EntityKind(
        kind.name,
        kind.lifecycle,
        table=kind.table,
        id_field=kind.id_field,
        fields=kind.fields,
        indexes=kind.indexes,
    )
    assert again == kind


def buffer_values(gateway_id: str = "gw-a") -> dict[str, object]:
    return {
        "gateway_id": gateway_id,
        "platform": "loopback",
        "seq": 1,
        "event_json": "{}",
        "created_at": 1_000.0,
        "updated_at": 1_000.0,
    }


def snapshot(store: Store, kind: EntityKind[Any], entity_id: str) -> tuple[object, ...]:
    row = store.get(kind, entity_id)
    assert row is not None
    return (row.state, row.fence, dict(row.values), len(store.history(kind, entity_id)))


def test_buffer_guard_refuses_illegal_moves(store: Store) -> None:
    """Each store refuses a second ack, a move out of a terminal state, a creation event as a
    move, a stale fence, a foreign owner's ack and an immutable change, changing nothing."""
    store.insert(BUFFER_KIND, "b1", buffer_values(), event="append", audit=AUDIT)
    with pytest.raises(InvalidTransition):
        store.insert(BUFFER_KIND, "b2", buffer_values(), event="send", audit=AUDIT)
    assert store.get(BUFFER_KIND, "b2") is None
    sent = store.transition(BUFFER_KIND, "b1", "send", audit=AUDIT)
    before = snapshot(store, BUFFER_KIND, "b1")
    with pytest.raises(StaleState):  # an ack by another gateway
        store.transition(BUFFER_KIND, "b1", "ack", audit=AUDIT, expect={"gateway_id": "gw-b"})
    with pytest.raises(StaleState):  # a zombie with an old fence
        store.transition(BUFFER_KIND, "b1", "ack", audit=AUDIT, fence=sent.fence - 1)
    with pytest.raises(ValueError, match="immutable"):
        store.transition(BUFFER_KIND, "b1", "send", audit=AUDIT, changes={"gateway_id": "x"})
    with pytest.raises(InvalidTransition):
        store.transition(BUFFER_KIND, "b1", "append", audit=AUDIT)
    assert snapshot(store, BUFFER_KIND, "b1") == before
    store.transition(BUFFER_KIND, "b1", "ack", audit=AUDIT, expect={"gateway_id": "gw-a"})
    acked = snapshot(store, BUFFER_KIND, "b1")
    for event in ("ack", "send", "expire"):
        with pytest.raises(InvalidTransition):
            store.transition(BUFFER_KIND, "b1", event, audit=AUDIT)
    assert snapshot(store, BUFFER_KIND, "b1") == acked


def test_unsettled_buffer_entries_cannot_be_pruned(store: Store) -> None:
    """Prune removes acked and expired entries and never a buffered or sent one."""
    for entry_id in ("buffered", "sent", "acked", "expired"):
        store.insert(BUFFER_KIND, entry_id, buffer_values(), event="append", audit=AUDIT)
    store.transition(BUFFER_KIND, "sent", "send", audit=AUDIT)
    store.transition(BUFFER_KIND, "acked", "ack", audit=AUDIT)
    store.transition(BUFFER_KIND, "expired", "expire", audit=AUDIT)
    assert store.prune(BUFFER_KIND, "prune", where={"seq": 1}) == 2
    remaining = store.select(BUFFER_KIND)
    assert sorted((r.id, r.state) for r in remaining) == [
        ("buffered", B.BUFFERED),
        ("sent", B.SENT),
    ]
    with pytest.raises(InvalidTransition):
        store.prune(BUFFER_KIND, "ack")


def test_dedupe_guard_refuses_illegal_moves(store: Store) -> None:
    """A remembered key is inserted once (idempotently), forgotten once, pruned only when
    forgotten."""
    row, created = store.insert(DEDUPE_KIND, "b1", {"handled_at": 5.0}, event="handle", audit=AUDIT)
    assert (row.state, created) == (D.HANDLED, True)
    again, created = store.insert(
        DEDUPE_KIND, "b1", {"handled_at": 9.0}, event="handle", audit=AUDIT
    )
    assert (again.values["handled_at"], created) == (5.0, False)
    assert store.prune(DEDUPE_KIND, "prune") == 0
    with pytest.raises(InvalidTransition):
        store.transition(DEDUPE_KIND, "b1", "handle", audit=AUDIT)
    store.transition(DEDUPE_KIND, "b1", "forget", audit=AUDIT)
    forgotten = snapshot(store, DEDUPE_KIND, "b1")
    with pytest.raises(InvalidTransition):
        store.transition(DEDUPE_KIND, "b1", "forget", audit=AUDIT)
    assert snapshot(store, DEDUPE_KIND, "b1") == forgotten
    assert store.prune(DEDUPE_KIND, "prune") == 1
    assert store.get(DEDUPE_KIND, "b1") is None

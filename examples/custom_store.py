"""A custom store: ``ChangeFeedStore``, an in-memory store with a change feed, contract-tested.

Any object with the methods of ``statecore.Store`` can hold a gateway's ledger, sessions and
delegations.  This one keeps its data in an ``InMemoryStore`` and appends one JSON line per
*committed* change -- insert, transition, prune -- to a feed file: an audit trail or a stream
for another system to follow.

The one subtle part is transactions.  Writes inside ``atomic()`` blocks are collected per thread
and written to the feed when the outermost block ends -- still inside the in-memory store's
transaction, so a feed write that fails undoes the transaction (``StoreError``), and a block
that raises leaves nothing in the feed (a nested block that raises drops only its own lines).
The feed therefore holds exactly the committed changes, in commit order.

That the store is swappable is not a claim: ``tests/test_examples.py`` runs the whole contract
kit, ``stores.testing.StoreContract``, against it::

    class TestCustomStoreContract(StoreContract):
        @pytest.fixture
        def store(self, tmp_path: Path) -> StoreFactory:
            paths = (tmp_path / f"feed-{n}.jsonl" for n in itertools.count())
            return lambda: ChangeFeedStore(next(paths))

Run it: ``python examples/custom_store.py`` (a ledger over the store, then the feed it wrote);
the contract: ``pytest tests/test_examples.py -k CustomStoreContract``.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from statecore import (
    Audit,
    EntityKind,
    Ledger,
    Row,
    Store,
    StoreError,
    TransitionRecord,
)
from statecore.batching import routes_through_overrides, transition_many_one_by_one
from stores import InMemoryStore

S = TypeVar("S", bound=Enum)


class _Transaction(threading.local):
    """One thread's open transaction: feed lines not yet committed, and a mark per block."""

    def __init__(self) -> None:
        self.pending: list[dict[str, Any]] = []
        self.marks: list[int] = []


class ChangeFeedStore:
    """A :class:`statecore.Store`: ``InMemoryStore`` data plus a JSON-lines feed of every
    committed change at ``feed_path`` (appended to; created if missing)."""

    def __init__(self, feed_path: str | os.PathLike[str]) -> None:
        self.inner = InMemoryStore()
        self.feed_path = Path(feed_path)
        self._feed = self.feed_path.open("a", encoding="utf-8")
        self._feed_lock = threading.Lock()
        self._tx = _Transaction()

    def __repr__(self) -> str:
        return f"ChangeFeedStore({str(self.feed_path)!r})"

    # -- transactions and the feed -------------------------------------------------------------

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """A transaction (nested blocks are savepoints); its changes reach the feed on commit."""
        tx = self._tx
        with self.inner.atomic():  # raises StoreError once closed
            tx.marks.append(len(tx.pending))
            try:
                yield
            except BaseException:
                del tx.pending[tx.marks[-1] :]  # this block's changes never happened
                raise
            finally:
                tx.marks.pop()
            if not tx.marks:
                lines, tx.pending = tx.pending, []
                self._append(lines)  # inside the inner transaction: a failure undoes it

    def _append(self, changes: list[dict[str, Any]]) -> None:
        if not changes:
            return
        text = "".join(json.dumps(c, sort_keys=True) + "\n" for c in changes)
        with self._feed_lock:
            try:
                self._feed.write(text)
                self._feed.flush()
            except (OSError, ValueError) as exc:  # ValueError: the file is closed
                raise StoreError(f"cannot append to the change feed {self.feed_path}") from exc

    def _change(self, op: str, kind: EntityKind[Any], event: str, row: Row[Any]) -> None:
        state = row.state.value if isinstance(row.state.value, str | int) else row.state.name
        change = {"op": op, "kind": kind.name, "id": row.id, "event": event, "state": state}
        self._tx.pending.append(change | {"fence": row.fence})

    # -- the Store protocol: writes (each one a transaction of its own, or part of the caller's)

    def register(self, kind: EntityKind[Any]) -> None:
        self.inner.register(kind)

    def insert(
        self,
        kind: EntityKind[S],
        entity_id: str,
        values: Mapping[str, object],
        *,
        event: str,
        audit: Audit,
    ) -> tuple[Row[S], bool]:
        with self.atomic():
            row, created = self.inner.insert(kind, entity_id, values, event=event, audit=audit)
            if created:
                self._change("insert", kind, event, row)
        return row, created

    def transition(
        self,
        kind: EntityKind[S],
        entity_id: str,
        event: str,
        *,
        audit: Audit,
        fence: int | None = None,
        expect: Mapping[str, object] | None = None,
        changes: Mapping[str, object] | None = None,
    ) -> Row[S]:
        with self.atomic():
            row = self.inner.transition(
                kind, entity_id, event, audit=audit, fence=fence, expect=expect, changes=changes
            )
            self._change("transition", kind, event, row)
        return row

    def transition_many(
        self,
        kind: EntityKind[S],
        entity_ids: Sequence[str],
        event: str,
        *,
        audit: Audit,
        expect: Mapping[str, object] | None = None,
        changes: Mapping[str, object] | None = None,
        increments: Mapping[str, int] | None = None,
    ) -> list[Row[S]]:
        if routes_through_overrides(self, "transition_many", "transition"):
            # A subclass overrides transition(): every write must reach it.
            return transition_many_one_by_one(
                self,
                kind,
                entity_ids,
                event,
                audit=audit,
                expect=expect,
                changes=changes,
                increments=increments,
            )
        with self.atomic():
            rows = self.inner.transition_many(
                kind,
                entity_ids,
                event,
                audit=audit,
                expect=expect,
                changes=changes,
                increments=increments,
            )
            for row in rows:
                self._change("transition", kind, event, row)
        return rows

    def prune(
        self,
        kind: EntityKind[S],
        event: str,
        *,
        where: Mapping[str, object] | None = None,
        limit: int | None = None,
    ) -> int:
        with self.atomic():
            removed = self.inner.prune(kind, event, where=where, limit=limit)
            if removed:
                change = {"op": "prune", "kind": kind.name, "event": event, "count": removed}
                self._tx.pending.append(change)
        return removed

    def close(self) -> None:
        """Close the data and the feed; later calls raise ``StoreError``.  Idempotent."""
        self.inner.close()  # first: it waits for a transaction that is committing now
        with self._feed_lock:
            self._feed.close()

    # -- the Store protocol: reads (straight through) -------------------------------------------

    def get(self, kind: EntityKind[S], entity_id: str) -> Row[S] | None:
        return self.inner.get(kind, entity_id)

    def select(
        self,
        kind: EntityKind[S],
        *,
        states: Iterable[S] | None = None,
        where: Mapping[str, object] | None = None,
        order_by: str | None = None,
        limit: int | None = None,
    ) -> list[Row[S]]:
        return self.inner.select(kind, states=states, where=where, order_by=order_by, limit=limit)

    def count(
        self,
        kind: EntityKind[S],
        *,
        states: Iterable[S] | None = None,
        where: Mapping[str, object] | None = None,
    ) -> int:
        return self.inner.count(kind, states=states, where=where)

    def history(self, kind: EntityKind[S], entity_id: str) -> list[TransitionRecord]:
        return self.inner.history(kind, entity_id)

    # -- reading the feed ------------------------------------------------------------------------

    @staticmethod
    def read_feed(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
        """Every change in a feed file, oldest first."""
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]


def main(workdir: Path) -> int:
    feed = workdir / "changes.jsonl"
    store = ChangeFeedStore(feed)
    assert isinstance(store, Store)  # the protocol is runtime-checkable (method names only)
    ledger = Ledger(store)

    print("a ledger over ChangeFeedStore: record a reply, attempt it, deliver it")
    ob = ledger.record(
        session_key="agent:main:loopback:dm:c1",
        platform="loopback",
        chat_id="c1",
        content="hello from a custom store",
        message_ref="m1",
    )
    ledger.mark_attempting(ob.obligation_id)
    ledger.mark_delivered(ob.obligation_id)

    print("a second reply inside a transaction that fails: nothing of it may reach the feed")
    try:
        with store.atomic():
            ledger.record(
                session_key="agent:main:loopback:dm:c1",
                platform="loopback",
                chat_id="c1",
                content="this one is rolled back",
                message_ref="m2",
            )
            raise RuntimeError("the caller changed its mind")
    except RuntimeError as exc:
        print(f"  the block raised: {exc}")
    print(f"  owed replies now: {len(ledger.owed())}")
    delivered = ledger.get(ob.obligation_id)
    print(f"  the first reply's state: {delivered.state.value if delivered else None}")
    store.close()

    changes = ChangeFeedStore.read_feed(feed)
    print(f"\nthe change feed ({feed.name}), {len(changes)} committed changes:")
    for change in changes:
        print(
            f"  {change['op']:<10} {change['kind']:<10} {change['event']:<10} -> {change['state']}"
        )
    events = [c["event"] for c in changes]
    ok = events == ["record", "attempt", "deliver"]
    print(f"\nfeed matches the delivered reply's lifecycle: {ok}")
    print("the contract kit: pytest tests/test_examples.py -k CustomStoreContract")
    return 0 if ok else 1


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="statecore-custom-store-") as tmp:
        raise SystemExit(main(Path(tmp)))

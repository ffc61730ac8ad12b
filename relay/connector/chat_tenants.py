"""The tenant of each chat, as the platform said it: the tenant guard's memory, kept durably.

With a tenants table the connector performs an outbound action only when the target chat's
tenant is approved for the gateway, and the chat's tenant is what the platform's own inbound
traffic said (its scope id, or its user for a direct message) -- it outranks whatever a gateway
claims in its metadata.  That memory must outlive the process: a restarted connector that had
forgotten it would decline a reply owed to a chat until someone wrote there again, and would
let a gateway's claimed scope decide for a chat the platform had placed in another tenant.

So each (platform, chat) is written once, when the platform first shows it (again only when the
platform moves it to another tenant), and read back into memory at start; the guard itself is
one dictionary lookup.  Connector nodes sharing the store (a cluster) read through: a node that
does not hold a chat, or whose memory would decline it, reads its row (:meth:`ChatTenants.reread`)
before the guard decides, and a chat another node learned, moved or forgot is read again on that
node's notice (:attr:`ChatTenants.announce`) or, at the latest, by the sweep's re-read of the
whole table a page at a time (:meth:`ChatTenants.reread_page`).  Forgotten rows are deleted by
the connector's housekeeping once forgotten longer ago than the retention
(:meth:`ChatTenants.prune`, a bounded batch per round).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from enum import StrEnum

from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind, Field
from statecore.ids import composite_id
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit, Row, Store, gt, lt

__all__ = ["CHAT_TENANT", "CHAT_TENANT_KIND", "PRUNE_BATCH", "ChatTenantState", "ChatTenants"]

PRUNE_BATCH = 1000
"""Forgotten rows one housekeeping round deletes at most (the rest go in the next rounds)."""


class ChatTenantState(StrEnum):
    """What the connector knows of one chat's tenant."""

    KNOWN = "known"
    """The platform said which tenant the chat belongs to."""
    FORGOTTEN = "forgotten"
    """Terminal: an operator withdrew it; the next inbound event from the chat teaches it again."""


_T = ChatTenantState

CHAT_TENANT: Lifecycle[ChatTenantState] = Lifecycle(
    "chat_tenant",
    ChatTenantState,
    initial=_T.KNOWN,
    terminal=(_T.FORGOTTEN,),
    description="The tenant a chat belongs to, as the platform's inbound traffic said it.",
    transitions=(
        Transition("learn", None, _T.KNOWN),
        Transition("move", _T.KNOWN, _T.KNOWN),
        Transition("forget", _T.KNOWN, _T.FORGOTTEN),
        Transition("prune", _T.FORGOTTEN, None),
    ),
)

CHAT_TENANT_KIND: EntityKind[ChatTenantState] = EntityKind(
    "chat_tenant",
    CHAT_TENANT,
    table="relay_chat_tenant",
    id_field="chat_key",
    fields=(
        Field("platform", str, nullable=False, immutable=True),
        Field("chat_id", str, nullable=False, immutable=True),
        Field("tenant", str, nullable=False),
        Field("updated_at", float, nullable=False),
    ),
)


class ChatTenants:
    """The durable chat → tenant memory over any Store.

    :meth:`get` and :meth:`changes` are in-memory reads, safe on the event loop; :meth:`learn`,
    :meth:`forget`, the re-reads and :meth:`prune` use the store (call them off the loop).

    ``announce`` (None: a lone connector) is called as ``announce(platform, chat_id)`` inside
    the transaction of every learn, move and forget, so that a cluster node can tell its peers
    (the notice is sent on commit); it must not raise but for a ``StoreError``.
    """

    def __init__(self, store: Store, *, clock: Clock | None = None) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        store.register(CHAT_TENANT_KIND)
        # Held by every change of memory; a re-read holds it from its read to its last change,
        # so a read that began before a learn of this process can never undo that learn.
        self._lock = threading.Lock()
        self.announce: Callable[[str, str], None] | None = None
        self._known: dict[tuple[str, str], str] = {
            (row["platform"], row["chat_id"]): row["tenant"]
            for row in store.select(CHAT_TENANT_KIND, states=(_T.KNOWN,))
        }

    def get(self, platform: str, chat_id: str) -> str | None:
        """The tenant ``chat_id`` on ``platform`` belongs to (None: never shown)."""
        return self._known.get((platform, chat_id))

    def changes(self, platform: str, chat_id: str, tenant: str) -> bool:
        """True when :meth:`learn` would write: the chat is new, or it moved tenant."""
        return self._known.get((platform, chat_id)) != tenant

    def learn(self, platform: str, chat_id: str, tenant: str) -> bool:
        """Remember that ``chat_id`` belongs to ``tenant`` (idempotent); True when it wrote.
        Raises ``StoreError`` when the store cannot record it (memory is then left as it was,
        so the guard never acts on what the store does not hold)."""
        if not self.changes(platform, chat_id, tenant):
            return False
        now = self.clock.now()
        key = composite_id(platform, chat_id)
        values = {"tenant": tenant, "updated_at": now}
        with self.store.atomic():
            row = self.store.get(CHAT_TENANT_KIND, key)
            if row is not None and row.state is _T.KNOWN:
                self.store.transition(
                    CHAT_TENANT_KIND, key, "move", audit=Audit(now, platform), changes=values
                )
            else:
                if row is not None:  # forgotten: it starts over
                    where = {"platform": platform, "chat_id": chat_id}
                    self.store.prune(CHAT_TENANT_KIND, "prune", where=where)
                self.store.insert(
                    CHAT_TENANT_KIND,
                    key,
                    {"platform": platform, "chat_id": chat_id, **values},
                    event="learn",
                    audit=Audit(now, platform),
                )
            if self.announce is not None:
                self.announce(platform, chat_id)
        with self._lock:
            self._known[(platform, chat_id)] = tenant
        return True

    def forget(self, platform: str, chat_id: str) -> None:
        """Withdraw what is known of one chat (every node of a cluster stops using it: see
        ``announce``).  Raises ``InvalidTransition`` when nothing is, ``StoreError`` when the
        store fails (memory is then left as it was)."""
        now = self.clock.now()
        with self.store.atomic():
            self.store.transition(
                CHAT_TENANT_KIND,
                composite_id(platform, chat_id),
                "forget",
                audit=Audit(now),
                changes={"updated_at": now},
            )
            if self.announce is not None:
                self.announce(platform, chat_id)
        with self._lock:
            self._known.pop((platform, chat_id), None)

    def reread(self, platform: str, chat_id: str) -> str | None:
        """Read one chat's row into memory (another node sharing the store may have learned,
        moved or forgotten it since this memory was filled) and return its tenant now (None:
        not known there).  Off the loop; raises ``StoreError`` when the store cannot be read
        (memory is then left as it was)."""
        with self._lock:
            row = self.store.get(CHAT_TENANT_KIND, composite_id(platform, chat_id))
            self._apply(platform, chat_id, row)
        return self._known.get((platform, chat_id))

    def reread_page(self, after: str, *, limit: int = 1000) -> str:
        """Read up to ``limit`` rows into memory, in id order after the id ``after`` ("" from
        the start); return the id to pass next, "" once the end of the table was reached.  A
        caller that keeps passing what it got back re-reads the whole table, ``limit`` rows at
        a time.  Off the loop; raises ``StoreError`` (memory is then left as it was)."""
        where = {CHAT_TENANT_KIND.id_field: gt(after)} if after else None
        with self._lock:
            rows = self.store.select(CHAT_TENANT_KIND, where=where, limit=limit)
            for row in rows:
                self._apply(row["platform"], row["chat_id"], row)
        return rows[-1].id if len(rows) == limit else ""

    def _apply(self, platform: str, chat_id: str, row: Row[ChatTenantState] | None) -> None:
        """Make memory say what ``row`` (as just read) says; the caller holds the lock."""
        if row is not None and row.state is _T.KNOWN:
            self._known[(platform, chat_id)] = row["tenant"]
        else:
            self._known.pop((platform, chat_id), None)

    def prune(self, *, older_than_s: float, limit: int = PRUNE_BATCH) -> int:
        """Delete at most ``limit`` chats forgotten more than ``older_than_s`` ago, with their
        history; return how many.  A known chat is never deleted.  Raises ``StoreError``."""
        cutoff = self.clock.now() - older_than_s
        return self.store.prune(
            CHAT_TENANT_KIND, "prune", where={"updated_at": lt(cutoff)}, limit=limit
        )

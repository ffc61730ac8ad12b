"""The tenant of each chat, as the platform said it: the tenant guard's memory, kept durably.

With a tenants table the connector performs an outbound action only when the target chat's
tenant is approved for the gateway, and the chat's tenant is what the platform's own inbound
traffic said (its scope id, or its user for a direct message) -- it outranks whatever a gateway
claims in its metadata.  That memory must outlive the process: a restarted connector that had
forgotten it would decline a reply owed to a chat until someone wrote there again, and would
let a gateway's claimed scope decide for a chat the platform had placed in another tenant.

So each (platform, chat) is written once, when the platform first shows it (again only when the
platform moves it to another tenant), and read back into memory at start; the guard itself is
one dictionary lookup.
"""

from __future__ import annotations

import threading
from enum import StrEnum

from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind, Field
from statecore.ids import composite_id
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit, Store

__all__ = ["CHAT_TENANT", "CHAT_TENANT_KIND", "ChatTenantState", "ChatTenants"]


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

    :meth:`get` and :meth:`changes` are in-memory reads, safe on the event loop; :meth:`learn`
    and :meth:`forget` write the store (call them off the loop).
    """

    def __init__(self, store: Store, *, clock: Clock | None = None) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        store.register(CHAT_TENANT_KIND)
        self._lock = threading.Lock()
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
        with self._lock:
            self._known[(platform, chat_id)] = tenant
        return True

    def forget(self, platform: str, chat_id: str) -> None:
        """Withdraw what is known of one chat.  Raises ``InvalidTransition`` when nothing is."""
        now = self.clock.now()
        self.store.transition(
            CHAT_TENANT_KIND,
            composite_id(platform, chat_id),
            "forget",
            audit=Audit(now),
            changes={"updated_at": now},
        )
        with self._lock:
            self._known.pop((platform, chat_id), None)

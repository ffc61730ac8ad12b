"""Which gateways listen to which platform: remembered durably by the connector.

Without a tenant map, a platform's traffic goes to every gateway that said hello for it.  A
gateway that is asleep when the connector restarts has not said hello to the new process, so
the connector remembers every (gateway, platform) pair in its store and keeps buffering for it.
"""

from __future__ import annotations

from enum import StrEnum

from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind, Field
from statecore.ids import composite_id
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit, Store

__all__ = ["SUBSCRIPTION", "SUBSCRIPTION_KIND", "SubscriptionState", "Subscriptions"]


class SubscriptionState(StrEnum):
    """A gateway's interest in one platform's inbound traffic."""

    ACTIVE = "active"
    """The gateway said hello for the platform: its traffic is delivered or buffered for it."""
    RETIRED = "retired"
    """Terminal: an operator removed the gateway; nothing more is buffered for it."""


_S = SubscriptionState

SUBSCRIPTION: Lifecycle[SubscriptionState] = Lifecycle(
    "subscription",
    SubscriptionState,
    initial=_S.ACTIVE,
    terminal=(_S.RETIRED,),
    description="A gateway's interest in a platform, remembered across connector restarts.",
    transitions=(
        Transition("subscribe", None, _S.ACTIVE),
        Transition("retire", _S.ACTIVE, _S.RETIRED),
        Transition("prune", _S.RETIRED, None),
    ),
)

SUBSCRIPTION_KIND: EntityKind[SubscriptionState] = EntityKind(
    "subscription",
    SUBSCRIPTION,
    table="relay_subscriptions",
    id_field="subscription_id",
    fields=(
        Field("gateway_id", str, nullable=False, immutable=True),
        Field("platform", str, nullable=False, immutable=True),
        Field("since", float, nullable=False, immutable=True),
    ),
)


class Subscriptions:
    """The durable (gateway, platform) pairs, over any Store (synchronous)."""

    def __init__(self, store: Store, *, clock: Clock | None = None) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        store.register(SUBSCRIPTION_KIND)

    def add(self, gateway_id: str, platform: str) -> bool:
        """Remember that ``gateway_id`` listens to ``platform``; True if it is new."""
        now = self.clock.now()
        _, created = self.store.insert(
            SUBSCRIPTION_KIND,
            _key(gateway_id, platform),
            {"gateway_id": gateway_id, "platform": platform, "since": now},
            event="subscribe",
            audit=Audit(now, gateway_id),
        )
        return created

    def active(self) -> dict[str, set[str]]:
        """gateway id -> the platforms it listens to."""
        found: dict[str, set[str]] = {}
        for row in self.store.select(SUBSCRIPTION_KIND, states=(_S.ACTIVE,)):
            found.setdefault(row["gateway_id"], set()).add(row["platform"])
        return found

    def retire(self, gateway_id: str, platform: str) -> None:
        """Stop buffering ``platform``'s traffic for ``gateway_id``."""
        self.store.transition(
            SUBSCRIPTION_KIND,
            _key(gateway_id, platform),
            "retire",
            audit=Audit(self.clock.now(), gateway_id),
        )


def _key(gateway_id: str, platform: str) -> str:
    return composite_id(gateway_id, platform)

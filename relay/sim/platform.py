"""The chat platform of a world: users of two tenants writing, the webhook that hands each
message to the connector (retried until accepted), and the sends the bots perform."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs

from relay.sim.world import World
from relay.wire.frames import EventSource, InboundEvent, OutboundOutcome

__all__ = [
    "PLATFORM",
    "TENANTS",
    "Performed",
    "PlatformState",
    "SimPlatform",
    "Written",
    "gateway_tenants",
    "tenant_of",
]

PLATFORM = "sim"
TENANTS = ("acme", "globex")
CHATS_PER_TENANT = 2


def gateway_tenants() -> dict[str, str]:
    """Each gateway of a world (``gw-<tenant>``) and the one tenant it serves."""
    return {f"gw-{t}": t for t in TENANTS}


def tenant_of(chat_id: str) -> str:
    """The tenant a chat belongs to (its id is ``<tenant>-<n>``)."""
    return chat_id.rpartition("-")[0]


@attrs.frozen
class Written:
    """One message a user wrote."""

    message_id: str
    chat_id: str
    text: str
    at: float

    def event(self) -> InboundEvent:
        """The webhook's event for this message (its chat's tenant as the scope)."""
        return InboundEvent(
            text=self.text,
            message_id=self.message_id,
            source=EventSource(
                platform=PLATFORM,
                chat_id=self.chat_id,
                chat_type="group",
                user_id=f"user-{self.chat_id}",
                scope_id=tenant_of(self.chat_id),
            ),
        )


@attrs.frozen
class Performed:
    """One send the platform performed (what a user saw), and the gateway that asked."""

    chat_id: str
    text: str
    gateway_id: str
    at: float


class Accepting(Protocol):
    """The connector, as the webhook reaches it."""

    def accept(self, event: InboundEvent) -> bool:
        """Take ``event`` durably; False (or a raise) when it could not."""
        ...


class PlatformState:
    """What a simulated platform saw -- the messages users wrote, those the connector took,
    the sends it performed -- and the faults it plays next; what the checks read."""

    def __init__(self) -> None:
        self.chats = [f"{t}-{n}" for t in TENANTS for n in range(CHATS_PER_TENANT)]
        self.written: dict[str, Written] = {}
        self.accepted: set[str] = set()
        self.performed: list[Performed] = []
        self.refuse_next = 0
        self.slow_until = -1.0
        self.duplicate_next = 0


class SimPlatform(PlatformState):
    """Users write round the chats; each message is delivered to the connector until it is
    accepted (a refusal or a connector that is down is retried, as a webhook is)."""

    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world
        self.connector: Accepting | None = None
        self._n = 0

    def write(self) -> None:
        """A user writes one message in a random chat."""
        self._n += 1
        chat = self.world.rng.choice(self.chats)
        message = Written(f"m{self._n}", chat, f"message {self._n} in {chat}", self.world.now)
        self.written[message.message_id] = message
        self.world.log(f"user writes {message.message_id} in {chat}")
        self._deliver(message, 1)

    def _deliver(self, message: Written, attempt: int) -> None:
        event = message.event()
        connector = self.connector
        took = False
        if connector is not None:
            try:
                took = connector.accept(event)
            except Exception as exc:  # the connector's store failed: not accepted
                self.world.log(f"webhook {message.message_id}: refused ({exc})")
        if took:
            self.accepted.add(message.message_id)
            if self.duplicate_next > 0:  # the platform delivers it once more
                self.duplicate_next -= 1
                self.world.at(
                    self.world.rng.uniform(0.01, 0.5),
                    "webhook repeat",
                    lambda: self._deliver(message, attempt + 1),
                )
            return
        self.world.at(
            min(5.0, 0.2 * attempt), "webhook retry", lambda: self._deliver(message, attempt + 1)
        )

    def perform(
        self,
        gateway_id: str,
        action: Mapping[str, Any],
        done: Callable[[OutboundOutcome], None],
    ) -> None:
        """Perform one send after a delay (longer while slow), or refuse it; call ``done`` with
        the outcome (the caller may be gone by then: the user still saw the message)."""
        slow = self.world.now < self.slow_until
        delay = self.world.rng.uniform(1.0, 4.0) if slow else self.world.rng.uniform(0.005, 0.05)

        def finish() -> None:
            if self.refuse_next > 0:
                self.refuse_next -= 1
                self.world.log(f"platform refuses a send of {gateway_id}")
                done(OutboundOutcome(False, None, "platform busy", "platform_busy"))
                return
            chat, text = str(action["chat_id"]), str(action["content"])
            self.performed.append(Performed(chat, text, gateway_id, self.world.now))
            self.world.log(f"platform shows in {chat}: {text!r}")
            done(OutboundOutcome(True, f"p{len(self.performed)}"))

        self.world.at(delay, "platform send", finish)

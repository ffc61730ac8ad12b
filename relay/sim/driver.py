"""The chat platform of a world of the real runtime, as a connector platform driver.

It is the same platform as :class:`relay.sim.platform.SimPlatform` -- users of two tenants
writing round the chats, the webhook that hands each message to the connector until it is
accepted, the sends the bots perform -- but the real :class:`~relay.connector.Connector`
drives it through the :class:`~relay.connector.platform.PlatformDriver` protocol:

* the webhook calls the intake the connector attached, as a task of the *connector's* life
  (a connector killed mid-request never answers; the platform gives up after a timeout and
  retries, as a webhook does);
* a send runs as a task of the *platform's* life: once asked, the platform performs it even
  if the connector that asked dies meanwhile (the user saw it; the connector never learnt).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Mapping
from typing import Any

from relay.connector.platform import Intake, LoopbackPlatform, target_chat
from relay.sim.lives import PROCESS, Life
from relay.sim.loop import SimLoop
from relay.sim.platform import PLATFORM, Performed, PlatformState, Written
from relay.wire.descriptor import CapabilityDescriptor
from relay.wire.frames import InboundEvent, OutboundOutcome

__all__ = ["WEBHOOK_TIMEOUT_S", "SimDriver"]

WEBHOOK_TIMEOUT_S = 5.0
"""How long the webhook waits for the connector to take a message before trying again."""


class SimDriver(PlatformState):
    """See the module docs.  ``SimDriver(loop, rng, log, life)``: ``life`` is the platform's
    own (never killed); ``log`` records a step of the world's trace.  The world tells
    :attr:`asked` which gateway asked for each send, as the gateway's transport asks for it."""

    platform = PLATFORM

    def __init__(self, loop: SimLoop, rng: Any, log: Any, life: Life) -> None:
        super().__init__()
        self.loop = loop
        self.rng = rng
        self.log = log
        self.life = life
        self._descriptor = LoopbackPlatform(PLATFORM, id_prefix="sim").descriptor()
        self._intake: Intake | None = None
        self._intake_context: contextvars.Context | None = None
        self._n = 0
        self.asked: dict[tuple[str, str], set[str]] = {}
        """(chat, text) -> the gateways whose transport asked for that send."""

    # -- the PlatformDriver protocol -------------------------------------------------------------

    def attach(self, intake: Intake) -> None:
        """Called by each connector life as it starts: the webhook goes to it from now on."""
        self._intake = intake
        self._intake_context = contextvars.copy_context()

    def descriptor(self) -> CapabilityDescriptor:
        """The loopback platform's capabilities, under this platform's name."""
        return self._descriptor

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        """Perform one action (see the module docs): typing is shown and forgotten; a send takes
        a few milliseconds (seconds while slow) or is refused while refusals are due."""
        if action.get("op") == "typing":
            return OutboundOutcome(True)
        chat = target_chat(action)
        content = action.get("content")
        if chat is None or not isinstance(content, str):
            return OutboundOutcome(False, None, "chat_id and content are required", "bad_action")
        work = self.loop.spawn(self.life, lambda: self._perform(chat, content))
        return await asyncio.shield(work)

    async def _perform(self, chat: str, text: str) -> OutboundOutcome:
        slow = self.loop.time() < self.slow_until
        await asyncio.sleep(self.rng.uniform(1.0, 4.0) if slow else self.rng.uniform(0.005, 0.05))
        if self.refuse_next > 0:
            self.refuse_next -= 1
            self.log(f"platform refuses a send in {chat}")
            return OutboundOutcome(False, None, "platform busy", "platform_busy")
        # The gateway that asked for it; several (or none) name no gateway of the world.
        writer = "+".join(sorted(self.asked.get((chat, text), ()))) or "(nobody)"
        self.performed.append(Performed(chat, text, writer, self.loop.time()))
        self.log(f"platform shows in {chat}: {text!r}")
        return OutboundOutcome(True, f"p{len(self.performed)}")

    # -- users ---------------------------------------------------------------------------------

    def write(self) -> None:
        """A user writes one message in a random chat; the webhook delivers it."""
        self._n += 1
        chat = self.rng.choice(self.chats)
        message = Written(f"m{self._n}", chat, f"message {self._n} in {chat}", self.loop.time())
        self.written[message.message_id] = message
        self.log(f"user writes {message.message_id} in {chat}")
        self.loop.spawn(self.life, lambda: self._webhook(message))

    async def _webhook(self, message: Written) -> None:
        attempt = 0
        while not await self._post(message):
            attempt += 1
            await asyncio.sleep(min(5.0, 0.2 * attempt))
        self.accepted.add(message.message_id)
        if self.duplicate_next > 0:  # the platform delivers it once more
            self.duplicate_next -= 1
            await asyncio.sleep(self.rng.uniform(0.01, 0.5))
            self.log(f"webhook repeats {message.message_id}")
            await self._post(message)

    async def _post(self, message: Written) -> bool:
        """One webhook request: True once the connector took the message."""
        intake, context = self._intake, self._intake_context
        owner = context.get(PROCESS) if context is not None else None
        if intake is None or context is None or owner is None or owner in self.loop.dead:
            return False  # connection refused: no connector is up
        event = message.event()
        request = self.loop.create_task(_call(intake, event), context=context.copy())
        try:
            await asyncio.wait_for(asyncio.shield(request), WEBHOOK_TIMEOUT_S)
        except TimeoutError:
            self.log(f"webhook {message.message_id}: no answer")
            return False
        except Exception as exc:  # the connector failed to take it (its store failed)
            self.log(f"webhook {message.message_id}: refused ({type(exc).__name__})")
            return False
        return True


async def _call(intake: Intake, event: InboundEvent) -> None:
    await intake(PLATFORM, event)

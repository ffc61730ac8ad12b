"""RelayAdapter.dedupe_window_s: how long the connector's platform deduplicates a resend under
one idempotency key, read from the handshaken descriptor -- a window only where the descriptor
announces idempotent sends and gives one; nothing for an original connector."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import attrs
import pytest
import pytest_asyncio

from relay.client.adapter import RelayAdapter
from relay.client.lifecycle import TransportState as T
from relay.client.requests import RequestOutcome, RequestResult
from relay.wire.compat import IDEMPOTENT_SENDS, OUR_FEATURES
from relay.wire.descriptor import CONTRACT_VERSION, CapabilityDescriptor
from relay.wire.frames import InboundEvent
from statecore.gateway.adapter import abilities_of
from stores.memory import InMemoryStore
from tests.relay.connector.connector_harness import Harness
from tests.relay.connector.deduping_platform import DAY_S, DedupingPlatform

ORIGINAL = CapabilityDescriptor(
    contract_version=CONTRACT_VERSION,
    platform="matrix",
    label="Matrix",
    max_message_length=60000,
    supports_draft_streaming=False,
    supports_edit=True,
    supports_threads=True,
    markdown_dialect="commonmark",
    len_unit="chars",
)
"""What an original connector sends: no features, no window."""

DEDUPING = attrs.evolve(
    ORIGINAL, features=(*OUR_FEATURES, IDEMPOTENT_SENDS), idempotency_window_s=DAY_S
)


class HandshakeTransport:
    """A transport double whose handshake answers with ``answer``; after it, ``descriptor`` is
    that of the latest handshake (as on the real transport)."""

    platform = "matrix"

    def __init__(self, answer: CapabilityDescriptor) -> None:
        self.answer = answer
        self.descriptor: CapabilityDescriptor | None = None
        self.state = T.NEW
        self.listeners: list[Callable[[T, T, str], None]] = []

    async def connect(self) -> None:
        self.state = T.HANDSHAKING

    async def handshake(self) -> CapabilityDescriptor:
        self.state = T.CONNECTED
        self.descriptor = self.answer
        return self.answer

    def set_inbound_handler(
        self, handler: Callable[[InboundEvent], Awaitable[None]] | None
    ) -> None:
        del handler

    async def request(
        self, action: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> RequestResult:
        return RequestResult(RequestOutcome.OK, "r1", "m1")

    async def go_idle(self, timeout_s: float = 10.0) -> bool:
        return True

    async def go_dormant(self, timeout_s: float = 10.0) -> bool:
        return False

    async def disconnect(self, budget_s: float | None = None) -> None:
        self.state = T.CLOSED


async def connected(answer: CapabilityDescriptor) -> tuple[HandshakeTransport, RelayAdapter]:
    transport = HandshakeTransport(answer)
    adapter = RelayAdapter(transport)
    assert await adapter.connect()
    return transport, adapter


def test_the_adapter_declares_that_it_may_dedupe_sends() -> None:
    """The runtime reads the window only of an adapter that declares it."""
    assert abilities_of(RelayAdapter(HandshakeTransport(ORIGINAL))).dedupes_sends


@pytest.mark.asyncio
async def test_an_announced_window_is_the_adapters_dedupe_window() -> None:
    """IDEMPOTENT_SENDS with a window: that window, in seconds."""
    _, adapter = await connected(DEDUPING)
    assert adapter.dedupe_window_s == float(DAY_S)


@pytest.mark.parametrize(
    "descriptor",
    [
        ORIGINAL,
        attrs.evolve(ORIGINAL, features=OUR_FEATURES),
        attrs.evolve(ORIGINAL, idempotency_window_s=DAY_S),
        attrs.evolve(ORIGINAL, features=(IDEMPOTENT_SENDS,)),
    ],
    ids=["original", "our-features-only", "window-without-feature", "feature-without-window"],
)
@pytest.mark.asyncio
async def test_no_window_unless_announced_with_one(descriptor: CapabilityDescriptor) -> None:
    """An original connector, ours without the feature, a window without the feature, or the
    feature without a window: None (every possible repeat stays labelled)."""
    _, adapter = await connected(descriptor)
    assert adapter.dedupe_window_s is None


def test_no_window_before_a_descriptor_was_adopted() -> None:
    """Not connected yet and no placeholder: None."""
    assert RelayAdapter(HandshakeTransport(DEDUPING)).dedupe_window_s is None


@pytest.mark.asyncio
async def test_the_latest_handshake_decides() -> None:
    """A connector reached again that no longer announces it: None from then on."""
    transport, adapter = await connected(DEDUPING)
    transport.answer = ORIGINAL
    await transport.handshake()  # the transport's own reconnection
    assert adapter.dedupe_window_s is None


# -- through the reference connector ----------------------------------------------------------


@pytest_asyncio.fixture
async def h() -> AsyncIterator[Harness]:
    """A connector harness over an in-memory store, closed afterwards."""
    store = InMemoryStore()
    harness = Harness(store)
    try:
        yield harness
    finally:
        await harness.close()
        store.close()


@pytest.mark.parametrize(("deduping", "window"), [(True, float(DAY_S)), (False, None)])
@pytest.mark.asyncio
async def test_through_a_connector_the_drivers_window_reaches_the_adapter(
    h: Harness, deduping: bool, window: float | None
) -> None:
    """A connector whose driver deduplicates announces its window to the adapter; one with the
    loopback driver announces none."""
    driver = DedupingPlatform() if deduping else h.platform
    connector = await h.start(drivers={"loopback": driver})
    transport = h.transport(connector, "gw-a")
    adapter = RelayAdapter(transport)

    assert await adapter.connect()

    assert adapter.dedupe_window_s == window

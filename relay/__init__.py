"""The relay: the wire between a gateway and the connector that fronts its chat platforms.

* :class:`WebSocketRelayTransport` -- one WebSocket to a connector, driven by the TRANSPORT
  lifecycle (reconnect, dormancy, bounded teardown);
* :class:`RelayAdapter` -- the platform adapter the gateway runtime (``statecore.gateway``)
  sends replies through;
* :class:`Connector` -- the reference connector server, with :class:`LoopbackPlatform`;
* the sans-I/O wire layer (``relay.wire``): frames, codec, :class:`CapabilityDescriptor`,
  :func:`mint_token` / :func:`verify_token`, :func:`relay_url`.
"""

from relay.client.adapter import SEND_PATH_DEGRADED, ChatRoute, RelayAdapter
from relay.client.dedupe import StoreBufferDedupe
from relay.client.lifecycle import TRANSPORT, TransportState
from relay.client.requests import RequestOutcome, RequestResult
from relay.client.transport import WebSocketRelayTransport
from relay.connector.platform import LoopbackPlatform, PlatformDriver
from relay.connector.server import Connector
from relay.wire.auth import mint_token, verify_token
from relay.wire.descriptor import CONTRACT_VERSION, CapabilityDescriptor
from relay.wire.errors import (
    AuthError,
    ContractVersionError,
    ProtocolError,
    RelayBroken,
    RelayClosed,
)
from relay.wire.frames import EventSource, InboundEvent
from relay.wire.urls import relay_url

__all__ = [
    "CONTRACT_VERSION",
    "SEND_PATH_DEGRADED",
    "TRANSPORT",
    "AuthError",
    "CapabilityDescriptor",
    "ChatRoute",
    "Connector",
    "ContractVersionError",
    "EventSource",
    "InboundEvent",
    "LoopbackPlatform",
    "PlatformDriver",
    "ProtocolError",
    "RelayAdapter",
    "RelayBroken",
    "RelayClosed",
    "RequestOutcome",
    "RequestResult",
    "StoreBufferDedupe",
    "TransportState",
    "WebSocketRelayTransport",
    "mint_token",
    "relay_url",
    "verify_token",
]

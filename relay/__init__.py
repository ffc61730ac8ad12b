"""The relay: the wire between a gateway and the connector that fronts its chat platforms.

* :class:`WebSocketRelayTransport` -- one WebSocket to a connector, driven by the TRANSPORT
  lifecycle (reconnect, dormancy, bounded teardown);
* :class:`RelayAdapter` -- the platform adapter the gateway runtime sends replies through;
* :class:`Gateway` -- the runtime a bot is built on (:class:`Turn`, :class:`Message`);
* :class:`Connector` -- the reference connector server, with :class:`LoopbackPlatform`;
* the sans-I/O wire layer: ``relay.frames``, ``relay.codec``, :class:`CapabilityDescriptor`,
  :func:`mint_token` / :func:`verify_token`, :func:`relay_url`.
"""

from relay.adapter import SEND_PATH_DEGRADED, ChatRoute, RelayAdapter
from relay.auth import mint_token, verify_token
from relay.connector import Connector
from relay.dedupe import StoreBufferDedupe
from relay.descriptor import CONTRACT_VERSION, CapabilityDescriptor
from relay.errors import AuthError, ContractVersionError, ProtocolError, RelayBroken, RelayClosed
from relay.frames import EventSource, InboundEvent
from relay.gateway import Gateway, Message, Turn
from relay.platform import LoopbackPlatform, PlatformDriver
from relay.transport import RequestOutcome, RequestResult, WebSocketRelayTransport
from relay.urls import relay_url

__all__ = [
    "CONTRACT_VERSION",
    "SEND_PATH_DEGRADED",
    "AuthError",
    "CapabilityDescriptor",
    "ChatRoute",
    "Connector",
    "ContractVersionError",
    "EventSource",
    "Gateway",
    "InboundEvent",
    "LoopbackPlatform",
    "Message",
    "PlatformDriver",
    "ProtocolError",
    "RelayAdapter",
    "RelayBroken",
    "RelayClosed",
    "RequestOutcome",
    "RequestResult",
    "StoreBufferDedupe",
    "Turn",
    "WebSocketRelayTransport",
    "mint_token",
    "relay_url",
    "verify_token",
]

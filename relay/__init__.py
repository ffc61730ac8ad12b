"""The relay: the wire between a gateway and the connector that fronts its chat platforms.

* :class:`WebSocketRelayTransport` -- one WebSocket to a connector, driven by the TRANSPORT
  lifecycle (reconnect, dormancy, bounded teardown);
* :class:`RelayAdapter` -- the platform adapter the gateway runtime sends replies through;
* the sans-I/O wire layer: ``relay.frames``, ``relay.codec``, :class:`CapabilityDescriptor`,
  :func:`mint_token` / :func:`verify_token`, :func:`relay_url`.
"""

from relay.adapter import ChatRoute, RelayAdapter
from relay.auth import mint_token, verify_token
from relay.descriptor import CONTRACT_VERSION, CapabilityDescriptor
from relay.errors import AuthError, ContractVersionError, ProtocolError, RelayBroken, RelayClosed
from relay.frames import EventSource, InboundEvent
from relay.transport import RequestOutcome, RequestResult, WebSocketRelayTransport
from relay.urls import relay_url

__all__ = [
    "CONTRACT_VERSION",
    "AuthError",
    "CapabilityDescriptor",
    "ChatRoute",
    "ContractVersionError",
    "EventSource",
    "InboundEvent",
    "ProtocolError",
    "RelayAdapter",
    "RelayBroken",
    "RelayClosed",
    "RequestOutcome",
    "RequestResult",
    "WebSocketRelayTransport",
    "mint_token",
    "relay_url",
    "verify_token",
]

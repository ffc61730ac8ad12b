"""The gateway side of the relay: the WebSocket transport (one connection to a connector, driven
by the TRANSPORT lifecycle), its inbound dispatcher, the platform adapter the runtime sends
through, and the durable dedupe of buffered deliveries.  Built on :mod:`relay.wire`."""

"""The reference connector: the relay's server (:mod:`relay.connector.server`), the durable
inbound buffer, the subscriptions and egress provenance it remembers, and the platform drivers
(:mod:`relay.connector.platform`).  Built on :mod:`relay.wire`."""

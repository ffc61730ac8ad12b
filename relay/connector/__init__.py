"""The reference connector: the relay's server (:mod:`relay.connector.server`), the durable
inbound buffer, the subscriptions and egress provenance it remembers, the platform drivers
(:mod:`relay.connector.platform`), its housekeeping and its ``/healthz`` and ``/metrics``
endpoints.  Built on :mod:`relay.wire`."""

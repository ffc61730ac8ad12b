"""The reference connector: the relay's server (:mod:`relay.connector.server`), the durable
inbound buffer, the subscriptions, egress provenance and chat tenants it remembers in its store
(:mod:`relay.connector.chat_tenants`: the tenant each chat belongs to, as the platform said it),
the platform drivers (:mod:`relay.connector.platform`) and what they get from it
(:mod:`relay.connector.intake`: the inbound dedupe of :mod:`relay.connector.seen`, the hold of
:mod:`relay.connector.held`, the records of :mod:`relay.connector.rejected`, the notes of
:mod:`relay.connector.driver_notes`), its housekeeping and its ``/healthz`` and ``/metrics``
endpoints.  Built on :mod:`relay.wire`.

In a cluster every node reads the chat tenants at start only: a chat whose tenant another node
learnt afterwards falls back, on this node, to the scope or user the gateway claims until the
node restarts."""

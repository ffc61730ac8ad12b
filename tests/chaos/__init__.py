"""The fault harness: a PostgreSQL fleet of gateways and a connector cluster, real processes,
under partitions, pauses, server restarts, clock offsets and SIGKILLs; and its history checker."""

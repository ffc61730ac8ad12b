"""The connector's housekeeping: settled rows are pruned on a timer on the connector's clock.

Every ``prune_interval_s`` (0: never) one round runs on the store thread, in order:

* unacked buffer entries older than the buffer's ``retention_s`` are expired (counted and
  logged at WARNING by the buffer: they were never delivered), whichever gateway they wait for
  -- also a gateway that never comes back;
* acked and expired buffer entries settled more than ``buffer_retention_s`` ago are deleted
  (``buffer``);
* egress-provenance targets an operator made the connector forget more than
  ``buffer_retention_s`` ago are deleted (``provenance``);
* inbound dedupe keys taken more than ``seen_retention_s`` ago are forgotten and deleted
  (``seen``);
* events held for a gateway that has not said hello, held longer than the buffer's
  ``retention_s``, are expired (counted and logged at WARNING by the hold), and held entries
  released or expired more than ``buffer_retention_s`` ago are deleted (``held``);
* rejected-event records an operator dismissed, and drivers' notes dropped, more than
  ``buffer_retention_s`` ago are deleted (``rejected``, ``notes``);
* with a tenants table, chat tenants an operator made the connector forget more than
  ``buffer_retention_s`` ago are deleted, at most
  :data:`~relay.connector.chat_tenants.PRUNE_BATCH` a round (``chat_tenants``: the key is in
  the counts only with a tenants table, the only configuration that writes chat tenants).

An unacked entry, a known target or chat, an event still held, a record nobody dismissed and a saved
note are never deleted.  Each count goes to the metrics hook (``metrics.pruned(what, rows)``)
and the round is logged once at INFO with every count (``extra``: ``pruned``, ``expired``,
``expired_held``, ``duration_s``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

from relay.connector._settings import HousekeepingSettings
from relay.connector._store_thread import StoreThread
from relay.connector.chat_tenants import ChatTenants

__all__ = ["Housekeeping"]

# Every part of the connector logs to the one logger docs/configuration.md names.
log = logging.getLogger("relay.connector.server")


class _Settings(HousekeepingSettings, Protocol):
    """What the housekeeping reads of the connector besides :class:`HousekeepingSettings`."""

    @property
    def tenants(self) -> Mapping[str, frozenset[str]] | None:
        """The tenants table (None: no chat tenants are written, none are pruned)."""
        ...

    @property
    def chat_tenants(self) -> ChatTenants:
        """The chat tenants whose forgotten rows it prunes."""
        ...


class Housekeeping:
    """The connector's housekeeping timer and rounds (see the module docs)."""

    def __init__(self, connector: _Settings, *, store: StoreThread) -> None:
        self._connector = connector
        self._store = store
        self._timer: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the timer (unless it runs, or the interval is 0)."""
        if not self._connector.prune_interval_s:
            return
        if self._timer is None or self._timer.done():
            self._timer = asyncio.create_task(self._run_timer(), name="connector-housekeeping")

    def stop(self) -> None:
        """Stop the timer (a round in progress finishes on the store thread)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _run_timer(self) -> None:
        connector = self._connector
        while True:  # until stop() cancels it
            await connector.clock.sleep(connector.prune_interval_s)
            try:
                await self.run()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("connector: housekeeping failed", exc_info=True)

    async def run(self) -> dict[str, int]:
        """One round, on the store thread; returns what it deleted by table (``buffer``,
        ``provenance``, ``seen``, ``held``, ``rejected``, ``notes``, and ``chat_tenants`` with
        a tenants table).  Raises ``StoreError`` when the store fails (nothing more is done)."""
        return await self._store.run(self._round)

    def _round(self) -> dict[str, int]:
        """On the store thread: expire, prune, count, log."""
        connector = self._connector
        began = connector.clock.monotonic()
        expired = connector.buffer.expire()
        held_out = connector.hold.expire(older_than_s=connector.buffer.retention_s)
        for platform in sorted(held_out):
            self._store.report_held(platform)
        retention = connector.buffer_retention_s
        pruned = {
            "buffer": connector.buffer.prune(older_than_s=retention),
            "provenance": connector.provenance.prune(older_than_s=retention),
            "seen": connector.seen.prune(older_than_s=connector.seen_retention_s),
            "held": connector.hold.prune(older_than_s=retention),
            "rejected": connector.rejected.prune(older_than_s=retention),
            "notes": connector.notes.prune(older_than_s=retention),
        }
        if connector.tenants is not None:
            pruned["chat_tenants"] = connector.chat_tenants.prune(older_than_s=retention)
        for what, rows in pruned.items():
            connector.metrics.pruned(what, rows)
        took = connector.clock.monotonic() - began
        expired_held = sum(held_out.values())
        log.info(
            "connector: housekeeping pruned %d settled buffer entries, %d forgotten targets, "
            "%d dedupe keys, %d settled held events, %d dismissed rejected events, %d dropped "
            "notes and %d forgotten chat tenants (expired %d unacked entries and %d held "
            "events) in %.3f s",
            pruned["buffer"],
            pruned["provenance"],
            pruned["seen"],
            pruned["held"],
            pruned["rejected"],
            pruned["notes"],
            pruned.get("chat_tenants", 0),
            expired,
            expired_held,
            took,
            extra={
                "pruned": dict(pruned),
                "expired": expired,
                "expired_held": expired_held,
                "duration_s": took,
            },
        )
        return pruned

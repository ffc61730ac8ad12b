"""The connector's bounded log lines: what a peer can cause is rate-limited per kind of line,
with counts (:class:`~relay.wire.throttle.LogLimits`), and what a peer wrote is escaped
(:mod:`relay.wire.logtext`) before any line carries it."""

from __future__ import annotations

import logging

from relay.wire.throttle import LogLimits

__all__ = ["limited", "log", "report_suppressed"]

# Every part of the connector logs to the one logger docs/configuration.md names.
log = logging.getLogger("relay.connector.server")


def limited(limits: LogLimits, kind: str, level: int) -> str | None:
    """:meth:`LogLimits.check` on the connector's logger: None to skip the line, else the
    suffix it must end with (the count of the lines of ``kind`` not logged before it)."""
    return limits.check(log, level, kind)


def report_suppressed(limits: LogLimits, source: str) -> None:
    """:meth:`LogLimits.report` on the connector's logger; ``source`` names what went away
    (never a peer's text)."""
    limits.report(log, f"connector: {source}")

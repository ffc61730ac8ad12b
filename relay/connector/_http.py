"""Plain HTTP on the connector's port, answered before any WebSocket upgrade.

The server's ``process_request`` hook sees every request first:

* ``GET /healthz`` -- 200 with a small JSON object: ``status`` (``"ok"``), ``gateways`` (how
  many gateway ids have a handshaken connection), ``buffered`` (unacked entries in the durable
  buffer, every gateway together) and ``oldest_buffered_s`` (how long the oldest of them has
  waited, None when none does: a growing value is a stalled gateway).  When the store cannot
  be read: 503, ``status`` ``"store_unavailable"`` and the ``error``.
* ``GET /metrics`` -- 200 with what the connector's ``http_metrics()`` returns (Prometheus
  text; run on a worker thread), or 404 when none is configured; 500 when it raised.
* anything else goes to the relay's admission (:func:`~relay.connector._admission.check_path`):
  the relay's path is upgraded (a plain GET there is refused as before, 426), any other path
  is 404.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from relay.connector._admission import check_path
from relay.connector._instance import Instance
from relay.connector._log import limited, log
from relay.connector._settings import HttpSettings
from relay.connector._store_thread import StoreThread
from relay.wire.logtext import peer_text
from relay.wire.throttle import LogLimits

__all__ = ["HEALTH_PATH", "METRICS_PATH", "HttpEndpoints"]

HEALTH_PATH = "/healthz"
METRICS_PATH = "/metrics"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class HttpEndpoints:
    """The connector's HTTP answers (see the module docs); ``served`` is the connector's table
    of served connections; failures are logged rate-limited in the connector's ``log_limits``
    (anyone who reaches the port decides how many requests there are)."""

    def __init__(
        self,
        connector: HttpSettings,
        *,
        served: Mapping[str, Instance],
        store: StoreThread,
        log_limits: LogLimits,
    ) -> None:
        self._connector = connector
        self._log_limits = log_limits
        self._served = served
        self._store = store

    async def process_request(
        self, connection: ServerConnection, request: Request
    ) -> Response | None:
        """The server's hook: an answer for the HTTP endpoints, else the relay's admission."""
        path = request.path.split("?", 1)[0]
        if path == HEALTH_PATH:
            return await self._health(connection)
        if path == METRICS_PATH:
            return await self._metrics(connection)
        return check_path(connection, request)

    async def _health(self, connection: ServerConnection) -> Response:
        gateways = sum(1 for instance in self._served.values() if instance.is_handshaken())
        try:
            buffered, oldest = await self._store.run(self._connector.buffer.backlog_stats)
        except Exception as exc:
            if (
                more := limited(self._log_limits, "failed health reads", logging.WARNING)
            ) is not None:
                log.warning(
                    "connector: /healthz could not read the buffer: %s%s",
                    peer_text(str(exc)),
                    more,
                )
            body = {"status": "store_unavailable", "gateways": gateways, "error": str(exc)}
            return _respond(connection, 503, json.dumps(body), "application/json")
        waited = None if oldest is None else max(0.0, self._connector.clock.now() - oldest)
        body = {
            "status": "ok",
            "gateways": gateways,
            "buffered": buffered,
            "oldest_buffered_s": waited,
        }
        return _respond(connection, 200, json.dumps(body), "application/json")

    async def _metrics(self, connection: ServerConnection) -> Response:
        metrics_text = self._connector.http_metrics
        if metrics_text is None:
            return connection.respond(404, "no metrics are configured on this connector\n")
        try:
            text: Any = await asyncio.to_thread(metrics_text)
        except Exception:
            if (
                more := limited(self._log_limits, "failed metrics reads", logging.WARNING)
            ) is not None:
                log.warning("connector: /metrics failed%s", more, exc_info=True)
            return connection.respond(500, "the metrics could not be read\n")
        body = text.decode("utf-8") if isinstance(text, bytes) else str(text)
        return _respond(connection, 200, body, PROMETHEUS_TEXT)


def _respond(connection: ServerConnection, status: int, body: str, content_type: str) -> Response:
    """A response with ``body`` as ``content_type`` (websockets' own answer, retyped)."""
    response = connection.respond(status, body)
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = content_type
    return response

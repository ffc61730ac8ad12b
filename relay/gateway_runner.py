"""``statecore gateway package.module:handler``: run a bot until SIGTERM, configured from the
environment.

The handler is ``async def handler(turn)`` (a :class:`~statecore.gateway.Turn`).  Settings, each
also a command-line option::

    STATECORE_CONNECTOR_URL   the connector's URL (required)              --connector
    STATECORE_STORE_URL       the ledger's store (sqlite:///bot.db)        --store
    STATECORE_PLATFORM        the platform to serve (loopback)             --platform
    STATECORE_BOT_ID          the bot's id on it (bot)                     --bot-id
    STATECORE_GATEWAY_ID      the identity the connector knows (bot id)    --gateway-id
    STATECORE_SECRET          the gateway's secret (none: no token)        --secret
    STATECORE_HTTP_PORT       serve /healthz and /metrics here (off)       --http-port
    STATECORE_HTTP_HOST       the address they listen on (127.0.0.1)       --http-host
    STATECORE_STOP_BUDGET_S   the graceful stop's budget (10)              --stop-budget

SIGTERM or SIGINT stops the gateway within the budget: in-flight replies are settled, the
connector is told to buffer (going idle), the ledger is closed.  A handler that cannot be
imported, a missing connector URL or a store that cannot be opened is refused before anything
connects, with a message naming it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs

from relay.client.adapter import RelayAdapter
from relay.client.dedupe import StoreBufferDedupe
from relay.client.transport import WebSocketRelayTransport
from statecore.cli.plugin import forwarding, serve_until_signalled
from statecore.errors import StatecoreError
from statecore.gateway import Gateway, Turn
from statecore.metrics import NO_METRICS, Metrics
from stores import open_store

__all__ = ["GATEWAY_COMMAND", "GatewayConfig", "main", "run_gateway"]

log = logging.getLogger(__name__)

Handler = Callable[[Turn], Awaitable[None]]

_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class ConfigError(ValueError):
    """A gateway configuration that cannot work; the message names the setting."""


@attrs.frozen
class GatewayConfig:
    """What ``statecore gateway`` runs (see the module docs)."""

    handler: str
    connector: str
    store: str = "sqlite:///bot.db"
    platform: str = "loopback"
    bot_id: str = "bot"
    gateway_id: str | None = None
    secret: str | None = None
    http_port: int | None = None
    http_host: str = "127.0.0.1"
    stop_budget_s: float = 10.0


_ENV = {
    "connector": "STATECORE_CONNECTOR_URL",
    "store": "STATECORE_STORE_URL",
    "platform": "STATECORE_PLATFORM",
    "bot_id": "STATECORE_BOT_ID",
    "gateway_id": "STATECORE_GATEWAY_ID",
    "secret": "STATECORE_SECRET",
    "http_port": "STATECORE_HTTP_PORT",
    "http_host": "STATECORE_HTTP_HOST",
    "stop_budget_s": "STATECORE_STOP_BUDGET_S",
}


def load_config(
    handler: str, env: Mapping[str, str], overrides: Mapping[str, Any] | None = None
) -> GatewayConfig:
    """The configuration from ``env`` then ``overrides``; raises :class:`ConfigError` naming
    the setting when one is missing or malformed."""
    values: dict[str, Any] = {k: env[v] for k, v in _ENV.items() if env.get(v)}
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    if not values.get("connector"):
        raise ConfigError(f"the connector URL is required ({_ENV['connector']} or --connector)")
    if ":" not in handler:
        raise ConfigError(f"handler must be package.module:function, not {handler!r}")
    try:
        port = None if values.get("http_port") is None else int(values["http_port"])
        budget = float(values.get("stop_budget_s", 10.0))
    except ValueError as exc:
        raise ConfigError(f"http port / stop budget: {exc}") from None
    if port is not None and not 0 <= port <= 65535:
        raise ConfigError(f"http port must be within 0-65535, not {port}")
    values.update(http_port=port, stop_budget_s=budget)
    return GatewayConfig(handler=handler, **values)


def import_handler(path: str) -> Handler:
    """The ``async def handler(turn)`` at ``package.module:function``; :class:`ConfigError`
    when it cannot be imported or is not a coroutine function."""
    module_name, _, name = path.partition(":")
    try:
        handler = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import the handler {path!r}: {exc}") from exc
    if not asyncio.iscoroutinefunction(handler):
        raise ConfigError(f"the handler {path!r} must be an async function taking a turn")
    return handler  # type: ignore[no-any-return]


def _prometheus() -> tuple[Metrics, Callable[[], bytes] | None, Any]:
    try:
        from prometheus_client import CollectorRegistry  # noqa: PLC0415

        from statecore.prometheus import PrometheusMetrics  # noqa: PLC0415
    except ImportError:
        return NO_METRICS, None, None
    metrics = PrometheusMetrics(CollectorRegistry())
    return metrics, metrics.render, metrics


async def _http(
    host: str, port: int, health: Callable[[], dict[str, Any]], metrics: Callable[[], bytes] | None
) -> asyncio.Server:
    """A minimal HTTP/1.1 endpoint (``GET /healthz``, ``GET /metrics``; anything else: 404)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            parts = request.split(b" ", 2)
            path = parts[1].decode("latin-1") if len(parts) > 1 else ""
            if parts[0] == b"GET" and path == "/healthz":
                status, body, kind = 200, json.dumps(health()).encode(), "application/json"
            elif parts[0] == b"GET" and path == "/metrics" and metrics is not None:
                status, kind = 200, "text/plain; version=0.0.4; charset=utf-8"
                body = await asyncio.to_thread(metrics)
            else:
                status, body, kind = 404, b"not found\n", "text/plain"
            reason = "OK" if status == 200 else "Not Found"
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a client that sends nothing useful gets nothing
        finally:
            writer.close()

    return await asyncio.start_server(answer, "0.0.0.0", port, limit=16 * 1024)


async def run_gateway(config: GatewayConfig, stop: asyncio.Event) -> None:
    """Run the bot until ``stop`` is set, then stop it within its budget.

    Prints ``gateway running`` (and the health URL when served) to standard output once it
    started.  Raises :class:`ConfigError` for a handler that cannot be imported, and
    ``ValueError`` / ``StoreError`` for a store that cannot be opened (before connecting).
    """
    handler = import_handler(config.handler)
    store = open_store(config.store)
    metrics, metrics_text, exporter = _prometheus()
    gateway = Gateway(store, metrics=metrics)
    if exporter is not None:
        exporter.track_ledger(store)
    transport = WebSocketRelayTransport(
        config.connector,
        config.platform,
        config.bot_id,
        gateway_id=config.gateway_id,
        secret=config.secret,
        dedupe=StoreBufferDedupe(store),
        metrics=metrics,
    )
    gateway.add_adapter(config.platform, RelayAdapter(transport))
    gateway.on_message(handler)
    server: asyncio.Server | None = None
    try:
        claimed = await gateway.start()
        if config.http_port is not None:

            def health() -> dict[str, Any]:
                targets = sorted(f"{p}/{q}" for p, q in gateway.connected_targets())
                return {"status": "ok" if targets else "connecting", "connected": targets}

            server = await _http(config.http_host, config.http_port, health, metrics_text)
            port = server.sockets[0].getsockname()[1]
            print(
                f"statecore gateway health on http://{config.http_host}:{port}/healthz", flush=True
            )
        print(f"statecore gateway running ({claimed} owed replies claimed)", flush=True)
        await stop.wait()
        log.info("gateway stopping (signal), budget %.1f s", config.stop_budget_s)
    finally:
        if server is not None:
            server.close()
        await gateway.stop(budget_s=config.stop_budget_s)
        store.close()


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run ``statecore gateway``; returns the exit code (0 after a graceful stop, 2 for a
    configuration that cannot work, with the reason on standard error)."""
    parser = argparse.ArgumentParser(prog="statecore gateway", description=__doc__.split("\n")[0])
    parser.add_argument("handler", help="package.module:function, an async handler of turns")
    for name in ("connector", "store", "platform", "bot-id", "gateway-id", "secret"):
        parser.add_argument(f"--{name}")
    parser.add_argument("--http-port", type=int)
    parser.add_argument("--http-host")
    parser.add_argument("--stop-budget", type=float, dest="stop_budget_s")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k != "handler"}
    try:
        config = load_config(args.handler, os.environ if env is None else env, overrides)
    except ConfigError as exc:
        print(f"statecore gateway: {exc}", file=sys.stderr)
        return 2
    try:
        serve_until_signalled(functools.partial(run_gateway, config))
    except (ValueError, OSError, StatecoreError) as exc:
        print(f"statecore gateway: {exc}", file=sys.stderr)
        return 2
    return 0


GATEWAY_COMMAND = forwarding(
    "gateway", "run a bot (package.module:handler) from the environment until SIGTERM", main
)
"""``statecore gateway``: registered through the ``statecore.cli`` entry point group."""

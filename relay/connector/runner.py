"""``statecore connector``: serve a connector from a config file or the environment until SIGTERM.

Configuration is a TOML file (``--config PATH`` or ``STATECORE_CONNECTOR_CONFIG``), then the
environment, then the command line, each overriding the one before::

    host = "0.0.0.0"                  # STATECORE_CONNECTOR_HOST, --host
    port = 8765                       # STATECORE_CONNECTOR_PORT, --port
    store = "sqlite:///connector.db"  # STATECORE_STORE_URL, --store
    open_egress = false               # STATECORE_CONNECTOR_OPEN_EGRESS (1/0)
    cluster = false                   # STATECORE_CONNECTOR_CLUSTER (1/0)

    [secrets]                         # STATECORE_CONNECTOR_SECRETS="bot=s1,s2;other=s3"
    my-bot = ["s3cret"]

    [drivers]                         # STATECORE_CONNECTOR_DRIVERS="loopback=loopback"
    loopback = "loopback"             # or "matrix", "telegram", "slack", "discord", or
                                      # "package.module:factory" (factory(platform) -> driver)

    [matrix]                          # the settings of every "matrix" driver (relay.matrix)
    homeserver = "https://matrix.example.org"  # STATECORE_MATRIX_HOMESERVER
    user_id = "@bot:example.org"      # STATECORE_MATRIX_USER_ID
    password = "..."                  # STATECORE_MATRIX_PASSWORD (better kept out of files)
    access_token = "..."              # STATECORE_MATRIX_ACCESS_TOKEN (either, or both)
    device_id = "BOTDEVICE"           # STATECORE_MATRIX_DEVICE_ID (optional)
    auto_join = true                  # STATECORE_MATRIX_AUTO_JOIN (1/0): join when invited
    msgtype = "m.text"                # STATECORE_MATRIX_MSGTYPE: or "m.notice"

The ``telegram``, ``slack`` and ``discord`` drivers are configured by the environment only (their
tokens stay out of files): ``STATECORE_TELEGRAM_TOKEN`` (and ``_MODE``, ``_WEBHOOK_*``,
``_API_URL``: :func:`relay.telegram.driver_from_env`); ``STATECORE_SLACK_BOT_TOKEN``,
``_APP_TOKEN`` (Socket Mode), ``_SIGNING_SECRET`` (the Events API), ``_MODE`` (``socket`` or
``events``), ``_CONNECTIONS``, ``_EVENTS_HOST``, ``_EVENTS_PORT``, ``_API_URL``;
``STATECORE_DISCORD_TOKEN`` and ``STATECORE_DISCORD_API_BASE``.

    [tenants]                         # STATECORE_CONNECTOR_TENANTS="my-bot=scope-a,scope-b"
    my-bot = ["scope-a"]

The connector answers ``GET /healthz`` and, when ``prometheus-client`` is installed
(``statecore[prometheus]``), ``GET /metrics`` on its own port.  SIGTERM or SIGINT stops it
gracefully.  With ``cluster = true`` the process is one node of a connector cluster: its store
must be PostgreSQL, and it listens with ``SO_REUSEPORT`` so that several nodes on one host may
share the port (``relay.connector._cluster``).  A configuration that cannot work (no secrets,
an unknown driver, a bad port, an unreadable file, a cluster on anything but PostgreSQL, a
``matrix`` driver without a homeserver, a bot id or credentials) is refused before anything is
opened, with a message naming the setting; so is a bot whose homeserver refuses its credentials
(exit code 2, before the connector serves anyone).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import logging
import os
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from relay.connector.platform import LoopbackPlatform, PlatformDriver
from relay.connector.server import Connector
from statecore.cli.plugin import forwarding, serve_until_signalled
from statecore.errors import StatecoreError
from statecore.metrics import NO_METRICS, Metrics
from stores import open_store

__all__ = [
    "CONNECTOR_COMMAND",
    "ConfigError",
    "ConnectorConfig",
    "load_config",
    "main",
    "serve",
]

log = logging.getLogger(__name__)

_ENV_PREFIX = "STATECORE_CONNECTOR_"
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class ConfigError(ValueError):
    """A connector configuration that cannot work; the message names the setting."""


@attrs.frozen
class ConnectorConfig:
    """What ``statecore connector`` serves (see the module docs)."""

    secrets: Mapping[str, tuple[str, ...]]
    drivers: Mapping[str, str]
    host: str = "127.0.0.1"
    port: int = 8765
    store: str = "sqlite:///connector.db"
    tenants: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    open_egress: bool = False
    cluster: bool = False
    matrix: Mapping[str, Any] = attrs.field(factory=dict)
    """The ``[matrix]`` table: the keyword arguments of every ``matrix`` driver."""


_BUILT_IN = ("loopback", "matrix", "telegram", "slack", "discord")
"""The driver specs ``[drivers]`` names without a factory."""

_MATRIX_ENV = "STATECORE_MATRIX_"
_MATRIX_SETTINGS: dict[str, type] = {
    "homeserver": str,
    "user_id": str,
    "password": str,
    "access_token": str,
    "device_id": str,
    "auto_join": bool,
    "msgtype": str,
    "markdown": bool,
    "backlog_on_first_start": bool,
}


def load_config(
    path: str | None, env: Mapping[str, str], overrides: Mapping[str, Any] | None = None
) -> ConnectorConfig:
    """Read the file at ``path`` (if any), then ``env``, then ``overrides``.

    Raises :class:`ConfigError` naming the setting for anything unusable: an unreadable or
    malformed file, a port that is not an integer in 0-65535, no secrets, no drivers.
    """
    values: dict[str, Any] = {}
    path = path or env.get(_ENV_PREFIX + "CONFIG") or None
    if path:
        try:
            with open(path, "rb") as file:
                values.update(tomllib.load(file))
        except OSError as exc:
            raise ConfigError(f"config file {path!r}: {exc.strerror or exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path!r} is not valid TOML: {exc}") from exc
    for key in ("host", "port"):
        if env.get(_ENV_PREFIX + key.upper()):
            values[key] = env[_ENV_PREFIX + key.upper()]
    if env.get("STATECORE_STORE_URL"):
        values["store"] = env["STATECORE_STORE_URL"]
    for flag in ("open_egress", "cluster"):
        if env.get(_ENV_PREFIX + flag.upper()):
            values[flag] = _truthy(env[_ENV_PREFIX + flag.upper()])
    for key in ("secrets", "tenants"):
        if env.get(_ENV_PREFIX + key.upper()):
            values[key] = _pairs(key, env[_ENV_PREFIX + key.upper()])
    if env.get(_ENV_PREFIX + "DRIVERS"):
        values["drivers"] = {
            platform: names[0]
            for platform, names in _pairs("drivers", env[_ENV_PREFIX + "DRIVERS"]).items()
        }
    matrix = (
        dict(values.get("matrix") or {}) if isinstance(values.get("matrix", {}), Mapping) else None
    )
    if matrix is None:
        raise ConfigError("matrix: expected a table of settings")
    for key, kind in _MATRIX_SETTINGS.items():
        text = env.get(_MATRIX_ENV + key.upper())
        if text:
            matrix[key] = _truthy(text) if kind is bool else text
    if matrix:
        values["matrix"] = matrix
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return _checked(values)


def _truthy(text: str) -> bool:
    """An environment flag: ``1``, ``true`` or ``yes`` is on, anything else off."""
    return text.strip() in ("1", "true", "yes")


def _pairs(setting: str, text: str) -> dict[str, list[str]]:
    """``"a=x,y;b=z"`` -> ``{"a": ["x", "y"], "b": ["z"]}``."""
    out: dict[str, list[str]] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, sep, rest = item.partition("=")
        if not sep or not name.strip() or not rest.strip():
            raise ConfigError(f"{setting}: expected name=value[,value...], got {item!r}")
        out[name.strip()] = [v.strip() for v in rest.split(",") if v.strip()]
    return out


def _checked(values: Mapping[str, Any]) -> ConnectorConfig:
    unknown = set(values) - {f.name for f in attrs.fields(ConnectorConfig)}
    if unknown:
        raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    try:
        port = int(values.get("port", 8765))
    except (TypeError, ValueError):
        raise ConfigError(f"port must be an integer, not {values.get('port')!r}") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"port must be within 0-65535, not {port}")
    secrets = _string_lists("secrets", values.get("secrets", {}))
    if not secrets:
        raise ConfigError("secrets: no gateway may connect (give at least one gateway a secret)")
    drivers = values.get("drivers", {})
    if not isinstance(drivers, Mapping) or not drivers:
        raise ConfigError('drivers: no platform is fronted (e.g. loopback = "loopback")')
    for platform, spec in drivers.items():
        if not isinstance(spec, str) or not (spec in _BUILT_IN or ":" in spec):
            raise ConfigError(
                f"drivers.{platform}: expected one of {', '.join(map(repr, _BUILT_IN))} or "
                f'"package.module:factory", not {spec!r}'
            )
    matrix = _matrix_settings(values.get("matrix", {}), "matrix" in drivers.values())
    store = str(values.get("store", "sqlite:///connector.db"))
    cluster = _flag("cluster", values.get("cluster", False))
    if cluster and not store.startswith(("postgresql://", "postgres://")):
        raise ConfigError("cluster: the nodes of a cluster share a PostgreSQL store (store = ...)")
    return ConnectorConfig(
        secrets=secrets,
        drivers=dict(drivers),
        host=str(values.get("host", "127.0.0.1")),
        port=port,
        store=store,
        tenants=_string_lists("tenants", values.get("tenants", {})),
        open_egress=_flag("open_egress", values.get("open_egress", False)),
        cluster=cluster,
        matrix=matrix,
    )


def _matrix_settings(value: object, used: bool) -> dict[str, Any]:
    """The ``[matrix]`` table checked (types, and what a matrix driver cannot do without)."""
    if not isinstance(value, Mapping):
        raise ConfigError("matrix: expected a table of settings")
    settings: dict[str, Any] = {}
    for key, setting in value.items():
        kind = _MATRIX_SETTINGS.get(key)
        if kind is None:
            raise ConfigError(f"matrix.{key}: unknown setting")
        if not isinstance(setting, kind) or (kind is str and not setting):
            raise ConfigError(
                f"matrix.{key}: expected a {'non-empty string' if kind is str else 'true or false'}"
            )
        settings[key] = setting
    if used:
        for key in ("homeserver", "user_id"):
            if key not in settings:
                raise ConfigError(
                    f"matrix.{key}: a matrix driver needs it (or {_MATRIX_ENV}{key.upper()})"
                )
        if "password" not in settings and "access_token" not in settings:
            raise ConfigError(
                f"matrix: give the bot a password or an access_token ({_MATRIX_ENV}PASSWORD)"
            )
    return settings


def _flag(setting: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{setting}: expected true or false, not {value!r}")
    return value


def _string_lists(setting: str, value: object) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{setting}: expected a table of name = [values]")
    out: dict[str, tuple[str, ...]] = {}
    for name, items in value.items():
        listed = [items] if isinstance(items, str) else items
        if not isinstance(listed, list | tuple) or not all(isinstance(i, str) for i in listed):
            raise ConfigError(f"{setting}.{name}: expected a list of strings")
        if listed:
            out[str(name)] = tuple(listed)
    return out


def make_driver(
    platform: str,
    spec: str,
    matrix: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> PlatformDriver:
    """The driver ``spec`` names for ``platform``: ``"loopback"``, ``"matrix"`` (configured by
    ``matrix``, the ``[matrix]`` settings), ``"telegram"``, ``"slack"``, ``"discord"``
    (configured by ``env``, default ``os.environ``) or ``"module:factory"``.

    Raises :class:`ConfigError` when the module or factory cannot be found, or the driver
    refuses its settings (naming the setting, never quoting a token).
    """
    if spec == "loopback":
        return LoopbackPlatform(platform)
    if spec in ("telegram", "slack", "discord"):
        try:
            return _env_driver(platform, spec, os.environ if env is None else env)
        except ImportError as exc:
            raise ConfigError(f"drivers.{platform}: the {spec} driver cannot load: {exc}") from exc
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"drivers.{platform} ({spec}): {exc}") from exc
    if spec == "matrix":
        try:
            from relay.matrix import MatrixDriver  # noqa: PLC0415  (needs statecore[matrix])
        except ImportError as exc:
            raise ConfigError(
                f"drivers.{platform}: the matrix driver needs statecore[matrix]: {exc}"
            ) from exc
        settings = dict(matrix or {})
        try:
            return MatrixDriver(
                settings.pop("homeserver"), settings.pop("user_id"), platform=platform, **settings
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"matrix: {exc}") from exc
    module_name, _, attr = spec.partition(":")
    try:
        factory: Callable[[str], PlatformDriver] = getattr(
            importlib.import_module(module_name), attr
        )
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"drivers.{platform}: cannot load {spec!r}: {exc}") from exc
    return factory(platform)


def _env_driver(platform: str, spec: str, env: Mapping[str, str]) -> PlatformDriver:
    """A telegram, slack or discord driver from the environment (see the module docs)."""

    def get(name: str) -> str | None:
        value = env.get(f"STATECORE_{spec.upper()}_{name}", "").strip()
        return value or None

    def required(name: str) -> str:
        value = get(name)
        if value is None:
            raise ValueError(f"STATECORE_{spec.upper()}_{name} is not set")
        return value

    if spec == "telegram":
        from relay.telegram import driver_from_env  # noqa: PLC0415

        return driver_from_env(platform, env)
    if spec == "discord":
        from relay.discord import DiscordDriver  # noqa: PLC0415

        base = get("API_BASE")
        if base is None:
            return DiscordDriver(required("TOKEN"), platform=platform)
        return DiscordDriver(required("TOKEN"), platform=platform, api_base=base)
    from relay.slack import SlackDriver  # noqa: PLC0415

    options: dict[str, Any] = {"platform": platform}
    for name in ("APP_TOKEN", "SIGNING_SECRET", "MODE", "EVENTS_HOST", "API_URL"):
        value = get(name)
        if value is not None:
            options[name.lower()] = value
    for name in ("CONNECTIONS", "EVENTS_PORT"):
        value = get(name)
        if value is not None:
            if not value.isdigit():
                raise ValueError(f"STATECORE_SLACK_{name} must be a whole number")
            options[name.lower()] = int(value)
    return SlackDriver(required("BOT_TOKEN"), **options)


def _prometheus() -> tuple[Metrics, Callable[[], bytes] | None]:
    """Metrics and the ``/metrics`` body when ``prometheus-client`` is installed."""
    try:
        from prometheus_client import CollectorRegistry  # noqa: PLC0415

        from statecore.prometheus import PrometheusMetrics  # noqa: PLC0415
    except ImportError:
        return NO_METRICS, None
    metrics = PrometheusMetrics(CollectorRegistry())
    return metrics, metrics.render


async def serve(config: ConnectorConfig, stop: asyncio.Event) -> None:
    """Serve ``config`` until ``stop`` is set, then stop the connector and close its store.

    Prints one ``listening on URL`` line to standard output once the connector accepts
    connections.  Raises :class:`ConfigError` for a driver that cannot be loaded or started and
    ``StoreError`` / ``ValueError`` for a store URL that cannot be opened (before serving).
    """
    drivers = {
        platform: make_driver(platform, spec, config.matrix)
        for platform, spec in config.drivers.items()
    }
    store = open_store(config.store)
    metrics, metrics_text = _prometheus()
    connector = Connector(
        store,
        secrets=config.secrets,
        drivers=drivers,
        tenants=config.tenants or None,
        open_egress=config.open_egress,
        metrics=metrics,
        http_metrics=metrics_text,
        cluster=config.cluster,
    )
    try:
        await connector.start(config.host, config.port, reuse_port=config.cluster)
        if connector.driver_failures:
            # Credentials a platform refuses for good: the operator must fix the configuration.
            raise ConfigError(
                "; ".join(
                    f"drivers.{platform}: could not start: {why}"
                    for platform, why in sorted(connector.driver_failures.items())
                )
            )
        print(f"statecore connector listening on {connector.url}", flush=True)
        log.info("connector listening on %s", connector.url, extra={"url": connector.url})
        await stop.wait()
        log.info("connector stopping (signal)")
    finally:
        await connector.stop()
        store.close()


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run ``statecore connector``; returns the process exit code (0 after a graceful stop,
    2 for a configuration that cannot work, with the reason on standard error)."""
    parser = argparse.ArgumentParser(prog="statecore connector", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="a TOML file (see the module docs)")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--store", help="store URL, e.g. sqlite:///connector.db")
    args = parser.parse_args(argv)
    try:
        config = load_config(
            args.config,
            os.environ if env is None else env,
            {"host": args.host, "port": args.port, "store": args.store},
        )
    except ConfigError as exc:
        print(f"statecore connector: {exc}", file=sys.stderr)
        return 2
    try:
        serve_until_signalled(functools.partial(serve, config))
    except ConfigError as exc:
        print(f"statecore connector: {exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError, StatecoreError) as exc:
        # An unusable store URL, an unopenable store, a port already in use.
        print(f"statecore connector: {exc}", file=sys.stderr)
        return 2
    return 0


CONNECTOR_COMMAND = forwarding(
    "connector", "serve a connector from a config file or the environment until SIGTERM", main
)
"""``statecore connector``: registered through the ``statecore.cli`` entry point group."""

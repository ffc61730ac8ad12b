"""``statecore dashboard``: serve the live dashboard of a store until SIGINT or SIGTERM.

::

    statecore dashboard --store sqlite:///bot.db [--host 127.0.0.1] [--port 8780]

The store is opened as the other ``statecore`` commands open it (``--store`` or
``STATECORE_STORE_URL``; a missing SQLite file is refused, not created).  ``--host`` and
``--port`` default to ``STATECORE_DASHBOARD_HOST`` / ``STATECORE_DASHBOARD_PORT``, else
127.0.0.1 and 8780.  Operator secrets come from the environment only, never the command line:
``STATECORE_DASHBOARD_SECRETS="alice=s1,s2;bob=s3"`` (the format of the connector's
``STATECORE_CONNECTOR_SECRETS``).  Without them the dashboard is read-only.  An operator's token
is minted with ``relay.wire.auth.mint_token(operator, secret)``, or printed by
``statecore dashboard --mint-token OPERATOR`` (valid for an hour, signed with that operator's
newest secret from the environment).

It prints ``statecore dashboard on http://HOST:PORT/dashboard/`` once it serves (the only
line naming the URL; its log lines go to standard error, without the ``websockets`` library's
INFO lines about each listen and connection), and stops gracefully on SIGINT or SIGTERM
(exit 0).  A store URL that cannot be opened, a bad port or
malformed secrets are refused with exit status 2, naming the setting (a store URL is shown
without its password).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from relay.web.dashboard import Dashboard
from relay.web.server import WebServer
from relay.wire.auth import DEFAULT_MAX_TTL_S, mint_token
from statecore.cli.plugin import (
    STORE_URL_ENV,
    STORES_GROUP,
    CliError,
    forwarding,
    installed,
    serve_until_signalled,
    store_scheme,
)
from statecore.errors import StatecoreError
from statecore.store import Store

__all__ = ["DASHBOARD_COMMAND", "SECRETS_ENV", "main", "parse_secrets", "store_label"]

log = logging.getLogger("relay.web")

SECRETS_ENV = "STATECORE_DASHBOARD_SECRETS"
HOST_ENV = "STATECORE_DASHBOARD_HOST"
PORT_ENV = "STATECORE_DASHBOARD_PORT"
DEFAULT_PORT = 8780
_NAME = "statecore dashboard"


class _Refused(Exception):
    """A setting that cannot work; the message names it."""


def parse_secrets(text: str) -> dict[str, tuple[str, ...]]:
    """``"alice=s1,s2;bob=s3"`` -> ``{"alice": ("s1", "s2"), "bob": ("s3",)}`` (newest secret
    first).  Raises ``ValueError`` naming the malformed item by its operator only (never a
    secret)."""
    out: dict[str, tuple[str, ...]] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, sep, rest = item.partition("=")
        secrets = tuple(v.strip() for v in rest.split(",") if v.strip())
        if not sep or not name.strip() or not secrets:
            shown = name.strip() if sep else "(an item without '=')"
            raise ValueError(f"{SECRETS_ENV}: expected operator=secret[,secret...] for {shown!r}")
        out[name.strip()] = secrets
    return out


def store_label(url: str) -> str:
    """``url`` as the page and messages show it: scheme, host and path, without user,
    password or query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


def _safe_label(url: str) -> str:
    try:
        return store_label(url)
    except ValueError:  # a port that is not a number: show the scheme alone
        return f"{url.partition(':')[0]}://..."


def _open(url: str) -> Store:
    """The store ``url`` names, opened as ``statecore`` commands open it.  Raises
    :class:`_Refused` naming the URL without its password."""
    label = _safe_label(url)
    try:
        opener = installed(STORES_GROUP).get(store_scheme(url))
    except CliError:
        raise _Refused(f"--store: not a store URL: {label}") from None
    if opener is None:
        known = ", ".join(f"{s}://" for s in sorted(installed(STORES_GROUP)))
        raise _Refused(f"--store: unknown store URL scheme in {label} (known: {known})")
    try:
        store: Store = opener(url)
    except (ValueError, StatecoreError, OSError) as exc:
        reason = str(exc).replace(url, label)
        password = _password(url)
        if password:
            reason = reason.replace(password, "***")
        raise _Refused(f"--store: cannot open {label}: {reason}") from None
    return store


def _password(url: str) -> str | None:
    try:
        return urlsplit(url).password
    except ValueError:
        return None


def _port(text: str | None) -> int:
    if text is None or text == "":
        return DEFAULT_PORT
    try:
        port = int(text)
    except ValueError:
        raise _Refused(f"--port must be an integer, not {text!r}") from None
    if not 0 <= port <= 65535:
        raise _Refused(f"--port must be within 0-65535, not {port}")
    return port


async def serve(
    store: Store,
    *,
    host: str,
    port: int,
    secrets: Mapping[str, Sequence[str]],
    label: str,
    stop: asyncio.Event,
    show_content: bool = False,
) -> None:
    """Serve the dashboard of ``store`` on ``host:port`` until ``stop`` is set; then stop the
    server and the dashboard (the caller closes the store).  Prints one ``statecore dashboard on
    URL`` line once it serves.  Raises ``OSError`` when it cannot listen."""
    dashboard = Dashboard(store, secrets=secrets, store_label=label, show_content=show_content)
    server = WebServer([dashboard])
    try:
        await server.start(host, port)
        url = f"{server.url}{dashboard.prefix}/"
        print(f"{_NAME} on {url}", flush=True)  # the one line naming the URL
        log.info(
            "dashboard serving %s (%s)",
            label,
            "operators: " + ", ".join(sorted(secrets)) if secrets else "read-only",
            extra={"url": url},
        )
        await stop.wait()
        log.info("dashboard stopping (signal)")
    finally:
        await server.stop()
        await dashboard.close()


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run ``statecore dashboard``; return the exit status (0 after a graceful stop, 2 for a
    setting that cannot work, with the reason on standard error)."""
    environ = os.environ if env is None else env
    parser = argparse.ArgumentParser(prog=_NAME, description=__doc__.split("\n")[0])
    parser.add_argument("--store", metavar="URL", help=f"the store (default: ${STORE_URL_ENV})")
    parser.add_argument("--host", help=f"the address to listen on (${HOST_ENV}; 127.0.0.1)")
    parser.add_argument("--port", help=f"the port (${PORT_ENV}; {DEFAULT_PORT}; 0: any free)")
    parser.add_argument(
        "--mint-token",
        metavar="OPERATOR",
        help=f"print a token for OPERATOR (secret from ${SECRETS_ENV}), valid for an hour",
    )
    parser.add_argument(
        "--show-content",
        action="store_true",
        help="show the replies' text (anyone who can open the page reads every chat's replies)",
    )
    args = parser.parse_args(argv)
    try:
        secrets = parse_secrets(environ.get(SECRETS_ENV, ""))
        if args.mint_token is not None:
            if args.mint_token not in secrets:
                raise _Refused(f"--mint-token: {args.mint_token!r} has no secret in ${SECRETS_ENV}")
            print(mint_token(args.mint_token, secrets[args.mint_token][0], ttl_s=DEFAULT_MAX_TTL_S))
            return 0
        url = args.store or environ.get(STORE_URL_ENV)
        if not url:
            raise _Refused(f"no store given: pass --store URL or set {STORE_URL_ENV}")
        host = args.host or environ.get(HOST_ENV) or "127.0.0.1"
        port = _port(args.port if args.port is not None else environ.get(PORT_ENV))
        store = _open(url)
    except (_Refused, ValueError) as exc:
        print(f"{_NAME}: {exc}", file=sys.stderr)
        return 2
    # The websockets library logs every listen and connection at INFO: only its warnings
    # belong in this command's output.
    logging.getLogger("websockets").setLevel(logging.WARNING)
    try:
        serve_until_signalled(
            lambda stop: serve(
                store,
                host=host,
                port=port,
                secrets=secrets,
                label=_safe_label(url),
                stop=stop,
                show_content=args.show_content,
            )
        )
    except OSError as exc:  # the port is taken, the address is not ours
        print(f"{_NAME}: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    return 0


DASHBOARD_COMMAND = forwarding(
    "dashboard", "serve the live dashboard of a store (counts, transitions, repairs)", main
)
"""``statecore dashboard``: registered through the ``statecore.cli`` entry point group."""

"""One small web server for the browser-facing parts: plain files and one WebSocket per app.

Each app (:class:`WebApp`) owns a path prefix (``/chat``, ``/dashboard``): ``GET <prefix>/``
serves its ``index.html``, ``GET <prefix>/<file>`` its other files (from the package's
``relay/web/static/<name>/``, read once), and ``<prefix>/ws`` is its WebSocket, handed to
:meth:`WebApp.session`.  ``GET /`` lists the apps, ``GET /favicon.ico`` is a small icon.
Nothing else is served: any other path is 404, any method but GET is refused by the WebSocket
server itself.

Every page is sent with a ``Content-Security-Policy`` that allows scripts, styles and
connections from this server only (no inline script, no CDN): text a user or a peer wrote can
never run as script, even if a page rendered it as HTML by mistake.  Messages on the WebSockets
are bounded (``max_message_bytes``); a browser that sends more is disconnected with 1009.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Protocol

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

__all__ = ["CSP", "WebApp", "WebServer", "static_files"]

log = logging.getLogger("relay.web")

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The policy every page is served with: nothing inline, nothing from elsewhere."""

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
}


_ICON = (
    b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
    b'<rect width="16" height="16" rx="3" fill="#2f6fdb"/>'
    b'<path d="M4 5h8M4 8h8M4 11h5" stroke="#fff" stroke-width="1.6"/></svg>'
)


class WebApp(Protocol):
    """One app the server hosts under ``prefix``."""

    @property
    def prefix(self) -> str:
        """Its path prefix, e.g. ``"/chat"`` (no trailing slash)."""

    @property
    def title(self) -> str:
        """What ``GET /`` calls it."""

    @property
    def files(self) -> Mapping[str, tuple[bytes, str]]:
        """Its files by name (``index.html`` included): body and content type."""

    async def session(self, ws: ServerConnection) -> None:
        """Serve one browser's WebSocket (``<prefix>/ws``) until it closes."""


def static_files(name: str) -> dict[str, tuple[bytes, str]]:
    """The files shipped in ``relay/web/static/<name>/``, by file name, with their content
    types (read once; raises ``FileNotFoundError`` when the folder is missing)."""
    folder = resources.files("relay.web").joinpath("static", name)
    out: dict[str, tuple[bytes, str]] = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _TYPES:
            out[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    if "index.html" not in out:
        raise FileNotFoundError(f"relay/web/static/{name}/index.html")
    return out


class WebServer:
    """Serves ``apps`` on one port (see the module docs).

    ``async with WebServer([...]) as server:`` starts it on any free port of 127.0.0.1 (or call
    :meth:`start` with a host and port); ``server.url`` then says where.
    """

    def __init__(self, apps: Sequence[WebApp], *, max_message_bytes: int = 65_536) -> None:
        prefixes = [app.prefix for app in apps]
        for prefix in prefixes:
            if not prefix.startswith("/") or prefix.endswith("/") or prefix.count("/") != 1:
                raise ValueError(f"an app's prefix is one path segment like '/chat': {prefix!r}")
        if len(set(prefixes)) != len(prefixes):
            raise ValueError(f"two apps share a prefix: {prefixes}")
        if max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes must be at least 1024: {max_message_bytes}")
        self._apps = {app.prefix: app for app in apps}
        self._max = max_message_bytes
        self._server: Server | None = None
        self.url = ""
        """``http://host:port`` once started."""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on ``host:port`` (0: any free port).  Raises ``OSError`` when it cannot."""
        self._server = await serve(
            self._session,
            host,
            port,
            process_request=self._request,
            max_size=self._max,
            compression=None,
            server_header=None,
        )
        sockname = next(iter(self._server.sockets)).getsockname()
        self.url = f"http://{sockname[0]}:{sockname[1]}"

    async def stop(self) -> None:
        """Close every connection and stop listening (bounded by websockets' close timeout)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> WebServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _request(self, connection: ServerConnection, request: Request) -> Response | None:
        """Files for plain GETs; None (go on with the upgrade) for an app's WebSocket."""
        path = request.path.split("?", 1)[0]
        if path == "/":
            return _page(connection, 200, self._index(), "text/html; charset=utf-8")
        if path == "/favicon.ico":  # browsers ask for it on every page: a small icon, no 404
            return _page(connection, 200, _ICON, "image/svg+xml")
        prefix, _, rest = path[1:].partition("/")
        app = self._apps.get("/" + prefix)
        if app is None:
            return _page(connection, 404, b"not found\n", "text/plain; charset=utf-8")
        if rest == "ws":
            if "upgrade" not in request.headers.get("Connection", "").lower():
                return _page(connection, 426, b"a WebSocket\n", "text/plain; charset=utf-8")
            return None
        if path == app.prefix:  # "/chat" -> "/chat/": relative links resolve inside the app
            response = _page(connection, 301, b"", "text/plain; charset=utf-8")
            response.headers["Location"] = app.prefix + "/"
            return response
        found = app.files.get(rest or "index.html")
        if found is None or "/" in rest:
            return _page(connection, 404, b"not found\n", "text/plain; charset=utf-8")
        return _page(connection, 200, found[0], found[1])

    async def _session(self, ws: ServerConnection) -> None:
        path = ws.request.path.split("?", 1)[0] if ws.request is not None else ""
        app = self._apps.get(path.rsplit("/ws", 1)[0])
        if app is None:  # _request let nothing else through
            await ws.close(1008, "unknown path")
            return
        await app.session(ws)

    def _index(self) -> bytes:
        links = "".join(
            f'<li><a href="{html.escape(p)}/">{html.escape(a.title)}</a></li>'
            for p, a in sorted(self._apps.items())
        )
        return (
            '<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f"<title>statecore</title></head><body><ul>{links}</ul></body></html>"
        ).encode()


def _page(connection: ServerConnection, status: int, body: bytes, content_type: str) -> Response:
    """A response with ``body``, its type, the content security policy and no caching."""
    response = connection.respond(status, "")
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Content-Security-Policy", CSP),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
            ("Cache-Control", "no-store"),
        ]
    )
    return Response(status, response.reason_phrase, headers, body)

"""A small HTTP proxy in front of the test homeserver that can spoil ``/sync`` answers.

Everything is forwarded to the real server; while ``faults`` holds entries, each ``/sync``
takes the next one instead: ``"502"`` (a server error), ``"malformed"`` (a 200 whose body is
not a sync answer), ``"not-json"`` (a 200 that is not JSON) or ``"drop"`` (the connection is
closed without an answer).  Used by the driver's tests of a homeserver misbehaving mid-sync.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

_HOP_HEADERS = frozenset(("host", "content-length", "transfer-encoding", "connection"))


class FaultProxy:
    """``await FaultProxy(upstream).start()``; ``url`` is where to point the driver."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.faults: list[str] = []
        self.spoiled = 0
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> FaultProxy:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._session = aiohttp.ClientSession(trust_env=False)
        return self

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/sync") and self.faults:
            fault = self.faults.pop(0)
            self.spoiled += 1
            if fault == "502":
                return web.json_response(
                    {"errcode": "M_UNKNOWN", "error": "bad gateway"}, status=502
                )
            if fault == "malformed":
                return web.json_response({"rooms": [], "next_batch": 7})
            if fault == "not-json":
                return web.Response(text="<html>oops</html>", content_type="text/html")
            if fault == "drop":
                assert request.transport is not None
                request.transport.close()
                await asyncio.sleep(0)
                return web.Response(status=500)
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        body = await request.read()
        async with self._session.request(
            request.method,
            self.upstream + request.rel_url.path_qs,
            headers=headers,
            data=body or None,
            allow_redirects=False,
        ) as answer:
            payload = await answer.read()
            return web.Response(
                body=payload, status=answer.status, content_type=answer.content_type
            )

"""A bot the whole way, in this process, for the platforms' test_bot.py
(tests/relay/{matrix,slack,telegram,discord}): the reference connector with one platform's
driver and a gateway answering ``echo: <text>`` (or what ``reply`` makes of it), each on its
own SQLite file under ``data``; what the handler saw is in ``seen``.

Each platform subclasses :class:`RelayBot` with how its driver is built (and, when the driver
is started only once something on the platform is live, :meth:`RelayBot.driver_live`).  The
connector restarts on the port it first had, so that the gateway redials the same URL.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from relay.client.adapter import RelayAdapter
from relay.client.dedupe import StoreBufferDedupe
from relay.client.transport import WebSocketRelayTransport
from relay.connector.platform import PlatformDriver
from relay.connector.server import Connector
from statecore.gateway import Gateway, Turn
from stores import SQLiteStore

GATEWAY_ID = "gw"

D = TypeVar("D", bound=PlatformDriver)
B = TypeVar("B", bound="RelayBot[Any]")


class RelayBot(Generic[D]):
    """A connector with ``platform``'s driver and a gateway, on SQLite files under ``data``."""

    def __init__(self, data: Path, platform: str, secret: str) -> None:
        self.data = data
        self.platform = platform
        self.secret = secret
        self.seen: list[str] = []
        self.reply: Callable[[str], str] = lambda text: f"echo: {text}"
        """What the handler answers to a message's text."""
        self.connector: Connector | None = None
        self.gateway: Gateway | None = None
        self.driver: D | None = None
        self._stores: list[SQLiteStore] = []

    def make_driver(self) -> D:
        """A new driver for the platform (each connector start builds one)."""
        raise NotImplementedError

    async def driver_live(self, driver: D) -> None:
        """Until the started driver is live on the platform (nothing to wait for by default)."""

    def gateway_options(self) -> dict[str, Any]:
        """The ``Gateway`` keywords beside its store (none by default)."""
        return {}

    async def answer(self, turn: Turn) -> None:
        """The bot's handler: note the text, answer it."""
        self.seen.append(turn.message.text)
        await turn.reply(self.reply(turn.message.text))

    async def start_connector(self) -> Connector:
        """Start a connector with a new driver (on the port of the first one, if any)."""
        store = SQLiteStore(self.data / "connector.db")
        self._stores.append(store)
        driver = self.driver = self.make_driver()
        port = 0 if self.connector is None else int(self.connector.url.rsplit(":", 1)[1])
        self.connector = Connector(
            store, secrets={GATEWAY_ID: [self.secret]}, drivers={self.platform: driver}
        )
        await self.connector.start(port=port)
        await self.driver_live(driver)
        return self.connector

    async def stop_connector(self) -> None:
        """Stop the current connector."""
        assert self.connector is not None
        await self.connector.stop()

    async def start_gateway(self) -> Gateway:
        """Start the gateway, connected to the current connector."""
        assert self.connector is not None
        store = SQLiteStore(self.data / "gateway.db")
        self._stores.append(store)
        transport = WebSocketRelayTransport(
            self.connector.url,
            self.platform,
            "bot",
            gateway_id=GATEWAY_ID,
            secret=self.secret,
            reconnect_backoff_s=0.05,
            reconnect_max_s=0.5,
            dedupe=StoreBufferDedupe(store),
        )
        self.gateway = Gateway(store, **self.gateway_options())
        self.gateway.on_message(self.answer)
        self.gateway.add_adapter(self.platform, RelayAdapter(transport))
        await self.gateway.start()
        return self.gateway

    async def close(self) -> None:
        """Stop the gateway and the connector, close every store."""
        if self.gateway is not None:
            await self.gateway.stop()
        if self.connector is not None:
            await self.connector.stop()
        for store in self._stores:
            store.close()


@contextlib.asynccontextmanager
async def started(bot: B, *, gateway: bool = True) -> AsyncIterator[B]:
    """``bot``'s connector (and, when ``gateway``, its gateway) started; closed afterwards."""
    try:
        await bot.start_connector()
        if gateway:
            await bot.start_gateway()
        yield bot
    finally:
        await bot.close()

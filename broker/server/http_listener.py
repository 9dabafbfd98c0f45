"""The HTTP API's listener (`dashboard.listeners.http.bind`): bound with the MQTT listeners,
serving once they serve.

aiohttp and prometheus_client take about a third of a second to import, more than all the
rest of a start on an empty data dir. Nothing an MQTT client does needs them, so the port is
bound (a port in use still stops the start) but not listening, the MQTT listeners serve, and
the API's modules are imported on a worker thread while the event loop answers CONNECTs;
then the port listens. A client of the API meanwhile finds it refusing connections, as
before the process started; the log's "broker ... started" line comes once it listens.

The import starts once the node has answered its first client, or after `IMPORT_DELAY`
without one: the worker thread holds the GIL for a switch interval (5 ms) each time the
event loop lets go of it (every system call), so clients that were waiting for the node
to start would otherwise wait for the import too.
"""

import asyncio
import importlib
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from broker.server.app import BrokerApp

_API_MODULE = "broker.server.http_app"
IMPORT_DELAY: Final = 0.1  # seconds without a client before the API's import starts anyway
_POLL: Final = 0.005  # seconds: how soon the first answer is seen


class HttpListener:
    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._protocols: Callable[[], asyncio.BaseProtocol] | None = None
        self._close: Callable[[], Awaitable[None]] | None = None
        self._import: asyncio.Future[ModuleType] | None = None

    def start_import(self) -> "asyncio.Future[ModuleType]":
        """Imports the API on a worker thread from now on, without waiting for a client;
        the caller may await it. A cluster node does (BrokerApp.start), before its links
        come up: a new replica catching up from its first second would otherwise receive
        its snapshot under an import holding the GIL (a third of a second of CPU, tens of
        milliseconds at a time in a C call), with the transfer slowed to match."""
        if self._import is None:
            self._import = asyncio.ensure_future(
                asyncio.to_thread(importlib.import_module, _API_MODULE))
        return self._import

    async def bind(self, host: str, port: int) -> int:
        """The bound port; nothing is accepted before `serve`."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, host, port, reuse_address=True,
                                                start_serving=False)
        return int(self._server.sockets[0].getsockname()[1])

    def _protocol(self) -> asyncio.BaseProtocol:
        assert self._protocols is not None  # the socket listens only once it is set
        return self._protocols()

    async def serve(self, app: "BrokerApp") -> None:
        """Imports the API on a worker thread, builds it and starts listening."""
        assert self._server is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + IMPORT_DELAY
        stats = app.node.stats
        while (self._import is None and not stats.bytes_sent
               and loop.time() < deadline):  # no client answered yet
            await asyncio.sleep(_POLL)
        api = await self.start_import()
        self._protocols, self._close = await api.start(app)
        await self._server.start_serving()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._close is not None:
            await self._close()

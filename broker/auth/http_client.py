"""The asyncio side of HTTP authentication and authorization: one aiohttp session per
service, its connections bounded by `pool_size`, each request by `request_timeout`, and at
most `max_inflight` requests out at once. Past that a CONNECT or an action is not queued: it
is answered "busy" at once (the caller refuses it: 0x88 Server unavailable for a CONNECT,
0x97 Quota exceeded for an action), so a slow or dead service costs a bounded number of
waiting clients and never the event loop or the other clients."""

import logging
from collections.abc import Callable

import aiohttp

from broker.auth.http_requests import BUSY, UNAVAILABLE, Answer, RequestTemplate, render

log = logging.getLogger(__name__)


class HttpService:
    def __init__(self, template: RequestTemplate, timeout: float, pool_size: int,
                 max_inflight: int) -> None:
        self.template = template
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._pool_size = pool_size
        self._max_inflight = max_inflight
        self.inflight = 0
        self._session: aiohttp.ClientSession | None = None

    async def ask(self, values: dict[str, str],
                  interpret: Callable[[int, bytes], Answer]) -> Answer:
        """The request `values` fill in, its answer read by `interpret`."""
        if self.inflight >= self._max_inflight:
            return BUSY
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._pool_size), timeout=self._timeout)
        request = render(self.template, values)
        self.inflight += 1
        try:
            async with self._session.request(request.method, request.url,
                                             headers=request.headers, params=request.params,
                                             json=request.json) as response:
                body = await response.content.read(65 * 1024)
                return interpret(response.status, body)
        except (TimeoutError, aiohttp.ClientError) as error:
            # Debug, not warning: a dead service would log once per request; the refusals
            # are counted (mqtt_auth_failures_total, mqtt_authz_unavailable_total).
            log.debug("%s %s: %r", request.method, request.url, error)
            return UNAVAILABLE
        finally:
            self.inflight -= 1

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

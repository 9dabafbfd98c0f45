"""The asyncio side of HTTP authentication: one aiohttp session per service, its
connections bounded by `pool_size`, each request by `request_timeout`, and at most
`max_inflight` requests out at once. Past that a CONNECT is not queued: it is answered
"unavailable" at once (the caller refuses it with 0x88 Server unavailable), so a slow or dead
service costs a bounded number of waiting CONNECTs and never the event loop or the other
clients."""

import logging

import aiohttp

from broker.auth.http_requests import UNAVAILABLE, Answer, RequestTemplate, interpret, render

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

    @property
    def saturated(self) -> bool:
        return self.inflight >= self._max_inflight

    async def ask(self, values: dict[str, str], client_id: str, username: str | None) -> Answer:
        if self.saturated:
            return UNAVAILABLE
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
                return interpret(response.status, body, client_id, username)
        except (TimeoutError, aiohttp.ClientError) as error:
            # Debug, not warning: a dead service would log once per CONNECT; the refusals
            # are counted (mqtt_auth_failures_total{reason="http_unavailable"}).
            log.debug("%s %s: %r", request.method, request.url, error)
            return UNAVAILABLE
        finally:
            self.inflight -= 1

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

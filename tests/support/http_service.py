"""An aiohttp service for a broker under test to call (HTTP authentication and
authorization, a JWKS): its own event loop in a thread, bound to loopback on a free port,
one route. `release` lets a handler hold requests until the test (or `stop`) lets them go."""

import asyncio
import threading
from collections import Counter
from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ThreadedService:
    def __init__(self, path: str, handler: Handler, method: str = "POST") -> None:
        self.release = threading.Event()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._run,
                                        args=(method, path, handler, started), daemon=True)
        self._thread.start()
        assert started.wait(10), "the HTTP service did not start"

    def _run(self, method: str, path: str, handler: Handler, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route(method, path, handler)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        started.set()
        self._loop.run_forever()

    async def held(self, timeout: float) -> None:
        """In a handler: waits until `release` is set (or `timeout`), off the service's loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.release.wait, timeout)

    def stop(self) -> None:
        self.release.set()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def assert_bounded_storm(answers: list[tuple[int, float]], passed: int, refused: int,
                         inflight: int, slow_s: float) -> int:
    """A storm of clients against a service taking `slow_s` with `inflight` requests out at
    most: each client's (reason code, seconds to its answer). The first `inflight` waited
    for the service and passed; clients read after a slot freed may have found one, but
    most were refused at once. Returns how many were refused."""
    waited = [took for code, took in answers if code == passed]
    rejected = [took for code, took in answers if code == refused]
    assert len(waited) + len(rejected) == len(answers), Counter(code for code, _ in answers)
    assert inflight <= len(waited) < len(answers) // 4, len(waited)
    assert min(waited) >= slow_s
    assert max(rejected) < slow_s, "a refusal waited as long as the service"
    return len(rejected)

"""The HTTP authentication service security_bench.py's HTTP case asks: the least a service
can be (aiohttp, every POST answered `{"result": "allow"}`), in a process of its own on the
load CPUs, so the figure is the broker's HTTP client and chain rather than a user database."""

import asyncio
import contextlib
import multiprocessing
import os
from collections.abc import Iterator
from typing import Any

from aiohttp import web

ALLOW = b'{"result": "allow"}'


async def _allow(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=ALLOW, content_type="application/json")


async def _serve(ports: Any) -> None:
    app = web.Application()
    app.router.add_post("/auth", _allow)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    ports.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    await asyncio.Event().wait()  # until the process is ended


def _run(cpus: set[int], ports: Any) -> None:
    os.sched_setaffinity(0, cpus)
    asyncio.run(_serve(ports))


@contextlib.contextmanager
def allow_service(cpus: set[int]) -> Iterator[str]:
    """The service's URL while it runs; ended (and waited for) on leaving."""
    ctx = multiprocessing.get_context("fork")
    ports = ctx.Queue()
    process = ctx.Process(target=_run, args=(cpus, ports), daemon=True)
    process.start()
    try:
        yield f"http://127.0.0.1:{ports.get(timeout=30)}/auth"
    finally:
        process.kill()
        process.join()

"""Request/response between nodes over their link (the RPC channel): admin and API calls.

Not the message path: forwarding, routes and Raft have channels and encodings of their own.
JSON, one frame per request or reply, matched by id. A request may carry bytes after its
JSON, a NUL between (JSON text has none), which its method finds as `params["body"]`: a
Raft command forwarded to its group's leader goes as it is, not in base64. A call fails
fast when there is no link to the peer or the link drops while waiting, and times out
otherwise; a remote handler that raises answers with its error's text, never leaves the
caller hanging.
"""

import asyncio
import itertools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from broker.cluster.frames import Channel
from broker.cluster.service import Cluster

log = logging.getLogger(__name__)

Method = Callable[[Any], Awaitable[Any] | Any]


class RpcError(Exception):
    pass


class Rpc:
    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._methods: dict[str, Method] = {}
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        cluster.on(Channel.RPC, self._frame)
        cluster.on_peer_down(self._peer_down)

    def register(self, name: str, method: Method) -> None:
        self._methods[name] = method

    async def call(self, site: str, method: str, params: Any = None,
                   timeout: float = 5.0, body: bytes | None = None) -> Any:
        call_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        payload = json.dumps({"id": call_id, "m": method, "p": params}).encode()
        if body is not None:
            payload = b"".join((payload, b"\0", body))
        if not self._cluster.send(site, Channel.RPC, payload):
            raise RpcError(f"no link to {site}")
        self._waiting[call_id] = (site, future)
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise RpcError(f"{method} on {site}: no answer in {timeout} s") from None
        finally:
            self._waiting.pop(call_id, None)

    async def multicall(self, method: str, params: Any = None,
                        timeout: float = 5.0) -> dict[str, Any]:
        """Every peer with a link: site -> result, or the RpcError it failed with."""
        sites = self._cluster.peers()
        results = await asyncio.gather(
            *(self.call(site, method, params, timeout) for site in sites), return_exceptions=True
        )
        return dict(zip(sites, results, strict=True))

    def _peer_down(self, site: str) -> None:
        for waiting_site, future in list(self._waiting.values()):
            if waiting_site == site and not future.done():
                future.set_exception(RpcError(f"link to {site} lost"))

    def _frame(self, site: str, payload: bytes) -> None:
        head, nul, body = payload.partition(b"\0")
        message = json.loads(head)
        if nul and isinstance(message.get("p"), dict):
            message["p"]["body"] = body
        if "m" in message:
            task = asyncio.create_task(self._serve(site, message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        waiting = self._waiting.get(int(message["id"]))
        if waiting is None or waiting[1].done():
            return  # answered after its caller gave up
        if "e" in message:
            waiting[1].set_exception(RpcError(str(message["e"])))
        else:
            waiting[1].set_result(message.get("r"))

    async def _serve(self, site: str, message: dict[str, Any]) -> None:
        reply: dict[str, Any] = {"id": message.get("id")}
        method = self._methods.get(str(message["m"]))
        try:
            if method is None:
                raise RpcError(f"unknown method {str(message['m'])[:64]!r}")
            result = method(message.get("p"))
            if asyncio.iscoroutine(result):
                result = await result
            reply["r"] = result
        except Exception as error:
            log.debug("rpc %s from %s failed", message.get("m"), site, exc_info=True)
            reply["e"] = f"{type(error).__name__}: {error}"
        self._cluster.send(site, Channel.RPC, json.dumps(reply).encode())

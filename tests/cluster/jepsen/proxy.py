"""Network partitions between real broker processes on one loopback: a front door per node.

Nodes cannot be put in network namespaces of their own here (the `cluster` fixture starts
them, clients must reach 127.0.0.1) and there is no packet filter on this machine, so the
links between nodes go through a TCP proxy the test controls:

    node A --dial--> door(B) 127.0.0.1:F_B --proxy--> B's inter-node listener 127.0.0.1:R_B

A proxy per pair of nodes is not enough: a node remembers a peer by the address the peer
*advertises* in its handshake (`host`/`port` of `hello` and `challenge`, broker/cluster/
handshake.py, from `node.name` and `rpc.tcp_server_port`), gossips it, keeps it in
`members.json` and dials that address when the link drops: the real port, past any proxy.
So the door rewrites the advertised port (R_X -> F_X) in the handshake and in the member
lists gossiped on the MEMBERSHIP channel; the port is not part of the handshake's HMAC
proof, so authentication is untouched. Every node then only ever knows the doors, and the
seeds (`cluster.static.seeds`) name the doors too (`wire()`).

The door reads the dialer's `hello` before it connects upstream, so it knows which two nodes
a connection joins, whichever dialled: `cut(a, b)` blackholes the pair's connections (bytes
are dropped, both sockets stay open: each node notices the silence by its heartbeats, as in
a real partition) and new connections between them get their `hello` swallowed.
`heal()` closes the blackholed connections (their streams lost bytes mid-frame and cannot
resume) and lets new ones through.

    doors = FrontDoors()
    nodes = cluster.make(3, **settings); doors.wire(nodes); [n.start() for n in nodes]
    doors.partition(["n1"], ["n2", "n3"]); ...; doors.heal(); doors.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from broker.cluster.frames import Channel, FrameDecoder, encode_frame

if TYPE_CHECKING:
    from tests.cluster.conftest import Node

HOST = "127.0.0.1"
_MAX_FRAME = 64 * 1024 * 1024
T = TypeVar("T")

Pair = frozenset[str]


def node_short_name(node: str) -> str:
    """`n1@127.0.0.1` -> `n1`."""
    return node.partition("@")[0]


def rewrite(channel: int, payload: bytes, ports: dict[int, int]) -> bytes:
    """The frame's payload with every advertised real port replaced by its door (handshake
    `hello`/`challenge` and gossiped member lists); any other frame unchanged."""
    if channel not in (Channel.HANDSHAKE, Channel.MEMBERSHIP):
        return payload
    try:
        message = json.loads(payload)
    except ValueError:
        return payload
    if not isinstance(message, dict):
        return payload
    changed = False
    identities = [message] if channel == Channel.HANDSHAKE else message.get("members", [])
    for identity in identities if isinstance(identities, list) else []:
        if isinstance(identity, dict) and identity.get("port") in ports:
            identity["port"] = ports[identity["port"]]
            changed = True
    return json.dumps(message, separators=(",", ":")).encode() if changed else payload


class _Pipe:
    """One proxied connection: the dialer's socket and, once its hello allowed it, the
    upstream one."""

    def __init__(self, doors: FrontDoors, listener: str) -> None:
        self.doors = doors
        self.listener = listener
        self.dialer = ""
        self.blackholed = False
        self.writers: list[asyncio.StreamWriter] = []

    @property
    def pair(self) -> Pair:
        return frozenset((self.dialer, self.listener))

    def close(self) -> None:
        for writer in self.writers:
            transport = writer.transport
            with contextlib.suppress(Exception):
                if isinstance(transport, asyncio.Transport):
                    transport.abort()
                else:
                    writer.close()

    async def run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        doors = self.doors
        try:
            decoder = FrameDecoder(_MAX_FRAME)
            frames: list[tuple[int, bytes]] = []
            while not frames:  # the dialer's hello names it
                data = await reader.read(65536)
                if not data:
                    return
                frames = decoder.feed(data)
            with contextlib.suppress(ValueError):
                self.dialer = node_short_name(str(json.loads(frames[0][1]).get("node", "")))
            doors.pipes.add(self)
            if doors.is_cut(self.pair):
                self.blackholed = True
                await _discard(reader)
                return
            upstream_reader, upstream_writer = await asyncio.open_connection(
                HOST, doors.real_ports[self.listener])
            self.writers.append(upstream_writer)
            first = b"".join(encode_frame(channel, rewrite(channel, payload, doors.to_door))
                             for channel, payload in frames)
            upstream_writer.write(first)
            await asyncio.gather(
                self._pump(reader, upstream_writer, decoder),
                self._pump(upstream_reader, writer, FrameDecoder(_MAX_FRAME)))
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:
            doors.pipes.discard(self)
            self.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    decoder: FrameDecoder) -> None:
        ports = self.doors.to_door
        while True:
            data = await reader.read(65536)
            if not data:
                if not self.blackholed:  # in a partition, no FIN gets through either
                    self.close()
                return
            if self.blackholed:
                continue
            frames = decoder.feed(data)
            if frames:
                writer.write(b"".join(encode_frame(channel, rewrite(channel, payload, ports))
                                      for channel, payload in frames))
                await writer.drain()


async def _discard(reader: asyncio.StreamReader) -> None:
    while await reader.read(65536):
        pass


class FrontDoors:
    """A proxy in front of each node's inter-node port, on its own event loop thread."""

    def __init__(self) -> None:
        self.real_ports: dict[str, int] = {}  # node -> its inter-node listener
        self.door_ports: dict[str, int] = {}  # node -> its door
        self.to_door: dict[int, int] = {}  # real port -> door port
        self.pipes: set[_Pipe] = set()
        self._cut: set[Pair] = set()
        self._servers: list[asyncio.Server] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="front-doors",
                                        daemon=True)
        self._thread.start()

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    # ---- doors ----------------------------------------------------------------------------------
    def add(self, name: str, real_port: int) -> int:
        """A door for node `name` whose inter-node listener is `real_port`; its port."""
        async def open_door() -> int:
            server = await asyncio.start_server(
                lambda r, w: _Pipe(self, name).run(r, w), HOST, 0)
            self._servers.append(server)
            return int(server.sockets[0].getsockname()[1])

        port = self._call(open_door())
        self.real_ports[name], self.door_ports[name] = real_port, port
        self.to_door[real_port] = port
        return port

    def wire(self, nodes: list[Node]) -> None:
        """Doors for `nodes` (made, not started) and seeds that name the doors."""
        for node in nodes:
            self.add(node.name, node.rpc_port)
        seeds = ",".join(f"{node.name}@{HOST}:{self.door_ports[node.name]}" for node in nodes)
        for node in nodes:
            node.settings["cluster.static.seeds"] = seeds
            node.process.settings["cluster.static.seeds"] = seeds

    def close(self) -> None:
        async def shut() -> None:
            for server in self._servers:
                server.close()
            for pipe in list(self.pipes):
                pipe.close()

        with contextlib.suppress(Exception):
            self._call(shut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # ---- faults ---------------------------------------------------------------------------------
    def is_cut(self, pair: Pair) -> bool:
        return len(pair) == 2 and pair in self._cut

    def cut(self, a: str, b: str) -> None:
        """No byte passes between nodes `a` and `b` any more, either way."""
        self.cut_pairs([frozenset((a, b))])

    def cut_pairs(self, pairs: Iterable[Pair]) -> None:
        async def apply(pairs: list[Pair]) -> None:
            self._cut.update(pairs)
            for pipe in self.pipes:
                if self.is_cut(pipe.pair):
                    pipe.blackholed = True

        self._call(apply([frozenset(pair) for pair in pairs]))

    def partition(self, *groups: Iterable[str]) -> None:
        """Nodes talk only inside their group (a node in no group is cut from all)."""
        sides = [set(group) for group in groups]
        names = sorted(self.door_ports)
        self.cut_pairs(frozenset((a, b)) for i, a in enumerate(names) for b in names[i + 1:]
                       if not any(a in side and b in side for side in sides))

    def isolate(self, name: str) -> None:
        self.cut_pairs(frozenset((name, other)) for other in self.door_ports if other != name)

    def heal(self) -> None:
        async def apply() -> None:
            self._cut.clear()
            for pipe in [p for p in self.pipes if p.blackholed]:
                pipe.close()

        self._call(apply())

    def cuts(self) -> set[Pair]:
        return set(self._cut)

    def links(self) -> set[Pair]:
        """Pairs of distinct nodes with a connection passing bytes now."""
        async def read() -> set[Pair]:
            return {pipe.pair for pipe in self.pipes
                    if len(pipe.pair) == 2 and not pipe.blackholed and len(pipe.writers) == 2}

        return self._call(read())

"""Where the memory of an idle connection goes: scenario e, with the broker in-process.

Starts the broker in this process (its defaults, loopback listeners, a temp data dir),
opens N connections from a child process as scenario e does (CONNECT, keepalive 0 unless
--keepalive says otherwise, clean session, then idle), and reports per connection: RSS
growth and the objects that appeared, by type; with --trace, what tracemalloc traced, by
the source file that allocated it (tracemalloc's own bookkeeping then inflates the RSS
figure). bench/run.py --only e gives the comparable figure; this tells which code it
belongs to.

    .venv/bin/python bench/idle_memory.py [--connections 10000] [--keepalive S] [--trace]
"""

import argparse
import asyncio
import collections
import gc
import os
import resource
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(ROOT))

from bench import wire  # noqa: E402
from bench.procstat import rss_kib  # noqa: E402
from broker.config.loader import load_config  # noqa: E402
from broker.server import app  # noqa: E402

_READY = b"ready\n"


def hold(port: int, count: int, keepalive: int) -> None:
    """The child: opens `count` connections, each up to its CONNACK, says so and waits for
    its stdin to close."""
    held = []
    sel = selectors.DefaultSelector()
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(wire.connect(f"idle-memory-{i}", keepalive))
        held.append(sock)
        sel.register(sock, selectors.EVENT_READ)
    pending = set(held)
    while pending:
        for key, _ in sel.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if len(sock.recv(64)) < wire.CONNACK_SIZE:
                raise SystemExit("a connection was refused or closed")
            sel.unregister(sock)
            pending.discard(sock)
    sys.stdout.buffer.write(_READY)
    sys.stdout.flush()
    sys.stdin.read()


def _types() -> collections.Counter[str]:
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


async def measure(settings: list[str], count: int, keepalive: int, trace: bool) -> None:
    data_dir = tempfile.mkdtemp(prefix="idle-memory-")
    try:
        config = load_config(None, [
            "listeners.tcp.default.bind=127.0.0.1:0", "listeners.ws.default.bind=127.0.0.1:0",
            "dashboard.listeners.http.bind=127.0.0.1:0", f"node.data_dir={data_dir}",
            *settings])
        broker = app.BrokerApp(config)
        await broker.start()
        gc.collect()
        rss, types = rss_kib(os.getpid()), _types()
        if trace:
            tracemalloc.start()
        before = tracemalloc.take_snapshot() if trace else None
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--hold", str(broker.ports["tcp"]), str(count),
            str(keepalive),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert child.stdout is not None and child.stdin is not None
        if await child.stdout.readline() != _READY:
            raise SystemExit("the connections did not all get a CONNACK")
        grown = rss_kib(os.getpid()) - rss
        print(f"{count} idle connections: RSS +{grown / 1024:.1f} MiB,"
              f" {grown * 1024 / count:.0f} bytes each")
        if before is not None:
            by_file: collections.Counter[str] = collections.Counter()
            for stat in tracemalloc.take_snapshot().compare_to(before, "filename"):
                name = stat.traceback[0].filename
                by_file[str(Path(name).relative_to(ROOT)) if name.startswith(str(ROOT))
                        else "/".join(Path(name).parts[-2:])] += stat.size_diff
            tracemalloc.stop()
            print(f"traced: {sum(by_file.values()) / count:.0f} bytes each, by the file that"
                  " allocated them:")
            for name, size in by_file.most_common(15):
                print(f"  {size / count:7.0f}  {name}")
        gc.collect()
        new = _types() - types
        print("objects each, by type:")
        for name, number in new.most_common():
            if number >= count // 2:
                print(f"  {number / count:5.2f}  {name}")
        child.stdin.close()
        await child.wait()
        await broker.stop()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    if sys.argv[1:2] == ["--hold"]:
        hold(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--keepalive", type=int, default=0,
                        help="the clients' keep-alive, seconds (scenario e: 0)")
    parser.add_argument("--trace", action="store_true", help="tracemalloc, by source file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a broker setting, as `broker run --set`")
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the child inherits it
    asyncio.run(measure(args.set, args.connections, args.keepalive, args.trace))


if __name__ == "__main__":
    main()

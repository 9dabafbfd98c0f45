"""Compiles the broker's hot-path modules to C extensions with mypyc, or removes them.

Why: the durable QoS 1 path spends ~80% of its CPU in the Python interpreter (profile in
bench/README.md). mypyc turns these type-annotated modules into C extensions: the same
source, no second implementation, 30-50% less CPU per message. An extension module shadows
its `.py` file, so a stale one would run old code: the build writes `broker/native.json`
(each compiled source's SHA-256, size and mtime) and `broker/__init__.py` refuses to start
when a compiled source changed since (see `broker.native`).

Usage: python tools/build_native.py [build|clean]   (build is a no-op when up to date)
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "broker"
MANIFEST = PACKAGE / "native.json"
# The shared library of all compiled modules lives inside the package, so the editable
# install's import finder (which only knows `broker`) finds it.
GROUP = "broker.native_lib"

# Hot-path modules only. Not compiled, as mypyc would change what they mean:
# - broker/mqtt/errors.py: subclasses set their own default `reason_code`, which compiled
#   exception classes lose;
# - broker/ds/tx.py: KVStore keeps weak references to transactions, and native classes
#   have no __weakref__;
# - broker/raft/wal.py: the Raft simulation's CheckedWal subclasses WriteAheadLog, and
#   compiled, its recovery tests failed (not investigated: its cost is zlib and joins, in C).
MODULES = (
    "broker/mqtt/codec.py", "broker/mqtt/constants.py", "broker/mqtt/decode.py",
    "broker/mqtt/encode.py", "broker/mqtt/packets.py", "broker/mqtt/properties.py",
    "broker/mqtt/record.py", "broker/mqtt/topic.py",
    "broker/ds/buffer.py", "broker/ds/bulk.py", "broker/ds/cook.py", "broker/ds/db.py",
    "broker/ds/iterator.py",
    "broker/ds/keys.py", "broker/ds/kv.py", "broker/ds/lts.py", "broker/ds/recent.py",
    "broker/ds/shard.py",
    "broker/ds/slab.py", "broker/ds/storage.py", "broker/ds/subscribe.py",
    "broker/ds/table_writer.py", "broker/ds/ttv.py",
    "broker/routing/router.py", "broker/routing/trie.py",
    "broker/server/ack_order.py", "broker/server/admission.py", "broker/server/connection.py",
    "broker/server/delivery.py", "broker/server/output.py", "broker/server/ratelimit.py",
    "broker/server/reactor.py", "broker/server/transports.py", "broker/server/websocket.py",
    "broker/server/wheel.py", "broker/server/wire.py", "broker/server/handlers/acks.py",
    "broker/server/handlers/connect.py", "broker/server/handlers/disconnect.py",
    "broker/server/handlers/publish.py",
    "broker/session/manager.py", "broker/session/message.py", "broker/session/session.py",
    "broker/session/durable/batches.py", "broker/session/durable/context.py",
    "broker/session/durable/group_member.py", "broker/session/durable/offline.py",
    "broker/session/durable/persist.py",
    "broker/session/durable/records.py",
    "broker/session/durable/session.py", "broker/session/durable/store.py",
    "broker/session/durable/turn.py",
    "broker/node.py",
    "broker/raft/core.py", "broker/raft/host.py", "broker/raft/latency.py",
    "broker/raft/log.py", "broker/raft/messages.py", "broker/raft/progress.py",
    "broker/raft/ready.py",
    "broker/ds/replication_layer.py", "broker/ds/replication_shard.py",
    "broker/ds/shard_snapshot.py",
)


# What `mypyc` (the command) does, plus a group name; extensions are built in place.
_SETUP = f"""
from setuptools import setup
from mypyc.build import mypycify
setup(name="broker-native", py_modules=[], packages=[],
      ext_modules=mypycify({list(MODULES)!r}, group_name={GROUP!r}),
      script_args=["build_ext", "--inplace", "--build-temp", "build/native"])
"""


def digests() -> dict[str, str]:
    return {path: hashlib.sha256((ROOT / path).read_bytes()).hexdigest() for path in MODULES}


def stats() -> dict[str, list[int]]:
    """Each source's [size, mtime in ns], as `broker.native` compares them (the build cannot
    import it: `broker` refuses to import while a compiled source is stale). Taken before
    the sources are hashed and compiled: a source edited meanwhile then differs from its
    stat, so the start-up check hashes it and finds that it is not what was compiled."""
    return {path: [(stat := os.stat(ROOT / path)).st_size, stat.st_mtime_ns]
            for path in MODULES}


def _write_manifest(wanted: dict[str, object], seen: dict[str, list[int]]) -> None:
    MANIFEST.write_text(json.dumps({**wanted, "stats": seen}, indent=1) + "\n")


def clean() -> None:
    MANIFEST.unlink(missing_ok=True)
    for extension in PACKAGE.rglob("*.so"):
        extension.unlink()


def build() -> int:
    seen = stats()
    wanted = {"group": GROUP, "modules": digests()}
    if MANIFEST.exists():
        built = json.loads(MANIFEST.read_text())
        if {key: built.get(key) for key in wanted} == wanted:
            _write_manifest(wanted, seen)  # sources touched since: hashed at each start till now
            print("native modules up to date")
            return 0
    clean()  # no manifest while extensions are half built: the guard then refuses them
    done = subprocess.run([sys.executable, "-c", _SETUP], cwd=ROOT, check=False,
                          stdout=subprocess.DEVNULL)
    if done.returncode:
        clean()
        print("mypyc failed (see above); no native modules built", file=sys.stderr)
        return done.returncode
    _write_manifest(wanted, seen)
    print(f"compiled {len(MODULES)} modules")
    return 0


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "build"
    if command == "clean":
        clean()
        return 0
    if command == "build":
        return build()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

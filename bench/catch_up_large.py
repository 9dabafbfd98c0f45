"""A new replica catching up a large shard (issue 42, by hand: ~12 GB of free disk, ~10 min).

    .venv/bin/python bench/catch_up_large.py MESSAGES PAYLOAD_BYTES [KEY=VALUE ...]

A 3-node RF 3 cluster (replication_bench's settings plus KEY=VALUE), one offline session and
one publisher storing MESSAGES messages into one shard (default generation size: sealed
generations of 1 GB and the current one); once every node applied them, node 3 is killed, its
data dir emptied and the node started again: seconds from its HTTP API's first answer until it
applied everything (`transfer_s`), against `cp -r` of node 2's data dir afterwards (node 3
stopped and removed first, to keep the disk's peak at four copies). Prints the JSON.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import brokers, durable_bench
from bench.replication_bench import (
    REPLICATED,
    _answers,
    _applied,
    _commits,
    _size,
    wait_for,
    wait_led,
)


def main(argv: list[str]) -> dict[str, Any]:
    messages, payload = int(argv[0]), int(argv[1])
    extra = dict(arg.split("=", 1) for arg in argv[2:])
    make = durable_bench.PublisherSpec
    durable_bench.PublisherSpec = (  # type: ignore[misc]
        lambda port, ids, topics, _payload, *a, **k: make(port, ids, topics, b"x" * payload,
                                                          *a, **k))
    out: dict[str, Any] = {"messages": messages, "payload_bytes": payload, "settings": extra,
                           "loadavg_at_start": os.getloadavg()[0]}
    with brokers.running_cluster("ours", 3, {**REPLICATED, **extra}) as members:
        wait_led(members)
        durable_bench.create_sessions(members[0], 1)
        out["publish_msgs_per_s"] = durable_bench.publish(members[0], messages)[
            "publish_msgs_per_s"]
        target = _commits(members)
        wait_for(lambda: all(_applied(m, target) for m in members), members, "applied", 900)
        victim, source = members[2], members[1]
        out["source_data_mib"] = round(_size(source.tmp / "data") / 2**20, 1)
        os.kill(victim.pid, signal.SIGKILL)
        victim.proc.wait()
        shutil.rmtree(victim.tmp / "data")
        (victim.tmp / "data").mkdir()
        started = time.monotonic()
        brokers.respawn(victim)
        up = wait_for(lambda: _answers(victim), members, "its HTTP API")
        done = wait_for(lambda: _applied(victim, target), members, "caught up", 1800)
        out.update({"up_s": round(up - started, 3), "transfer_s": round(done - up, 3),
                    "replica_data_mib": round(_size(victim.tmp / "data") / 2**20, 1),
                    "installed": [line[:200] for line in victim.log.read_text().splitlines()
                                  if "replaced by a snapshot" in line]})
        os.kill(victim.pid, signal.SIGKILL)
        victim.proc.wait()
        shutil.rmtree(victim.tmp / "data")
        copy = victim.tmp.parent / "copy"
        copy_started = time.monotonic()
        subprocess.run(["cp", "-r", str(source.tmp / "data"), str(copy)], check=True)
        out["copy_s"] = round(time.monotonic() - copy_started, 3)
        shutil.rmtree(copy)
    out["catch_up_msgs_per_s"] = round(messages / out["transfer_s"])
    out["copy_msgs_per_s"] = round(messages / out["copy_s"])
    out["catch_up_over_copy"] = round(out["copy_s"] / out["transfer_s"], 3)
    out["loadavg_at_end"] = os.getloadavg()[0]
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=1))

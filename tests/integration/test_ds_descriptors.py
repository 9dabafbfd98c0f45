"""Sealed generations do not hold file descriptors (issue 15, defect 1).

Every seal makes a generation per shard that holds data; each LevelDB open holds 4
descriptors. A broker sealed after every publish (anyone can, through the HTTP API) must
keep at most `durable_storage.messages.max_open_slabs` of them open, open none of them at
start-up, and still deliver every message from them: a reader reopens a closed one.
"""

import json
import os
import urllib.request

import pytest

from tests.integration.clients import scrape_metrics, unique, wait_offline
from tests.support.broker_process import BrokerProcess
from tests.support.raw_mqtt import HOST, TIMEOUT

pytestmark = pytest.mark.integration

N_SHARDS = 4
# Room for sealed generations beside the 2 pinned per shard: its current generation and the
# next one, made ahead (broker/ds/spare.py).
MAX_OPEN_SLABS = 2 * N_SHARDS + 4
SEALS = 300
PER_SLAB = 4  # LOCK, LOG, MANIFEST and log file of an open LevelDB (broker/ds/slab.py)
SLACK = 8  # the publisher's and subscriber's sockets, an HTTP request's
SETTINGS = {
    "durable_storage.messages.max_open_slabs": str(MAX_OPEN_SLABS),
    "durable_storage.messages.n_shards": str(N_SHARDS),
}


def open_descriptors(broker: BrokerProcess) -> int:
    assert broker.proc is not None
    return len(os.listdir(f"/proc/{broker.proc.pid}/fd"))


def seal(broker: BrokerProcess) -> int:
    request = urllib.request.Request(
        f"http://{HOST}:{broker.ports['http']}/api/v5/ds/storages/messages/generations",
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        sealed: int = json.loads(response.read())["sealed"]
    return sealed


def test_seals_keep_descriptors_bounded_across_restarts_and_reads_reopen_them(
    paho_client, start_broker
) -> None:
    broker = start_broker(**SETTINGS)
    client_id = unique("durable")
    subscriber = paho_client(client_id, port=broker.tcp, clean_start=False, session_expiry=3600)
    assert subscriber.subscribe("fd/#", 1) == [1]
    subscriber.disconnect()
    wait_offline(broker.ports["http"], client_id)
    baseline = open_descriptors(broker)  # no shard yet: each is made by its first write
    bound = baseline + PER_SLAB * MAX_OPEN_SLABS + SLACK

    publisher = paho_client(unique("pub"), port=broker.tcp)
    for i in range(SEALS):
        assert publisher.publish("fd/t", str(i).encode(), qos=1) == 0
        assert seal(broker) == 1
    publisher.close()
    assert open_descriptors(broker) <= bound, f"baseline {baseline}"
    metrics = scrape_metrics(broker.ports["http"])
    assert metrics["ds_generations"] == 1 + SEALS  # the publisher's shard only
    assert metrics["ds_open_slabs"] <= MAX_OPEN_SLABS
    assert metrics["ds_max_open_slabs"] == MAX_OPEN_SLABS

    assert broker.stop() == 0
    broker = start_broker(broker.data_dir, **SETTINGS)
    # no sealed generation opened: the shard's current one and its next, made ahead
    assert open_descriptors(broker) <= baseline + 2 * PER_SLAB + SLACK
    assert scrape_metrics(broker.ports["http"])["ds_open_slabs"] <= 2

    subscriber = paho_client(client_id, port=broker.tcp, clean_start=False, session_expiry=3600)
    assert subscriber.connack is not None and subscriber.connack.session_present
    received = subscriber.wait_messages(SEALS, timeout=120)
    assert [m.payload for m in received] == [str(i).encode() for i in range(SEALS)]
    assert open_descriptors(broker) <= bound
    metrics = scrape_metrics(broker.ports["http"])
    assert metrics["ds_open_slabs"] <= MAX_OPEN_SLABS
    assert metrics["ds_slab_reopens_total"] >= SEALS - MAX_OPEN_SLABS

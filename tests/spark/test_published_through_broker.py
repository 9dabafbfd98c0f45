"""The whole path a user takes: MQTT clients publish to a running broker, a durable session
makes the topics durable, the generation is sealed through the admin API, and the Spark jobs
read exactly what was published while the broker keeps running."""

import json
import urllib.request
from collections import Counter

from pyspark.sql import SparkSession

import slabframe
import slabs
import stats
from tests.integration.clients import PahoClient, wait_offline
from tests.support.broker_process import BrokerProcess

TRUCKS = 5
PER_TRUCK = 40


def test_jobs_read_what_clients_published(spark: SparkSession, start_broker, tmp_path) -> None:
    broker: BrokerProcess = start_broker(**{"durable_storage.messages.n_shards": "4"})
    clients: list[PahoClient] = []
    try:
        fleet = PahoClient(broker.tcp, "fleet-app")
        clients.append(fleet)
        fleet.connect(clean_start=False, session_expiry=3600)
        fleet.subscribe("fleet/#", 1)  # from now on fleet/... topics are stored
        fleet.disconnect()
        wait_offline(broker.ports["http"], "fleet-app")
        sent: list[tuple[str, bytes, str]] = []
        for n in range(TRUCKS):
            truck = PahoClient(broker.tcp, f"truck{n}")
            clients.append(truck)
            truck.connect()
            for i in range(PER_TRUCK):
                topic, payload = f"fleet/truck{n}/gps", f"{n}:{i}".encode()
                truck.publish(topic, payload, 1)
                sent.append((topic, payload, f"truck{n}"))
            truck.publish("other/noise", b"not durable", 1)  # nobody durable subscribed
        request = urllib.request.Request(
            f"http://127.0.0.1:{broker.ports['http']}/api/v5/ds/storages/messages/generations",
            method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["sealed"] >= 1

        frame, report = slabframe.read_messages(spark, broker.data_dir, slabs.Selection())
        rows = frame.select("topic", "payload", "publisher", "qos").collect()
        assert sorted((r.topic, bytes(r.payload), r.publisher) for r in rows) == sorted(sent)
        assert {r.qos for r in rows} == {1}
        # Only the fresh, empty generations the seal opened are left out.
        assert all(s["reason"].startswith("unsealed") for s in report.to_json()["skipped"])

        stats.main([str(broker.data_dir), "--output", str(tmp_path / "stats")])
        by_topic = spark.read.parquet(str(tmp_path / "stats" / "by_topic")).collect()
        counts = Counter({r.topic: 0 for r in by_topic})
        for row in by_topic:
            counts[row.topic] += row.messages
        assert counts == {f"fleet/truck{n}/gps": PER_TRUCK for n in range(TRUCKS)}
        assert broker.proc is not None and broker.proc.poll() is None  # still running
    finally:
        for client in clients:
            client.close()

"""A rolling upgrade under load: a 3-node `builtin_raft` cluster of the previous release
(RELEASES) holding durable sessions, retained messages and stored messages in sealed and
current generations is upgraded to this tree one node at a time (SIGTERM, then this code
on the same data dir, as a StatefulSet rolls its pods) while the checked workload runs.

Nothing acknowledged may be lost, every durable reconnect must find its session, the
retained messages and the stored ones an offline session waits for must all be there.
"""

from pathlib import Path

import pytest

from tests.cluster.conftest import Node, http_json
from tests.cluster.jepsen.harness import RAFT, Harness, backend
from tests.integration.clients import PahoClient, wait_until
from tests.support.releases import build, releases

pytestmark = pytest.mark.integration

STORED = 60  # messages per generation stored for the offline session
RETAINED = 20


@pytest.fixture(scope="session")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(list(releases())[-1], tmp_path_factory.mktemp("releases"))


def _publish(port: int, client_id: str, messages: list[tuple[str, bytes, bool]]) -> None:
    publisher = PahoClient(port, client_id)
    publisher.connect()
    try:
        for topic, payload, retain in messages:
            # 0x10: no matching subscribers (yet), still stored or retained
            assert publisher.publish(topic, payload, qos=1, retain=retain) in (0, 0x10)
    finally:
        publisher.close()


def _offline_session(port: int) -> None:
    keeper = PahoClient(port, "upgrade-keeper")
    keeper.connect(clean_start=True, session_expiry=3600)
    assert keeper.subscribe("upgrade/stored/#", qos=1) == [1]
    keeper.disconnect()
    keeper.close()


def _stored(harness: Harness) -> list[tuple[str, bytes, bool]]:
    """Messages for the offline session in a sealed generation, then in the current one."""
    node = harness.nodes[0]
    batches = []
    for name in ("sealed", "current"):
        batch = [(f"upgrade/stored/{i % 4}", f"{name}-{i}".encode(), False)
                 for i in range(STORED)]
        _publish(node.process.tcp, f"upgrade-pub-{name}", batch)
        batches += batch
        if name == "sealed":
            answer = http_json(node.http, "/api/v5/ds/storages/messages/generations", "POST")
            assert answer["sealed"], "no generation sealed"
    return batches


def _durable_group(nodes: list[Node]) -> None:
    """A durable shared group made on one node stores a job its worker gets on another."""
    share = "$share/upgraded/upgrade/jobs/#"
    worker = PahoClient(nodes[0].process.tcp, "upgrade-worker")
    worker.connect(clean_start=True, session_expiry=3600)
    assert worker.subscribe(share, qos=1) == [1]
    worker.disconnect()
    worker.close()
    wait_until(lambda: all(share in [g["topic"] for g in http_json(
        node.http, "/api/v5/durable_shared_groups")["data"]] for node in nodes), 15,
        "the durable group in every replica")
    _publish(nodes[1].process.tcp, "upgrade-job", [("upgrade/jobs/1", b"job", False)])
    back = PahoClient(nodes[2].process.tcp, "upgrade-worker")
    try:
        assert back.connect(clean_start=False, session_expiry=3600).session_present
        assert [m.payload for m in back.wait_messages(1, timeout=30)] == [b"job"]
    finally:
        back.close()


def test_a_rolling_upgrade_from_the_previous_release_loses_nothing(
        jepsen, previous_release: Path) -> None:
    harness = jepsen(3, code=previous_release, **backend(RAFT))
    nemesis, nodes = harness.nemesis, harness.nodes
    retained = {f"upgrade/retained/{i}": f"r{i}".encode() for i in range(RETAINED)}
    _publish(nodes[1].process.tcp, "upgrade-retain",
             [(topic, payload, True) for topic, payload in retained.items()])
    _offline_session(nodes[2].process.tcp)
    # 0.1.0's other nodes learn the session's filter as they apply its record, some time
    # after its SUBACK: a message published on node 1 before then is not stored for it.
    wait_until(lambda: nodes[0].metric("mqtt_durable_filters") >= 1, 15,
               "node 1 storing for the offline session")
    stored = _stored(harness)

    workload = harness.workload(seed=38)
    workload.start()
    workload.run_for(2)
    for node in nodes:
        assert nemesis.stop(node.name) == 0, f"{node.name} did not stop cleanly"
        node.process.code = None  # this tree, on the same data dir
        nemesis.restart(node.name)
        if node is not nodes[-1]:  # a member still runs the previous release
            assert node.cluster_version() == 0
        workload.run_for(2)
    report = workload.finish(drain_timeout=30)
    print(report.summary(), workload.stats)
    if not report.ok:
        print(f"evidence kept in {harness.keep_evidence()}")
    assert report.ok, report.summary()

    # Every member runs this tree: the cluster's effective version rises, and the command
    # kinds it gates (a durable shared group's writes) are used.
    harness.cluster.wait_version(nodes)
    _durable_group(nodes)

    for node in nodes:
        reader = PahoClient(node.process.tcp, f"upgrade-retained-{node.name}")
        reader.connect()
        try:
            reader.subscribe("upgrade/retained/#", qos=1)
            got = {m.topic: m.payload for m in reader.wait_messages(RETAINED)}
        finally:
            reader.close()
        assert got == retained, f"{node.name}: retained messages changed"

    keeper = PahoClient(nodes[0].process.tcp, "upgrade-keeper")
    result = keeper.connect(clean_start=False, session_expiry=3600)
    try:
        assert result.session_present, "the offline session did not survive the upgrade"
        got = keeper.wait_messages(len(stored), timeout=30)
    finally:
        keeper.close()
    assert sorted(m.payload for m in got) == sorted(payload for _, payload, _ in stored)
    for batch in ("sealed-", "current-"):  # one publisher each: its order per topic holds
        for topic in {topic for topic, _, _ in stored}:
            expected = [p for t, p, _ in stored if t == topic and p.startswith(batch.encode())]
            assert [m.payload for m in got
                    if m.topic == topic and m.payload.startswith(batch.encode())] == expected

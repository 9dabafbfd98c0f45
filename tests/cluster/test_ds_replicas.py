"""`broker ctl ds join | leave | set-replicas | forget` on real builtin_raft nodes, without
an operator: a site that leaves `messages` stops voting in its shards but keeps a learner's
copy (its durable sessions still read locally), joins again, and a site gone for good is
forgotten, which only a site that is down may be."""

import shutil

from tests.cluster.conftest import Cluster, Node, http_json
from tests.cluster.test_ds_placement import N_SHARDS, _held, durable_pair
from tests.cluster.test_replicated_ds import REPLICATED, _client, _groups_led
from tests.integration.clients import PahoClient, run_cli, unique, wait_until

EVERYTHING = sorted([("sessions", "0")] + [("messages", str(i)) for i in range(N_SHARDS)])


def _ctl(node: Node, *args: str) -> tuple[int, str]:
    done = run_cli("ctl", "ds", *args, "--url", f"http://127.0.0.1:{node.http}")
    return done.returncode, done.stdout + done.stderr


def _in_groups(node: Node, site: str) -> set[str]:
    """Where `node` sees `site` in the DS groups: 'voter', 'learner' or both."""
    seen = set()
    for group in http_json(node.http, "/api/v5/raft")["groups"]:
        if group["name"].startswith("messages"):
            seen |= {"voter"} if site in group["voters"] else set()
            seen |= {"learner"} if site in group["learners"] else set()
    return seen


def test_leave_join_and_forget_a_site(cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(3, **REPLICATED)
    cluster.all_running(nodes)
    _groups_led(nodes, 2 + N_SHARDS)
    sites = [http_json(node.http, "/api/v5/raft")["site"] for node in nodes]
    wait_until(lambda: all(_held(nodes[0], site) == EVERYTHING for site in sites), 20,
               "every site voting in every group")

    code, out = _ctl(nodes[0], "leave", "messages", sites[2].upper())
    assert code == 0 and out.split(": ")[1].split() == sorted(sites[:2]), out
    wait_until(lambda: _in_groups(nodes[0], sites[2]) == {"learner"}, 30,
               "the leaving site a learner in every shard")
    assert _held(nodes[0], sites[2]) == [("sessions", "0")]
    assert http_json(nodes[1].http, "/api/v5/ds/storages/messages/replicas") == sorted(
        sites[:2])

    # Two voters are a majority; the learner's durable session reads its local copy.
    subscriber, publisher, topic = durable_pair(clients, nodes[2], nodes[0], "left")
    assert publisher.publish(topic, b"voters elsewhere", qos=1) == 0
    assert subscriber.wait_messages(1)[0].payload == b"voters elsewhere"

    code, out = _ctl(nodes[1], "join", "messages", sites[2])
    assert code == 0, out
    wait_until(lambda: _held(nodes[0], sites[2]) == EVERYTHING, 30, "the site voting again")

    code, out = _ctl(nodes[0], "set-replicas", "messages", sites[0], "0000nosuchsite")
    assert code == 1 and "not a member" in out, out
    code, out = _ctl(nodes[0], "join", "sessions", sites[2])
    assert code == 2 and "only the `messages` database" in out, out
    code, out = _ctl(nodes[0], "forget", sites[2])
    assert code == 1 and "is up" in out, out

    nodes[2].process.kill()
    cluster.wait_statuses(nodes[:2], {nodes[2].node_name: "stopped"})
    code, out = _ctl(nodes[0], "forget", sites[2])
    assert code == 0 and sites[2] in out, out
    wait_until(lambda: all(not _in_groups(node, sites[2]) for node in nodes[:2]), 30,
               "the forgotten site in no group on either survivor")
    assert sites[2] not in http_json(nodes[1].http, "/api/v5/ds/sites")
    assert publisher.publish(topic, b"after forget", qos=1) == 0


def test_a_member_back_on_an_empty_data_dir_stays_out_until_forgotten(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    """A configured site ID (as the operator gives each pod) on a new, empty volume: the
    peers refuse it (as that member it would vote having forgotten its votes and what it
    acknowledged); once an administrator forgets the site, it joins again as a new replica
    and catches up."""
    nodes = cluster.make(3, **REPLICATED)
    sites = [f"00000000000000a{i}" for i in range(3)]
    for node, site in zip(nodes, sites, strict=True):
        node.process.settings["node.site_id"] = site
        node.start()
    cluster.all_running(nodes)
    _groups_led(nodes, 2 + N_SHARDS)
    subscriber, publisher, topic = durable_pair(clients, nodes[0], nodes[1], "reborn")
    assert publisher.publish(topic, b"before", qos=1) == 0

    lost = nodes[2]
    lost.process.kill()
    shutil.rmtree(lost.process.data_dir)
    lost.process.start()
    wait_until(lambda: "reborn" in lost.process.log_text(), 20, "the peers' refusal logged")
    assert nodes[0].statuses()[lost.node_name] == "stopped"
    assert sites[2] in _voters_of_every_group(nodes[0])  # its old vote is still counted

    code, out = _ctl(nodes[0], "forget", sites[2])
    assert code == 0, out
    wait_until(lambda: sites[2] not in _voters_of_every_group(nodes[0]), 30,
               "the forgotten site out of every group")

    # One join: the node keeps dialling with it while peers still see the old site leaving.
    done = run_cli("ctl", "cluster", "join", nodes[0].seed, "--url",
                   f"http://127.0.0.1:{lost.http}")
    assert done.returncode == 0, done.stderr
    cluster.wait_statuses(nodes, {lost.node_name: "running"}, timeout=30)
    wait_until(lambda: _held(nodes[0], sites[2]) == EVERYTHING, 60,
               "the new replica caught up and voting again")
    reader = _client(clients, lost, unique("late"))
    reader.connect(clean_start=False, session_expiry=3600)
    reader.subscribe(topic, qos=1)
    assert publisher.publish(topic, b"after", qos=1) == 0
    assert [m.payload for m in subscriber.wait_messages(2)] == [b"before", b"after"]
    assert reader.wait_messages(1)[0].payload == b"after"


def _voters_of_every_group(node: Node) -> set[str]:
    return {site for group in http_json(node.http, "/api/v5/raft")["groups"]
            for site in group["voters"]}


def _every_group_voted_by(node: Node, sites: set[str]) -> bool:
    """Each group, as `node` sees it, has exactly `sites` as voters."""
    return all(set(group["voters"]) == sites
               for group in http_json(node.http, "/api/v5/raft")["groups"])


def test_a_node_back_on_a_new_data_dir_replaces_its_old_site(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    """Without a configured site ID, a node whose data dir was lost comes back as a new
    site under its old name: its old site is gone for good and is removed by itself. Twice
    in a row on three nodes: with the old sites kept as voters, the groups would count two
    dead voters of five and could not add the third new one."""
    nodes = cluster.start(3, **REPLICATED)
    cluster.all_running(nodes)
    _groups_led(nodes, 2 + N_SHARDS)
    subscriber, publisher, topic = durable_pair(clients, nodes[0], nodes[1], "replaced")
    lost = nodes[2]
    for round_ in range(2):
        old = http_json(lost.http, "/api/v5/raft")["site"]
        lost.process.kill()
        shutil.rmtree(lost.process.data_dir)
        lost.process.start()
        new = http_json(lost.http, "/api/v5/raft")["site"]
        assert new != old
        sites = {http_json(node.http, "/api/v5/raft")["site"] for node in nodes}
        wait_until(lambda sites=sites: all(_every_group_voted_by(node, sites)
                                           for node in nodes), 60,
                   f"round {round_}: the new site voting everywhere, the old one nowhere")
        assert old not in http_json(nodes[0].http, "/api/v5/ds/sites")
        assert publisher.publish(topic, f"{round_}".encode(), qos=1) == 0
    assert [m.payload for m in subscriber.wait_messages(2)] == [b"0", b"1"]


def test_a_node_on_an_empty_data_dir_catches_up_from_snapshots_of_every_group(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    """With logs compacted every 8 entries, a node whose data dir was lost is sent a
    snapshot of each group it rejoins: a `messages` shard, `sessions` and the retained
    messages (the metadata group's). Then, with the session's own node dead, the session
    resumes on it, its messages come, and so does a retained message, from what the
    snapshots carried."""
    nodes = cluster.start(3, **REPLICATED, **{"durable_storage.raft.snapshot_interval": "8"})
    cluster.all_running(nodes)
    _groups_led(nodes, 2 + N_SHARDS)
    subscriber, publisher, topic = durable_pair(clients, nodes[0], nodes[1], "snapshots")
    sent = [f"m{i}".encode() for i in range(60)]
    for payload in sent[:30]:  # delivered and acknowledged: `sessions` commands
        assert publisher.publish(topic, payload, qos=1) == 0
    subscriber.wait_messages(30)
    subscriber.disconnect()
    for payload in sent[30:]:  # stored for it while it is away
        assert publisher.publish(topic, payload, qos=1) == 0
    kept = {b"k%d" % index for index in range(12)}
    for index in range(12):  # metadata commands (0x10: no subscriber, retained all the same)
        assert publisher.publish(f"{topic}-kept/{index}", b"k%d" % index, qos=1,
                                 retain=True) == 0x10
    for index in range(10):  # more `sessions` commands
        other = _client(clients, nodes[1], unique("other"))
        other.connect(clean_start=False, session_expiry=3600)
        other.subscribe(f"{topic}-other/{index}", qos=1)
        other.disconnect()
    lost = nodes[2]
    lost.process.kill()
    shutil.rmtree(lost.process.data_dir)
    lost.process.start()
    sites = {http_json(node.http, "/api/v5/raft")["site"] for node in nodes}
    # Each group: the old site removed, then the new one added as a learner and promoted, so
    # until the last group is done a group may have the two others as its only voters.
    wait_until(lambda: all(_every_group_voted_by(node, sites) for node in nodes), 60,
               "the new site voting in every group")
    for installed in ("messages shard", "the sessions database", "retained messages"):
        wait_until(lambda installed=installed: f"{installed}" in "\n".join(
            line for line in lost.process.log_lines if "replaced by a snapshot" in line),
            30, f"a snapshot of {installed} installed on the new node")
    nodes[0].process.kill()  # the session's node: the session moves to the new one
    resumed = _client(clients, lost, subscriber.client_id)
    # The takeover waits for the groups the dead node led to elect new leaders.
    assert resumed.connect(clean_start=False, session_expiry=3600, timeout=30).session_present
    resumed.subscribe(f"{topic}-kept/#", qos=1)
    wait_until(lambda: set(sent[30:]) | kept <= {m.payload for m in resumed.messages}, 30,
               "the messages stored for the session and the retained ones")
    got = resumed.barrier()
    assert {m.payload for m in got} <= set(sent) | kept
    assert {m.payload for m in got if m.retain} == kept

"""Backup and restore on one node (issue 39), with real processes, sockets and LevelDB: an
export taken while a QoS 1 publisher runs, checked, corrupted, refused, imported into a
fresh node where the durable sessions resume with every message acknowledged before the
export began, the retained messages and the shared group; a node holding data is refused;
a stopped node's data dir is restored offline with --force.
"""

import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.backup import restore
from broker.backup.manifest import CHECKSUMS, NAME, pairs_of
from tests.integration.clients import PahoClient, wait_offline, wait_until
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

EXPIRY = 3600
SHARE = "$share/workers/jobs/#"
RETAINED = {f"state/{n}": f"retained {n}".encode() for n in range(20)}


def ctl(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "broker", "ctl", "data", *args],
                          capture_output=True, text=True, timeout=120)
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def url(broker: BrokerProcess) -> str:
    return f"http://127.0.0.1:{broker.ports['http']}"


def seal(broker: BrokerProcess) -> None:
    request = urllib.request.Request(
        f"{url(broker)}/api/v5/ds/storages/messages/generations", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


class Publisher(threading.Thread):
    """QoS 1 publishes, one at a time, until stopped; `acked` holds those acknowledged."""

    def __init__(self, client: PahoClient, tag: str = "m") -> None:
        super().__init__(daemon=True)
        self.client = client
        self.tag = tag
        self.acked: list[bytes] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            payload = f"{self.tag} {n}".encode()
            info = self.client.client.publish(f"data/{n % 7}", payload, 1)
            info.wait_for_publish(30)
            assert info.is_published()
            with self._lock:
                self.acked.append(payload)
            n += 1

    def snapshot(self) -> list[bytes]:
        with self._lock:
            return list(self.acked)


def resume(port: int, client_id: str) -> PahoClient:
    client = PahoClient(port, client_id)
    client.connect(clean_start=False, session_expiry=EXPIRY)
    assert client.connack is not None and client.connack.session_present is True
    return client


def retained_on(port: int) -> dict[str, bytes]:
    reader = PahoClient(port, "retained-reader")
    reader.connect()
    try:
        reader.subscribe([("state/#", 1)])
        received = reader.wait_messages(len(RETAINED))
        return {m.topic: m.payload for m in received}
    finally:
        reader.close()


def receives_all(client: PahoClient, expected: list[bytes]) -> None:
    wanted = set(expected)
    wait_until(lambda: wanted <= {m.payload for m in client.messages}, 30,
               f"{client.client_id}: the {len(wanted)} messages acknowledged before the cut")


def publish_after(port: int, clients: list[PahoClient]) -> list[bytes]:
    """Messages published after the import by the exporting side's publishers' client IDs
    (so into the shards the archive filled): none may take a restored one's place."""
    sent = []
    for n in range(2):
        client = PahoClient(port, f"publisher-{n}" if n else "publisher")
        clients.append(client)
        client.connect()
        for i in range(20):
            payload = f"after {n} {i}".encode()
            assert client.publish(f"data/{i % 7}", payload, qos=1) == 0
            sent.append(payload)
        client.disconnect()
    return sent


def corrupt(archive: Path, member: str, into: Path) -> None:
    """A copy of the archive with one byte of `member`'s data flipped."""
    with tarfile.open(archive) as tar:
        offset = tar.getmember(member).offset_data
    data = bytearray(archive.read_bytes())
    data[offset] ^= 0xFF
    into.write_bytes(bytes(data))


def as_version_1(archive: Path, into: Path) -> None:
    """The archive as format version 1 wrote it: the members' checksums in the manifest,
    the first member; each database read through a snapshot in one member."""
    data: dict[str, bytes] = {}
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile(NAME))  # type: ignore[arg-type]
        for info in tar.getmembers():
            if info.name not in (NAME, CHECKSUMS):
                name = pairs_of(info.name) or info.name
                data[name] = data.get(name, b"") + tar.extractfile(info).read()  # type: ignore[union-attr]
    manifest.update(version=1, files=[
        {"path": path, "size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
        for path, content in data.items()])
    with tarfile.open(into, "w") as tar:
        for path, content in [(NAME, json.dumps(manifest).encode()), *data.items()]:
            info = tarfile.TarInfo(path)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))


def test_export_under_load_verify_corrupt_import_and_offline(
        start_broker: Callable[..., Any], tmp_path: Path,
        clients: list[PahoClient]) -> None:
    source: BrokerProcess = start_broker(tmp_path / "source")
    for client_id, topic in (("durable-1", "data/#"), ("durable-2", "data/#"),
                             ("worker-1", SHARE)):
        sub = PahoClient(source.tcp, client_id)
        clients.append(sub)
        sub.connect(clean_start=False, session_expiry=EXPIRY)
        assert sub.subscribe([(topic, 1)]) == [1]
        sub.disconnect()
        wait_offline(source.ports["http"], client_id)
    setter = PahoClient(source.tcp, "setter")
    clients.append(setter)
    setter.connect()
    for topic, payload in RETAINED.items():
        setter.client.publish(topic, payload, 1, retain=True).wait_for_publish(10)
    setter.client.publish("jobs/1", b"job before", 1).wait_for_publish(10)

    pub = PahoClient(source.tcp, "publisher")
    clients.append(pub)
    pub.connect()
    publisher = Publisher(pub)
    publisher.start()
    wait_until(lambda: len(publisher.snapshot()) >= 100, 30, "100 messages acknowledged")
    seal(source)  # some generations go into the archive as their files, others as pairs
    wait_until(lambda: len(publisher.snapshot()) >= 200, 30, "200 messages acknowledged")
    before_cut = publisher.snapshot()
    archive = tmp_path / "backup.tar"
    ctl("export", str(archive), "--url", url(source), "-o", "json")
    wait_until(lambda: len(publisher.snapshot()) >= len(before_cut) + 50, 30, "more after")
    publisher.stop.set()
    publisher.join(30)
    assert not archive.with_name("backup.tar.part").exists()

    checked = ctl("verify", str(archive), "-o", "json")
    assert '"backend": "builtin_local"' in checked.stdout
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert names[0] == "manifest.json" and any(n.endswith(".ldb") for n in names)
    assert names[-1] == "checksums.json" and "sessions.pairs.000000" in names
    assert not any("reserve.bin" in n for n in names)
    bad = tmp_path / "bad.tar"
    corrupt(archive, "sessions.pairs.000000", bad)
    refused = ctl("verify", str(bad), ok=False)
    assert refused.returncode == 1
    assert "sessions.pairs.000000: checksum mismatch" in refused.stderr

    target: BrokerProcess = start_broker(tmp_path / "target")
    refused = ctl("import", str(bad), "--url", url(target), ok=False)
    assert refused.returncode == 1 and "400 BAD_ARCHIVE" in refused.stderr
    assert "sessions.pairs" in refused.stderr
    ctl("import", str(archive), "--url", url(target))

    after = publish_after(target.tcp, clients)
    durable = resume(target.tcp, "durable-1")
    clients.append(durable)
    receives_all(durable, before_cut + after)
    assert retained_on(target.tcp) == RETAINED == retained_on(source.tcp)
    worker = resume(target.tcp, "worker-1")
    clients.append(worker)
    assert worker.wait_message_on("jobs/1").payload == b"job before"
    setter = PahoClient(target.tcp, "setter-2")
    clients.append(setter)
    setter.connect()
    setter.client.publish("jobs/2", b"job after", 1).wait_for_publish(10)
    assert worker.wait_message_on("jobs/2").payload == b"job after"  # the group's route

    again = ctl("import", str(archive), "--url", url(target), ok=False)
    assert again.returncode == 1 and "409 NOT_EMPTY" in again.stderr
    compressed = tmp_path / "backup.tar.gz"  # uploaded to a file first, then read as one
    ctl("export", str(compressed), "--url", url(source))
    # The node's second export sends the sealed tables from the page cache with the
    # checksums the first one took (the CLI checked them as they came): the same.
    ctl("verify", str(compressed))
    first, second = tables_of(archive), tables_of(compressed)
    assert second and all(first[path] == sha for path, sha in second.items() if path in first)
    again = ctl("import", str(compressed), "--url", url(target), ok=False)
    assert again.returncode == 1 and "409 NOT_EMPTY" in again.stderr

    running = ctl("import", str(archive), "--force", "--data-dir", str(target.data_dir),
                  ok=False)
    assert running.returncode == 1 and "running" in running.stderr
    for client in clients:
        client.close()
    assert target.stop() == 0
    old = tmp_path / "version-1.tar"  # an archive of the format before still imports
    as_version_1(archive, old)
    ctl("import", str(old), "--force", "--data-dir", str(target.data_dir))
    restarted: BrokerProcess = start_broker(target.data_dir)
    durable = resume(restarted.tcp, "durable-2")
    clients.append(durable)
    receives_all(durable, before_cut)
    assert retained_on(restarted.tcp) == RETAINED


def test_an_offline_import_syncs_every_file_before_swapping_it_in(
        start_broker: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        clients: list[PahoClient]) -> None:
    """The tables an import writes (sealed generations' as they are, the others' built from
    their pairs, bulk.Build) go past the page cache without a sync each: the whole tree is
    synced before the rename that makes it the node's data, or a power loss after the import
    could leave tables cut short where the old data was."""
    source: BrokerProcess = start_broker(tmp_path / "source")
    sub = PahoClient(source.tcp, "durable-1")
    clients.append(sub)
    sub.connect(clean_start=False, session_expiry=EXPIRY)
    assert sub.subscribe([("data/#", 1)]) == [1]
    sub.disconnect()
    published(source.tcp, clients, "synced")
    seal(source)
    archive = tmp_path / "backup.tar"
    ctl("export", str(archive), "--url", url(source))
    synced: set[tuple[int, int]] = set()
    fsync = os.fsync

    def recorded(handle: int) -> None:
        status = os.fstat(handle)
        synced.add((status.st_dev, status.st_ino))
        fsync(handle)

    monkeypatch.setattr(os, "fsync", recorded)
    offline = tmp_path / "offline"
    restore.import_offline([archive], offline, offline / "raft" / "wal")
    trees = [offline / "ds" / "messages", offline / "ds" / "sessions", offline / "retained"]
    files = [path for tree in trees for path in (tree, *tree.rglob("*"))]
    assert all(any(tree.rglob("*.ldb")) for tree in trees[:2])  # (no retained message here)
    assert [path for path in files
            if (path.stat().st_dev, path.stat().st_ino) not in synced] == []


def published(port: int, clients: list[PahoClient], tag: str, count: int = 30) -> list[bytes]:
    """`count` QoS 1 messages on data/N, each acknowledged."""
    client = PahoClient(port, f"publisher-{tag}")
    clients.append(client)
    client.connect()
    sent = [f"{tag} {i}".encode() for i in range(count)]
    for i, payload in enumerate(sent):
        assert client.publish(f"data/{i % 7}", payload, qos=1) == 0
    client.disconnect()
    return sent


def tables_of(archive: Path) -> dict[str, str]:
    """The sealed tables an archive lists: their SHA-256 by path."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile(CHECKSUMS)
        assert member is not None
        listed = json.load(member)["files"]
    return {f["path"]: f["sha256"] for f in listed if f["path"].endswith(".ldb")}


def export_since(source: BrokerProcess, archive: Path, since: str | None) -> dict[str, Any]:
    """An export (incremental since the time `since`, when given): its `verify -o json`."""
    ctl("export", str(archive), "--url", url(source), *(("--since", since) if since else ()))
    return json.loads(ctl("verify", str(archive), "-o", "json").stdout)  # type: ignore[no-any-return]


def refusal(*args: str) -> str:
    refused = ctl("import", *args, ok=False)
    assert refused.returncode == 1, refused.stdout
    return refused.stderr


def test_a_full_archive_and_its_increments_restore_together(
        start_broker: Callable[..., Any], tmp_path: Path,
        clients: list[PahoClient]) -> None:
    """A full archive, then two made `--since` the one before (each after generations were
    sealed, so each leaves some to the archives before it), restored as one, online and
    offline: the durable sessions get every message acknowledged before the last cut. An
    increment alone, out of order, or after a gap is refused, naming why."""
    source: BrokerProcess = start_broker(tmp_path / "source")
    for client_id in ("durable-1", "durable-2"):
        sub = PahoClient(source.tcp, client_id)
        clients.append(sub)
        sub.connect(clean_start=False, session_expiry=EXPIRY)
        assert sub.subscribe([("data/#", 1)]) == [1]
        sub.disconnect()
        wait_offline(source.ports["http"], client_id)
    sent = published(source.tcp, clients, "a")
    seal(source)
    sent += published(source.tcp, clients, "b")
    base, inc1, inc2 = (tmp_path / name for name in ("base.tar", "inc1.tar", "inc2.tar"))
    made = export_since(source, base, None)
    assert made["incremental_since_us"] is None
    seal(source)  # the base's current generations, sealed: the next increment holds them
    sent += published(source.tcp, clients, "c")
    made = export_since(source, inc1, made["created"])
    sent += published(source.tcp, clients, "d")
    seal(source)
    sent += published(source.tcp, clients, "e")
    assert export_since(source, inc2, made["created"])["incremental_since_us"] is not None
    with tarfile.open(inc2) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
    left = [g for g in manifest["generations"] if not g["in_archive"]]
    assert left, "the last increment leaves no generation to the archives before it"

    target: BrokerProcess = start_broker(tmp_path / "target")
    where = ("--url", url(target))
    assert "incremental" in refusal(str(inc2), *where)
    assert "give the archives oldest first" in refusal(str(base), str(inc2), str(inc1), *where)
    gap = refusal(str(base), str(inc2), *where)
    assert "400 BAD_ARCHIVE" in gap and "inc2.tar" in gap and "an increment is missing" in gap
    assert "a full archive restores alone" in refusal(str(base), str(base), *where)
    done = json.loads(ctl("import", str(base), str(inc1), str(inc2), *where, "-o", "json").stdout)
    assert done["file"] == str(base) and done["increments"] == [str(inc1), str(inc2)]
    durable = resume(target.tcp, "durable-1")
    clients.append(durable)
    receives_all(durable, sent)

    offline = tmp_path / "offline"
    assert "an increment is missing" in refusal(str(base), str(inc2), "--force",
                                                "--data-dir", str(offline))
    ctl("import", str(base), str(inc1), str(inc2), "--force", "--data-dir", str(offline))
    restarted: BrokerProcess = start_broker(offline)
    durable = resume(restarted.tcp, "durable-2")
    clients.append(durable)
    receives_all(durable, sent)


def _post_import(port: int, head: bytes, length: int) -> bytes:
    """`head` of an upload of `length` bytes, then silence: what the node answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"POST /api/v5/data/import HTTP/1.1\r\nHost: x\r\nContent-Type:"
                     b" application/x-tar\r\nContent-Length: %d\r\n\r\n" % length + head)
        answer = bytearray()
        while data := sock.recv(65536):  # (to its end: the node closes the connection)
            answer += data
        return bytes(answer)


def test_an_upload_that_stops_is_refused_and_frees_the_node(
        start_broker: Callable[..., Any], tmp_path: Path) -> None:
    """A client that stops sending mid-body is dropped after header_timeout, the import
    refused naming why (the thread reading the socket gives up: it does not hold the node's
    one import), and the next import is taken."""
    node: BrokerProcess = start_broker(
        tmp_path / "node", **{"dashboard.listeners.http.header_timeout": "1s"})
    answer = _post_import(node.ports["http"], b"\0" * 70_000, 10 << 20)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"Connection: close" in answer  # read by the thread: aiohttp never saw its end
    assert b"the upload stopped: no byte of the body for 1 s" in answer, answer
    answer = _post_import(node.ports["http"], b"not a tar", 9)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]  # not 409 BUSY
    assert b"BAD_ARCHIVE" in answer and b"the upload stopped" not in answer, answer
